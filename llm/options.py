"""The runner's performance switches, in one place: `RunnerOptions`, a frozen value that
`llm.load` hands to the backend (and through it to the graphs and the generation loop). The
kernels' own switches (stdlib_kernels.options.KernelOptions: GEMV/GEMM routing, decode attention
kernels) are part of it: `kernels`, and `kernel_options`, the value the kernels backend passes to
every routing call (kernels_weights, decode attention's default_config).

The defaults are the measured best (benchmarks/RESULTS.md says where each was measured); the
PYKERNEL_* environment variables below override them for comparisons, read once by
`RunnerOptions.from_env()` when a model is loaded, never at import. Tests build the options they
want (`RunnerOptions(short_context=4)`) instead of patching module globals.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:     # stdlib_kernels (and pykernel under it) is imported by the kernels backend
    from stdlib_kernels.options import KernelOptions

# the environment variables stdlib_kernels.options.KernelOptions.from_env reads
KERNEL_VARIABLES = ("PYKERNEL_GEMV_TOKENS", "PYKERNEL_INT8_GEMM_TOKENS", "PYKERNEL_MMA_GEMV",
                    "PYKERNEL_DECODE_MMA", "PYKERNEL_DECODE_BULK", "PYKERNEL_PREFILL_WGMMA",
                    "PYKERNEL_HOPPER_QUANT_GEMM",
                    "PYKERNEL_DEQUANT_F16_GEMM", "PYKERNEL_DEQUANT_F16_TOKENS")


def _flag(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    return default if value is None else value not in ("", "0")


@dataclass(frozen=True)
class RunnerOptions:
    # tokens per prefill step of the numpy backend and of eager passes: bounds the (heads, n,
    # n_ctx) attention scores (PYKERNEL_PREFILL_CHUNK)
    prefill_chunk: int = 256
    # decode graphs: positions below it run decode attention without splits (one split beat
    # splits + combine up to 383 positions on the H200)
    short_context: int = 384
    # graphs capture programmatic dependent launches (PYKERNEL_PDL)
    pdl: bool = True
    # a graph's first run compiles its kernels in parallel first (PYKERNEL_PRECOMPILE)
    precompile: bool = True
    # prompts of 2..prefill_graph_max tokens run as captured graphs (PYKERNEL_PREFILL_GRAPHS,
    # PYKERNEL_PREFILL_GRAPH_MAX); longer prompts run in steps of that many tokens
    prefill_graphs: bool = True
    prefill_graph_max: int = 1024
    # prefill attention on tensor cores (False: the SIMT kernel; tests compare both)
    tensor_core_prefill: bool = True
    # which decode attention launches write the o-projection's Q8_1 input themselves: "all",
    # "split" (only split attention's combine kernel) or "none" (PYKERNEL_ATTN_Q8)
    attention_q8: str = "all"
    # decode attention reads its length and first K/V rows before the PDL wait
    # (launch_decode(early_kv=), PYKERNEL_EARLY_KV)
    early_kv: bool = True
    # decode attention's split / combine kernels trigger their dependents at entry
    # (PYKERNEL_EARLY_TRIGGER)
    early_trigger: bool = True
    # tensor parallel: all-reduces of f32 tensors up to this many KiB read the peer GPUs'
    # buffers over NVLink (one-shot kernel, llm/parallel/peer_allreduce.py) instead of NCCL;
    # 0 = off, the default until measured on GPUs (PYKERNEL_PEER_ALLREDUCE_KB)
    peer_allreduce_kb: int = 0
    # greedy / sampled decode of llama-style models as one persistent launch per token
    # (llm/backends/persistent_decode.py) instead of the layer graph's launches; other models,
    # q8_0 caches and f32 activations keep the graphs. Off until a GPU shows it wins
    # (benchmarks/persistent_decode.py; PYKERNEL_PERSISTENT_DECODE)
    persistent_decode: bool = False
    # the kernels' switches (stdlib_kernels.options.KernelOptions); None: its defaults. The
    # runner's two choices (f32_weights_gemv, route_by_format) are always added: kernel_options
    kernels: KernelOptions | None = None

    def __post_init__(self):
        if self.attention_q8 not in ("all", "split", "none"):
            raise ValueError(f"attention_q8 must be 'all', 'split' or 'none', got "
                             f"{self.attention_q8!r}")
        if self.peer_allreduce_kb < 0:
            raise ValueError(f"peer_allreduce_kb must be >= 0 (0: off), got "
                             f"{self.peer_allreduce_kb}")
        if self.prefill_chunk < 1 or self.prefill_graph_max < 0 or self.short_context < 0:
            raise ValueError(f"prefill_chunk must be >= 1 and prefill_graph_max, short_context "
                             f">= 0: {self}")

    @functools.cached_property
    def kernel_options(self) -> KernelOptions:
        """`kernels` with the runner's choices: F32 weights keep the f32 GEMV, and a row group
        leaves the GEMV by its format alone (the runner decides before it has activations)."""
        from stdlib_kernels.options import KernelOptions
        if self.kernels is not None and not isinstance(self.kernels, KernelOptions):
            raise TypeError(f"RunnerOptions.kernels must be a stdlib_kernels.options."
                            f"KernelOptions or None, got {type(self.kernels).__name__}")
        return dataclasses.replace(self.kernels or KernelOptions(), f32_weights_gemv=True,
                                   route_by_format=True)

    @classmethod
    def from_env(cls, **overrides) -> "RunnerOptions":
        """The defaults, with the PYKERNEL_* variables set in the environment, then overrides.
        The kernels' variables (KERNEL_VARIABLES) are parsed by stdlib_kernels.options, imported
        only when one is set (the numpy backend imports no kernel code)."""
        base = cls()
        env = dict(
            prefill_chunk=int(os.environ.get("PYKERNEL_PREFILL_CHUNK", base.prefill_chunk)),
            pdl=_flag("PYKERNEL_PDL", base.pdl),
            precompile=_flag("PYKERNEL_PRECOMPILE", base.precompile),
            prefill_graphs=_flag("PYKERNEL_PREFILL_GRAPHS", base.prefill_graphs),
            prefill_graph_max=int(os.environ.get("PYKERNEL_PREFILL_GRAPH_MAX",
                                                 base.prefill_graph_max)),
            attention_q8=os.environ.get("PYKERNEL_ATTN_Q8", base.attention_q8),
            early_kv=_flag("PYKERNEL_EARLY_KV", base.early_kv),
            early_trigger=_flag("PYKERNEL_EARLY_TRIGGER", base.early_trigger),
            peer_allreduce_kb=int(os.environ.get("PYKERNEL_PEER_ALLREDUCE_KB",
                                                 base.peer_allreduce_kb)),
            persistent_decode=_flag("PYKERNEL_PERSISTENT_DECODE", base.persistent_decode))
        if any(name in os.environ for name in KERNEL_VARIABLES):
            from stdlib_kernels.options import KernelOptions
            env["kernels"] = KernelOptions.from_env(os.environ)
        return dataclasses.replace(base, **{**env, **overrides})
