"""Where one persistent decode launch spends its time: the profiling build's per-item
globaltimer stamps (decode_take.py: TAKEN, READY, PREPPED, DONE; DecodeRunner(profile=True)
then runner.profile()) summed per item kind.

    rows, totals = profile_summary(runner.sched, runner.profile())
    print(format_profile(rows, totals))

Per stage name (decode_schedule's stage_names, in order of first appearance: embed, qkv_in,
qkv, attn, o_in, o, gate_up_in, gate_up, down, lm_head_in, lm_head; the *_in stages are the
QUANT items writing the next matrix's normed Q8_1 input, which exist only for quantized
matrices, o_in only where the attention's merge cannot write it (the GLU items write the down
projection's, so there is no down_in; with decode_schedule's fold_norm_blocks the normed ones
are the last embed / o / down item's work, in those rows); attn is the split attention
with the RoPE and the cache write fused in):
- critical: the launch's wall time attributed to the kind's stages: a stage's share is from
  the last item of the stage before finishing to its own last item finishing, so the shares
  add up to the launch (first ticket to last item done). This is the column to read first.
- item: mean READY -> DONE of one item (its work once its dependency is met), and within it
  prep: READY -> PREPPED (GEMV / GLU of F32 rows: the RMS of x; 0 otherwise).
- wait: mean TAKEN -> READY (a block holding a ticket whose stage before is not done yet).
- lag: mean READY minus the later of its TAKEN and the stage before's last DONE: how long
  after its item could start a block noticed (the acquire poll and its nanosleep backoff); a
  slightly negative mean only says the producers' DONE stamps (after their release) land
  after the consumer's acquire.
globaltimer ticks in steps of some ns on recent GPUs (totals['tick_ns'], the smallest step
seen): means over many items stay useful below it, single items do not.
"""
from __future__ import annotations

import numpy as np

from .decode_take import DONE, PREPPED, PROF_COLS, READY, TAKEN


def stage_kinds(sched) -> list[str]:
    """The profile's rows: the schedule's stage names, each once, in order."""
    return list(dict.fromkeys(sched.stage_names))


def profile_summary(sched, stamps: np.ndarray) -> tuple[dict, dict]:
    """(per-kind rows: items, critical_us, item_us, prep_us, wait_us, lag_us; totals:
    launch_us, wait_us (block time spent waiting, all items), tick_ns)."""
    stamps = np.asarray(stamps)
    if stamps.shape != (sched.n_items, PROF_COLS) or not stamps[:, DONE].all():
        raise ValueError(f"decode_profile: stamps must be ({sched.n_items}, {PROF_COLS}) from a "
                         f"profiled launch, got {stamps.shape}")
    t = stamps.astype(np.int64) - int(stamps[:, TAKEN].min())    # ns from the first ticket
    stage = sched.items[:, 0]
    names = sched.stage_names
    last_done = np.array([t[stage == s, DONE].max() for s in range(sched.n_stages)])
    before = np.concatenate([[0], last_done[:-1]])               # the stage before's end
    rows = {k: {"items": 0, "critical_us": 0.0, "item_us": 0.0, "prep_us": 0.0,
                "wait_us": 0.0, "lag_us": 0.0} for k in stage_kinds(sched)}
    for s, name in enumerate(names):
        mine = t[stage == s]
        row = rows[name]
        row["items"] += len(mine)
        row["critical_us"] += (last_done[s] - before[s]) / 1e3
        row["item_us"] += (mine[:, DONE] - mine[:, READY]).sum() / 1e3
        row["prep_us"] += (mine[:, PREPPED] - mine[:, READY]).sum() / 1e3
        row["wait_us"] += (mine[:, READY] - mine[:, TAKEN]).sum() / 1e3
        if s:
            since = np.maximum(mine[:, TAKEN], before[s])   # when the item could start
            row["lag_us"] += (mine[:, READY] - since).sum() / 1e3
    for row in rows.values():
        for key in ("item_us", "prep_us", "wait_us", "lag_us"):
            row[key] /= max(row["items"], 1)
    steps = np.diff(np.unique(t))
    totals = {"launch_us": last_done[-1] / 1e3,
              "wait_us": (t[:, READY] - t[:, TAKEN]).sum() / 1e3,
              "tick_ns": int(steps.min()) if steps.size else 0}
    return rows, totals


def format_profile(rows: dict, totals: dict) -> str:
    """A markdown table of profile_summary's rows and a line of its totals."""
    out = ["| stage | items | critical us (share) | item us | of it F32 norm us | "
           "wait us | lag us |", "|---|---|---|---|---|---|---|"]
    launch = max(totals["launch_us"], 1e-9)
    for name, r in rows.items():
        out.append(f"| {name} | {r['items']} | {r['critical_us']:.1f} "
                   f"({r['critical_us'] / launch:.0%}) | {r['item_us']:.2f} | "
                   f"{r['prep_us']:.2f} | {r['wait_us']:.2f} | {r['lag_us']:.2f} |")
    out.append(f"launch {totals['launch_us']:.1f} us (first ticket to last item); block time "
               f"waiting {totals['wait_us']:.0f} us; globaltimer step {totals['tick_ns']} ns")
    return "\n".join(out)
