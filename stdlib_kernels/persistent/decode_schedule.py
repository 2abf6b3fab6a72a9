"""Host side of the persistent decode step: one token of a llama-style decoder as a chain of
stages cut into work items (the kernel is decode.py's), and where each weight lies in the one
byte buffer it reads (decode_weights.py packs it).

    shape = DecodeShape(n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_ctx)
    sched = decode_schedule(shape, tile_rows=16, formats={"blk.0.qkv": (("Q4_K", 96),
                                                                         ("Q6_K", 32)), ...})

Stages, in order (each reads all of the previous stage's output, so each item waits for every
tile of the stage before it: the chain of schedule.py, checked by its validate_chain):

    EMBED      x = token_embd[token]                            row tiles of n_embd
    per layer:
      QUANT    xq_x = Q8_1(rmsnorm(x, attn_norm))               tiles of QUANT_TILE blocks
      GEMV     qkv = Wqkv @ xq_x                                row tiles of q+k+v rows
      ATTN     attn[h] = softmax(rope(q_h) K^T * scale) V,      attn_splits items per query
               K/V row pos = rope(k), v of this token;          head (flash-decoding splits,
               xq_attn = Q8_1(attn) by each head's merge        decode_attn.py)
      GEMV     x += Wo @ xq_attn                                row tiles of n_embd (residual)
      QUANT    xq_x = Q8_1(rmsnorm(x, ffn_norm))
      GLU      act = silu(Wg @ xq_x) * (Wu @ xq_x),             row tiles of n_ff
               xq_ffn = Q8_1(act) per 32-row block by the item
               completing it
      GEMV     x += Wdown @ xq_ffn                              row tiles of n_embd (residual)
    QUANT      xq_x = Q8_1(rmsnorm(x, output_norm))
    GEMV       logits = Wout @ xq_x                             row tiles of n_vocab

A QUANT stage stands before a GEMV / GLU stage whose matrix has a quantized row group: its
items write the matrix's input once, normed where the matrix has a norm and rounded to Q8_1,
into the xq buffer (u32 words, XQ), and the matrix's row items start with their dot products
(before, every row item recomputed the norm and the Q8_1 input, 2.4-4 us of a 4-6 us item on
an H200, RESULTS.md). It costs one short link per such matrix: a QUANT item is the RMS of x
(each item reads all of x, in the decode graph's order, so every item gets the same rstd) and
one Q8_1 block per warp. The O-projection's input needs none when head_dim is a multiple of
32: the attention's merge writes each head's Q8_1 blocks. Nor does the down projection's: its
input (the GLU output, no norm) is written by the GLU items (Q_OUT), each writing the 32-row
blocks inside its rows and, of a block shared with other items, the last to arrive on the
block's counter (q8_groups counters after the heads'), before it publishes. And a normed input
of x of at most fold_norm_blocks blocks (the default 32: SmolLM2-135M's 18) has none either:
the stage writing x before it (embed, o, down) publishes through an acq_rel arrival, and its
last item to arrive (N_ITEMS) writes the input and publishes again (the next stage waits for
N_ITEMS + 1: extra_arrivals). Links per layer: 8 with every QUANT stage (qkv_in, qkv, attn, o,
gate_up_in, gate_up, down_in, down), 7 with the GLU fold, 5 with both (qkv, attn, o, gate_up,
down); o_in adds one when head_dim is not whole blocks. A matrix of F32 rows only has no QUANT
stage: its items norm x themselves (the F32 dot reads x * rstd * w per value). Stage names
(`stage_names`: embed, qkv_in, qkv, attn, [o_in,] o, ..., lm_head) label the profile.
x is updated in place by the residual tiles: row r is read and written by the one warp that
owns it, and every other reader of x (the normed stages) finished before (the chain). The xq
regions are reused by every layer: the chain orders each write after the last read before it.

Weights: every matrix is one or two row groups of GGUF types (the runner's DeviceMatrix: q|k
Q4_K and v Q6_K in one qkv matrix); a group's rows lie back to back in the buffer, each group
16-byte aligned. Matrix row r is in group A (rows < SPLIT) at W + r ROW_BYTES, or in group B at
W_B + (r - SPLIT) ROW_BYTES_B. A GLU stage's matrix is gate|up: gate row r is matrix row r, up
row r is matrix row n_ff + r. Norm vectors are F32.

Tables: items int32 (n_items, ITEM_COLS) exactly as schedule.py's; stages int64 (n_stages,
STAGE_COLS): kind | w | w2 | x | y | n_in | n_out | norm | residual | layer | fmt | row_bytes |
split | fmt_b | w_b | row_bytes_b | xq | part | n_split | split_rows | q_out. w, w_b, norm:
byte offsets into the weight buffer (-1 none); x, y: float offsets into the activation buffer
(multiples of 4 floats: 16-byte vector loads); ATTN keeps its scores at w2 (floats, activation
buffer); fmt: a ggml type id (formats.py); xq: word offset into the xq buffer (u32,
XQ_ALIGN-word aligned) of a GEMV / GLU stage's Q8_1 input or of the Q8_1 a QUANT stage writes
(-1 none; QUANT's y is the same);
q_out: word offset of the Q8_1 copy of a GLU stage's output its items write (-1 none).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..quant.formats import F32, get_format
from .schedule import ALIGN, FIRST_STAGE_COUNTER, ITEM_COLS, NO_WAIT, ItemTables, validate_chain

# item kinds (the kernel's dispatch table switches on these)
EMBED, GEMV, GLU, ATTN, QUANT = 0, 1, 2, 3, 4
KIND_NAMES = {EMBED: "embed", GEMV: "gemv", GLU: "glu", ATTN: "attn", QUANT: "quant"}
STAGE_COLS = 23
(KIND, W, W2, X, Y, N_IN, N_OUT, NORM, RESIDUAL, LAYER, FMT, ROW_BYTES, SPLIT, FMT_B, W_B,
 ROW_BYTES_B, XQ, PART, N_SPLIT, SPLIT_ROWS, Q_OUT, Q_NORM, N_ITEMS) = range(STAGE_COLS)
MAX_HEAD_DIM = 256       # an ATTN item's q, k and v rows in shared memory
MAX_SPLITS = 32          # attention splits per head (the merge's shared weights)
QUANT_TILE = 8           # Q8_1 blocks a QUANT item writes: one per warp of decode.WARPS
FOLD_NORM_BLOCKS = 32    # normed Q8_1 inputs of at most this many blocks (4 a warp) are folded
Q8_1_WORDS = 9           # u32 words of one Q8_1 block (32 values): d, s as f16x2, 32 int8
XQ_ALIGN = 32            # xq regions start on 128-byte lines
NO_NORM = -1
BYTE_ALIGN = 16
# the formats the step's items read (decode_rows.py's dispatch): F32, and the DP4A dots' types
# on Q8_1 activations (stdlib quant's item_dot_q8)
WEIGHT_FORMATS = ("F32", "Q8_0", "Q4_1", "Q4_K", "Q6_K")
Q8_1_FORMATS = WEIGHT_FORMATS[1:]


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
class WeightPlace:
    """Where one tensor lies in the weight buffer: its row groups (type name, rows, byte
    offset, bytes per row), in row order."""
    shape: tuple
    groups: tuple

    @property
    def offset(self) -> int:
        return self.groups[0][2]


@dataclass(frozen=True)
class DecodeSchedule(ItemTables):
    shape: DecodeShape
    items: np.ndarray                       # int32 (n_items, ITEM_COLS)
    stages: np.ndarray                      # int64 (n_stages, STAGE_COLS)
    weights: dict[str, WeightPlace]         # name -> its place in the weight buffer
    acts: dict[str, tuple[int, int]]        # name -> (offset, floats) in the activations
    weight_bytes: int
    act_elems: int
    xq_words: int                           # u32 words of the xq buffer (the Q8_1 inputs)
    stage_names: tuple                      # per stage: embed, qkv_in, qkv, ..., lm_head
    attn_splits: int                        # ATTN items per query head
    split_rows: int                         # their granule (decode_attn.split_len)

    @property
    def q8_groups(self) -> int:
        """Arrival counters of the Q8_1 blocks a GLU stage writes of its output (Q_OUT): one
        per 32 rows of n_ff, shared by the layers; 0 when no stage writes one."""
        return self.shape.n_ff // 32 if (self.stages[:, Q_OUT] >= 0).any() else 0

    @property
    def counters(self) -> int:
        """The chain's counters, one arrival counter per query head (the ATTN merge), then
        one per Q8_1 block of the GLU output (q8_groups)."""
        return FIRST_STAGE_COUNTER + self.n_stages + self.shape.n_head + self.q8_groups


def _round_up(n: int, m: int = ALIGN) -> int:
    return (n + m - 1) // m * m


def _groups_of(name: str, shape: tuple, formats: dict) -> tuple:
    """(type, rows) pairs of a tensor: formats[name] or F32 whole; vectors are always F32."""
    if len(shape) == 1:                   # a vector: one F32 row
        return (("F32", 1),)
    groups = tuple((str(t), int(r)) for t, r in formats.get(name, (("F32", shape[0]),)))
    if not 1 <= len(groups) <= 2 or sum(r for _, r in groups) != shape[0]:
        raise ValueError(f"decode_schedule: {name} must be one or two row groups covering its "
                         f"{shape[0]} rows, got {groups}")
    for type_name, _ in groups:
        if type_name not in WEIGHT_FORMATS:
            raise ValueError(f"decode_schedule: {name} is {type_name}; the persistent step "
                             f"reads {', '.join(WEIGHT_FORMATS)}")
        if shape[1] % get_format(type_name).block_elems:
            raise ValueError(f"decode_schedule: {name} rows of {shape[1]} values are not whole "
                             f"{type_name} blocks")
    if name == "token_embd" and len(groups) != 1:
        raise ValueError("decode_schedule: token_embd must be one row group")
    return groups


def _weight_layout(shape: DecodeShape, formats: dict) -> tuple[dict, int]:
    places, off = {}, 0
    for name, dims in shape.weight_shapes().items():
        groups = []
        for type_name, rows in _groups_of(name, dims, formats):
            fmt = get_format(type_name)
            row_bytes = dims[-1] // fmt.block_elems * fmt.block_bytes
            groups.append((type_name, rows, off, row_bytes))
            off += _round_up(rows * row_bytes, BYTE_ALIGN)
        places[name] = WeightPlace(tuple(dims), tuple(groups))
    return places, off


def _act_layout(s: DecodeShape, splits: int) -> tuple[dict, int]:
    sizes = {"x": s.n_embd, "qkv": s.q_rows + 2 * s.kv_rows, "attn": s.q_rows, "ffn": s.n_ff,
             "logits": s.n_vocab, "scores": s.n_head * s.n_ctx,
             "parts": s.n_head * splits * (s.head_dim + 2)}     # per split: m, l, o

    out, off = {}, 0
    for name, size in sizes.items():
        out[name] = off
        off += _round_up(size)
    return out, off


def _xq_layout(s: DecodeShape) -> tuple[dict, int]:
    """Word offsets of the Q8_1 inputs (x normed: qkv, gate_up, lm_head; attn; ffn)."""
    out, off = {}, 0
    for name, size in (("x", s.n_embd), ("attn", s.q_rows), ("ffn", s.n_ff)):
        out[name] = off
        off += _round_up(size // 32 * Q8_1_WORDS, XQ_ALIGN)
    return out, max(off, XQ_ALIGN)


def _quantized(place: WeightPlace) -> bool:
    return any(type_name != "F32" for type_name, *_ in place.groups)


def _matrix_cols(place: WeightPlace) -> dict:
    """The stage columns of a matrix: its groups A and B (B = A when there is one)."""
    (ta, ra, wa, ba), *rest = place.groups
    tb, _, wb, bb = rest[0] if rest else (ta, 0, wa, ba)
    return {"w": wa, "fmt": get_format(ta).id, "row_bytes": ba,
            "split": ra if rest else place.shape[0], "fmt_b": get_format(tb).id, "w_b": wb,
            "row_bytes_b": bb}


def decode_schedule(shape: DecodeShape, tile_rows=16, formats: dict | None = None,
                    attn_splits: int = 8, split_rows: int = 16,
                    fold_norm_blocks: int = FOLD_NORM_BLOCKS) -> DecodeSchedule:
    """The stages and items of one decode token (module docstring), tiles of tile_rows rows
    (an int, or a dict: stage name (embed, qkv, o, gate_up, down, lm_head) -> rows, as
    decode_plan.plan_items gives); formats: matrix name -> ((type name, rows), ...) row groups
    (default: all F32); attn_splits ATTN items per query head, each at least split_rows cache
    rows long; fold_norm_blocks: a normed Q8_1 input of x of at most this many blocks is
    written by the last item of the residual (or embed) stage before it, not a QUANT stage
    (0: never)."""
    _check_sizes(shape, tile_rows, attn_splits, split_rows)
    s = shape
    places, weight_bytes = _weight_layout(s, formats or {})
    a_off, act_elems = _act_layout(s, attn_splits)
    xq_off, xq_words = _xq_layout(s)
    stages, names = [], []

    def stage(name, kind, n_out, w=-1, w2=-1, x=-1, y=-1, n_in=0, norm=NO_NORM, residual=0,
              layer=0, fmt=F32, row_bytes=0, split=0, fmt_b=F32, w_b=-1, row_bytes_b=0, xq=-1,
              part=-1, n_split=0, granule=0, q_out=-1):
        names.append(name)
        stages.append([kind, w, w2, x, y, n_in, n_out, norm, residual, layer, fmt, row_bytes,
                       split, fmt_b, w_b, row_bytes_b, xq, part, n_split, granule, q_out,
                       NO_NORM, 0])

    def fold_into_last(x, n_in, norm, xq) -> bool:
        """Whether the stage before (a residual GEMV or the embed, writing x) can write the
        normed Q8_1 input itself (its last item to arrive); if so, mark it."""
        last = stages[-1]
        if last[KIND] not in (GEMV, EMBED) or last[Y] != a_off[x] or norm == NO_NORM or \
                n_in // 32 > fold_norm_blocks:
            return False
        last[Q_OUT], last[Q_NORM] = xq, norm
        return True

    def matrix(label, kind, name, n_out, x, y, n_in, norm=None, residual=0, written=-1,
               q_out=-1):
        """A GEMV / GLU stage, after the QUANT stage of its Q8_1 input unless the stage before
        wrote it (written: its xq offset); q_out: where its items write their output's Q8_1
        blocks (-1: none)."""
        norm = NO_NORM if norm is None else places[norm].offset
        xq = -1
        if _quantized(places[name]):
            if n_in % 32:
                raise ValueError(f"decode_schedule: {name} is quantized; its input needs "
                                 f"whole Q8_1 blocks (32 values), got {n_in}")
            xq = xq_off[x]
            if written < 0 and not fold_into_last(x, n_in, norm, xq):
                stage(label + "_in", QUANT, n_in // 32, x=a_off[x], y=xq, n_in=n_in, norm=norm,
                      xq=xq)
        stage(label, kind, n_out, x=a_off[x], y=a_off[y], n_in=n_in, residual=residual,
              norm=norm, xq=xq, q_out=q_out, **_matrix_cols(places[name]))

    e = s.n_embd
    stage("embed", EMBED, e, y=a_off["x"], n_in=e, **_matrix_cols(places["token_embd"]))
    for il in range(s.n_layer):
        blk = f"blk.{il}."
        matrix("qkv", GEMV, blk + "qkv", s.q_rows + 2 * s.kv_rows, "x", "qkv", e,
               blk + "attn_norm")
        # the merge writes the O-projection's Q8_1 input per head when heads are whole blocks
        attn_xq = xq_off["attn"] if _quantized(places[blk + "attn_out"]) and \
            s.head_dim % 32 == 0 else -1
        stage("attn", ATTN, s.n_head * attn_splits, w2=a_off["scores"], x=a_off["qkv"],
              y=a_off["attn"], layer=il, xq=attn_xq, part=a_off["parts"],
              n_split=attn_splits, granule=split_rows)
        matrix("o", GEMV, blk + "attn_out", e, "attn", "x", s.q_rows, residual=1,
               written=attn_xq)
        # the GLU items write the down projection's Q8_1 input as its blocks complete
        ffn_xq = xq_off["ffn"] if _quantized(places[blk + "down"]) and s.n_ff % 32 == 0 else -1
        matrix("gate_up", GLU, blk + "gate_up", s.n_ff, "x", "ffn", e, blk + "ffn_norm",
               q_out=ffn_xq)
        matrix("down", GEMV, blk + "down", e, "ffn", "x", s.n_ff, residual=1, written=ffn_xq)
    matrix("lm_head", GEMV, "output", s.n_vocab, "x", "logits", e, "output_norm")
    items = _items(stages, names, tile_rows)
    table = np.array(stages, np.int64).reshape(-1, STAGE_COLS)
    table[:, N_ITEMS] = np.bincount(items[:, 0], minlength=len(stages))
    acts = {"x": (a_off["x"], e), "ffn": (a_off["ffn"], s.n_ff),
            "logits": (a_off["logits"], s.n_vocab)}
    sched = DecodeSchedule(s, items, table, places, acts, weight_bytes, act_elems, xq_words,
                           tuple(names), attn_splits, split_rows)
    validate_decode(sched)
    return sched


ROW_STAGES = ("embed", "qkv", "o", "gate_up", "down", "lm_head")


def _check_sizes(shape: DecodeShape, tile_rows, attn_splits: int, split_rows: int):
    sizes = tile_rows if isinstance(tile_rows, dict) else dict.fromkeys(ROW_STAGES, tile_rows)
    if set(sizes) != set(ROW_STAGES) or min(sizes.values()) < 1:
        raise ValueError(f"decode_schedule: tile_rows must be positive, one int or one per "
                         f"stage of {ROW_STAGES}, got {tile_rows}")
    if not 1 <= attn_splits <= MAX_SPLITS:
        raise ValueError(f"decode_schedule: attn_splits must be in 1..{MAX_SPLITS}, got "
                         f"{attn_splits}")
    if split_rows < 1:
        raise ValueError(f"decode_schedule: split_rows must be positive, got {split_rows}")
    if shape.head_dim > MAX_HEAD_DIM:
        raise ValueError(f"decode_schedule: head_dim {shape.head_dim} is over the attention "
                         f"items' {MAX_HEAD_DIM}")


def _items(stages: list, names: list, tile_rows) -> np.ndarray:
    """Row tiles (GEMV, GLU, EMBED: tile_rows, or tile_rows[stage name]), Q8_1 block tiles
    (QUANT) or one item per split of a head (ATTN), stage by stage, each waiting for all the
    items of the stage before (and for a stage whose last item writes the next input's Q8_1,
    its extra arrival: extra_arrivals)."""
    items, prev_items = [], 0
    for index, (st, name) in enumerate(zip(stages, names)):
        kind, n_out = st[KIND], st[N_OUT]
        if kind == ATTN:
            step = 1
        elif kind == QUANT:
            step = QUANT_TILE
        else:
            step = tile_rows[name] if isinstance(tile_rows, dict) else tile_rows
        wait = (NO_WAIT, 0) if index == 0 else (FIRST_STAGE_COUNTER + index - 1, prev_items)
        tiles = [(lo, min(lo + step, n_out)) for lo in range(0, n_out, step)]
        items += [(index, lo, hi, *wait, FIRST_STAGE_COUNTER + index) for lo, hi in tiles]
        prev_items = len(tiles) + extra_arrivals(st)
    return np.array(items, np.int32).reshape(-1, ITEM_COLS)


def extra_arrivals(st) -> int:
    """1 for a GEMV / EMBED stage writing the next input's normed Q8_1 (its last item to arrive
    publishes again when it is written), else 0 (a GLU stage's Q8_1 is written before its
    items publish)."""
    return 1 if st[Q_OUT] >= 0 and st[KIND] != GLU else 0


def validate_decode(sched: DecodeSchedule) -> None:
    """The chain's checks (schedule.validate_chain), plus: every GEMV / GLU stage's row groups
    inside the weight buffer, and a Q8_1 input (a quantized group) of whole Q8_1 blocks."""
    extra = [extra_arrivals(st) for st in sched.stages.tolist()]
    validate_chain(sched.items, sched.stages[:, N_OUT].tolist(), sched.counters, extra)
    s = sched.shape
    for index, st in enumerate(sched.stages.tolist()):
        if st[KIND] == QUANT and (st[XQ] < 0 or st[XQ] + st[N_OUT] * Q8_1_WORDS >
                                  sched.xq_words or st[N_OUT] * 32 != st[N_IN]):
            raise ValueError(f"decode stage {index}: Q8_1 blocks outside the xq buffer")
        writer = (st[KIND] == GLU and st[N_OUT] == s.n_ff) or \
            (st[KIND] in (GEMV, EMBED) and st[Q_NORM] >= 0 and st[N_OUT] == s.n_embd)
        if st[Q_OUT] >= 0 and (not writer or st[N_OUT] % 32 or
                               st[Q_OUT] + st[N_OUT] // 32 * Q8_1_WORDS > sched.xq_words):
            raise ValueError(f"decode stage {index}: only a GLU stage of n_ff rows or a normed "
                             f"x writer writes its output's Q8_1 (whole blocks, in the xq "
                             f"buffer)")
        if st[KIND] not in (GEMV, GLU, EMBED):
            continue
        rows = st[N_OUT] * (2 if st[KIND] == GLU else 1)
        ends = [st[W] + min(rows, st[SPLIT]) * st[ROW_BYTES],
                st[W_B] + max(0, rows - st[SPLIT]) * st[ROW_BYTES_B]]
        if min(st[W], st[W_B]) < 0 or max(ends) > sched.weight_bytes:
            raise ValueError(f"decode stage {index}: matrix outside the weight buffer")
        quantized = st[FMT] != F32 or st[FMT_B] != F32
        before = sched.stages[index - 1]
        written = before[XQ] if before[KIND] in (QUANT, ATTN) else before[Q_OUT]
        same_norm = before[KIND] in (QUANT, ATTN, GLU) or before[Q_NORM] == st[NORM]
        if st[KIND] != EMBED and quantized and (st[XQ] < 0 or written != st[XQ] or
                                                not same_norm):
            raise ValueError(f"decode stage {index}: a quantized matrix reads the Q8_1 input "
                             f"the stage before (QUANT, ATTN's merge, GLU's groups, the last "
                             f"item of a normed x writer) writes, with its norm")
