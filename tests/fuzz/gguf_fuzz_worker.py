"""Runs GGUF fuzz cases in a process of its own: (seed, case count, base files) -> one JSON line
per case that broke the rules, then a summary line.

    python -m tests.fuzz.gguf_fuzz_worker --seed S --cases N --dir TMP BASE.gguf...

Case i mutates base file i % len(bases) with `np.random.default_rng([seed, i])` (so any one case
replays alone), then reads it with `GGUFFile` and the tokenizer's `MetadataReader`, loads it
with `llm.load` (numpy backend, CPU) and, when that works, generates two tokens greedily and two
sampled. The rules: everything works, or a `GGUFError` / `NonFiniteLogitsError` (or a
`ContextError`) with a non-empty message comes out. Any other exception, an empty message, or
a case running past CASE_SECONDS (a hang) is reported. The parent test caps this process's
address space, so a header that makes the loader allocate without bound fails as a MemoryError
here instead of exhausting the machine.
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import traceback
import warnings
from pathlib import Path

import numpy as np

import llm
from llm.generate import ContextError
from llm.gguf_file import GGUFError, GGUFFile
from llm.gguf_reader_view import MetadataReader
from llm.sampling import NonFiniteLogitsError
from tests.fuzz.gguf_mutator import mutate

# ContextError: a file whose context_length is shorter than this harness's 32 tokens (a model
# limit the user is told about, as for a real model with a short context)
ALLOWED = (GGUFError, NonFiniteLogitsError, ContextError)
CASE_SECONDS = 20


class CaseTimeout(Exception):
    """A case ran past CASE_SECONDS (reported as a hang)."""


def _on_alarm(signum, frame):
    raise CaseTimeout(f"case ran past {CASE_SECONDS} s")


def exercise(path: Path) -> str:
    """The outcome of one file: 'ok' or the allowed exception's type name (others propagate)."""
    try:
        g = GGUFFile(path)
        MetadataReader(g)
        g.close()
        model = llm.load(path, device="cpu", backend="numpy", n_ctx=32, progress=False)
        "".join(model.generate("hi", max_tokens=2, temperature=0))
        "".join(model.generate("hi", max_tokens=2, temperature=0.8, seed=0))
    except ALLOWED as exc:
        if not str(exc).strip():
            raise AssertionError(f"{type(exc).__name__} with an empty message") from exc
        return type(exc).__name__
    return "ok"


def run(seed: int, cases: int, bases: list[Path], workdir: Path) -> dict:
    originals = [b.read_bytes() for b in bases]
    outcomes: dict[str, int] = {}
    signal.signal(signal.SIGALRM, _on_alarm)
    for i in range(cases):
        k = i % len(bases)
        data, mutations = mutate(originals[k], np.random.default_rng([seed, i]))
        path = workdir / f"case{i}-{bases[k].name}"
        path.write_bytes(data)
        signal.alarm(CASE_SECONDS)
        try:
            outcome = exercise(path)
        except BaseException as exc:  # everything else is what the fuzzer looks for
            if isinstance(exc, KeyboardInterrupt):
                raise
            outcome = "failure"
            print(json.dumps({"case": i, "base": bases[k].name, "mutations": mutations,
                              "error": f"{type(exc).__name__}: {exc}"[:2000],
                              "traceback": traceback.format_exc()[-3000:]}), flush=True)
        finally:
            signal.alarm(0)
            path.unlink(missing_ok=True)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    return outcomes


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--cases", type=int, required=True)
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("bases", type=Path, nargs="+")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")  # NaN payloads make numpy warn; the outcome is what counts
    outcomes = run(args.seed, args.cases, args.bases, args.dir)
    print(json.dumps({"summary": outcomes}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
