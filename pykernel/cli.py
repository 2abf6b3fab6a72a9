"""The `pykernel` command line: compiler commands (build, ptx, ir, check, selftest) and the
LLM runner's commands (run, chat, tokenize, info, bench, quantize, synth), which the `llm`
package registers through `llm.cli.register(subparsers)`."""
from __future__ import annotations

import argparse
import sys


def _compiler_commands(sub) -> None:
    try:
        from pykernel import cli_compiler
    except ImportError:  # compiler CLI not built yet
        return
    cli_compiler.register(sub)


def _runner_commands(sub) -> None:
    try:
        from llm import cli as llm_cli
    except ImportError:
        return
    llm_cli.register(sub)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pykernel", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _compiler_commands(sub)
    _runner_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
