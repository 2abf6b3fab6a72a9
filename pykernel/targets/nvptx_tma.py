"""NVPTX lowering of TMA tensor copies (intrinsics/tma.py), mixed into NVPTXTarget: inline PTX
(PTX ISA 8.0, sm_90).

A `pk.TensorMap` parameter is a `byval` struct of 128 bytes aligned to 64, marked
grid-constant (`nvvm.annotations` "grid_constant"): LLVM then declares
`.param .align 64 .b8 name[128]` and, where the kernel takes its address, converts that
address with `cvta.param` instead of copying the map to local memory (which the TMA unit
cannot read). The copies take that generic address as their tensor-map operand."""
from __future__ import annotations

from llvmlite import ir

from .nvptx_bulk import _asm, ptx_isa

I16, I32, I64 = ir.IntType(16), ir.IntType(32), ir.IntType(64)
TENSOR_MAP_STRUCT = ir.LiteralStructType([ir.ArrayType(I64, 16)])     # 128 bytes


def tensor_map_param_type() -> ir.Type:
    return TENSOR_MAP_STRUCT.as_pointer()


def mark_tensor_map_param(module, fn, arg, index: int) -> None:
    """arg (parameter `index` of kernel fn): passed by value, 64-byte aligned, grid-constant."""
    arg.add_attribute("byval")
    arg.attributes.align = 64
    module.add_named_metadata("nvvm.annotations", [
        fn, ir.MetaDataString(module, "grid_constant"),
        module.add_metadata([ir.Constant(I32, index + 1)])])


def _coords_text(first: int, count: int) -> str:
    """PTX lists coordinates innermost first: the reverse of the kernel's (numpy) order."""
    return "{" + ", ".join(f"${first + count - 1 - k}" for k in range(count)) + "}"


class NVPTXTmaOps:
    def _tmap_address(self, ctx, tmap):
        return ctx.builder.ptrtoint(tmap.ir, I64)

    @ptx_isa(80)
    def tma_load(self, ctx, dst, tmap, coords, bar, mask, site):
        self.check_address(ctx, dst.ptr, dst.elem, dst.origin, site)
        b, rank = ctx.builder, len(coords)
        args = [b.ptrtoint(dst.ptr, I32), self._tmap_address(ctx, tmap),
                self._bar_address(ctx, bar, site)] + list(coords)
        cons = ["r", "l", "r"] + ["r"] * rank
        suffix, tail = "", ""
        if mask is not None:
            suffix, tail = ".multicast::cluster", f", ${len(args)}"
            args.append(mask)
            cons.append("h")
        _asm(b, f"cp.async.bulk.tensor.{rank}d.shared::cluster.global.tile.mbarrier::"
             f"complete_tx::bytes{suffix} [$0], [$1, {_coords_text(3, rank)}], [$2]{tail};",
             ",".join(cons), args)

    @ptx_isa(80)
    def tma_store(self, ctx, tmap, coords, src, site):
        self.check_address(ctx, src.ptr, src.elem, src.origin, site)
        b, rank = ctx.builder, len(coords)
        args = [self._tmap_address(ctx, tmap), b.ptrtoint(src.ptr, I32)] + list(coords)
        _asm(b, f"cp.async.bulk.tensor.{rank}d.global.shared::cta.tile.bulk_group "
             f"[$0, {_coords_text(2, rank)}], [$1];", ",".join(["l", "r"] + ["r"] * rank),
             args)

    @ptx_isa(80)
    def bulk_commit_group(self, ctx):
        _asm(ctx.builder, "cp.async.bulk.commit_group;", "", [])

    @ptx_isa(80)
    def bulk_wait_group(self, ctx, count: int, read: bool):
        _asm(ctx.builder, f"cp.async.bulk.wait_group{'.read' if read else ''} {count};", "",
             [])

    @ptx_isa(80)
    def prefetch_tensormap(self, ctx, tmap):
        _asm(ctx.builder, "prefetch.tensormap [$0];", "l", [self._tmap_address(ctx, tmap)])
