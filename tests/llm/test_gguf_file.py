"""GGUF parsing: good files parse like gguf-py; bad files give one GGUFError naming file, key or
tensor and what was expected, quickly and without large allocations."""
import struct

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType

import llm
from llm.gguf_file import GGUFError, GGUFFile
from llm.gguf_reader_view import MetadataReader
from tests.llm.gguf_helpers import (TINY, TINY_LLAMA, key_value_offset, patch, rewrite,
                                    require_for_module, tensor_info_offset)

require_for_module(TINY_LLAMA)

TINY_FILES = sorted(TINY.glob("*.gguf"))


@pytest.mark.parametrize("path", TINY_FILES, ids=lambda p: p.name)
def test_parse_matches_gguf_reader(path):
    ours, ref = GGUFFile(path), GGUFReader(path)
    assert set(ours.tensors) == {t.name for t in ref.tensors}
    for t in ref.tensors:
        mine = ours.tensors[t.name]
        assert mine.ggml_type == t.tensor_type
        assert mine.shape == tuple(reversed(t.shape.tolist()))
        assert mine.offset == t.data_offset and mine.n_bytes == t.n_bytes
        assert np.array_equal(mine.data, t.data.reshape(-1).view(np.uint8))
    view = MetadataReader(ours)
    for key, field in ref.fields.items():
        if key.startswith("GGUF."):
            continue
        mine = view.fields[key]
        assert mine.types == field.types, key
        assert mine.contents() == field.contents(), key
        if field.types[0] == GGUFValueType.ARRAY and field.data:  # what the tokenizer reads
            if field.types[1] == GGUFValueType.STRING:
                assert [bytes(mine.parts[i]) for i in mine.data] == \
                    [bytes(field.parts[i]) for i in field.data], key
            else:
                assert np.array_equal(np.concatenate([mine.parts[i] for i in mine.data]),
                                      np.concatenate([field.parts[i] for i in field.data])), key


def _load_error(path, **kw) -> GGUFError:
    with pytest.raises(GGUFError) as info:
        llm.load(path, n_ctx=64, **kw)
    assert str(path) in str(info.value)
    return info.value


def test_not_a_gguf(tmp_path):
    text = tmp_path / "notes.gguf"
    text.write_text("hello, I am not a model\n" * 10)
    err = _load_error(text)
    assert "not a GGUF file" in str(err)
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    assert "empty" in str(_load_error(empty))


def test_missing_file_is_clear(tmp_path):
    with pytest.raises(llm.ModelFileError, match="no such file"):
        llm.load(tmp_path / "nope.gguf")


def test_every_truncation_is_a_gguf_error(tmp_path, rng):
    data = TINY_LLAMA.read_bytes()
    header_end = GGUFFile(TINY_LLAMA).tensors["token_embd.weight"].offset
    cuts = sorted(set(rng.integers(5, header_end, 40).tolist()) | {4, 8, 23, 24, 31, header_end,
                                                                  len(data) - 1})
    for cut in cuts:
        path = tmp_path / f"cut{cut}.gguf"
        path.write_bytes(data[:cut])
        with pytest.raises(GGUFError) as info:
            GGUFFile(path)
        assert str(path) in str(info.value), cut


def test_tensor_data_past_end(tmp_path):
    path = tmp_path / "short.gguf"
    path.write_bytes(TINY_LLAMA.read_bytes()[:-100])
    err = _load_error(path)
    assert "past the end" in err.expected and "tensor" in err.what


def test_unknown_tensor_type(tmp_path):
    path = tmp_path / "type.gguf"
    path.write_bytes(TINY_LLAMA.read_bytes())
    at = tensor_info_offset(path, "blk.0.attn_q.weight")
    n_dims = struct.unpack_from("<I", path.read_bytes(), at)[0]
    patch(path, at + 4 + 8 * n_dims, "<I", 99)
    err = _load_error(path)
    assert "blk.0.attn_q.weight" in err.what and "unknown tensor type 99" in err.expected


def test_huge_dimension_is_rejected_without_allocating(tmp_path):
    path = tmp_path / "dims.gguf"
    path.write_bytes(TINY_LLAMA.read_bytes())
    patch(path, tensor_info_offset(path, "output.weight") + 4, "<Q", 1 << 40)
    err = _load_error(path)
    assert "output.weight" in err.what


@pytest.mark.parametrize("field,value", [("kv_count", 1 << 60), ("tensor_count", 1 << 60)])
def test_huge_counts(tmp_path, field, value):
    path = tmp_path / "counts.gguf"
    path.write_bytes(TINY_LLAMA.read_bytes())
    patch(path, 8 if field == "tensor_count" else 16, "<Q", value)
    _load_error(path)


def test_huge_string_and_array_lengths(tmp_path):
    path = tmp_path / "strlen.gguf"
    path.write_bytes(TINY_LLAMA.read_bytes())
    patch(path, key_value_offset(path, "general.architecture") + 4, "<Q", 1 << 62)
    assert "general.architecture" in _load_error(path).what
    path.write_bytes(TINY_LLAMA.read_bytes())
    patch(path, key_value_offset(path, "tokenizer.ggml.tokens") + 8, "<Q", 1 << 61)
    assert "tokenizer.ggml.tokens" in _load_error(path).what


def test_unknown_value_type(tmp_path):
    path = tmp_path / "vtype.gguf"
    path.write_bytes(TINY_LLAMA.read_bytes())
    patch(path, key_value_offset(path, "llama.block_count"), "<I", 77)
    err = _load_error(path)
    assert "llama.block_count" in err.what and "unknown value type 77" in err.expected


def test_missing_key(tmp_path):
    path = rewrite(TINY_LLAMA, tmp_path / "nokey.gguf", drop_keys=["llama.embedding_length"])
    err = _load_error(path)
    assert "llama.embedding_length" in err.what and "missing" in err.expected


def test_wrong_key_type(tmp_path):
    path = rewrite(TINY_LLAMA, tmp_path / "keytype.gguf",
                   set_keys={"llama.block_count": ("two", GGUFValueType.STRING)})
    err = _load_error(path)
    assert "llama.block_count" in err.what and "expected int" in err.expected


def test_unsupported_architecture(tmp_path):
    path = rewrite(TINY_LLAMA, tmp_path / "arch.gguf",
                   set_keys={"general.architecture": ("mamba",)})
    err = _load_error(path)
    assert "general.architecture" in err.what and "'mamba' is not supported" in err.expected


def test_missing_tensor(tmp_path):
    path = rewrite(TINY_LLAMA, tmp_path / "notensor.gguf", drop_tensors=["blk.1.ffn_up.weight"])
    err = _load_error(path)
    assert "blk.1.ffn_up.weight" in err.what and "missing" in err.expected


def test_wrong_shape(tmp_path, rng):
    bad = rng.standard_normal((48, 64)).astype(np.float32)
    path = rewrite(TINY_LLAMA, tmp_path / "shape.gguf",
                   tensors={"blk.0.attn_q.weight": (bad, None)})
    err = _load_error(path)
    assert "blk.0.attn_q.weight" in err.what
    assert "expected shape (64, 64)" in err.expected and "(48, 64)" in err.expected


def test_row_length_not_a_multiple_of_the_block(tmp_path):
    # Q8_0 needs ne0 % 32 == 0: a 64 x 20 raw tensor declared with ne0 = 20 is invalid
    raw = np.zeros((64, 20), dtype=np.float32)
    path = rewrite(TINY_LLAMA, tmp_path / "block.gguf",
                   tensors={"blk.0.attn_q.weight": (raw, None)})
    at = tensor_info_offset(path, "blk.0.attn_q.weight")
    patch(path, at + 4 + 16, "<I", int(GGMLQuantizationType.Q8_0))
    err = _load_error(path)
    assert "multiple of 32" in err.expected


def test_corrupted_header_bytes_never_crash(tmp_path, rng):
    """Random byte flips in the header: either a GGUFError or a loadable model, nothing else."""
    data = TINY_LLAMA.read_bytes()
    header_end = GGUFFile(TINY_LLAMA).tensors["token_embd.weight"].offset
    for trial in range(25):
        corrupt = bytearray(data)
        for at in rng.integers(4, header_end, 3):
            corrupt[at] = int(rng.integers(0, 256))
        path = tmp_path / f"fuzz{trial}.gguf"
        path.write_bytes(bytes(corrupt))
        try:
            llm.load(path, n_ctx=16)
        except GGUFError:
            pass
