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


class AnnotationError(KernelSourceError, TypeError):
    """A malformed type annotation (`Ptr[f32, "rw"]`, `pk.Array[f32, 0]`): Python evaluates
    annotations when it defines the function, before any decorator sees them, so the error is
    located from the frame that evaluated it. A TypeError too, as Python's own are."""


def annotation_error(message: str, hint: str | None = None) -> AnnotationError:
    """An AnnotationError at the expression being evaluated in the nearest frame outside
    pykernel/ (its exact column on Python 3.11+, from the code's position table)."""
    import linecache
    import os
    import sys
    package = os.path.dirname(os.path.abspath(__file__))
    frame = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame = frame.f_back
    if frame is None or frame.f_code.co_filename.startswith("<"):
        # a string annotation (`from __future__ import annotations`) evaluated by pykernel
        # itself: no source position here; the evaluating code (signature.py) relocates it
        return AnnotationError(message, hint=hint)
    file, line, col, end_col = frame.f_code.co_filename, frame.f_lineno, 0, None
    positions = getattr(frame.f_code, "co_positions", None)
    if positions is not None:
        at = list(positions())[frame.f_lasti // 2]
        if at[0] is not None and at[2] is not None:
            line, col = at[0], at[2]
            end_col = at[3] if at[1] == at[0] else None
    return AnnotationError(message, file, line, col, end_col, linecache.getline(file, line), hint)
