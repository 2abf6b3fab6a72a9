"""A function that launches kernels -> the kernels it would compile, compiled in parallel.

A kernel compiles on one core in 0.1-2 s (Python lowering, then LLVM); a model's first decode
step needs 25-30 of them, one after another, while the other cores idle. `precompile(run)`
calls `run()` with launches recorded instead of made (so `run` must not read results back to
the host: graph-capturable code qualifies), then has worker processes (this module run by
`python -c`, one per core, PYKERNEL_COMPILE_WORKERS to change) compile the recorded
specializations into the disk cache (cache.py). The real launches afterwards find them
compiled. On a cuda device a thread of this process meanwhile loads each kernel compiled so
far into the driver and finishes its lazy loading (`CudaDevice.preload`: the PTX JIT, 0.1-0.8 s
a kernel, which would otherwise run in the kernel's first launch), one at a time: loading
from several threads was measured slower than one by one, and JIT-ing in the workers (each
with its own context) cost as much in context start-up as it saved. A kernel a worker cannot
import by module and name (defined
in `__main__` or inside a function), or whose Const values are not numbers, strings, pykernel
or numpy dtypes, is left to its launch, which compiles it as before: this only saves time.

Worker protocol: `{"ready": true}` once started, then per stdin line
`{"module", "name", "arch", "options", "spec"}` one stdout line `{"ok": bool, "error": str}`.
"""
from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict

import numpy as np

MAX_WORKERS = 16
MIN_WORKERS = 4     # fewer: each worker's start-up (imports) eats the gain (2 measured equal)
WAIT_S = 600.0      # a worker silent this long is abandoned (its kernels compile at launch)
_BOOT = "from pykernel.compile_pool import serve; serve()"


def worker_count(jobs: int) -> int:
    """Workers for `jobs` compiles: one per core (PYKERNEL_COMPILE_WORKERS overrides), none
    on machines of fewer than MIN_WORKERS cores."""
    setting = os.environ.get("PYKERNEL_COMPILE_WORKERS")
    cores = int(setting) if setting not in (None, "") else (os.cpu_count() or 1)
    if cores < MIN_WORKERS:
        return 0
    return min(jobs, cores, MAX_WORKERS)


RECORDING: list | None = None   # the launches recorded_launches() collects, else None


def record(kernel, arch: str, spec: dict, options) -> bool:
    """For launch paths (Launcher, stdlib's direct launch): True, with the launch recorded,
    while recorded_launches() is active; the caller must then not compile or launch."""
    if RECORDING is None:
        return False
    RECORDING.append((kernel, arch, spec, options or kernel.options))
    return True


@contextmanager
def recorded_launches():
    """Launches inside the block are not made: each appends (kernel, arch, spec, options) to
    the yielded list."""
    global RECORDING
    if RECORDING is not None:
        raise RuntimeError("recorded_launches: already recording")
    jobs = RECORDING = []
    try:
        yield jobs
    finally:
        RECORDING = None


def precompile(run, *args) -> dict:
    """run(*args) with launches recorded, then its kernels compiled (see module docstring).
    Returns counts and seconds, for benchmarks."""
    from . import cache
    start = time.perf_counter()
    with recorded_launches() as recorded:
        run(*args)
    unique = {}     # a step launches each kernel many times: hash each specialization once
    for kernel, arch, spec, options in recorded:
        unique.setdefault((id(kernel), arch, repr(spec), repr(options)),
                          (kernel, arch, spec, options))
    jobs = []
    for kernel, arch, spec, options in unique.values():
        key = cache.kernel_key(kernel, arch, kernel.spec_from_kwargs(spec), options)
        jobs.append((kernel, arch, spec, options, cache.lookup(key, arch) is None))
    remote = [job[:4] for job in jobs if job[4] and _encodable(job[0], job[2], job[3])]
    preloader = _Preloader.for_current_device()
    if preloader is not None:
        for job in jobs:
            if not job[4]:                         # compiled already: load while they compile
                preloader.submit(job[:4])
    try:
        in_workers = _compile_in_workers(
            remote, None if preloader is None else lambda i: preloader.submit(remote[i]))
    finally:
        if preloader is not None:
            preloader.finish()
    for kernel, arch, spec, options, _ in jobs:
        compile_like_launch(kernel, arch, options, spec)   # disk hits now, or compiled here
    return dict(kernels=len(jobs), compiled_in_workers=in_workers,
                seconds=time.perf_counter() - start)


def compile_like_launch(kernel, arch: str, options, spec: dict):
    """Compile as a launch on an `arch` device does: a kernel that uses an arch-specific
    instruction (wgmma, setmaxnreg) compiles for the "a" variant (sm_90a), so the recorded
    plain arch never fails where the launch would not."""
    from .launch import _compile_for_device
    return _compile_for_device(kernel, arch, options, spec)


def _encode(value):
    if isinstance(value, bool):
        return {"b": value}
    if isinstance(value, int):
        return {"i": value}
    if isinstance(value, float):
        return {"f": value}
    if isinstance(value, str):
        return {"s": value}
    if isinstance(value, np.dtype):                  # a type variable given as numpy's dtype
        return {"np": value.str}
    import pykernel
    name = getattr(value, "name", None)
    if isinstance(name, str) and getattr(pykernel, name, None) is value:
        return {"t": name}
    return None


def _decode(encoded: dict):
    (tag, value), = encoded.items()
    if tag == "t":
        import pykernel
        return getattr(pykernel, value)
    return np.dtype(value) if tag == "np" else value


def _encodable(kernel, spec: dict, options) -> bool:
    module = sys.modules.get(kernel.fn.__module__)
    if module is None or kernel.fn.__module__ == "__main__" or \
            getattr(module, kernel.name, None) is not kernel:
        return False
    return all(_encode(v) is not None for v in spec.values()) and \
        all(isinstance(v, (bool, int)) for v in asdict(options).values())


class _Preloader:
    """A thread that preloads (CudaDevice.preload) each submitted (kernel, arch, spec,
    options) whose PTX is in the cache, one at a time; failures are left to the launch, which
    loads again and reports them."""

    def __init__(self, device):
        self.device = device
        self.jobs: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    @classmethod
    def for_current_device(cls):
        from .runtime.device import current_device
        device = current_device()
        if not hasattr(device, "preload") or \
                os.environ.get("PYKERNEL_PRELOAD", "1") in ("", "0"):
            return None
        return cls(device)

    def submit(self, job):
        self.jobs.put(job)

    def finish(self):
        self.jobs.put(None)
        self.thread.join()

    def _run(self):
        while (job := self.jobs.get()) is not None:
            kernel, arch, spec, options = job
            try:
                self.device.preload(compile_like_launch(kernel, arch, options, spec))
            except Exception:
                pass


def _compile_in_workers(jobs: list, on_compiled=None) -> int:
    """Compiles jobs in worker processes, calling on_compiled(index) as each one succeeds;
    returns how many succeeded."""
    n = worker_count(len(jobs))
    if n < 2:       # one job: its launch compiles it as fast
        return 0
    pending = [json.dumps(dict(module=k.fn.__module__, name=k.name, arch=a, options=asdict(o),
                              spec={p: _encode(v) for p, v in s.items()})).encode() + b"\n"
              for k, a, s, o in jobs]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    workers = [subprocess.Popen([sys.executable, "-c", _BOOT], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
               for _ in range(n)]
    replies: queue.Queue = queue.Queue()     # (worker, line or None at its end), from threads
    for i, w in enumerate(workers):
        threading.Thread(target=_forward_lines, args=(i, w.stdout, replies), daemon=True).start()
    done, running = 0, n
    assigned: dict = {}                      # worker -> index of the job it was given last
    try:
        while running:
            try:
                i, line = replies.get(timeout=WAIT_S)
            except queue.Empty:
                break
            if line is None:                  # closed (or died: its job compiles at launch)
                running -= 1
                continue
            finished = assigned.pop(i, None) if json.loads(line).get("ok") else None
            worker = workers[i]
            if not worker.stdin.closed:
                try:
                    if pending:
                        assigned[i] = len(pending) - 1
                        worker.stdin.write(pending.pop())
                        worker.stdin.flush()
                    else:
                        worker.stdin.close()
                except OSError:   # it died: its end of file comes through `replies`
                    pass
            if finished is not None:          # after feeding the worker its next job
                done += 1
                if on_compiled is not None:
                    on_compiled(finished)
    finally:
        for w in workers:
            try:
                w.stdin.close()
            except OSError:
                pass
            try:
                w.wait(timeout=5)
            except subprocess.TimeoutExpired:
                w.kill()
                w.wait()
            w.stdout.close()
    return done


def _forward_lines(worker: int, stream, replies: queue.Queue):
    try:
        for line in stream:
            replies.put((worker, line))
    except (OSError, ValueError):
        pass
    replies.put((worker, None))


def serve():
    """The worker: compile each job into the disk cache until stdin closes."""
    import importlib

    from .lower.context import Options
    sys.stdout.write(json.dumps({"ready": True}) + "\n")
    sys.stdout.flush()
    for line in sys.stdin:
        job = json.loads(line)
        try:
            kernel = getattr(importlib.import_module(job["module"]), job["name"])
            compile_like_launch(kernel, job["arch"], Options(**job["options"]),
                                {p: _decode(v) for p, v in job["spec"].items()})
            reply = {"ok": True}
        except Exception as exc:   # reported to nobody: the launch compiles it and raises
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
