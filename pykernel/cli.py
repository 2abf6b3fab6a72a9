"""The `pykernel` command line: compiler commands (build, ptx, ir, check, selftest) and the
LLM runner's commands (run, chat, tokenize, info from llm.cli; bench, synth from llm.cli_bench;
quantize from stdlib_kernels.quant.cli), each registered through `register(subparsers)`."""
from __future__ import annotations

import argparse
import sys


def _compiler_commands(sub) -> None:
    try:
        from pykernel import cli_compiler
    except ImportError:  # compiler CLI not built yet
        return
    cli_compiler.register(sub)


def _runner_commands(sub) -> list[str]:
    """Each module contributes subcommands through register(subparsers). Returns why a module
    present in this checkout could not be imported (a missing dependency such as gguf), so an
    unknown command can say so instead of only listing the compiler's commands."""
    unavailable = []
    for module_name in ("llm.cli", "llm.cli_bench", "stdlib_kernels.quant.cli"):
        try:
            module = __import__(module_name, fromlist=["register"])
        except ImportError as e:
            if e.name not in (module_name, module_name.split(".")[0]):
                unavailable.append(f"{module_name}: {e}")
            continue
        register = getattr(module, "register", None)
        if register is not None:
            register(sub)
    return unavailable


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pykernel", description="pykernel: GPU kernels in Python, and a GGUF LLM runner.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _compiler_commands(sub)
    parser.unavailable = _runner_commands(sub)
    parser.commands = sub.choices
    if parser.unavailable:
        parser.epilog = "commands not available here: " + "; ".join(parser.unavailable)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)
    if command is not None and command not in parser.commands and parser.unavailable:
        print(f"pykernel: '{command}' is not available: the runner's commands failed to import "
              f"({'; '.join(parser.unavailable)})", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        status = int(args.func(args) or 0)
        sys.stdout.flush()        # a closed pipe shows up here for buffered output
        return status
    except BrokenPipeError:
        return _reader_went_away()


# exit status of a process that SIGPIPE ended, as `cat`, `grep`, ... report it
EXIT_BROKEN_PIPE = 128 + 13


def _reader_went_away() -> int:
    """`pykernel ptx k.py | head`: the reader closed the pipe. Exit quietly, like a C tool
    ended by SIGPIPE; stdout goes to /dev/null so the interpreter's final flush cannot raise
    a second BrokenPipeError at shutdown."""
    import os
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
