"""GGUF fuzzing (issue 45): mutated tiny models must load and run, or fail with a GGUFError /
NonFiniteLogitsError that has a message; never another exception, a hang, or unbounded memory.

The cases run in one subprocess (gguf_fuzz_worker) whose address space is capped, so a runaway
allocation is a reported MemoryError rather than a machine out of memory. CI runs DEFAULT_CASES
(a few seconds); PYKERNEL_FUZZ_CASES=N runs more, PYKERNEL_SEED=S replays a run (the seed is
printed on failure, and each failing case is listed with its mutations).
"""
import json
import os
import resource
import subprocess
import sys

import numpy as np

from tests.fuzz.gguf_mutator import MUTATIONS, layout, mutate
from tests.llm.cli_helpers import REPO
from tests.llm.gguf_helpers import TINY, TINY_LLAMA, require, require_for_module
from tests.child_env import child_env

require_for_module(TINY_LLAMA)

DEFAULT_CASES = 1000
BASES = ("tiny-llama-f32.gguf", "tiny-llama-q8_0.gguf", "tiny-gpt2-f32.gguf",
         "tiny-qwen3-f32.gguf")
ADDRESS_SPACE_LIMIT = 3 << 30   # the tiny models need ~0.5 GiB; a runaway header wants far more
SHOWN_FAILURES = 5


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_LIMIT, ADDRESS_SPACE_LIMIT))


def _run_worker(seed: int, cases: int, workdir) -> tuple[list, dict, str]:
    bases = [str(require(TINY / name)) for name in BASES]
    env = child_env(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, "-m", "tests.fuzz.gguf_fuzz_worker", "--seed", str(seed),
         "--cases", str(cases), "--dir", str(workdir), *bases],
        capture_output=True, text=True, cwd=REPO, env=env, preexec_fn=_cap_memory,
        timeout=max(300, cases // 5))
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    failures = [line for line in lines if "case" in line]
    summary = next((line["summary"] for line in lines if "summary" in line), {})
    return failures, summary, out.stderr[-3000:]


def _report(seed: int, failures: list) -> str:
    shown = "\n\n".join(f"case {f['case']} ({f['base']}): {f['mutations']}\n{f['traceback']}"
                        for f in failures[:SHOWN_FAILURES])
    return (f"{len(failures)} fuzz cases broke the rules; replay with PYKERNEL_SEED={seed}\n"
            f"{shown}")


def test_mutated_gguf_files_load_or_fail_cleanly(tmp_path, seed):
    cases = int(os.environ.get("PYKERNEL_FUZZ_CASES", DEFAULT_CASES))
    failures, summary, stderr = _run_worker(seed, cases, tmp_path)
    assert summary, f"the fuzz worker died (PYKERNEL_SEED={seed}):\n{stderr}"
    assert not failures, _report(seed, failures)
    assert sum(summary.values()) == cases
    if cases >= 500:  # the mutator must not only break headers: some files load and run
        assert summary.get("ok", 0) > 0 and summary.get("NonFiniteLogitsError", 0) > 0, summary


def test_mutator_is_seeded_and_every_mutation_changes_the_file(seed):
    data = TINY_LLAMA.read_bytes()
    first = mutate(data, np.random.default_rng(seed))
    assert mutate(data, np.random.default_rng(seed)) == first
    lay = layout(data)
    assert lay.offsets and lay.scalars and lay.dims and lay.data_start <= len(data)
    rng = np.random.default_rng(seed)
    for name, mutation in MUTATIONS.items():
        for _ in range(5):  # a single draw may rewrite a field with its own value
            buf = bytearray(data)
            description = mutation(buf, lay, rng)
            if bytes(buf) != data:
                break
        assert bytes(buf) != data, f"{name} never changed the file ({description}, seed {seed})"
