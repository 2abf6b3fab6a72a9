"""The result of compiling one kernel specialization (kept light: the disk-cache path loads
it without importing the compiler or LLVM)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Site:
    """A source location that a runtime check can report (kernel name + file:line:col)."""
    kind: str
    file: str
    line: int
    col: int
    text: str

    def describe(self) -> str:
        return f"{self.file}:{self.line}:{self.col + 1}: {self.kind}\n    {self.text.strip()}"


@dataclass(frozen=True)
class ParamABI:
    name: str
    kind: str            # "ptr" | "array" | "scalar"
    dtype: object        # numpy dtype (pointee for ptr), "bfloat16" for bf16
    size: int
    align: int
    readonly: bool = False
    type_name: str = ""  # DSL spelling: "Ptr[f32]", "Array[f32, 2]", "i32"
    rank: int = 0        # kind "array": the data pointer, followed by `rank` i64 extents and
                         # `rank` i64 strides (in elements), each its own "scalar" parameter


@dataclass
class CompiledKernel:
    name: str
    entry: str
    target: str
    arch: str
    params: list
    shared_bytes: int
    cache_key: str
    ptx: str = ""
    llvm_ir: str = ""
    sites: list = field(default_factory=list)
    uses: frozenset = frozenset()
    min_arch: str = "sm_75"
    source_hash: str = ""
    hidden_extents: int = 0      # bounds_check on the GPU: trailing __nbytes_* parameters
    cpu: object = None           # CPU target: the JIT-compiled entry (targets/cpu.py)
