"""Target-specific decisions live in pykernel/targets/: the compiler asks the target (hidden
parameters, line tables, which result field emission fills) and never tests its name."""
from __future__ import annotations

import ast
import pathlib

import pykernel
from pykernel.lower.context import Options
from pykernel.targets import get_target
from pykernel.types import PtrType, f32, i32

ROOT = pathlib.Path(pykernel.__file__).parent


def _name_tests(path: pathlib.Path) -> list[str]:
    """`<expr>.name == "<target>"` comparisons in a module (the branches targets/ replaces)."""
    hits = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Attribute) and \
                node.left.attr == "name" and "target" in ast.unparse(node.left.value) and \
                any(isinstance(c, ast.Constant) and c.value in ("nvptx", "cpu")
                    for c in node.comparators):
            hits.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return hits


def test_no_target_name_branch_outside_targets():
    hits = [h for path in ROOT.rglob("*.py") if "targets" not in path.parts
            for h in _name_tests(path)]
    assert hits == [], f"target-name branches outside pykernel/targets/: {hits}"


def test_hidden_extent_params_only_where_the_target_checks_through_them():
    params = [("x", PtrType(f32)), ("n", i32), ("y", PtrType(f32))]
    checked = Options(bounds_check=True)
    assert get_target("sm_90").hidden_params(params, checked) == \
        [("__nbytes_x", pykernel.types.i64), ("__nbytes_y", pykernel.types.i64)]
    assert get_target("sm_90").hidden_params(params, Options()) == []
    assert get_target("cpu").hidden_params(params, checked) == []   # checks every access itself

