"""CPU-target emulation of TMA tensor copies (intrinsics/tma.py), mixed into CPUTarget.

A tensor map parameter is the record runtime/tensor_map.py packs (address, rank, element
size, dims, byte strides, box, swizzle, out-of-bounds fill: innermost first). A copy happens
when issued, one byte at a time:

    box element (i0, i1, ...) (i0 innermost) <-> global coordinates (c0 + i0, c1 + i1, ...)
    shared offset o = start + ((... i2) * box1 + i1) * box0 * size + i0 * size (+ byte)
    swizzled (T = 32, 64, 128 bytes): o ^ ((o >> 7) & (T / 16 - 1)) << 4

with o measured from the block's shared-memory base, exactly the XOR the wgmma emulation reads
through a descriptor of the same mode (cpu_hopper._desc_offset). A load fills elements outside
the tensor with zeros (or the map's NaN) and then completes its bytes on the mbarrier, as
bulk_copy does; a store skips them. Commit / wait groups have nothing to wait for."""
from __future__ import annotations

from llvmlite import ir

from . import cpu_abi as abi
from .cpu_thread_state import Loop

I8, I16, I32, I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
# record offsets (runtime/tensor_map.py)
ADDRESS, RANK, ELEM_BYTES, DIMS, STRIDES, BOX, SWIZZLE, FILL, NAN_BITS, MAGIC = (
    0, 8, 12, 16, 56, 96, 106, 108, 112, 120)
MAGIC_VALUE = int.from_bytes(b"PKTMAP01", "little")
ALIGN = 128                        # the shared side of a tensor copy
MAX_CLUSTER = 16
TMA_ERROR = 11


def _c(v, ty=I64):
    return ir.Constant(ty, v)


class _MapFields:
    """The record's fields as i64 IR values, for `rank` dimensions (innermost first)."""

    def __init__(self, b, record, rank):
        def field(offset, ty):
            ptr = b.bitcast(b.gep(record, [_c(offset)]), ty.as_pointer())
            value = b.load(ptr, align=1)
            return value if ty is I64 else b.zext(value, I64)
        self.address = field(ADDRESS, I64)
        self.elem = field(ELEM_BYTES, I32)
        self.dims = [field(DIMS + 8 * d, I64) for d in range(rank)]
        self.strides = [field(STRIDES + 8 * d, I64) for d in range(rank)]
        self.box = [field(BOX + 2 * d, I16) for d in range(rank)]
        self.fill, self.nan = field(FILL, I32), field(NAN_BITS, I64)
        swizzle = field(SWIZZLE, I16)
        self.swizzle_mask = b.select(b.icmp_unsigned("==", swizzle, _c(0)), _c(0),
                                     b.sub(b.udiv(swizzle, _c(16)), _c(1)))
        self.valid = b.and_(b.icmp_unsigned("==", field(RANK, I32), _c(rank)),
                            b.icmp_unsigned("==", field(MAGIC, I64), _c(MAGIC_VALUE)))
        self.inner = b.mul(self.box[0], self.elem)
        rows = _c(1)
        for n in self.box[1:]:
            rows = b.mul(rows, n)
        self.rows, self.total = rows, b.mul(rows, self.inner)


class CPUTmaOps:
    def tma_load(self, ctx, dst, tmap, coords, bar, mask, site):
        b = ctx.builder
        m = _MapFields(b, tmap.ir, len(coords))
        bar_ptr = b.ptrtoint(self._bar(ctx, bar, site), I64)
        if mask is None:
            self._checked_copy(ctx, m, coords, dst, _c(0), True, site)
            self._update(ctx, b.inttoptr(bar_ptr, I64.as_pointer()), b.neg(m.total), False,
                         site)
            return
        self._coro_blocks(ctx)             # the cluster's blocks must be alive together
        own = b.zext(self.cluster_register(ctx, "rank"), I64)
        size = b.zext(self.cluster_register(ctx, "size"), I64)
        bits = b.zext(mask, I64)
        with b.if_then(b.icmp_unsigned("!=", b.lshr(bits, size), _c(0)), likely=False):
            self.fail(ctx, TMA_ERROR, site, bits)     # a rank outside the cluster
        with Loop(b, _c(0), b.select(b.icmp_unsigned("<", size, _c(MAX_CLUSTER)), size,
                                     _c(MAX_CLUSTER)), "tma.rank") as rank:
            chosen = b.trunc(b.lshr(bits, rank), ir.IntType(1))
            with b.if_then(chosen):
                delta = b.mul(b.sub(rank, own), self.ctx_slot(ctx, abi.SHARED_STRIDE))
                self._checked_copy(ctx, m, coords, dst, delta, True, site)
                remote_bar = b.inttoptr(b.add(bar_ptr, delta), I64.as_pointer())
                self._update(ctx, remote_bar, b.neg(m.total), False, site)

    def tma_store(self, ctx, tmap, coords, src, site):
        """A store's box may run past the tensor's end (clipped) but not start before it: an
        H200 traps (illegal instruction) on a negative store coordinate (measured)."""
        b = ctx.builder
        m = _MapFields(b, tmap.ir, len(coords))
        for c in coords:
            with b.if_then(b.icmp_signed("<", c, ir.Constant(c.type, 0)), likely=False):
                self.fail(ctx, TMA_ERROR, site, b.sext(c, I64))
        self._checked_copy(ctx, m, coords, src, _c(0), False, site)

    def _checked_copy(self, ctx, m, coords, smem, delta, load, site):
        """The map must be a CPU record of this rank, the shared side 128-byte aligned and the
        innermost coordinate a whole number of 16 bytes (an H200 traps with an illegal
        instruction on 4 or 8: measured, tests/kernels/test_tma.py)."""
        b = ctx.builder
        base = self.ctx_slot(ctx, abi.SHARED_PTR)
        start = b.sub(b.ptrtoint(smem.ptr, I64), base)
        aligned = b.icmp_unsigned("==", b.urem(start, _c(ALIGN)), _c(0))
        inner_bytes = b.mul(b.sext(coords[-1], I64), m.elem)
        aligned = b.and_(aligned, b.icmp_signed("==", b.srem(inner_bytes, _c(16)), _c(0)))
        with b.if_else(b.and_(m.valid, aligned)) as (then, otherwise):
            with then:
                self._copy_box(ctx, m, coords, smem, start, delta, load, site)
            with otherwise:
                self.fail(ctx, TMA_ERROR, site, start)

    def _copy_box(self, ctx, m, coords, smem, start, delta, load, site):
        """Every byte of the box between global memory and shared memory (see the module
        docstring); shared bytes outside smem's array are out-of-bounds errors."""
        b = ctx.builder
        base = b.add(self.ctx_slot(ctx, abi.SHARED_PTR), delta)
        lo, hi = (self._extent(ctx, smem.origin) if smem.origin is not None
                  else (_c(0), _c(-1)))
        lo, hi = b.add(lo, delta), b.add(hi, delta)
        first = [b.sext(c, I64) for c in reversed(coords)]       # innermost first
        with Loop(b, _c(0), m.rows, "tma.row") as row:
            row_ok, gaddr, rest = ir.Constant(ir.IntType(1), 1), m.address, row
            for d in range(1, len(first)):
                coord = b.add(first[d], b.urem(rest, m.box[d]))
                rest = b.udiv(rest, m.box[d])
                row_ok = b.and_(row_ok, self._inside(b, coord, m.dims[d]))
                gaddr = b.add(gaddr, b.mul(coord, m.strides[d]))
            with Loop(b, _c(0), m.inner, "tma.byte") as j:
                c0 = b.add(first[0], b.udiv(j, m.elem))
                ok = b.and_(row_ok, self._inside(b, c0, m.dims[0]))
                byte = b.urem(j, m.elem)
                gbyte = b.add(b.add(gaddr, b.mul(c0, m.elem)), byte)
                off = b.add(start, b.add(b.mul(row, m.inner), j))
                off = b.xor(off, b.shl(b.and_(b.lshr(off, _c(7)), m.swizzle_mask), _c(4)))
                sbyte = b.add(base, off)
                in_smem = b.and_(b.icmp_unsigned(">=", sbyte, lo),
                                 b.icmp_unsigned("<", sbyte, hi))
                with b.if_else(in_smem) as (then, otherwise):
                    with then:
                        if load:
                            self._load_byte(b, m, ok, gbyte, byte, sbyte)
                        else:
                            with b.if_then(ok):
                                value = b.load(b.inttoptr(sbyte, I8.as_pointer()))
                                b.store(value, b.inttoptr(gbyte, I8.as_pointer()))
                    with otherwise:
                        self.fail(ctx, 1, site, b.sub(sbyte, lo))

    @staticmethod
    def _inside(b, coord, extent):
        return b.and_(b.icmp_signed(">=", coord, _c(0)), b.icmp_signed("<", coord, extent))

    @staticmethod
    def _load_byte(b, m, ok, gbyte, byte, sbyte):
        """The global byte when in bounds; else 0, or the byte of the map's NaN."""
        safe = b.select(ok, gbyte, m.address)
        value = b.load(b.inttoptr(safe, I8.as_pointer()))
        nan = b.trunc(b.lshr(m.nan, b.mul(byte, _c(8))), I8)
        fill = b.select(b.icmp_unsigned("!=", m.fill, _c(0)), nan, ir.Constant(I8, 0))
        b.store(b.select(ok, value, fill), b.inttoptr(sbyte, I8.as_pointer()))

    def bulk_commit_group(self, ctx):
        pass      # a store is complete when issued

    def bulk_wait_group(self, ctx, count, read):
        pass

    def prefetch_tensormap(self, ctx, tmap):
        pass
