"""The `pykernel` command line run as a subprocess (test_cli, test_perplexity): a module of its
own, so that a test module importing it is not skipped with test_cli when oracle data is
absent (test_cli skips itself at import then, and a name imported from it fails instead)."""
import subprocess
import sys
from pathlib import Path
from tests.child_env import child_env

REPO = Path(__file__).resolve().parents[2]


def pykernel(*args, stdin=None, timeout=120):
    env = child_env()
    return subprocess.run([sys.executable, "-m", "pykernel.cli", *map(str, args)], input=stdin,
                          capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env)
