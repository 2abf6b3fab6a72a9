"""(template, variables, source) -> rendered text, through one long-lived worker process.

The worker (template_sandbox.py run as a script) renders in jinja2's sandbox under an address
space cap; this side gives each render RENDER_TIMEOUT_S and kills the worker when it overruns,
or when it dies, so a hostile template costs at most that long and never this process's memory.
The worker starts on the first render (~0.1-0.3 s) and is reused; a killed one is replaced at
the next render. Requests are serialized by a lock (one worker, one render at a time).
"""
from __future__ import annotations

import atexit
import json
import os
import queue
import subprocess
import sys
import threading

RENDER_TIMEOUT_S = 10.0    # real templates take milliseconds
START_TIMEOUT_S = 60.0     # interpreter + jinja2 import on a slow, busy machine

# Runs template_sandbox.py by path: `python -m llm....` would import the llm package (numpy,
# the runner) into a process that needs only jinja2.
_BOOT = "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__main__')"
_SANDBOX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "template_sandbox.py")


class RenderFailed(Exception):
    """The template was rejected, failed, or overran its time or memory; str() says which."""


class _Worker:
    def __init__(self):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _BOOT, _SANDBOX],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        # a thread reads the replies, so waiting with a deadline works on every platform
        self.lines: queue.Queue = queue.Queue()
        self.reader = threading.Thread(target=_forward_lines, args=(self.proc.stdout, self.lines),
                                       daemon=True)
        self.reader.start()
        self.ready = self._reply(START_TIMEOUT_S) == {"ready": True}

    def ask(self, request: dict, timeout: float) -> dict | str:
        """The worker's reply, or why there is none: "timeout" or "died"."""
        try:
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return "died"
        return self._reply(timeout)

    def _reply(self, timeout: float) -> dict | str:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            return "timeout"
        return "died" if line is None else json.loads(line)

    def kill(self):
        self.proc.kill()
        self.proc.wait()
        self.reader.join(timeout=5)      # the pipe is at its end now
        for stream in (self.proc.stdin, self.proc.stdout):
            stream.close()


def _forward_lines(stream, lines: queue.Queue):
    """The worker's output, line by line, then None (end of file: it exited or was killed)."""
    try:
        for line in stream:
            lines.put(line)
    except (OSError, ValueError):
        pass
    lines.put(None)


_lock = threading.Lock()
_worker: _Worker | None = None


def render(template: str, variables: dict, source: str,
           timeout: float | None = None) -> str:
    """The rendered text; RenderFailed with the user's message otherwise."""
    global _worker
    timeout = RENDER_TIMEOUT_S if timeout is None else timeout
    request = dict(template=template, variables=variables, source=source)
    with _lock:
        if _worker is None:
            _worker = _Worker()
            if not _worker.ready:
                _worker.kill()
                _worker = None
                raise RenderFailed(f"{source}: the template renderer process did not start "
                                   f"({sys.executable} with jinja2)")
        reply = _worker.ask(request, timeout)
        if isinstance(reply, str):          # no reply: the worker is killed and replaced
            proc = _worker.proc
            _worker.kill()
            _worker = None
            if reply == "timeout":
                raise RenderFailed(f"{source}: rendering took longer than {timeout:g} s and "
                                   "was stopped")
            raise RenderFailed(f"{source}: the template renderer exited (status "
                               f"{proc.returncode}) while rendering it")
    if "error" in reply:
        raise RenderFailed(reply["error"])
    return reply["text"]


@atexit.register
def _stop_worker():
    with _lock:
        if _worker is not None:
            _worker.kill()
