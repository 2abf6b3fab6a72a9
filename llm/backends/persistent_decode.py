"""The runner's hook for the persistent decode step (stdlib_kernels/persistent/): a model
loaded on the kernels backend -> its decode schedule, its weights in their GGUF formats in one
device buffer, and a DecodeRunner that reads and writes the runner's own KV cache.

    pd = PersistentDecode.from_model(model)           # llm.load(..., backend="kernels")
    pd.attach(cache)                                  # a KernelsKVCache (f16 / f32) of n_ctx rows
    pd.launch(io, stream)                             # io = [token, pos] on the device
    logits = pd.logits_array()                        # (n_vocab,) device view
    logits = pd.step(token, pos)                      # or: io upload, launch, read back

Input: the backend's device weights (DeviceMatrix row groups, copied device to device into
the step's buffer as they are; norm vectors; the embedding table) and a cache whose rows
0..pos-1 the runner's prefill wrote. Output: the logits, K/V row pos of every layer in that
cache. GraphRunner runs it in place of the layer graph's launches when RunnerOptions.
persistent_decode is on (kernels_graph.py).

Scope: llama-style models (RMSNorm, SwiGLU, RoPE without scaling or frequency factors, no
biases, q/k norms, post-norms, sliding windows or MoE), weights of the step's formats
(decode_schedule.WEIGHT_FORMATS), Q8_1 activations, f16 or f32 caches; anything else is
refused by name (UnsupportedModel), and the runner keeps its decode graphs.
"""
from __future__ import annotations

import warnings

import numpy as np

from stdlib_kernels.persistent.decode_plan import plan_items
from stdlib_kernels.persistent.decode_runner import DecodeRunner, decode_grid
from stdlib_kernels.persistent.decode_schedule import (
    WEIGHT_FORMATS,
    DecodeShape,
    decode_schedule,
)
from stdlib_kernels.persistent.decode_weights import upload_decode_weights


class UnsupportedModel(ValueError):
    """A model the persistent decode step does not cover (yet)."""


def _matrices(weights) -> dict:
    """Name (DecodeShape.weight_shapes') -> DeviceMatrix of every matrix the step reads."""
    out = {"output": weights.output}
    for il, lw in enumerate(weights.layers):
        out.update({f"blk.{il}.qkv": lw.qkv, f"blk.{il}.attn_out": lw.attn_out,
                    f"blk.{il}.gate_up": lw.gate_up, f"blk.{il}.down": lw.down})
    return out


def check_supported(cfg, spec, weights, activations: str = "q8_1") -> None:
    """Raise UnsupportedModel naming every feature outside the persistent step's scope."""
    rope = cfg.rope
    types = {g.type_name for m in _matrices(weights).values() for g in m.groups}
    types.add(weights.token_embd.type_name)
    problems = {
        f"norm {spec.norm!r} (needs 'rms')": spec.norm != "rms",
        f"ffn {spec.ffn!r} (needs 'swiglu')": spec.ffn != "swiglu",
        "q/k norms": spec.qk_norm, "post-norms": spec.post_norms,
        "learned positions": spec.learned_positions, "attention sinks": spec.attn_sinks,
        "a mixture of experts": bool(spec.moe_gating) or cfg.moe is not None,
        f"ffn norm tensor {spec.ffn_norm!r}": spec.ffn_norm != "ffn_norm",
        "no RoPE": rope is None,
        "scaled RoPE (freq_scale, YaRN)": rope is not None and (rope.freq_scale != 1.0
                                                                 or rope.yarn is not None),
        "RoPE frequency factors": weights.rope_freqs is not None,
        "per-layer RoPE / sliding windows": cfg.rope_local is not None or cfg.sliding_window,
        f"embedding scale {cfg.embed_scale}": cfg.embed_scale != 1.0,
        "a value head size other than the key head size": cfg.head_dim_v != cfg.head_dim,
        f"weights of types {sorted(types - set(WEIGHT_FORMATS))} (it reads "
        f"{', '.join(WEIGHT_FORMATS)})": bool(types - set(WEIGHT_FORMATS)),
        f"{activations} activations (it quantizes them to Q8_1)": activations != "q8_1",
    }
    for layer in weights.layers:
        problems["biases"] = problems.get("biases") or any(
            b is not None for b in (layer.qkv_bias, layer.attn_out_bias, layer.gate_up_bias,
                                    layer.down_bias, layer.attn_norm.bias, layer.ffn_norm.bias))
    found = [name for name, present in problems.items() if present]
    if found:
        raise UnsupportedModel(f"persistent decode: {cfg.arch} model has {', '.join(found)}; "
                               f"it covers llama-style models only")


def weight_sources(weights) -> tuple[dict, dict]:
    """(formats, sources) for decode_schedule and upload_decode_weights: each matrix's row
    groups (type, rows) and raw device bytes, the embedding table, the norm vectors."""
    table = weights.token_embd
    formats = {"token_embd": ((table.type_name, int(table.raw.shape[0])),)}
    sources = {"token_embd": [table.raw], "output_norm": weights.output_norm.weight}
    for name, m in _matrices(weights).items():
        formats[name] = tuple((g.type_name, g.rows) for g in m.groups)
        sources[name] = [g.raw for g in m.groups]
    for il, lw in enumerate(weights.layers):
        sources[f"blk.{il}.attn_norm"] = lw.attn_norm.weight
        sources[f"blk.{il}.ffn_norm"] = lw.ffn_norm.weight
    return formats, sources


class PersistentDecode:
    """One model's persistent decode step (module docstring)."""

    def __init__(self, runner: DecodeRunner, cfg):
        self.runner, self.cfg = runner, cfg
        self.cache = None

    @classmethod
    def from_model(cls, model, n_ctx: int | None = None, tile_rows: int | None = None,
                   grid: int | None = None, cache_dtype=np.float16) -> PersistentDecode:
        """From an llm.Model loaded on the kernels backend (its transformer, or a GraphRunner
        around one); n_ctx: the KV cache rows (default the model's context)."""
        backend = model.backend
        if getattr(backend, "name", None) != "kernels":
            raise UnsupportedModel("persistent decode: the model must be loaded with "
                                   "backend='kernels'")
        transformer = getattr(model.transformer, "model", model.transformer)
        return cls.from_parts(transformer.cfg, transformer.spec, transformer.w,
                              backend.activations, int(n_ctx or model.n_ctx), tile_rows, grid,
                              cache_dtype)

    @classmethod
    def from_parts(cls, cfg, spec, weights, activations: str, n_ctx: int,
                   tile_rows: int | None = None, grid: int | None = None,
                   cache_dtype=np.float16, weights_buffer=None,
                   profile: bool = False) -> PersistentDecode:
        """From a transformer's config, spec and device weights (GraphRunner's way in);
        tile_rows: None (the model's plan, decode_plan.plan_items, for the launch's grid) or
        rows per tile of every row stage (attention splits then as the plan has them);
        weights_buffer: the buffer of another step of the same model, reused (same layout);
        profile: the kernel's profiling build (DecodeRunner.profile, decode_profile.py)."""
        check_supported(cfg, spec, weights, activations)
        shape = DecodeShape(cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_head_kv, cfg.head_dim,
                            cfg.n_ff, cfg.n_vocab, n_ctx)
        formats, sources = weight_sources(weights)
        rope = cfg.rope
        plan = plan_items(shape, grid or decode_grid(cache_dtype, rope.neox, profile))
        sched = decode_schedule(shape, plan.tile_rows if tile_rows is None else tile_rows,
                                formats, plan.attn_splits, plan.split_rows)
        buffer = weights_buffer if weights_buffer is not None else \
            upload_decode_weights(sched, sources)
        runner = DecodeRunner(sched, buffer, eps=cfg.eps,
                              scale=cfg.attn_scale, rope_theta=rope.base, rot_dim=rope.n_rot,
                              neox=rope.neox, grid=grid, cache_dtype=cache_dtype,
                              own_cache=False, profile=profile)
        return cls(runner, cfg)

    def supports(self, cache) -> bool:
        """Whether `cache` (a KernelsKVCache) is one this step can read: f16 / f32 of the
        schedule's type and context, its pool's one allocation for all layers."""
        s = self.runner.sched.shape
        pool = getattr(cache, "pool", None)
        return (pool is not None and not cache.q8 and pool.k_all is not None
                and np.dtype(cache.dtype) == self.runner.cache_dtype and cache.n_ctx == s.n_ctx
                and cache.n_head_kv == s.n_head_kv and cache.head_dim == s.head_dim)

    def attach(self, cache) -> None:
        """Read and write `cache` (a KernelsKVCache) from now on: rows its prefill wrote are
        the step's context; each step writes its row pos there."""
        if cache is self.cache:
            return
        if not self.supports(cache):
            raise UnsupportedModel(
                f"persistent decode: a {cache.dtype} cache of {cache.n_ctx} rows is not one it "
                f"reads ({self.runner.cache_dtype}, {self.runner.sched.shape.n_ctx} rows, "
                f"not q8_0)")
        pool, per_seq = cache.pool, int(np.prod(cache.k[0].shape))
        self.runner.bind_cache(pool.k_all, pool.v_all, cache.slot * per_seq,
                               pool.n_slots * per_seq)
        self.cache = cache

    def launch(self, io, stream=None) -> None:
        self.runner.launch(io, stream)

    def logits_array(self):
        return self.runner.logits_array()

    def step(self, token: int, pos: int) -> np.ndarray:
        """Logits (n_vocab,) after `token` at position `pos` (rows < pos already cached)."""
        return self.runner.step(int(token), int(pos))


class PersistentSteps:
    """GraphRunner's persistent decode steps (RunnerOptions.persistent_decode): one
    PersistentDecode per cache shape (context, element type), all reading one weight buffer,
    built on the first decode step of such a cache; a model it does not cover is refused once
    with a warning and keeps the layer graphs."""

    def __init__(self, graph_runner):
        self.graph_runner = graph_runner
        self.steps: dict = {}          # (n_ctx, dtype) -> PersistentDecode
        self.refused = False

    def prepare(self, cache) -> None:
        """Before a decode step of `cache` is recorded: build (or re-point) its step."""
        gr = self.graph_runner
        b = gr.backend
        if not b.options.persistent_decode or self.refused or getattr(cache, "q8", True):
            return
        key = (cache.n_ctx, np.dtype(cache.dtype))
        if key not in self.steps:
            try:
                check_supported(gr.cfg, gr.spec, gr.model.w, b.activations)
            except UnsupportedModel as exc:
                warnings.warn(f"{exc}; decoding with the layer graphs", RuntimeWarning,
                              stacklevel=3)
                self.refused = True
                return
            shared = next(iter(self.steps.values()), None)
            self.steps[key] = PersistentDecode.from_parts(
                gr.cfg, gr.spec, gr.model.w, b.activations, cache.n_ctx, cache_dtype=key[1],
                weights_buffer=None if shared is None else shared.runner.weights[0])
        self.steps[key].attach(cache)

    def ready(self, cache) -> PersistentDecode | None:
        """The step attached to `cache`, or None (the layer graph records instead)."""
        for step in self.steps.values():
            if step.cache is cache:
                return step
        return None
