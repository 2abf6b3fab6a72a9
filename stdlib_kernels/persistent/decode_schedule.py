"""Host side of the persistent decode step: one token of a llama-style decoder as a chain of
stages cut into work items (the kernel is decode.py's), and the flat buffers it reads.

    shape = DecodeShape(n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_ctx)
    sched = decode_schedule(shape, tile_rows=16)
    flat = pack_decode_weights(sched, {"token_embd": ..., "blk.0.qkv": ..., ...})

Stages, in order (each reads all of the previous stage's output, so each item waits for every
tile of the stage before it: the chain of schedule.py, checked by its validate_chain):

    EMBED      x = token_embd[token]                            row tiles of n_embd
    per layer:
      GEMV     qkv = Wqkv @ rmsnorm(x, attn_norm)               row tiles of q+k+v rows
      ROPE_KV  k head: RoPE -> cache_k[pos]; v head -> cache_v[pos];
               its group's q heads: RoPE -> qrot                one item per KV head
      ATTN     attn[h] = softmax(q_h K^T * scale) V             one item per query head
      GEMV     x += Wo @ attn                                   row tiles of n_embd (residual)
      GLU      act = silu(Wg @ h) * (Wu @ h), h = rmsnorm(x, ffn_norm)   row tiles of n_ff
      GEMV     x += Wdown @ act                                 row tiles of n_embd (residual)
    GEMV       logits = Wout @ rmsnorm(x, output_norm)          row tiles of n_vocab

The norms are fused into the GEMV / GLU items that read them (every such item recomputes the
RMS of x, n_embd values: one norm item would serialise the grid on one block twice a layer).
x is updated in place by the residual tiles: row r is read and written by the one warp that
owns it, and every other reader of x (the normed stages) finished before (the chain).

Tables: items int32 (n_items, ITEM_COLS) exactly as schedule.py's; stages int64 (n_stages,
STAGE_COLS): kind | w | w2 | x | y | n_in | n_out | norm | residual | layer (offsets in floats
into the flat weight buffer (w, w2, norm: -1 none) or the activation buffer (x, y; ATTN keeps
its scores at w2)). Offsets are int64 (an 8B model's f32 weights pass 2^31 floats) and
multiples of 4 floats, so 16-byte vector loads stay aligned.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .schedule import ALIGN, FIRST_STAGE_COUNTER, ITEM_COLS, NO_WAIT, ItemTables, validate_chain

# item kinds (the kernel's dispatch table switches on these)
EMBED, GEMV, GLU, ROPE_KV, ATTN = 0, 1, 2, 3, 4
KIND_NAMES = {EMBED: "embed", GEMV: "gemv", GLU: "glu", ROPE_KV: "rope_kv", ATTN: "attn"}
STAGE_COLS = 10
KIND, W, W2, X, Y, N_IN, N_OUT, NORM, RESIDUAL, LAYER = range(STAGE_COLS)
NO_NORM = -1


@dataclass(frozen=True)
class DecodeShape:
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    n_ctx: int              # KV cache rows per layer and head

    def __post_init__(self):
        for name, value in vars(self).items():
            if int(value) < 1:
                raise ValueError(f"DecodeShape: {name} must be positive, got {value}")
        if self.n_head % self.n_head_kv:
            raise ValueError(f"DecodeShape: n_head {self.n_head} is not a multiple of "
                             f"n_head_kv {self.n_head_kv}")

    @property
    def q_rows(self) -> int:
        return self.n_head * self.head_dim

    @property
    def kv_rows(self) -> int:
        return self.n_head_kv * self.head_dim

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """Name -> shape of every tensor the step reads, in buffer order."""
        e = self.n_embd
        shapes = {"token_embd": (self.n_vocab, e)}
        for il in range(self.n_layer):
            shapes.update({f"blk.{il}.attn_norm": (e,),
                           f"blk.{il}.qkv": (self.q_rows + 2 * self.kv_rows, e),
                           f"blk.{il}.attn_out": (e, self.q_rows),
                           f"blk.{il}.ffn_norm": (e,),
                           f"blk.{il}.gate_up": (2 * self.n_ff, e),   # gate rows, then up
                           f"blk.{il}.down": (e, self.n_ff)})
        shapes.update({"output_norm": (e,), "output": (self.n_vocab, e)})
        return shapes


@dataclass(frozen=True)
class DecodeSchedule(ItemTables):
    shape: DecodeShape
    items: np.ndarray                       # int32 (n_items, ITEM_COLS)
    stages: np.ndarray                      # int64 (n_stages, STAGE_COLS)
    weights: dict[str, tuple[int, tuple]]   # name -> (offset, shape) in the flat weights
    acts: dict[str, tuple[int, int]]        # name -> (offset, floats) in the activations
    weight_elems: int
    act_elems: int



def _round_up(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _layout(sizes: dict) -> tuple[dict, int]:
    out, off = {}, 0
    for name, size in sizes.items():
        out[name] = off
        off += _round_up(size)
    return out, off


def decode_schedule(shape: DecodeShape, tile_rows: int = 16) -> DecodeSchedule:
    """The stages and items of one decode token (module docstring), tiles of tile_rows rows."""
    if tile_rows < 1:
        raise ValueError(f"decode_schedule: tile_rows must be positive, got {tile_rows}")
    s = shape
    w_shapes = s.weight_shapes()
    w_off, weight_elems = _layout({k: int(np.prod(v)) for k, v in w_shapes.items()})
    a_off, act_elems = _layout({"x": s.n_embd, "qkv": s.q_rows + 2 * s.kv_rows,
                                "qrot": s.q_rows, "attn": s.q_rows, "ffn": s.n_ff,
                                "logits": s.n_vocab, "scores": s.n_head * s.n_ctx})
    stages = []

    def stage(kind, n_out, w=-1, w2=-1, x=-1, y=-1, n_in=0, norm=NO_NORM, residual=0,
              layer=0):
        stages.append((kind, w, w2, x, y, n_in, n_out, norm, residual, layer))

    e = s.n_embd
    stage(EMBED, e, w=w_off["token_embd"], y=a_off["x"], n_in=e)
    for il in range(s.n_layer):
        blk = f"blk.{il}."
        stage(GEMV, s.q_rows + 2 * s.kv_rows, w=w_off[blk + "qkv"], x=a_off["x"],
              y=a_off["qkv"], n_in=e, norm=w_off[blk + "attn_norm"])
        stage(ROPE_KV, s.n_head_kv, x=a_off["qkv"], y=a_off["qrot"], layer=il)
        stage(ATTN, s.n_head, w2=a_off["scores"], x=a_off["qrot"], y=a_off["attn"], layer=il)
        stage(GEMV, e, w=w_off[blk + "attn_out"], x=a_off["attn"], y=a_off["x"],
              n_in=s.q_rows, residual=1)
        gate = w_off[blk + "gate_up"]
        stage(GLU, s.n_ff, w=gate, w2=gate + s.n_ff * e, x=a_off["x"], y=a_off["ffn"], n_in=e,
              norm=w_off[blk + "ffn_norm"])
        stage(GEMV, e, w=w_off[blk + "down"], x=a_off["ffn"], y=a_off["x"], n_in=s.n_ff,
              residual=1)
    stage(GEMV, s.n_vocab, w=w_off["output"], x=a_off["x"], y=a_off["logits"], n_in=e,
          norm=w_off["output_norm"])
    items = _items(stages, tile_rows)
    table = np.array(stages, np.int64).reshape(-1, STAGE_COLS)
    weights = {k: (w_off[k], v) for k, v in w_shapes.items()}
    acts = {"x": (a_off["x"], e), "logits": (a_off["logits"], s.n_vocab)}
    sched = DecodeSchedule(shape, items, table, weights, acts, weight_elems, act_elems)
    validate_decode(sched)
    return sched


def _items(stages: list, tile_rows: int) -> np.ndarray:
    """Row tiles (GEMV, GLU, EMBED) or one item per head (ROPE_KV, ATTN), stage by stage,
    each waiting for all the items of the stage before."""
    items, prev_items = [], 0
    for index, st in enumerate(stages):
        kind, n_out = st[KIND], st[N_OUT]
        step = 1 if kind in (ROPE_KV, ATTN) else tile_rows
        wait = (NO_WAIT, 0) if index == 0 else (FIRST_STAGE_COUNTER + index - 1, prev_items)
        tiles = [(lo, min(lo + step, n_out)) for lo in range(0, n_out, step)]
        items += [(index, lo, hi, *wait, FIRST_STAGE_COUNTER + index) for lo, hi in tiles]
        prev_items = len(tiles)
    return np.array(items, np.int32).reshape(-1, ITEM_COLS)


def validate_decode(sched: DecodeSchedule) -> None:
    """The chain's checks (schedule.validate_chain), plus: every GEMV / GLU stage's norm and
    matrices inside the weight buffer."""
    validate_chain(sched.items, sched.stages[:, N_OUT].tolist(), sched.counters)
    for index, st in enumerate(sched.stages.tolist()):
        if st[KIND] in (GEMV, GLU):
            rows = st[N_OUT] * (2 if st[KIND] == GLU else 1)
            if st[W] < 0 or st[W] + rows * st[N_IN] > sched.weight_elems:
                raise ValueError(f"decode stage {index}: matrix outside the weight buffer")


def pack_decode_weights(sched: DecodeSchedule, tensors: dict) -> np.ndarray:
    """The flat f32 weight buffer from name -> array (DecodeShape.weight_shapes' names and
    shapes; "output" may be the embedding table itself: a tied LM head)."""
    flat = np.zeros(sched.weight_elems, np.float32)
    missing = sorted(set(sched.weights) - set(tensors))
    if missing:
        raise ValueError(f"pack_decode_weights: missing tensors {missing}")
    for name, (off, shape) in sched.weights.items():
        value = np.asarray(tensors[name], np.float32)
        if value.shape != shape:
            raise ValueError(f"pack_decode_weights: {name} must be {shape}, got {value.shape}")
        flat[off:off + value.size] = value.reshape(-1)
    return flat
