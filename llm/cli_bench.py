"""`pykernel bench` and `pykernel synth` subcommands (registered by pykernel.cli through
`register(subparsers)`)."""
from __future__ import annotations

import argparse
import sys
import time

from llm.backends.base import KV_CACHE_TYPES as CACHE_TYPES

CACHE_HELP = ("KV cache element type (K and V; llama.cpp's --cache-type-k/-v): f16 (default on "
              "cuda), f32 (default on cpu), q8_0 (half of f16's memory)")

TP_HELP = ("tensor-parallel ranks: split the model's heads, FFN and vocabulary over N GPUs (one "
           "process each, this one rank 0), or N threads of this process on the cpu (default 1)")


def int_list(text: str) -> list[int]:
    """"512" or "0,4096" -> [512] / [0, 4096] (llama-bench's list syntax); non-negative."""
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, got "
                                         f"{text!r}") from None
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected values >= 0, got {text!r}")
    return values


def cmd_bench(args) -> int:
    from llm.bench import bench
    device = args.device
    if device is None:
        import pykernel as pk
        device = "cuda" if pk.gpu_available() else "cpu"
    options = {"graphs": False} if args.no_graphs else {}
    if args.cache_type:
        options["kv_dtype"] = args.cache_type
    if args.tp != 1:
        options["tp"] = args.tp
    print(bench(args.model, p=args.p, n=args.n, r=args.r, device=device, backend=args.backend,
                depth=args.depth, **options))
    return 0


def cmd_synth(args) -> int:
    from llm.synth import write_synthetic
    t0 = time.perf_counter()
    path = write_synthetic(args.shape, args.type, args.output, seed=args.seed)
    size = path.stat().st_size
    print(f"wrote {path} ({size / 2**30:.2f} GiB) in {time.perf_counter() - t0:.1f} s",
          file=sys.stderr)
    return 0


def register(sub) -> None:
    """Add bench and synth to the `pykernel` subparsers."""
    from llm.synth import FILE_TYPES, SHAPES
    bench = sub.add_parser("bench", help="prompt and decode tokens/s of a model (llama-bench "
                                         "style markdown table)")
    bench.add_argument("model", help="GGUF path or model name")
    bench.add_argument("-p", type=int_list, default=[512],
                       help="prompt tokens, comma-separated list (default 512; 0 skips)")
    bench.add_argument("-n", type=int_list, default=[128],
                       help="generated tokens, comma-separated list (default 128; 0 skips)")
    bench.add_argument("-r", type=int, default=3, help="repetitions (default 3)")
    bench.add_argument("-d", "--depth", type=int_list, default=[0],
                       help="tokens already in the KV cache when each test starts, comma-"
                            "separated list (llama-bench -d; default 0)")
    bench.add_argument("--device", choices=("cpu", "cuda"), default=None,
                       help="default: cuda when a GPU is present")
    bench.add_argument("--backend", choices=("numpy", "kernels"), default=None)
    bench.add_argument("--cache-type", choices=CACHE_TYPES, default=None, help=CACHE_HELP)
    bench.add_argument("--tp", type=int, default=1, help=TP_HELP)
    bench.add_argument("--no-graphs", action="store_true",
                       help="kernels backend: launch decode steps one kernel at a time")
    bench.set_defaults(func=cmd_bench)

    synth = sub.add_parser("synth", help="write a synthetic GGUF model of a real shape "
                                         "(random weights in a real quantization layout)")
    synth.add_argument("--shape", required=True, choices=sorted(SHAPES))
    synth.add_argument("--type", required=True, choices=sorted(FILE_TYPES))
    synth.add_argument("-o", "--output", required=True, help="output .gguf path")
    synth.add_argument("--seed", type=int, default=0)
    synth.set_defaults(func=cmd_synth)
