"""`pykernel selftest`: run the runtime and kernel test suites on the current device (from a
source checkout) and print a short report: device name, arch, passed/failed/skipped."""
from __future__ import annotations

import os
import sys
from pathlib import Path


class _Counter:
    def __init__(self):
        self.counts = {"passed": 0, "failed": 0, "skipped": 0}
        self.failed = []

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            self.counts[report.outcome] = self.counts.get(report.outcome, 0) + 1
            if report.outcome == "failed":
                self.failed.append(report.nodeid)


def run_selftest(device: str | None, keyword: str | None) -> int:
    import pytest

    import pykernel as pk
    root = Path(__file__).resolve().parent.parent
    suites = [root / "tests" / "runtime", root / "tests" / "kernels"]
    if not suites[0].is_dir():
        print("pykernel selftest needs a source checkout (tests/ next to the package)",
              file=sys.stderr)
        return 2
    if device:
        os.environ["PYKERNEL_DEVICE"] = device
        pk.set_device(device)
    dev = pk.current_device()
    counter = _Counter()
    args = [str(s) for s in suites if s.is_dir()] + ["-q", "-p", "no:cacheprovider",
                                                       "-k", _device_filter(dev.kind, keyword)]
    pytest.main(args, plugins=[counter])
    c = counter.counts
    print(f"\npykernel selftest: device {dev.name} ({dev.kind}, {dev.arch}): "
          f"{c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped")
    for nodeid in counter.failed:
        print(f"  FAILED {nodeid}")
    return 1 if c["failed"] else 0


def _device_filter(kind: str, keyword: str | None) -> str:
    # Tests parametrized over devices carry [cpu] / [cuda] ids: run the current device's.
    other = "cpu" if kind == "cuda" else "cuda"
    base = f"not {other}"
    return f"({base}) and ({keyword})" if keyword else base
