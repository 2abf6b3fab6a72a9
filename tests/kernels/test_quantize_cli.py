"""`pykernel quantize` (stdlib_kernels.quant.cli / quantize_file): type rules, metadata kept,
tensors bit-exact with the reference codecs, output readable by gguf-py and the runner."""
import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter, LlamaFileType

from pykernel.cli import main as pykernel_main
from stdlib_kernels.quant import reference as ref
from stdlib_kernels.quant.cli import choose_type, fit_to_row, use_more_bits

from shared_data import GOLDEN, require

TINY = str(GOLDEN / "tiny" / "tiny-llama-f32.gguf")


def test_llama_cpp_type_rules():
    assert choose_type("output.weight", "Q4_K_M", 32, True) == "Q6_K"
    assert choose_type("output.weight", "Q8_0", 32, True) == "Q8_0"
    assert choose_type("token_embd.weight", "Q4_0", 32, False) == "Q6_K"   # tied output
    assert choose_type("token_embd.weight", "Q4_0", 32, True) == "Q4_0"
    more = [i for i in range(32) if use_more_bits(i, 32)]
    assert more[:6] == [0, 1, 2, 3, 6, 9] and more[-4:] == [28, 29, 30, 31]
    assert choose_type("blk.3.attn_v.weight", "Q4_K_M", 32, True) == "Q6_K"
    assert choose_type("blk.4.attn_v.weight", "Q4_K_M", 32, True) == "Q4_K"
    assert choose_type("blk.4.ffn_down.weight", "Q5_K_M", 32, True) == "Q5_K"
    assert choose_type("blk.31.ffn_down.weight", "Q5_K_M", 32, True) == "Q6_K"
    assert choose_type("blk.4.attn_qkv.weight", "Q4_K_M", 32, True) == "Q5_K"
    assert choose_type("blk.3.attn_v.weight", "Q4_K", 32, True) == "Q4_K"
    assert fit_to_row("Q6_K", 64) == "Q8_0" and fit_to_row("Q4_K", 96) == "Q5_0"
    assert fit_to_row("Q6_K", 512) == "Q6_K" and fit_to_row("Q8_0", 48) == "F16"


def _check_tensors_match(src_path, out_path, want_types):
    src = {t.name: t for t in GGUFReader(src_path).tensors}
    out = GGUFReader(out_path)
    assert [t.name for t in out.tensors] == list(src)
    for t in out.tensors:
        kind = GGMLQuantizationType(t.tensor_type).name
        assert kind == want_types[t.name], t.name
        source = np.asarray(src[t.name].data)
        if kind == GGMLQuantizationType(src[t.name].tensor_type).name:
            assert np.array_equal(np.asarray(t.data), source), t.name
            continue
        rows = source.astype(np.float32).reshape(-1, int(t.shape[0]))
        assert np.array_equal(np.asarray(t.data), ref.quantize(rows, kind)), t.name
    return out


def test_quantize_tiny_llama_q8_0_loads_in_runner(tmp_path, capsys):
    out_path = tmp_path / "tiny-q8_0.gguf"
    require(TINY)
    assert pykernel_main(["quantize", TINY, str(out_path), "--type", "Q8_0",
                          "--backend", "numpy"]) == 0
    assert "elements/s" in capsys.readouterr().err
    src = GGUFReader(TINY)
    want = {t.name: ("Q8_0" if len(t.shape) == 2 else "F32") for t in src.tensors}
    out = _check_tensors_match(TINY, out_path, want)
    keys = {k for k in src.fields if not k.startswith("GGUF.")}
    assert keys | {"general.file_type"} == {k for k in out.fields if not k.startswith("GGUF.")}
    assert out.fields["general.file_type"].contents() == LlamaFileType.MOSTLY_Q8_0
    assert out.fields["tokenizer.ggml.tokens"].contents() == \
        src.fields["tokenizer.ggml.tokens"].contents()
    import llm
    model = llm.load(str(out_path), progress=False)
    assert model.config.n_layer == 2


def _write_small_model(path, rng):
    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_tensor("blk.0.attn_norm.weight", rng.standard_normal(512).astype(np.float32))
    writer.add_tensor("blk.0.attn_v.weight", rng.standard_normal((3, 512)).astype(np.float16))
    writer.add_tensor("output.weight", rng.standard_normal((2, 512)).astype(np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_quantize_on_device_q4_k_m(tmp_path, rng, seed, device):
    src_path, out_path = tmp_path / "small.gguf", tmp_path / "small-q4_k_m.gguf"
    _write_small_model(src_path, rng)
    assert pykernel_main(["quantize", str(src_path), str(out_path), "--type", "Q4_K_M",
                          "--backend", "device"]) == 0
    want = {"blk.0.attn_norm.weight": "F32", "blk.0.attn_v.weight": "Q6_K",
            "output.weight": "Q6_K"}
    out = _check_tensors_match(src_path, out_path, want)
    assert out.fields["general.file_type"].contents() == LlamaFileType.MOSTLY_Q4_K_M, seed


def test_bad_input_file_is_reported(tmp_path, capsys):
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"not a gguf file at all")
    assert pykernel_main(["quantize", str(bogus), str(tmp_path / "o.gguf"), "--type",
                          "Q8_0", "--backend", "numpy"]) == 1
    err = capsys.readouterr().err
    assert "error" in err and "bogus.gguf" in err
