"""CPU-target lowering of the thread model, memory and warp operations (mixed into CPUTarget).
Warp operations exchange values through per-block slots: each lane writes its value, all lanes
of the warp suspend (a warp-scoped barrier), then each reads its source lane's slot. Two
alternating halves of the slot array make one barrier per operation enough."""
from __future__ import annotations

from llvmlite import ir

from . import cpu_abi as abi

I64, I32, I1 = ir.IntType(64), ir.IntType(32), ir.IntType(1)
I8P = ir.IntType(8).as_pointer()


class CPUOps:
    # --- registers -----------------------------------------------------------------------------
    def special_register(self, ctx, which, axis):
        td, b = ctx.target_data, ctx.builder
        k = "xyz".index(axis) if axis else 0
        if which == "thread_idx":
            return td["tid"][k]
        if which == "block_idx":
            return td["bid"][k]
        if which == "lane_id":
            return b.and_(td["tlin"], ir.Constant(I32, 31))
        slot = (abi.BLOCK if which == "block_dim" else abi.GRID) + k
        return b.trunc(self.ctx_slot(ctx, slot), I32)

    def block_threads(self, ctx):
        b = ctx.builder
        n = self.ctx_slot(ctx, abi.BLOCK)
        for k in (1, 2):
            n = b.mul(n, self.ctx_slot(ctx, abi.BLOCK + k))
        return b.trunc(n, I32)

    # --- synchronisation -----------------------------------------------------------------------
    def barrier(self, ctx, site):
        self.suspend(ctx, abi.AT_BARRIER, site)

    def fence(self, ctx):
        ctx.builder.fence("seq_cst")

    SLOT_WORDS = 16   # words each lane can publish per warp operation (mma needs 10)

    def exchange_words(self, ctx, words, site):
        """Publish this lane's words, wait for the warp; returns (slots, half, nthreads)."""
        b, td = ctx.builder, ctx.target_data
        counter = td.get("warp_counter")
        if counter is None:
            counter = ctx.alloca(I32, "warp.ops")
            ir.IRBuilder(ctx.entry).store(ir.Constant(I32, 0), counter)
            td["warp_counter"] = counter
        k = b.load(counter)
        td["warp_op_index"] = k
        b.store(b.add(k, ir.Constant(I32, 1)), counter)
        nt = self.block_threads(ctx)
        half = b.mul(b.and_(k, ir.Constant(I32, 1)), nt)
        slots = b.inttoptr(self.ctx_slot(ctx, abi.EXCHANGE_PTR), I64.as_pointer())
        mine = b.mul(b.add(half, td["tlin"]), ir.Constant(I32, self.SLOT_WORDS))
        for w, word in enumerate(words):
            b.store(word, b.gep(slots, [b.add(mine, ir.Constant(I32, w))]))
        self.suspend(ctx, abi.AT_WARP_OP, site)
        return slots, half, nt

    def fetch_word(self, ctx, slots, half, thread, w, width=32):
        """Word w that `thread` published (its low 32 bits, or all 64 with width=64)."""
        b = ctx.builder
        idx = b.add(b.mul(b.add(half, thread), ir.Constant(I32, self.SLOT_WORDS)),
                    ir.Constant(I32, w))
        word = b.load(b.gep(slots, [idx]))
        return word if width == 64 else b.trunc(word, I32)

    def _exchange(self, ctx, word_i64, site):
        return self.exchange_words(ctx, [word_i64], site)

    def shuffle(self, ctx, kind, word, lane_arg, mask, site):
        b, td = ctx.builder, ctx.target_data
        slots, half, nt = self._exchange(ctx, b.zext(word, I64), site)
        tlin = td["tlin"]
        lane = b.and_(tlin, ir.Constant(I32, 31))
        base = b.sub(tlin, lane)
        if kind == "bfly":
            src = b.xor(lane, lane_arg)
        elif kind == "down":
            src = b.add(lane, lane_arg)
        elif kind == "up":
            src = b.sub(lane, lane_arg)
        else:
            src = b.and_(lane_arg, ir.Constant(I32, 31))
        # Out-of-range sources (past the warp, or past the block's last thread) keep their own
        # value, as on the GPU.
        in_warp = b.and_(b.icmp_signed(">=", src, ir.Constant(I32, 0)),
                         b.icmp_signed("<", src, ir.Constant(I32, 32)))
        src_t = b.add(base, src)
        ok = b.and_(in_warp, b.icmp_signed("<", src_t, nt))
        src_t = b.select(ok, src_t, tlin)
        self._check_shuffle_source(ctx, mask, lane, b.select(ok, src, lane), src_t, site)
        return self.fetch_word(ctx, slots, half, src_t, 0)

    def _check_shuffle_source(self, ctx, mask, lane, src, src_t, site):
        """The GPU gives an undefined value when the source lane has returned or is not in
        the mask, and is undefined when the calling lane is not in it: errors
        SHUFFLE_SOURCE_GONE and MASK_NAMES_GONE."""
        b = ctx.builder
        src_in_mask = b.trunc(b.lshr(mask, src), I1)
        bad_source = b.or_(b.not_(src_in_mask), b.not_(self.lane_running(ctx, src_t)))
        with b.if_then(bad_source, likely=False):
            self.fail(ctx, abi.SHUFFLE_SOURCE_GONE, site, b.zext(src, I64))
        with b.if_then(b.not_(b.trunc(b.lshr(mask, lane), I1)), likely=False):
            self.fail(ctx, abi.MASK_NAMES_GONE, site, b.zext(mask, I64))

    RETURNED_WORD = 14   # of a thread's half-1 slot: -1 while it runs, then its warp-op count

    def _returned_word(self, ctx, b, thread=None):
        nt = self.ctx_slot(ctx, abi.BLOCK, b)
        for k in (1, 2):
            nt = b.mul(nt, self.ctx_slot(ctx, abi.BLOCK + k, b))
        thread = ctx.target_data["tlin"] if thread is None else thread
        idx = b.add(b.mul(b.add(b.trunc(nt, I32), thread), ir.Constant(I32, self.SLOT_WORDS)),
                    ir.Constant(I32, self.RETURNED_WORD))
        slots = b.inttoptr(self.ctx_slot(ctx, abi.EXCHANGE_PTR, b), I64.as_pointer())
        return b.gep(slots, [idx])

    def mark_running(self, ctx):
        """At the body's start (once the body is complete: no builder is inside it any more),
        not in the entry, which runs when the coroutine is created, before a cluster's
        scheduler points EXCHANGE_PTR at this block's words: this thread has not returned."""
        start = ir.IRBuilder()
        start.position_at_start(ctx.target_data["body"])
        start.store(ir.Constant(I64, -1), self._returned_word(ctx, start))

    def lane_running(self, ctx, thread):
        """i1: block thread `thread` takes part in the current warp operation: it has not
        returned, or returned after this operation (its state cannot tell: a lane may finish
        before the others have read the operation's words)."""
        b = ctx.builder
        done = b.load(self._returned_word(ctx, b, thread))
        k = b.zext(ctx.target_data["warp_op_index"], I64)
        return b.icmp_unsigned(">", done, k)      # -1: still running

    def check_warp_mask(self, ctx, mask, present, exists, site):
        """A warp operation whose mask names a lane that has returned (present: the lanes at
        the operation, exists: the warp's lanes in the block), or that the calling lane is not
        in, is undefined on the GPU: error MASK_NAMES_GONE (value: the mask)."""
        b = ctx.builder
        lane = b.and_(ctx.target_data["tlin"], ir.Constant(I32, 31))
        returned = b.and_(exists, b.not_(present))
        names_returned = b.icmp_unsigned("!=", b.and_(mask, returned), ir.Constant(I32, 0))
        caller_outside = b.not_(b.trunc(b.lshr(mask, lane), I1))
        with b.if_then(b.or_(names_returned, caller_outside), likely=False):
            self.fail(ctx, abi.MASK_NAMES_GONE, site, b.zext(mask, I64))

    PRESENT = 2   # bit of a lane's first exchange word: it takes part (cleared when it returns)

    def vote(self, ctx, kind, pred, mask, site):
        b, td = ctx.builder, ctx.target_data
        flag = b.or_(b.zext(pred, I64), ir.Constant(I64, self.PRESENT))
        slots, half, nt = self._exchange(ctx, flag, site)
        tlin = td["tlin"]
        base = b.sub(tlin, b.and_(tlin, ir.Constant(I32, 31)))
        ballot = present = exists = ir.Constant(I32, 0)
        for lane in range(32):   # unrolled: 32 loads, no loop blocks needed
            t = b.add(base, ir.Constant(I32, lane))
            live = b.icmp_signed("<", t, nt)
            safe = b.select(live, t, tlin)
            running = b.and_(live, self.lane_running(ctx, safe))   # a returned lane's word is
            word = b.select(running, self.fetch_word(ctx, slots, half, safe, 0),   # stale
                            ir.Constant(I32, 0))
            ballot = b.or_(ballot, b.shl(b.and_(word, ir.Constant(I32, 1)),
                                         ir.Constant(I32, lane)))
            present = b.or_(present, b.shl(b.zext(running, I32), ir.Constant(I32, lane)))
            exists = b.or_(exists, b.shl(b.zext(live, I32), ir.Constant(I32, lane)))
        self.check_warp_mask(ctx, mask, present, exists, site)
        if kind == "ballot":
            return ballot
        if kind == "any_sync":
            return b.icmp_unsigned("!=", ballot, ir.Constant(I32, 0))
        return b.icmp_unsigned("==", ballot, present)   # lanes that returned do not vote

    def clear_warp_flag(self, ctx, b):
        """At a thread's return: zero its first word of the half the warp's next operation
        uses, so the lanes still running see that it takes no part (not PRESENT, votes 0)."""
        counter = ctx.target_data.get("warp_counter")
        if counter is None:
            return
        td = ctx.target_data
        nt = self.ctx_slot(ctx, abi.BLOCK, b)
        for k in (1, 2):
            nt = b.mul(nt, self.ctx_slot(ctx, abi.BLOCK + k, b))
        half = b.mul(b.and_(b.load(counter), ir.Constant(I32, 1)), b.trunc(nt, I32))
        slots = b.inttoptr(self.ctx_slot(ctx, abi.EXCHANGE_PTR, b), I64.as_pointer())
        mine = b.mul(b.add(half, td["tlin"]), ir.Constant(I32, self.SLOT_WORDS))
        b.store(ir.Constant(I64, 0), b.gep(slots, [mine]))
        b.store(b.zext(b.load(counter), I64), self._returned_word(ctx, b))

    @staticmethod
    def constant_table(ctx, init: ir.Constant) -> ir.GlobalVariable:
        """A pk.const_array: a read-only global of the JIT-compiled module."""
        gv = ir.GlobalVariable(ctx.module, init.type, ctx.module.get_unique_name("const_table"))
        gv.initializer, gv.global_constant, gv.linkage, gv.align = init, True, "internal", 16
        return gv

    # --- shared memory -------------------------------------------------------------------------
    def shared_array(self, ctx, aty, align=16):
        """Offsets from the shared base (what swizzles and wgmma descriptors see) are aligned:
        the dynamic part before the static arrays is a runtime size, so an array aligned
        beyond 16 bytes rounds its offset up at run time, within align - 16 reserved bytes."""
        b = ctx.builder
        offset = (ctx.shared_bytes + 15) // 16 * 16
        ctx.shared_bytes = offset + (align - 16) + aty.count * aty.elem.nbytes
        rel = b.add(self.ctx_slot(ctx, abi.DYN_BYTES), ir.Constant(I64, offset))
        if align > 16:
            rel = b.and_(b.add(rel, ir.Constant(I64, align - 1)), ir.Constant(I64, -align))
        addr = b.add(self.ctx_slot(ctx, abi.SHARED_PTR), rel)
        return b.inttoptr(addr, aty.elem.storage.as_pointer())

    def dynamic_shared(self, ctx, elem):
        b = ctx.builder
        ptr = b.inttoptr(self.ctx_slot(ctx, abi.SHARED_PTR), elem.storage.as_pointer())
        return ptr, self.ctx_slot(ctx, abi.DYN_BYTES)

    # --- checked memory access -----------------------------------------------------------------
    def check_address(self, ctx, ptr, elem, origin, site, nbytes=None):
        if origin is None:
            return ptr
        b = ctx.builder
        addr = b.ptrtoint(ptr, I64)
        lo, hi = self._extent(ctx, origin)
        size = (nbytes if isinstance(nbytes, ir.Value)     # a runtime size (bulk copies)
                else ir.Constant(I64, nbytes or elem.nbytes))
        ok = b.and_(b.icmp_unsigned(">=", addr, lo),
                    b.icmp_unsigned("<=", b.add(addr, size), hi))
        bad_bb, ok_bb = ctx.append_block("oob"), ctx.append_block("inbounds")
        entry_bb = b.block
        b.cbranch(ok, ok_bb, bad_bb)
        b.position_at_end(bad_bb)
        self.fail(ctx, 1, site, b.sub(addr, lo))
        scratch = b.inttoptr(self.ctx_slot(ctx, abi.SCRATCH_PTR), ptr.type)
        bad_end = b.block
        b.branch(ok_bb)
        b.position_at_end(ok_bb)
        phi = b.phi(ptr.type)
        phi.add_incoming(ptr, entry_bb)
        phi.add_incoming(scratch, bad_end)
        return phi

    def tracks_pointer_bounds(self, ctx):
        return True               # every access is checked on this target

    def pointer_bounds(self, ctx, origin):
        lo, hi = self._extent(ctx, origin)
        b = ctx.builder
        return b.inttoptr(lo, I8P), b.sub(hi, lo)

    def _extent(self, ctx, origin):
        b = ctx.builder
        kind = origin[0]
        if kind == "param":
            ext = b.inttoptr(self.ctx_slot(ctx, abi.EXTENTS_PTR), I64.as_pointer())
            lo = b.load(b.gep(ext, [ir.Constant(I64, 2 * origin[1])]))
            n = b.load(b.gep(ext, [ir.Constant(I64, 2 * origin[1] + 1)]))
            return lo, b.add(lo, n)
        lo = b.ptrtoint(origin[1], I64)
        n = origin[2] if not isinstance(origin[2], int) else ir.Constant(I64, origin[2])
        return lo, b.add(lo, n)

    def check_index(self, ctx, index, extent, make_site):
        """An n-d array index (i64) against its extent (always on this target): a bad one
        records error 10 with the index and extent and reads element 0 instead."""
        b = ctx.builder
        bad = b.icmp_unsigned(">=", index, extent)
        with b.if_then(bad, likely=False):
            base = ctx.target_data["ctx"]
            first = b.icmp_signed("==", b.load(b.gep(base, [ir.Constant(I64, abi.ERROR_CODE)])),
                                  ir.Constant(I64, 0))
            with b.if_then(first):
                b.store(extent, b.gep(base, [ir.Constant(I64, abi.ERROR_EXTENT)]))
            self.fail(ctx, 10, make_site(), index)
        return b.select(bad, ir.Constant(I64, 0), index)

    def fail(self, ctx, code, site, value):
        """Record the first error of this worker (kernel keeps running on scratch memory): a
        call of the module's one recorder, not its body at each of the hundreds of checks a
        kernel has (that body, inlined, was a quarter of lowering a large kernel and grew every
        later stage)."""
        ctx.builder.call(_error_recorder(ctx.module),
                         [ctx.target_data["ctx"], ir.Constant(I64, code), ir.Constant(I64, site),
                          value, ctx.target_data["tlin"]])

    def device_print(self, ctx, fmt: str, args: list) -> None:
        """print() in a kernel (lower/printing.py): C printf, flushed at once so the lines
        keep their order with the host's output (the runtime flushes sys.stdout first)."""
        b, m = ctx.builder, ctx.module
        i8p = ir.IntType(8).as_pointer()
        printf = m.globals.get("printf") or ir.Function(
            m, ir.FunctionType(ir.IntType(32), [i8p], var_arg=True), "printf")
        fflush = m.globals.get("fflush") or ir.Function(
            m, ir.FunctionType(ir.IntType(32), [i8p]), "fflush")
        b.call(printf, [self.print_string(ctx, fmt)] + args)
        b.call(fflush, [ir.Constant(i8p, None)])

    @staticmethod
    def print_string(ctx, text: str) -> ir.Value:
        """A constant string as printf takes it."""
        return ctx.constant_string(text)

    def load(self, ctx, ptr, elem, readonly):
        return ctx.builder.load(ptr, align=elem.nbytes)

    def store(self, ctx, ptr, raw, elem):
        ctx.builder.store(raw, ptr, align=elem.nbytes)

    def load_vector(self, ctx, addr, vec_ty, site, l2_fetch=0):
        ptr = self.check_address(ctx, addr.ptr, addr.elem, addr.origin, site,
                                 vec_ty.count * addr.elem.nbytes)
        self._check_vector_alignment(ctx, ptr, vec_ty.count * addr.elem.nbytes, site)
        b = ctx.builder
        return b.load(b.bitcast(ptr, vec_ty.as_pointer()), align=addr.elem.nbytes)

    def store_vector(self, ctx, addr, vec, site):
        ptr = self.check_address(ctx, addr.ptr, addr.elem, addr.origin, site,
                                 vec.type.count * addr.elem.nbytes)
        self._check_vector_alignment(ctx, ptr, vec.type.count * addr.elem.nbytes, site)
        b = ctx.builder
        b.store(vec, b.bitcast(ptr, vec.type.as_pointer()), align=addr.elem.nbytes)

    def _check_vector_alignment(self, ctx, ptr, nbytes: int, site):
        """ld/st.v2/.v4 need an address aligned to the whole vector: the GPU raises a
        misaligned-address fault (killing the context) where x86 just loads, so the CPU
        target reports it at the kernel's line instead (error 18)."""
        b = ctx.builder
        offset = b.and_(b.ptrtoint(ptr, I64), ir.Constant(I64, nbytes - 1))
        with b.if_then(b.icmp_unsigned("!=", offset, ir.Constant(I64, 0)), likely=False):
            self.fail(ctx, abi.MISALIGNED_VECTOR, site, offset)

    def cp_async(self, ctx, dst, src, size, src_size, site):
        """The copy happens now: size bytes (bounds-checked), or the first src_size of them
        and zeros."""
        b = ctx.builder
        bytes_ty = ir.VectorType(ir.IntType(8), size)
        dptr = self.check_address(ctx, dst.ptr, dst.elem, dst.origin, site, size)
        if src_size is None:
            sptr = self.check_address(ctx, src.ptr, src.elem, src.origin, site, size)
            data = b.load(b.bitcast(sptr, bytes_ty.as_pointer()), align=1)
        else:
            sptr = b.bitcast(src.ptr, ir.IntType(8).as_pointer())
            slot = ctx.alloca(bytes_ty, "cp.bytes")
            b.store(ir.Constant(bytes_ty, None), slot)
            for k in range(size):
                with b.if_then(b.icmp_unsigned(">", src_size.ir, ir.Constant(I32, k))):
                    byte = b.load(b.gep(sptr, [ir.Constant(I32, k)]))
                    b.store(b.insert_element(b.load(slot), byte, ir.Constant(I32, k)), slot)
            data = b.load(slot)
        b.store(data, b.bitcast(dptr, bytes_ty.as_pointer()), align=1)

    def cp_async_commit(self, ctx):
        pass   # copies are complete when issued

    def cp_async_wait(self, ctx, n: int):
        pass

    def syncwarp(self, ctx, site):
        self.suspend(ctx, abi.AT_WARP_OP, site)

    def atomic(self, ctx, op, ptr, vals, elem):
        b = ctx.builder
        if op == "cas":
            return b.extract_value(b.cmpxchg(ptr, vals[0], vals[1], "seq_cst", "seq_cst"), 0)
        rmw = {"add": "fadd" if elem.is_float else "add", "exch": "xchg",
               "max": "fmax" if elem.is_float else ("max" if elem.is_signed else "umax"),
               "min": "fmin" if elem.is_float else ("min" if elem.is_signed else "umin")}[op]
        return b.atomic_rmw(rmw, ptr, vals[0], "seq_cst")

    def assert_fail(self, ctx, site):
        self.fail(ctx, 4, site, ir.Constant(I64, 0))
        ctx.builder.branch(ctx.exit_block)


def _error_recorder(module: ir.Module) -> ir.Function:
    """`__pk_record_error(ctx, code, site, value, tlin)`: the first error of this worker wins
    (ctx[ERROR_CODE] == 0); a cold, never-inlined function of the module."""
    name = "__pk_record_error"
    if name in module.globals:
        return module.globals[name]
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [I64.as_pointer(), I64, I64, I64,
                                                             I32]), name)
    fn.linkage = "internal"
    fn.attributes.add("noinline")
    fn.attributes.add("cold")
    base, code, site, value, tlin = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    slot = b.gep(base, [ir.Constant(I64, abi.ERROR_CODE)])
    with b.if_then(b.icmp_signed("==", b.load(slot), ir.Constant(I64, 0))):
        b.store(code, slot)
        b.store(site, b.gep(base, [ir.Constant(I64, abi.ERROR_SITE)]))
        b.store(value, b.gep(base, [ir.Constant(I64, abi.ERROR_VALUE)]))
        b.store(b.zext(tlin, I64), b.gep(base, [ir.Constant(I64, abi.ERROR_THREAD)]))
    b.ret_void()
    return fn
