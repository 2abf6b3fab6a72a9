"""Control of the BLAS thread count numpy uses, from inside a running process.

Input: a thread count. Output: the previous count (or None when numpy's BLAS cannot be reached).
Why: a decode step is a chain of small GEMVs; OpenBLAS's worker threads spin-wait between them,
and on a 2-core machine with any other busy process the spinning makes decode ~10x slower (2 vs
19 tok/s measured). The numpy backend therefore uses one BLAS thread unless told otherwise.
OPENBLAS_NUM_THREADS only works before numpy loads, hence the library's own setter via ctypes.
"""
from __future__ import annotations

import ctypes
import functools

_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
            "openblas_set_num_threads64_", "openblas_set_num_threads")
_GETTERS = ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads",
            "openblas_get_num_threads64_", "openblas_get_num_threads")


def _loaded_openblas() -> list[str]:
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.lower()}
    except OSError:
        return []
    return sorted(p for p in paths if p.startswith("/"))


@functools.lru_cache(maxsize=1)
def _functions():
    import numpy  # noqa: F401  (loads the BLAS library so it appears in the process maps)
    for path in _loaded_openblas():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        setter = next((getattr(lib, n) for n in _SETTERS if hasattr(lib, n)), None)
        getter = next((getattr(lib, n) for n in _GETTERS if hasattr(lib, n)), None)
        if setter is not None and getter is not None:
            setter.argtypes, getter.restype = [ctypes.c_int], ctypes.c_int
            return setter, getter
    return None


def get_threads() -> int | None:
    fns = _functions()
    return None if fns is None else int(fns[1]())


def set_threads(n: int) -> int | None:
    """Set numpy's BLAS threads to n; returns the previous value (None: not controllable)."""
    fns = _functions()
    if fns is None:
        return None
    previous = int(fns[1]())
    if previous != n:
        fns[0](int(n))
    return previous


class ThreadChooser:
    """Picks the BLAS thread count with the lowest measured cost (seconds per unit of work),
    re-trying the other counts now and then, so decode uses both cores on an idle machine and
    falls back to one when spinning workers would collide with another busy process."""

    def __init__(self, candidates: tuple[int, ...], explore_every: int = 200, trial: int = 12):
        self.candidates = candidates
        self.explore_every, self.trial = explore_every, trial
        self.cost: dict[int, float | None] = {c: None for c in candidates}
        self.calls = 0
        self.trying: int | None = None
        self.trial_left = 0

    def pick(self) -> int:
        untried = [c for c in self.candidates if self.cost[c] is None]
        if untried:
            return untried[0]
        best = min(self.candidates, key=lambda c: self.cost[c])
        if self.trial_left > 0:
            return self.trying
        self.calls += 1
        if len(self.candidates) > 1 and self.calls % self.explore_every == 0:
            others = [c for c in self.candidates if c != best]
            self.trying = others[(self.calls // self.explore_every) % len(others)]
            self.trial_left = self.trial
            return self.trying
        return best

    def record(self, threads: int, seconds: float, work: float) -> None:
        if self.trial_left > 0 and threads == self.trying:
            self.trial_left -= 1
        cost = seconds / max(work, 1.0)
        old = self.cost[threads]
        self.cost[threads] = cost if old is None else 0.8 * old + 0.2 * cost
