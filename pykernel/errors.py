"""Exceptions users see: kernel source errors printed like a compiler, launch-time argument
errors, and errors raised while a kernel runs."""
from __future__ import annotations


class KernelSourceError(Exception):
    """An error in kernel source: `file:line:col: error: message`, the line, a caret."""

    def __init__(self, message: str, file: str = "<unknown>", line: int = 0, col: int = 0,
                 end_col: int | None = None, source_line: str = "", hint: str | None = None):
        self.message, self.file, self.line, self.col = message, file, line, col
        self.end_col, self.source_line, self.hint = end_col, source_line, hint
        super().__init__(self.render())

    def render(self) -> str:
        out = [f"{self.file}:{self.line}:{self.col + 1}: error: {self.message}"]
        if self.source_line:
            out.append("    " + self.source_line.rstrip("\n"))
            width = max(1, (self.end_col or self.col + 1) - self.col)
            out.append("    " + " " * self.col + "^" + "~" * (width - 1))
        if self.hint:
            out.append(f"hint: {self.hint}")
        return "\n".join(out)

    def __str__(self) -> str:
        return self.render()


class UnsupportedArchError(KernelSourceError):
    """An instruction the chosen GPU architecture lacks (e.g. mma.sync before sm_80)."""


class LaunchError(TypeError):
    """Arguments that do not match a kernel's signature (names kernel, parameter, expected,
    given)."""


class KernelRuntimeError(RuntimeError):
    """A kernel failed while running (illegal address, out-of-bounds on the CPU target, ...)."""


class ArchSpecificError(UnsupportedArchError):
    """An instruction that only an arch-specific target has (wgmma, setmaxnreg: sm_90a); the
    launcher catches it when compiling for the plain arch and compiles for `arch` instead."""
    arch = "sm_90a"
