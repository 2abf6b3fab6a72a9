"""The `pykernel` command on bad input and closed pipes (issue 41, item 8): `pykernel ptx ...
| head` exits quietly (status 141, as a tool ended by SIGPIPE) instead of printing a
BrokenPipeError traceback; a kernel file with a source error is reported as file:line:col."""
import os
import subprocess
import sys
import textwrap

from tests.child_env import child_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

LONG_KERNEL = textwrap.dedent('''
    import pykernel as pk
    from pykernel import Ptr, f32

    @pk.kernel
    def long_ptx(x: Ptr[f32]):
        for i in pk.static_range(1500):
            x[i] = x[i + 1] * 2.0
''')

UNANNOTATED = textwrap.dedent('''
    import pykernel as pk
    from pykernel import f32

    @pk.kernel
    def no_annotation(x, n: f32):
        pass
''')


def pykernel_command(*args, **kwargs):
    env = child_env()
    return subprocess.Popen([sys.executable, "-m", "pykernel", *args], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)


def test_ptx_into_a_closed_pipe_exits_quietly(tmp_path):
    source = tmp_path / "long_kernel.py"
    source.write_text(LONG_KERNEL)
    proc = pykernel_command("ptx", str(source))
    first = proc.stdout.readline()            # `| head -1`: read a line, close the pipe
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, stderr
    assert first.startswith(b"//")
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr, stderr


def test_check_reports_a_signature_error_with_its_location(tmp_path):
    source = tmp_path / "bad_kernel.py"
    source.write_text(UNANNOTATED)
    proc = pykernel_command("check", str(source))
    out, err = (s.decode() for s in proc.communicate(timeout=120))
    assert proc.returncode == 1, out + err
    assert f"{source}:6:19: error: parameter 'x' needs a type annotation" in err, err
    assert "Traceback" not in err


def test_runner_command_without_its_dependencies_says_why():
    """A checkout whose runner cannot import (gguf missing) must say so for `pykernel run`,
    not answer as if `run` did not exist."""
    code = ("import sys; sys.modules['gguf'] = None\n"
            "from pykernel.cli import main\nsys.exit(main(['run', 'hello']))")
    done = subprocess.run([sys.executable, "-c", code], env=child_env(), cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "'run' is not available" in done.stderr and "gguf" in done.stderr, done.stderr
