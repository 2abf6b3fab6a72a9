"""Tensor-parallel speed: pp512 and tg128 of one synthetic file at tp = 1, 2, 4 (issue 42).

Input: argv = SHAPE:TYPE (llm.synth; default llama-8b:Q4_K_M) or a GGUF path; env SYNTH_DIR
(default /tmp), TP (default 1,2,4, cut to the GPUs present), P (default 512), N (default 128),
R (default 3), DEVICE (default cuda). Output: each run's `pykernel bench` table, then one row
per tp: tokens/s and the speed-up over tp=1. Each tp runs in a process of its own (rank 0 of
`pykernel bench --tp N`, which starts ranks 1..N-1), so no run keeps another's GPU memory.
NCCL_NVLS_ENABLE=0 is set by the runner itself (llm/parallel/nccl_comm.py).

    python3 benchmarks/tp_decode.py llama-8b:Q4_K_M
    python3 benchmarks/tp_decode.py llama-70b:Q4_K_M      # ~40 GiB: tp 2 and 4 only fit
"""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from batched_decode import model_file

ROW = re.compile(r"\|\s*(pp\d+|tg\d+)\s*\|\s*([\d.]+) ± ([\d.]+)\s*\|")


def gpu_count() -> int:
    from cuda.bindings import driver
    (err,) = driver.cuInit(0)
    if err:
        return 0
    err, count = driver.cuDeviceGetCount()
    return 0 if err else count


def bench(path, tp: int, device: str) -> dict:
    """{test: (mean, stdev)} of `pykernel bench --tp tp`; the table is echoed."""
    cmd = [sys.executable, "-m", "pykernel.cli", "bench", str(path), "--device", device,
           "--tp", str(tp), "-p", os.environ.get("P", "512"), "-n", os.environ.get("N", "128"),
           "-r", os.environ.get("R", "3")]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    print(done.stdout, flush=True)
    if done.returncode:
        print(f"tp={tp} failed:\n{done.stderr[-3000:]}", flush=True)
        return {}
    return {m.group(1): (float(m.group(2)), float(m.group(3)))
            for m in ROW.finditer(done.stdout)}


def main() -> int:
    path = model_file(sys.argv[1] if len(sys.argv) > 1 else "llama-8b:Q4_K_M")
    device = os.environ.get("DEVICE", "cuda")
    sizes = [int(t) for t in os.environ.get("TP", "1,2,4").split(",")]
    if device == "cuda":
        sizes = [t for t in sizes if t <= gpu_count()]
    results = {tp: bench(path, tp, device) for tp in sizes}
    base = results.get(1, {})
    print("| file | tp | test | t/s | vs tp=1 |\n| --- | ---: | --- | ---: | ---: |")
    for tp, rows in results.items():
        for test, (mean, stdev) in rows.items():
            ratio = f"{mean / base[test][0]:.2f}x" if test in base else "-"
            print(f"| {path.name} | {tp} | {test} | {mean:.2f} ± {stdev:.2f} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
