"""GPU checks and benchmarks of the LLM runner's kernels backend (issue 8), run on the device.

Input: argv = which parts to run ("tiny", or "bench:SHAPE:TYPE" items). Output on stdout: the
tiny models' relative L2 errors on cuda vs llama.cpp (golden/tiny) and decode-vs-prefill, then
for each synthetic model `pykernel bench` tables (synth files written to $SYNTH_DIR or /tmp).
"""
import json
import os
import sys
import time
import traceback
from pathlib import Path

import numpy as np

import llm

TINY = Path(os.environ.get("TINY_DIR", str(Path(__file__).resolve().parents[1] / "tests" / "data" / "golden" / "tiny")))


def rel_l2(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def tiny_checks():
    cases = json.loads((TINY / "tiny-logits.json").read_text())
    for name, texts in cases.items():
        for activations in ("q8_1", "f32"):
            model = llm.load(TINY / name, device="cuda", n_ctx=64, progress=False,
                             activations=activations, kv_dtype=np.float32)
            errs = [rel_l2(model.logits(c["tokens"]), np.asarray(c["logits"], np.float32))
                    for c in texts]
            ids = texts[1]["tokens"]
            full = model.logits(ids)
            s = model.session()
            s.reset()
            steps = [s.prefill(ids[:3])[0]] + [s.step(t) for t in ids[3:]]
            print(f"tiny {name} {activations}: max rel L2 vs llama.cpp {max(errs):.2e}, "
                  f"graph decode vs prefill {rel_l2(np.stack(steps), full[2:]):.2e}", flush=True)


def bench_one(shape, qtype, p=512, n=128, r=3):
    from llm.bench import bench
    from llm.synth import write_synthetic
    path = Path(os.environ.get("SYNTH_DIR", "/tmp")) / f"{shape}-{qtype}.gguf"
    t0 = time.perf_counter()
    if not path.exists():
        write_synthetic(shape, qtype, path)
    print(f"synth {path.name}: {path.stat().st_size / 2**30:.2f} GiB "
          f"({time.perf_counter() - t0:.1f} s)", flush=True)
    t0 = time.perf_counter()
    print(bench(path, p=p, n=n, r=r, device="cuda"), flush=True)
    print(f"(bench wall {time.perf_counter() - t0:.1f} s)", flush=True)


def main(argv):
    for item in argv:
        try:
            if item == "tiny":
                tiny_checks()
            else:
                _, shape, qtype = item.split(":")
                bench_one(shape, qtype)
        except Exception:
            traceback.print_exc()
            sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
