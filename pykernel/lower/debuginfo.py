"""Line tables: DILocation metadata on every statement so NVPTX emits `.file`/`.loc` and
profilers (Nsight Compute) map PTX back to Python lines."""
from __future__ import annotations

import os

from llvmlite import ir


class DebugInfo:
    def __init__(self, module: ir.Module, fn: ir.Function, fast):
        self.module = module
        path = os.path.abspath(fast.file)
        self.file = module.add_debug_info("DIFile", {"filename": os.path.basename(path),
                                                     "directory": os.path.dirname(path)})
        cu = module.add_debug_info("DICompileUnit", {
            "language": ir.DIToken("DW_LANG_C"), "file": self.file, "producer": "pykernel",
            "runtimeVersion": 0, "isOptimized": True,
            "emissionKind": ir.DIToken("DebugDirectivesOnly")}, is_distinct=True)
        sub_type = module.add_debug_info("DISubroutineType", {"types": module.add_metadata([])})
        self.scope = module.add_debug_info("DISubprogram", {
            "name": fast.name, "file": self.file, "line": fast.first_line, "type": sub_type,
            "scopeLine": fast.first_line, "isDefinition": True, "unit": cu,
            "spFlags": ir.DIToken("DISPFlagDefinition | DISPFlagOptimized")}, is_distinct=True)
        fn.set_metadata("dbg", self.scope)
        module.add_named_metadata("llvm.dbg.cu", cu)
        module.add_named_metadata("llvm.module.flags", module.add_metadata(
            [ir.IntType(32)(2), "Debug Info Version", ir.IntType(32)(3)]))
        self.cache = {}

    def set_location(self, builder: ir.IRBuilder, fast, node):
        line = fast.first_line + getattr(node, "lineno", 1) - 1
        col = getattr(node, "col_offset", 0) + fast.col_offset + 1
        key = (line, col)
        loc = self.cache.get(key)
        if loc is None:
            loc = self.module.add_debug_info("DILocation", {"line": line, "column": col,
                                                            "scope": self.scope})
            self.cache[key] = loc
        builder.debug_metadata = loc

    def finalize(self):
        pass
