"""A benchmark's finished table: printed, and also written to `--out` when one is given."""
from __future__ import annotations


def print_report(lines: list[str], out: str | None = None) -> None:
    text = "\n".join(lines)
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")
