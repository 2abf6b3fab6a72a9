"""Stage 1: a Python function -> FunctionAST (its ast, source lines and absolute positions)."""
from __future__ import annotations

import ast
import hashlib
import inspect
import textwrap
from dataclasses import dataclass, field

from ..errors import KernelSourceError


@dataclass
class FunctionAST:
    name: str
    tree: ast.FunctionDef
    file: str
    first_line: int          # absolute line of the `def` (decorators excluded)
    col_offset: int          # indentation removed by dedent
    source_lines: list[str]  # the file's lines (for error display)
    globals: dict            # the function's module globals (names resolve here)
    closure: dict = field(default_factory=dict)
    source_hash: str = ""
    single_assigned: frozenset | None = None   # codegen's constant-name analysis, computed once
    rebound: frozenset | None = None           # names bound at several places, computed once

    def error(self, node, message: str, hint: str | None = None) -> KernelSourceError:
        """A KernelSourceError pointing at `node` (absolute file:line:col)."""
        line = self.first_line + getattr(node, "lineno", 1) - 1
        col = getattr(node, "col_offset", 0) + self.col_offset
        end_col = None
        if getattr(node, "end_lineno", None) == getattr(node, "lineno", None):
            end_col = getattr(node, "end_col_offset", None)
            end_col = end_col + self.col_offset if end_col is not None else None
        text = self.source_lines[line - 1] if 0 < line <= len(self.source_lines) else ""
        return KernelSourceError(message, self.file, line, col, end_col, text, hint)


def parse(fn) -> FunctionAST:
    try:
        lines, start = inspect.getsourcelines(fn)
        file = inspect.getsourcefile(fn) or "<unknown>"
        all_lines = inspect.getsource(inspect.getmodule(fn)).splitlines(True) \
            if inspect.getmodule(fn) else lines
    except (OSError, TypeError) as exc:
        raise TypeError(f"cannot read the source of {fn!r}: {exc}") from None
    raw = "".join(lines)
    text = textwrap.dedent(raw)
    indent = len(lines[0]) - len(lines[0].lstrip())
    module = ast.parse(text)
    tree = module.body[0]
    if not isinstance(tree, ast.FunctionDef):
        raise TypeError(f"{fn!r} is not a plain function")
    if len(all_lines) < start + len(lines) - 1:
        all_lines = [""] * (start - 1) + lines
    def_line = start + tree.lineno - 1
    closure = {}
    if fn.__closure__:
        closure = {name: cell.cell_contents
                   for name, cell in zip(fn.__code__.co_freevars, fn.__closure__)}
    fast = FunctionAST(fn.__name__, tree, file, start, indent, all_lines, fn.__globals__, closure)
    # Line numbers inside `tree` count from the first source line (decorators included).
    fast.first_line = start
    fast.source_hash = hashlib.sha256(raw.encode()).hexdigest()
    del def_line
    return fast
