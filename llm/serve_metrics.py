"""Where a batch scheduler's worker spends its time, and what it ran: the counters behind
`pykernel serve`'s GET /metrics (Prometheus text format, as llama.cpp's server offers with
--metrics) and behind benchmarks/serve_load.py's breakdown.

Input: the worker's calls (`add`, `timed(phase)`) and a callable giving the gauges. Output:
`snapshot()` (a dict of numbers, the per-batch-size tables as dicts) and
`prometheus_text(snapshot)`. The worker is one thread
and readers (HTTP handlers) others, so updates and snapshots take a lock; an update is a few
additions per step, nothing that waits on the GPU.

Worker time is split by what it was doing (seconds, summed over the server's life):
    prompt   prefills of admitted requests (to the first token's logits on the host)
    decode   decode steps: the forward pass of the batch and its logits to the host
    sample   sampling each row, detokenizing, handing text to the request's consumer
    slots    moving caches between slots (a finished request's slot refilled)
    idle     waiting for requests
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager

PHASES = ("prompt", "decode", "sample", "slots", "idle")

# (name, type, help) of the scalar metrics, in the order /metrics prints them
SCALARS = (
    ("requests_total", "counter", "Requests admitted into a slot."),
    ("requests_finished_total", "counter", "Requests that ended (done, failed or cancelled)."),
    ("requests_failed_total", "counter",
     "Requests whose generation raised (each ended alone, with an error)."),
    ("requests_running", "gauge", "Requests holding a slot now."),
    ("requests_waiting", "gauge", "Requests queued for a free slot now."),
    ("prompt_tokens_total", "counter", "Prompt tokens run through the model (after reuse)."),
    ("prompt_passes_total", "counter",
     "Prompt prefills (one for the prompts admitted together)."),
    ("prompt_pass_decode_rows_total", "counter",
     "Running requests' tokens stepped inside prompt passes."),
    ("tokens_generated_total", "counter", "Tokens sampled."),
    ("decode_steps_total", "counter", "Decode steps (one forward pass of every running slot)."),
    ("decode_rows_total", "counter", "Sequences stepped, summed over decode steps."),
) + tuple((f"{p}_seconds_total", "counter", f"Worker seconds spent: {p}.") for p in PHASES)


class ServeMetrics:
    def __init__(self, gauges=lambda: {}):
        """gauges: a callable giving the gauges' values now (read from the scheduler's own
        state at each snapshot, not tracked here)."""
        self._lock = threading.Lock()
        self._gauges = gauges
        self._values = {name: 0 for name, kind, _ in SCALARS if kind == "counter"}
        self._steps_by_batch: dict[int, list] = {}      # batch size -> [steps, seconds]

    @contextmanager
    def timed(self, phase: str, batch: int = 0):
        """Add the block's wall time to phase's seconds (and, for a decode step of `batch`
        rows, to that batch size's row of the table)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            seconds = time.perf_counter() - t0
            with self._lock:
                self._values[f"{phase}_seconds_total"] += seconds
                if batch:
                    row = self._steps_by_batch.setdefault(batch, [0, 0.0])
                    row[0] += 1
                    row[1] += seconds
                    self._values["decode_steps_total"] += 1
                    self._values["decode_rows_total"] += batch

    def add(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self._values[name] += amount

    def snapshot(self) -> dict:
        """Every scalar, plus "steps_by_batch": {batch size: (steps, seconds)}."""
        with self._lock:
            out = dict(self._values)
            out["steps_by_batch"] = {b: tuple(r) for b, r in sorted(self._steps_by_batch.items())}
        out.update(self._gauges())
        return out


def difference(after: dict, before: dict) -> dict:
    """What happened between two snapshots (gauges: their value after)."""
    out = {name: after[name] - (0 if kind == "gauge" else before[name])
           for name, kind, _ in SCALARS}
    steps = {}
    for b, (n, s) in after["steps_by_batch"].items():
        n0, s0 = before["steps_by_batch"].get(b, (0, 0.0))
        if n > n0:
            steps[b] = (n - n0, s - s0)
    out["steps_by_batch"] = steps
    return out


def prometheus_text(snapshot: dict, prefix: str = "pykernel:") -> str:
    """The snapshot in Prometheus' text exposition format (version 0.0.4)."""
    lines = []
    for name, kind, help_text in SCALARS:
        lines += [f"# HELP {prefix}{name} {help_text}", f"# TYPE {prefix}{name} {kind}",
                  f"{prefix}{name} {_number(snapshot[name])}"]
    for name, column, help_text in (
            ("decode_steps_by_batch", 0, "Decode steps of each batch size."),
            ("decode_seconds_by_batch", 1, "Worker seconds in decode steps of each batch size.")):
        lines += [f"# HELP {prefix}{name} {help_text}", f"# TYPE {prefix}{name} counter"]
        lines += [f'{prefix}{name}{{batch="{b}"}} {_number(row[column])}'
                  for b, row in snapshot["steps_by_batch"].items()]
    return "\n".join(lines) + "\n"


def _number(value) -> str:
    return str(value) if isinstance(value, int) else f"{value:.6f}"
