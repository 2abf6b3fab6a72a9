"""The CPU target's threads are LLVM coroutines (`llvm.coro.*`). llvmlite has no `token`
type, so the IR is built with placeholder declarations and rewritten as text before LLVM
parses it."""
from __future__ import annotations

import re

from llvmlite import ir

I64, I8, I1 = ir.IntType(64), ir.IntType(8), ir.IntType(1)
I8P = I8.as_pointer()


def coro_decls(module):
    """Coroutine intrinsics. llvmlite has no `token` type, so the IR uses placeholder
    declarations (token values typed i8*) that `patch_coroutine_text` rewrites."""
    def decl(name, ret, args):
        fn = module.globals.get(name)
        return fn if fn is not None else ir.Function(module, ir.FunctionType(ret, args), name)
    return {
        "id": decl("__pk_coro_id", I8P, []),
        "size": decl("llvm.coro.size.i64", I64, []),
        "begin": decl("__pk_coro_begin", I8P, [I8P, I8P]),
        "suspend": decl("__pk_coro_suspend", I8, [I1]),
        "coro_free": decl("__pk_coro_free", I8P, [I8P, I8P]),
        "end": decl("__pk_coro_end", ir.VoidType(), [I8P, I1]),
        "resume": decl("llvm.coro.resume", ir.VoidType(), [I8P]),
        "destroy": decl("llvm.coro.destroy", ir.VoidType(), [I8P]),
        "malloc": decl("malloc", I8P, [I64]),
        "free": decl("free", ir.VoidType(), [I8P]),
    }


_PLACEHOLDER_DECLS = re.compile(r'^declare .*@"__pk_coro_\w+"\(.*\)\s*$', re.M)
_REAL_DECLS = """
declare token @llvm.coro.id(i32, ptr, ptr, ptr)
declare ptr @llvm.coro.begin(token, ptr)
declare i8 @llvm.coro.suspend(token, i1)
declare ptr @llvm.coro.free(token, ptr)
declare void @llvm.coro.end(ptr, i1, token)
"""


def patch_coroutine_text(text: str) -> str:
    text = _PLACEHOLDER_DECLS.sub("", text)
    text = re.sub(r'call (?:i8\*|ptr) @"__pk_coro_id"\(\)',
                  "call token @llvm.coro.id(i32 0, ptr null, ptr null, ptr null)", text)
    text = re.sub(r'call (?:i8\*|ptr) @"__pk_coro_begin"\((?:i8\*|ptr) ',
                  "call ptr @llvm.coro.begin(token ", text)
    text = re.sub(r'call (?:i8\*|ptr) @"__pk_coro_free"\((?:i8\*|ptr) ',
                  "call ptr @llvm.coro.free(token ", text)
    text = re.sub(r'call i8 @"__pk_coro_suspend"\(',
                  "call i8 @llvm.coro.suspend(token none, ", text)
    text = re.sub(r'call void @"__pk_coro_end"\(([^)]*)\)',
                  r"call void @llvm.coro.end(\1, token none)", text)
    return text + _REAL_DECLS
