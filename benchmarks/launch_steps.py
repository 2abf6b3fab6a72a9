"""Where a plain launch's host time goes, statement by statement, without a GPU.

Input: none (compiles one 4-argument kernel, `out = x + y` over n = 128, for sm_90 with LLVM; no
driver). Output: a table of nanoseconds per top-level statement of the launcher's generated
function (`kernel[grid, block]`'s fast path: mode guard, argument unpack, one check per
argument, parameter-buffer pool, pack, driver call), one column per argument kind:
- pykernel Arrays;
- torch tensors: CPU tensors on a mocked CUDA device whose ordinal is -1 (torch's
  `get_device()` of a host tensor), so they take the CUDA launcher's inline torch branch: the
  same C attribute reads (`dtype`, `get_device()`, `is_contiguous()`, `data_ptr()`) as CUDA
  tensors; skipped without torch;
- objects exposing only `__cuda_array_interface__` (the converter's path, a dict per call).

Measured by ablation: the function is compiled again cut after each top-level statement
(`return` appended, and the pool buffer handed back where the cut falls between taking and
giving it), every cut is timed in interleaved rounds through a functools.partial (as the
Launcher calls it), and a statement's cost is the difference between its cut and the one
before. The first row is the call itself (partial -> function, arguments bound). The driver
call is cuLaunchKernel replaced by a function returning (0,): its real cost, cuda.bindings'
argument conversion plus the driver, is the raw floor that `launch_host_cost.py --gpu`
measures.

With `--gpu` (the lead's H200 run): the same table on the real device, the driver call real,
torch CUDA tensors instead of the host stand-in, each batch of 200 calls followed by an
untimed synchronize.

    python3 benchmarks/launch_steps.py [--rounds 40] [--gpu]
"""
from __future__ import annotations

import argparse
import functools
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pykernel as pk  # noqa: E402
from benchmarks.launch_host_cost import (  # noqa: E402
    CudaArrayInterfaceObject,
    N,
    add4,
    device_arrays,
    mock_cuda_device,
)
from pykernel.runtime.device import set_device  # noqa: E402

BATCH, GPU_BATCH = 2000, 200         # calls per timed batch (on a GPU: below its queue)


def statements(source: str) -> tuple[str, list[list[str]]]:
    """(the `def` line, the body's top-level statements, each a list of lines: a compound
    statement keeps its elif / else / except clauses)."""
    header, *body = source.split("\n")
    groups: list[list[str]] = []
    for line in body:
        top = line.startswith("    ") and not line.startswith("     ")
        clause = line.strip().startswith(("elif ", "else:", "except", "finally:"))
        if top and not clause:
            groups.append([line])
        else:
            groups[-1].append(line)
    return header, groups


def cut_after(function, count: int):
    """`function` compiled again with only its first `count` statements, in its own globals."""
    header, groups = statements(function.source)
    kept = [line for group in groups[:count] for line in group]
    taken = any("take()" in line for line in kept)
    given = "    give(slot)" in kept        # at the top level, not the failed pack's own
    tail = ["    give(slot)"] if taken and not given else []
    text = "\n".join([header.replace("def launch(", "def cut("), *kept, *tail, "    return"])
    namespace: dict = {}
    exec(compile(text, "<cut>", "exec"), function.__globals__, namespace)
    return functools.partial(namespace["cut"])


def label(group: list[str], gpu: bool) -> str:
    text = group[0].strip()
    if "take()" in "".join(group):
        return "pool: take a parameter buffer (and give it back)"
    if text.startswith("err, ="):
        return "driver call (cuLaunchKernel)" if gpu else "driver call (mocked: returns (0,))"
    return text if len(text) <= 60 else text[:57] + "..."


def step_costs(launcher, args, rounds: int, synchronize=None):
    """(labels, ns per statement, ns of the whole launcher call) for `launcher(*args)`;
    `synchronize` (untimed, after each batch): the real device's, so its queue never fills."""
    function = launcher.func
    _, groups = statements(function.source)
    cuts = [cut_after(function, k) for k in range(len(groups) + 1)]
    best = [float("inf")] * (len(cuts) + 1)
    timed = cuts + [launcher]
    batch = BATCH if synchronize is None else GPU_BATCH
    for _ in range(rounds):
        for index, call in enumerate(timed):
            start = time.perf_counter()
            for _ in range(batch):
                call(*args)
            best[index] = min(best[index], (time.perf_counter() - start) / batch * 1e9)
            if synchronize is not None:
                synchronize()
    costs = [best[0]] + [best[k] - best[k - 1] for k in range(1, len(cuts))]
    labels = ["call: partial -> launch(...), arguments bound"] + \
        [label(g, synchronize is not None) for g in groups]
    return labels, costs, best[-1]


def warm_launcher(device, args, block: int):
    """`add4[grid, block]` on `device`, called until its generated function is in place
    (kernels keep their launchers per configuration: a block size per kind keeps them apart)."""
    set_device(device)
    launcher = add4[-(-N // block), block]
    for _ in range(3):
        launcher(*args)
    assert launcher.func.__name__ == "launch", "the generated fast function is in place"
    return launcher


def kinds(gpu: bool) -> dict:
    """Argument kind -> (its device, launcher, arguments)."""
    device = set_device("cuda") if gpu else mock_cuda_device()
    x, y, out = device_arrays(device)
    found = {"pk Array": (device, warm_launcher(device, (x, y, out, N), 128), (x, y, out, N))}
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and not gpu:
        host = mock_cuda_device(ordinal=-1)
        tensors = tuple(torch.zeros(N, dtype=torch.float32) for _ in range(3))
        found["torch tensor"] = (host, warm_launcher(host, (*tensors, N), 64), (*tensors, N))
    elif torch is not None and torch.cuda.is_available():
        tensors = tuple(torch.zeros(N, device="cuda") for _ in range(3))
        found["torch CUDA tensor"] = (device, warm_launcher(device, (*tensors, N), 64),
                                      (*tensors, N))
    objects = tuple(CudaArrayInterfaceObject(a.ptr, N) for a in (x, y, out))
    found["__cuda_array_interface__"] = (device, warm_launcher(device, (*objects, N), 32),
                                         (*objects, N))
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40, help="interleaved timing rounds")
    parser.add_argument("--gpu", action="store_true",
                        help="the real CUDA device: real driver calls, torch CUDA tensors")
    options = parser.parse_args()
    if options.gpu and not pk.runtime.device.gpu_available():
        sys.exit("launch_steps --gpu: no usable CUDA GPU")
    columns, labels, totals = {}, None, {}
    for kind, (device, launcher, args) in kinds(options.gpu).items():
        set_device(device)       # the launcher's guard sends other devices' calls elsewhere
        labels, columns[kind], totals[kind] = step_costs(
            launcher, args, options.rounds, device.synchronize if options.gpu else None)
    names = list(columns)
    print("| step (ns per launch) | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for row, text in enumerate(labels):
        cells = " | ".join(f"{columns[n][row]:.0f}" for n in names)
        print(f"| `{text}` | {cells} |")
    print("| sum of the steps | " + " | ".join(f"{sum(columns[n]):.0f}" for n in names) + " |")
    print("| the launcher's call, timed whole | " +
          " | ".join(f"{totals[n]:.0f}" for n in names) + " |")
    batch = GPU_BATCH if options.gpu else BATCH
    print(f"(numpy {np.__version__}; python {sys.version.split()[0]}; best of {options.rounds}"
          f" rounds of {batch} calls; differences of a few ns are noise)")


if __name__ == "__main__":
    main()
