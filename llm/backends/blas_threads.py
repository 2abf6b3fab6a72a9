"""Control of the BLAS thread count numpy uses, from inside a running process.

Input: a thread count. Output: the previous count (or None when numpy's BLAS cannot be reached).
Why: a decode step is a chain of small GEMVs; OpenBLAS's worker threads spin-wait between them,
and on a 2-core machine with any other busy process the spinning makes decode ~10x slower (2 vs
19 tok/s measured), while on an idle machine two threads decode ~1.4x faster than one.
`ThreadChooser` picks the count by measured speed. OPENBLAS_NUM_THREADS only works before numpy
loads, hence the library's own setter via ctypes.
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
    """Picks the BLAS thread count with the lowest measured cost (seconds per unit of work).
    The other counts are re-tried for `trial` calls after `explore_every` calls; each re-try that
    loses doubles that interval (up to 64x), so a count that is catastrophically slow on a busy
    machine costs almost nothing, while one that becomes faster is found again."""

    MAX_BACKOFF = 64

    def __init__(self, candidates: tuple[int, ...], explore_every: int = 48, trial: int = 3,
                 warmup: int = 3):
        self.candidates = candidates
        self.explore_every, self.trial, self.warmup = explore_every, trial, warmup
        self.cost: dict[int, float | None] = {c: None for c in candidates}
        self.samples = {c: 0 for c in candidates}
        self.backoff = 1
        self.until_explore = explore_every
        self.trying: int | None = None
        self.trial_left = 0

    def best(self) -> int:
        return min(self.candidates, key=lambda c: self.cost[c])

    def pick(self) -> int:
        # warm-up: every count gets a few samples (a first call after a switch is often slow)
        untried = [c for c in self.candidates if self.samples[c] < self.warmup]
        if untried:
            return min(untried, key=lambda c: self.samples[c])
        if self.trial_left > 0:
            return self.trying
        self.until_explore -= 1
        if len(self.candidates) > 1 and self.until_explore <= 0:
            best = self.best()
            self.trying = next(c for c in self.candidates if c != best)
            self.trial_left = self.trial
            return self.trying
        return self.best()

    def record(self, threads: int, seconds: float, work: float) -> None:
        cost = seconds / max(work, 1.0)
        self.samples[threads] += 1
        old = self.cost[threads]
        self.cost[threads] = cost if old is None else 0.7 * old + 0.3 * cost
        if self.trial_left > 0 and threads == self.trying:
            self.trial_left -= 1
            if self.trial_left == 0:  # trial over: back off if it lost, else start afresh
                lost = self.best() != threads
                self.backoff = min(self.backoff * 2, self.MAX_BACKOFF) if lost else 1
                self.until_explore = self.explore_every * self.backoff
