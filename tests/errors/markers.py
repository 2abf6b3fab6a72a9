"""Where a marker comment sits in a test file: the line an error message must point at."""


def line_of(path: str, marker: str) -> int:
    """The 1-based line of `path` holding `marker` (a line that calls line_of does not count)."""
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if marker in line and "line_of(" not in line:
                return n
    raise AssertionError(f"{marker} not found in {path}")
