"""Compiler commands of the `pykernel` CLI: build, ptx, ir, check, selftest."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile

from .targets import SUPPORTED_ARCHS


def register(sub) -> None:
    p = sub.add_parser("build", help="compile a file's kernels to .ptx + manifest.json + kernels.h")
    p.add_argument("file")
    p.add_argument("--arch", action="append", help="target arch (repeatable; default sm_90)")
    p.add_argument("-o", "--out", default="build/ptx", help="output folder")
    p.add_argument("--const", action="append", default=[], metavar="NAME=VALUE",
                   help="compile-time value (repeat a NAME for several specializations)")
    p.set_defaults(func=cmd_build)
    for name, what in (("ptx", "PTX"), ("ir", "LLVM IR")):
        p = sub.add_parser(name, help=f"print a kernel's {what}: FILE.py::kernel")
        p.add_argument("target", metavar="FILE.py::kernel")
        p.add_argument("--arch", default="sm_90")
        p.add_argument("--const", action="append", default=[], metavar="NAME=VALUE")
        p.set_defaults(func=cmd_show, what=name)
    p = sub.add_parser("check", help="compile every kernel for every arch; ptxas resource report")
    p.add_argument("file")
    p.add_argument("--const", action="append", default=[], metavar="NAME=VALUE")
    p.set_defaults(func=cmd_check)
    p = sub.add_parser("selftest", help="run the runtime and kernel tests on the current device")
    p.add_argument("--device", default=None, help="cpu or cuda (default: current device)")
    p.add_argument("-k", default=None, help="pytest -k expression")
    p.set_defaults(func=cmd_selftest)


def _report_source_error(exc) -> int:
    print(exc, file=sys.stderr)
    return 1


def cmd_build(args) -> int:
    from . import aot
    from .errors import KernelSourceError
    try:
        manifest = aot.build(args.file, args.arch or ["sm_90"], args.out, args.const)
    except KernelSourceError as exc:
        return _report_source_error(exc)
    except (ValueError, FileNotFoundError) as exc:
        print(f"pykernel build: {exc}", file=sys.stderr)
        return 2
    for e in manifest["kernels"]:
        print(f"{e['ptx']}: {e['entry']} ({len(e['params'])} params, "
              f"{e['shared_bytes']} B shared)")
    for s in manifest["skipped"]:
        print(f"skipped: {s}", file=sys.stderr)
    print(f"wrote {len(manifest['kernels'])} PTX files, manifest.json, kernels.h to {args.out}")
    return 0


def _one_kernel(target: str):
    from . import aot
    path, sep, name = target.partition("::")
    kernels = aot.load_kernels(path)
    if not sep:
        if len(kernels) != 1:
            raise ValueError(f"{path} has kernels {sorted(kernels)}: say FILE.py::name")
        return next(iter(kernels.values()))
    if name not in kernels:
        raise ValueError(f"{path} has no kernel '{name}' (kernels: {sorted(kernels)})")
    return kernels[name]


def cmd_show(args) -> int:
    from . import aot
    from .errors import KernelSourceError
    try:
        kernel = _one_kernel(args.target)
        spec = {k: v[0] for k, v in aot.parse_consts(args.const).items()}
        text = (kernel.ptx(args.arch, **spec) if args.what == "ptx"
                else kernel.llvm_ir(args.arch, **spec))
    except KernelSourceError as exc:
        return _report_source_error(exc)
    except (ValueError, TypeError, FileNotFoundError) as exc:
        print(f"pykernel {args.what}: {exc}", file=sys.stderr)
        return 2
    print(text)
    return 0


PTXAS_USAGE = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")


def cmd_check(args) -> int:
    from . import aot
    from .errors import KernelSourceError
    try:
        kernels = aot.load_kernels(args.file)
        consts = aot.parse_consts(args.const)
    except KernelSourceError as exc:      # e.g. a parameter without an annotation
        return _report_source_error(exc)
    except (ValueError, FileNotFoundError) as exc:
        print(f"pykernel check: {exc}", file=sys.stderr)
        return 2
    ptxas = shutil.which("ptxas")
    if not ptxas:
        print("ptxas not found on PATH: compiling only (no register/spill report)")
    failures = 0
    print(f"{'kernel':32} {'arch':7} {'regs':>5} {'spill B':>8} {'smem B':>7}  status")
    for name, kernel in sorted(kernels.items()):
        try:
            specs = aot.specializations(kernel, consts)
        except ValueError as exc:
            print(f"{name:32} skipped: {exc}")
            continue
        for spec in specs:
            for arch in SUPPORTED_ARCHS:
                try:
                    c = kernel.compile(arch, **spec)
                except KernelSourceError as exc:
                    if type(exc).__name__ == "UnsupportedArchError":
                        print(f"{name:32} {arch:7} {'':>5} {'':>8} {'':>7}  n/a: {exc.message}")
                        continue
                    failures += 1
                    print(exc)
                    continue
                failures += _ptxas_row(c, arch, ptxas)
    return 1 if failures else 0


def _ptxas_row(c, arch, ptxas) -> int:
    if not ptxas:
        print(f"{c.entry:32} {arch:7} {'-':>5} {'-':>8} {c.shared_bytes:7}  compiled")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(c.ptx)
        proc = subprocess.run([ptxas, f"-arch={arch}", "-v", src, "-o",
                               os.path.join(tmp, "k.cubin")], capture_output=True, text=True)
    if proc.returncode:
        print(f"{c.entry:32} {arch:7} ptxas FAILED:\n{proc.stderr}")
        return 1
    regs = re.search(r"Used (\d+) registers", proc.stderr)
    spill = re.search(r"(\d+) bytes spill stores", proc.stderr)
    smem = re.search(r"(\d+) bytes smem", proc.stderr)
    print(f"{c.entry:32} {arch:7} {regs.group(1) if regs else '?':>5} "
          f"{spill.group(1) if spill else '0':>8} {smem.group(1) if smem else '0':>7}  ok")
    return 0


def cmd_selftest(args) -> int:
    from .selftest import run_selftest
    return run_selftest(args.device, args.k)
