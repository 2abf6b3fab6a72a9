"""Where the oracle data lives: tests/data/golden inside the checkout, copied from the team's
shared folder (../shared/golden, made by llama.cpp) so that a fresh clone tests with nothing
beside it. A test that needs a file it cannot find fails: missing oracle data is a broken
checkout, not a reason to skip."""
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
GOLDEN = DATA / "golden"


def require(path) -> Path:
    """The path itself, after checking it exists (a clear error instead of a later one)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"oracle data {path} is missing from the checkout (tests/data)")
    return path
