"""Compile cache: in memory, on disk across processes, keys that follow every dependency,
atomic writes, and corrupt entries recompiled rather than trusted."""
import os
import subprocess
import sys
import textwrap

import pytest

SOURCE = textwrap.dedent('''
    import pykernel as pk
    from pykernel import Ptr, f32
    SCALE = {scale}

    @pk.func
    def helper(x: f32) -> f32:
        return x * {factor}

    @pk.kernel
    def k(out: Ptr[f32]):
        out[0] = helper(f32(SCALE))
''')

PROBE = textwrap.dedent('''
    import sys, time
    sys.path.insert(0, {d!r})
    import kmod
    from pykernel import cache
    t = time.perf_counter()
    c = kmod.k.compile("sm_90")
    hit = {{"memory": False}}
    print(c.cache_key, "{{:.1f}}".format((time.perf_counter() - t) * 1e3))
    print("LOWERED" if "pykernel.compiler" in sys.modules else "FROMDISK")
''')


def compile_in_new_process(tmp_path, cache_dir, scale=2.0, factor=3.0):
    (tmp_path / "kmod.py").write_text(SOURCE.format(scale=scale, factor=factor))
    env = dict(os.environ, PYKERNEL_CACHE_DIR=str(cache_dir))
    out = subprocess.run([sys.executable, "-c", PROBE.format(d=str(tmp_path))], env=env,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    key_line, how = out.stdout.split("\n")[:2]
    return key_line.split()[0], how


def test_disk_cache_across_processes(tmp_path):
    cache_dir = tmp_path / "cache"
    key1, how1 = compile_in_new_process(tmp_path, cache_dir)
    key2, how2 = compile_in_new_process(tmp_path, cache_dir)
    assert key1 == key2 and how1 == "LOWERED" and how2 == "FROMDISK"


@pytest.mark.parametrize("change", [{"scale": 5.0}, {"factor": 4.0}])
def test_key_follows_globals_and_device_functions(tmp_path, change):
    cache_dir = tmp_path / "cache"
    key1, _ = compile_in_new_process(tmp_path, cache_dir)
    key2, how = compile_in_new_process(tmp_path, cache_dir, **change)
    assert key1 != key2 and how == "LOWERED"


def test_corrupt_entry_is_recompiled(tmp_path):
    cache_dir = tmp_path / "cache"
    key, _ = compile_in_new_process(tmp_path, cache_dir)
    entry = cache_dir / f"{key}.ptxcache"
    text = entry.read_text()
    entry.write_text(text[:-40] + "garbage" * 3)       # PTX no longer matches its checksum
    key2, how = compile_in_new_process(tmp_path, cache_dir)
    assert key2 == key and how == "LOWERED"
    assert not list(cache_dir.glob(".tmp-*"))          # atomic writes leave no temp files
