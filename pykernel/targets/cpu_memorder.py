"""CPU-target forms of the memory-ordered accesses (intrinsics/memorder.py): LLVM atomic
loads, stores, read-modify-writes and fences with the orderings the kernel names. Blocks run
on several host threads (runtime/cpu.py), so these are the real semantics, not an imitation.
Every scope is the whole process: a host thread sees one coherent memory, so a narrower scope
would only allow what the GPU allows anyway."""
from __future__ import annotations

from llvmlite import ir

# the DSL's orderings -> LLVM's
_LLVM_ORDER = {"relaxed": "monotonic", "acquire": "acquire", "release": "release",
               "acq_rel": "acq_rel", "sc": "seq_cst"}
# an atomic cmpxchg's failure ordering may not be release / acq_rel
_FAILURE_ORDER = {"relaxed": "monotonic", "acquire": "acquire", "release": "monotonic",
                  "acq_rel": "acquire"}


def _integer_pointer(b, ptr, elem):
    """LLVM's atomic loads and stores of floats are fine, but an integer view keeps one form
    for every type (and matches the PTX's .b32 / .b64)."""
    return b.bitcast(ptr, ir.PointerType(ir.IntType(elem.bits), ptr.type.addrspace))


def ordered_load(fl, ptr, elem, order, scope):
    b = fl.b
    raw = b.load_atomic(_integer_pointer(b, ptr, elem), _LLVM_ORDER[order], elem.nbytes)
    return b.bitcast(raw, elem.llvm) if elem.is_float else raw


def ordered_store(fl, ptr, elem, value, order, scope):
    b = fl.b
    word = b.bitcast(value, ir.IntType(elem.bits)) if elem.is_float else value
    b.store_atomic(word, _integer_pointer(b, ptr, elem), _LLVM_ORDER[order], elem.nbytes)


def ordered_atomic(fl, op, ptr, vals, elem, order, scope):
    b = fl.b
    if op == "cas":
        pair = b.cmpxchg(ptr, vals[0], vals[1], _LLVM_ORDER[order], _FAILURE_ORDER[order])
        return b.extract_value(pair, 0)
    rmw = {"add": "fadd" if elem.is_float else "add", "exch": "xchg",
           "max": "max" if elem.is_signed else "umax",
           "min": "min" if elem.is_signed else "umin"}[op]
    return b.atomic_rmw(rmw, ptr, vals[0], _LLVM_ORDER[order])


def ordered_fence(fl, order, scope):
    fl.b.fence(_LLVM_ORDER[order])


INTRINSICS = {"ordered_load": ordered_load, "ordered_store": ordered_store,
              "ordered_atomic": ordered_atomic, "ordered_fence": ordered_fence}
