"""Where the oracle data lives: ../shared beside the checkout ($PYKERNEL_SHARED overrides).
Tests that need a file skip with the reason when it is absent (e.g. on a GPU machine that
received only the working tree); CI always has it."""
import os
from pathlib import Path

import pytest

SHARED = Path(os.environ.get("PYKERNEL_SHARED",
                             Path(__file__).resolve().parents[2] / "shared"))
GOLDEN = SHARED / "golden"


def require(path) -> Path:
    path = Path(path)
    if not path.exists():
        pytest.skip(f"oracle data {path} not present (needs ../shared beside the checkout)")
    return path
