"""Tensor-parallel speed: pp512 and tg128 of one synthetic file at tp = 1, 2, 4 (issue 42).

Input: argv = SHAPE:TYPE (llm.synth; default llama-8b:Q4_K_M) or a GGUF path; env SYNTH_DIR
(default /tmp), TP (default 1,2,4, cut to the GPUs present), P (default 512), N (default 128),
R (default 3), DEVICE (default cuda), RUN_TIMEOUT (seconds per run, default 270), WARM (1: a
short untimed run per tp first, which fills the kernel disk cache; bench itself already runs
each test once untimed in the measured process). Output: a header (GPUs, date, commit), each
run's `pykernel bench` table, then one row per tp: tokens/s and the speed-up over tp=1. Each
tp runs in a process group of its own (rank 0 of `pykernel bench --tp N`, which starts ranks
1..N-1), so no run keeps another's GPU memory, and a run past RUN_TIMEOUT (a hung collective)
is ended with all its ranks and reported, the next run still made. Unattended on a 2-GPU host
(the synthetic file is written first when missing): one call, exit code 1 if a run failed.
NCCL_NVLS_ENABLE=0 is set by the runner itself (llm/parallel/nccl_comm.py).

    python3 benchmarks/tp_decode.py llama-8b:Q4_K_M
    python3 benchmarks/tp_decode.py llama-70b:Q4_K_M      # ~40 GiB: tp 2 and 4 only fit
"""
import datetime
import os
import re
import signal
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


def run_group(cmd: list[str], timeout: float) -> subprocess.CompletedProcess | None:
    """cmd in a new process group (rank 0 and the ranks it starts); None, with the whole
    group killed, when it runs past timeout."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def bench(path, tp: int, device: str, prompt: str, gen: str, reps: str) -> dict | None:
    """{test: (mean, stdev)} of `pykernel bench --tp tp` (None: it failed); the table is
    echoed."""
    cmd = [sys.executable, "-m", "pykernel.cli", "bench", str(path), "--device", device,
           "--tp", str(tp), "-p", prompt, "-n", gen, "-r", reps]
    timeout = float(os.environ.get("RUN_TIMEOUT", "270"))
    done = run_group(cmd, timeout)
    if done is None:
        print(f"tp={tp}: no result after {timeout:.0f} s (ended with its ranks)", flush=True)
        return None
    print(done.stdout, flush=True)
    if done.returncode:
        print(f"tp={tp} failed:\n{done.stderr[-3000:]}", flush=True)
        return None
    return {m.group(1): (float(m.group(2)), float(m.group(3)))
            for m in ROW.finditer(done.stdout)}


def header(device: str) -> str:
    """Where and when: the GPUs, the UTC date, the commit (for RESULTS.md)."""
    try:
        gpus = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                              capture_output=True, text=True, check=False).stdout.split("\n")
    except FileNotFoundError:      # no driver tools on this machine
        gpus = []
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=False).stdout.strip()
    names = ", ".join(g.strip() for g in gpus if g.strip()) or device
    return (f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
            f"{names}, commit {commit or '?'}")


def main() -> int:
    path = model_file(sys.argv[1] if len(sys.argv) > 1 else "llama-8b:Q4_K_M")
    device = os.environ.get("DEVICE", "cuda")
    sizes = [int(t) for t in os.environ.get("TP", "1,2,4").split(",")]
    if device == "cuda":
        sizes = [t for t in sizes if t <= gpu_count()]
    print(header(device), flush=True)
    if os.environ.get("WARM", "0") not in ("", "0"):
        for tp in sizes:
            bench(path, tp, device, "32", "8", "1")
    results = {tp: bench(path, tp, device, os.environ.get("P", "512"),
                         os.environ.get("N", "128"), os.environ.get("R", "3")) for tp in sizes}
    base = results.get(1) or {}
    print("| file | tp | test | t/s | vs tp=1 |\n| --- | ---: | --- | ---: | ---: |")
    for tp, rows in results.items():
        if rows is None:
            print(f"| {path.name} | {tp} | - | failed | - |")
        for test, (mean, stdev) in (rows or {}).items():
            ratio = f"{mean / base[test][0]:.2f}x" if test in base else "-"
            print(f"| {path.name} | {tp} | {test} | {mean:.2f} ± {stdev:.2f} | {ratio} |")
    return 1 if any(rows is None for rows in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
