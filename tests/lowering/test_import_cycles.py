"""The compiler's modules import each other in few cycles: the largest strongly connected
component of pykernel/'s import graph (every import, including those inside functions; the
package root, which only re-exports the public API, left out) stays within the lowering
visitor's five modules, which recurse into each other by design. It was 13 modules before
describe() moved to lower/values.py and DeviceFunction to device_function.py."""
import ast
import os

import pykernel

ROOT = os.path.dirname(os.path.abspath(pykernel.__file__))
LARGEST_CYCLE = 5     # lower/{codegen, statements, expressions, calls, functions}


def _module_name(path: str) -> str:
    rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
    return rel[:-len(".__init__")] if rel.endswith(".__init__") else rel


def _import_graph() -> dict:
    files = {}
    for folder, _, names in os.walk(ROOT):
        for name in names:
            if name.endswith(".py"):
                files[_module_name(os.path.join(folder, name))] = os.path.join(folder, name)
    graph = {}
    for mod, path in files.items():
        with open(path) as f:
            tree = ast.parse(f.read())
        package = mod.split(".") if path.endswith("__init__.py") else mod.split(".")[:-1]
        deps = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package[:len(package) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                for a in node.names:
                    deps.add(f"{base}.{a.name}" if f"{base}.{a.name}" in files else base)
        graph[mod] = {d for d in deps if d in files and d not in (mod, "pykernel")}
    return graph


def _components(graph: dict) -> list:
    """Strongly connected components (Tarjan's algorithm)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while not comp or v not in comp:
                comp.add(stack.pop())
            on_stack.difference_update(comp)
            out.append(comp)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_larger_than_the_lowering_visitor():
    largest = max(_components(_import_graph()), key=len)
    assert len(largest) <= LARGEST_CYCLE, sorted(largest)
