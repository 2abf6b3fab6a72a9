"""The environment for a test's child Python process: this checkout first on PYTHONPATH, then
whatever PYTHONPATH already holds (a machine may keep dependencies there, as the GPU machines
keep gguf in a --target folder; replacing it would hide them and the child would fail for a
reason the test is not about)."""
from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def child_env(**extra: str) -> dict[str, str]:
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO)] + inherited), **extra}
