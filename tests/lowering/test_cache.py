"""Compile cache: in memory, on disk across processes, keys that follow every dependency,
atomic writes, and corrupt entries recompiled rather than trusted."""
import os
import subprocess
import sys
import textwrap

import pytest

SOURCE = textwrap.dedent('''
    import numpy as np
    import pykernel as pk
    from pykernel import Ptr, f16, f32, i32
    SCALE = {scale}
    OFFSET = np.float32({offset})
    ACC = {acc}

    class Tile:
        EXTRA = {extra}

    @pk.func
    def helper(x: f32) -> f32:
        return x * {factor}

    @pk.kernel
    def k(out: Ptr[f32], n: {ntype}):
        out[0] = helper(f32(SCALE)) + f32(ACC(OFFSET)) + f32(Tile.EXTRA)
''')

PROBE = textwrap.dedent('''
    import sys, time
    sys.path.insert(0, {d!r})
    import kmod
    from pykernel import cache
    t = time.perf_counter()
    c = kmod.k.compile({arch!r})
    print(c.cache_key, "{{:.1f}}".format((time.perf_counter() - t) * 1e3))
    print("LOWERED" if "pykernel.compiler" in sys.modules else "FROMDISK")
    if {arch!r} == "cpu":   # the object code loaded from disk must run
        import numpy as np, pykernel as pk
        pk.set_device("cpu")
        out = pk.zeros(1, np.float32)
        kmod.k[1, 1](out, 1)
        print(float(out.numpy()[0]))
''')


def compile_in_new_process(tmp_path, cache_dir, scale=2.0, factor=3.0, arch="sm_90",
                           ntype="i32", offset=0.5, acc="f32", extra=1):
    (tmp_path / "kmod.py").write_text(SOURCE.format(scale=scale, factor=factor, ntype=ntype,
                                                    offset=offset, acc=acc, extra=extra))
    env = dict(os.environ, PYKERNEL_CACHE_DIR=str(cache_dir))
    out = subprocess.run([sys.executable, "-c", PROBE.format(d=str(tmp_path), arch=arch)],
                         env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split("\n")
    if arch == "cpu":
        assert float(lines[2]) == scale * factor + offset + extra, out.stdout
    return lines[0].split()[0], lines[1]


@pytest.mark.parametrize("arch", ["sm_90", "cpu"])
def test_disk_cache_across_processes(tmp_path, arch):
    """PTX, and the CPU target's native object code (the second process skips LLVM)."""
    cache_dir = tmp_path / "cache"
    key1, how1 = compile_in_new_process(tmp_path, cache_dir, arch=arch)
    key2, how2 = compile_in_new_process(tmp_path, cache_dir, arch=arch)
    assert key1 == key2 and how1 == "LOWERED" and how2 == "FROMDISK"


@pytest.mark.parametrize("change", [{"scale": 5.0}, {"factor": 4.0}, {"ntype": "f32"},
                                    {"ntype": 'Ptr[f32, "ro"]'}, {"offset": 0.25},
                                    {"acc": "f16"}, {"extra": 2}])
def test_key_follows_globals_device_functions_and_annotations(tmp_path, change):
    """Annotations live on the function, not in its code object: a parameter's type or "ro"
    changes the code, so it must change the key; so must a numpy scalar global, a type alias
    and a class attribute (they once did not, and stale code was reused)."""
    cache_dir = tmp_path / "cache"
    key1, _ = compile_in_new_process(tmp_path, cache_dir)
    key2, how = compile_in_new_process(tmp_path, cache_dir, **change)
    assert key1 != key2 and how == "LOWERED"


@pytest.mark.parametrize("arch, suffix", [("sm_90", "ptxcache"), ("cpu", "cpucache")])
def test_corrupt_entry_is_recompiled(tmp_path, arch, suffix):
    cache_dir = tmp_path / "cache"
    key, _ = compile_in_new_process(tmp_path, cache_dir, arch=arch)
    entry = cache_dir / f"{key}.{suffix}"
    data = entry.read_bytes()
    entry.write_bytes(data[:-40] + b"garbage" * 3)     # body no longer matches its checksum
    key2, how = compile_in_new_process(tmp_path, cache_dir, arch=arch)
    assert key2 == key and how == "LOWERED"
    assert not list(cache_dir.glob(".tmp-*"))          # atomic writes leave no temp files


TWO_KERNELS = textwrap.dedent('''
    import gc
    import numpy as np
    import pykernel as pk
    from pykernel import Ptr, f32

    @pk.kernel
    def first(out: Ptr[f32]):
        out[pk.thread_idx.x] = 1.0

    @pk.kernel
    def second(out: Ptr[f32]):
        pk.syncthreads()
        out[pk.thread_idx.x] = 2.0

    first.llvm_ir("cpu")          # compiled (or loaded) and dropped: its engine is freed
    gc.collect()
    pk.set_device("cpu")
    out = pk.zeros(4, np.float32)
    second[1, 4](out)             # the second process loads this one from disk
    print(out.numpy().tolist())
''')


def test_cpu_objects_load_after_another_kernel_was_dropped(tmp_path):
    """Each loaded CPU object gets its own target machine: an execution engine frees the one
    it was given, and a shared one crashed the next load from disk ("Target does not support
    MC emission")."""
    env = dict(os.environ, PYKERNEL_CACHE_DIR=str(tmp_path / "cache"))
    (tmp_path / "two_kernels.py").write_text(TWO_KERNELS)      # kernels need a source file
    for _ in range(2):
        out = subprocess.run([sys.executable, str(tmp_path / "two_kernels.py")], env=env,
                             capture_output=True, text=True)
        assert out.returncode == 0 and out.stdout.strip() == "[2.0, 2.0, 2.0, 2.0]", out.stderr


BAD_HEADERS = {
    "null": lambda meta: None,
    "list": lambda meta: [meta],
    "number": lambda meta: 3,
    "string": lambda meta: "header",
    "missing-key": lambda meta: {k: v for k, v in meta.items() if k != "entry"},
    "extra-key": lambda meta: dict(meta, surprise=1),
    "wrong-type": lambda meta: dict(meta, shared_bytes="0"),
    "bad-param": lambda meta: dict(meta, params=[None]),
    "bad-site": lambda meta: dict(meta, sites=[{"kind": 1}]),
}


@pytest.mark.parametrize("arch, suffix", [("sm_90", "ptxcache"), ("cpu", "cpucache")])
def test_malformed_header_is_a_miss_and_overwritten(tmp_path, monkeypatch, arch, suffix):
    """A header that is JSON but not the header (issue 45, item 8) made every later compile
    fail with AttributeError until the file was deleted: now a miss, recompiled, rewritten."""
    import json

    import pykernel as pk
    from pykernel import Ptr, f32, cache
    monkeypatch.setenv("PYKERNEL_CACHE_DIR", str(tmp_path))

    @pk.kernel
    def cached(out: Ptr[f32]):
        out[0] = 2.0
    key = cached.compile(arch).cache_key
    entry = tmp_path / f"{key}.{suffix}"
    head, body = entry.read_bytes().split(b"\n", 1)
    meta = json.loads(head)
    for name, corrupt in BAD_HEADERS.items():
        entry.write_bytes(json.dumps(corrupt(meta)).encode() + b"\n" + body)
        cache._MEMORY.pop(key, None)
        assert cache.lookup(key, arch) is None, name
        compiled = cached.compile(arch)
        assert compiled.cache_key == key and compiled.entry == meta["entry"], name
        assert json.loads(entry.read_bytes().split(b"\n", 1)[0]) == meta, name
        cache._MEMORY.pop(key, None)
        assert cache.lookup(key, arch) is not None, name    # the rewritten entry loads
