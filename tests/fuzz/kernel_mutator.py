"""Seeded mutations of valid kernel source text, for the compiler's "bad input never crashes"
fuzz test (issue 45, item 9). Input: a seed kernel module (source text + Const arguments) and a
random.Random; output: mutated module text and the list of mutations applied. Mutations are
textual (operators swapped, annotations dropped or replaced, constants made huge, negative or
strings, lines deleted, wrong values stored, shifts by negatives, nonsense calls inserted), so
the result may not even be Python: the test skips what Python itself refuses to compile."""
from __future__ import annotations

import ast
import random
import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Seed:
    name: str
    source: str      # a whole module: imports, @pk.func helpers, @pk.kernel kernels
    consts: dict     # kernel name -> Const arguments for compile()


HEADER = '''from __future__ import annotations
import pykernel as pk
from pykernel import Const, Ptr, f16, f32, i32, u32
'''

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example_kernels(name: str) -> str:
    """The kernels of examples/<name>.py as a seed: its text up to its `main` (the host code
    that runs them is no compiler input)."""
    return (EXAMPLES / f"{name}.py").read_text().split("\ndef main(")[0]


SEEDS = [
    # an elementwise kernel and a shared-memory tree reduction (pk.syncthreads, a Const block)
    Seed("aot_build", example_kernels("aot_build"), {"row_sum": {"BLOCK": 128}}),
    # a @pk.func of warp shuffles unrolled by pk.static_range, then shared memory across warps
    Seed("block_reduction", example_kernels("block_reduction"), {"row_sum": {"BLOCK": 256}}),
    Seed("bits", HEADER + '''

@pk.func
def mix(v: u32, s: i32) -> u32:
    return (v << u32(s)) ^ (v >> u32(32 - s))


@pk.kernel
def bits(x: Ptr[u32], n: i32):
    i = pk.block_idx.x * 256 + pk.thread_idx.x
    tmp = pk.local_array(u32, 4)
    for k in range(4):
        tmp[k] = mix(x[i] + u32(k), 7) & u32(0xFFFF)
    if i < n and i % 2 == 0:
        x[i] = tmp[0] | tmp[3]
    elif i < n:
        x[i] = tmp[1] - tmp[2] * u32(3)
''', {"bits": {}}),
    Seed("softmax_row", HEADER + '''

@pk.kernel
def softmax_row(x: Ptr[f32], cols: i32, scale: f32):
    row = pk.block_idx.x
    m = f32(-1e30)
    j = 0
    while j < cols:
        m = max(m, x[row * cols + j] * scale)
        j += 1
    total = f32(0.0)
    for c in range(cols):
        e = pk.exp(x[row * cols + c] * scale - m)
        x[row * cols + c] = e
        total += e
    inv = f32(1.0) / total
    for c in range(cols):
        x[row * cols + c] = x[row * cols + c] * inv if cols > 1 else f32(1.0)
''', {"softmax_row": {}}),
]

OPERATORS = ["+", "-", "*", "/", "//", "%", "**", "<<", ">>", "&", "|", "^", "<", ">", "<=",
             ">=", "==", "!=", "and", "or", "is", "in", "@"]
OPERATOR_RE = re.compile(r"(?<=\s)(\*\*|//|<<|>>|<=|>=|==|!=|[-+*/%&|^<>])(?=\s)")
NUMBER_RE = re.compile(r"(?<![\w.])(\d+\.\d*|\d+|0x[0-9A-Fa-f]+)(?![\w.])")
CONSTANTS = ["2**70", "-1", "-2147483649", "10**40", "'s'", "1e308", "0", "-0.0", "None",
             "(1, 2)", "True", "2**31", "4294967296", "1.5", "10**100000", "1 << 4000", "-(2**63)"]
ANNOTATIONS = ["int", "float", '"T"', "Ptr[int]", "Const[str]", "pk", "f32[3]",
               'Ptr[f32, "rw"]', "Undefined", "Ptr", "Const", "Ptr[Ptr[f32]]", "None", "3"]
STORED = ["'a'", "(1, 2)", "x", "None", "pk", "1 << -1", "2**64", "f32", "pk.exp", "-1e400",
          "pk.thread_idx", "b'x'", "1j"]
EXPRESSIONS = ["1 << -1", "1 >> -5", "i32(1) << -1", "(1 << 100) >> -2", "2 ** -1", "7 // 0",
               "7 % 0", "1.0 / 0.0", "'ab' * 10**12", "10 ** 10 ** 9", "-(1 << 64)",
               "f32(1) << 2", "u32(1) - -1"]
CALLS = ["pk.nonexistent(1)", "len(x)", "open('f')", "print()", "pk.syncthreads(1, 2)",
         "pk.exp()", "pk.exp(1, 2)", "pk.local_array(f32, 2**40)", "pk.shared_array(f32, -1)",
         "pk.shared_array(f32, 2**20)", "pk.local_array(f32, (2**16, 2**16))",
         "pk.local_array(3, 4)", "pk.static_range(10**12)", "range('a')", "f32('x')",
         "pk.atomic_add(1, 2, 3)", "abs()", "min(1)", "pk.thread_idx.w", "pk.block_dim()",
         "x(1)", "x.y", "int(x)", "f32(x)", "pk.bitcast(1, f32, 3)", "pk.shfl_xor(1.0, -1)",
         "pk.static_range(0, 10, 0)", "[i for i in range(3)]", "lambda: 0", "{1: 2}",
         "pk.dynamic_shared(7)", "pk.load_vec(x, 0, 3)", "i32(2**40)", "u32(-1)"]
STATEMENTS = ["return 1", "del i", "import os", "global x", "assert False",
              "x = 1", "pk = 3", "raise ValueError()", "with x: pass", "i: f32 = 1.0",
              "a, b = 1", "a, b = (1, 2, 3)", "x[0], x[1] = 1", "for q in x: pass",
              "while True: pass", "pk.syncthreads()", "y = y", "f32 = 3"]


def mutate(source: str, rng: random.Random, count: int) -> tuple[str, list[str]]:
    """Apply `count` random mutations (each one that applies); returns (text, descriptions)."""
    lines, applied = source.split("\n"), []
    for _ in range(count):
        for _attempt in range(10):     # some mutations find nothing to change: try another
            name, fn = rng.choice(MUTATIONS)
            result = fn(lines, rng)
            if result is not None:
                lines, what = result
                applied.append(f"{name}: {what}")
                break
    return "\n".join(lines), applied


def _body_lines(lines) -> list[int]:
    """Indices of the indented lines of function bodies."""
    return [k for k, line in enumerate(lines) if line.startswith("    ") and line.strip()]


def _def_lines(lines) -> list[int]:
    return [k for k, line in enumerate(lines) if line.startswith("def ")]


def _replace_match(lines, rng, regex, choices):
    spots = [(k, m) for k in _body_lines(lines) for m in regex.finditer(lines[k])]
    if not spots:
        return None
    k, m = rng.choice(spots)
    new = rng.choice([c for c in choices if c != m.group(0)])
    line = lines[k][:m.start()] + new + lines[k][m.end():]
    return lines[:k] + [line] + lines[k + 1:], f"line {k + 1}: {m.group(0)!r} -> {new!r}"


def swap_operator(lines, rng):
    return _replace_match(lines, rng, OPERATOR_RE, OPERATORS)


def change_constant(lines, rng):
    return _replace_match(lines, rng, NUMBER_RE, CONSTANTS)


def _annotated_args(lines):
    """(line index, ast.arg) of every annotated parameter written on its `def` line."""
    out = []
    for k in _def_lines(lines):
        try:
            tree = ast.parse(lines[k].strip() + "\n    pass")
        except SyntaxError:
            continue
        out += [(k, a) for a in tree.body[0].args.args if a.annotation is not None]
    return out


def drop_annotation(lines, rng, replacement=None):
    spots = _annotated_args(lines)
    if not spots:
        return None
    k, arg = rng.choice(spots)
    line, ann = lines[k], arg.annotation
    start = arg.col_offset + len(arg.arg)
    new_ann = "" if replacement is None else f": {replacement}"
    line = line[:start] + new_ann + line[ann.end_col_offset:]
    return lines[:k] + [line] + lines[k + 1:], f"line {k + 1}: {arg.arg}{new_ann or ' (none)'}"


def replace_annotation(lines, rng):
    return drop_annotation(lines, rng, rng.choice(ANNOTATIONS))


def delete_line(lines, rng):
    body = _body_lines(lines)
    if not body:
        return None
    k = rng.choice(body)
    return lines[:k] + lines[k + 1:], f"line {k + 1} deleted: {lines[k].strip()!r}"


def wrong_store(lines, rng):
    stores = [k for k in _body_lines(lines) if re.match(r"\s+\w+\[.*\] = ", lines[k])]
    if not stores:
        return None
    k = rng.choice(stores)
    lhs = lines[k].split(" = ", 1)[0]
    value = rng.choice(STORED)
    return lines[:k] + [f"{lhs} = {value}"] + lines[k + 1:], f"line {k + 1}: stores {value}"


def _insert(lines, rng, text):
    body = _body_lines(lines)
    if not body:
        return None
    k = rng.choice(body)
    indent = lines[k][:len(lines[k]) - len(lines[k].lstrip())]
    return lines[:k] + [indent + text] + lines[k:], f"line {k + 1}: inserted {text!r}"


def insert_expression(lines, rng):
    return _insert(lines, rng, f"_v = {rng.choice(EXPRESSIONS)}")


def insert_call(lines, rng):
    return _insert(lines, rng, rng.choice(CALLS))


def insert_statement(lines, rng):
    return _insert(lines, rng, rng.choice(STATEMENTS))


MUTATIONS = [("swap_operator", swap_operator), ("change_constant", change_constant),
             ("drop_annotation", drop_annotation), ("replace_annotation", replace_annotation),
             ("delete_line", delete_line), ("wrong_store", wrong_store),
             ("insert_expression", insert_expression), ("insert_call", insert_call),
             ("insert_statement", insert_statement)]
