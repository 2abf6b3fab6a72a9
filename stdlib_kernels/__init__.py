"""stdlib_kernels: kernels written in pykernel for running transformers.

Core kernels (this module's namespace; see docs/stdlib.md): norms, RoPE, activations, softmax,
embedding lookup (incl. quantized tables), elementwise ops and conversions, device sampling.
Each function takes pykernel Arrays (numpy arrays are uploaded to the current device), returns
new Arrays (or writes `out=`) and never synchronizes with the host.
`stdlib_kernels.quant` (GGUF formats) and `stdlib_kernels.attention` are imported on use.
"""
from .activations import (activation, gelu_erf, gelu_tanh, gelu_tanh_mul, glu, glu_fused, silu,
                         silu_mul)
from .elementwise import add, convert, from_bf16, mul, scale, to_bf16
from .embed import embedding
from .norm import layernorm, rmsnorm
from .rotary import rope, rope_kv_cache
from .sampling import apply_penalties, argmax, sample
from .row_softmax import softmax

__all__ = ["rmsnorm", "layernorm", "rope", "rope_kv_cache", "softmax", "silu_mul",
           "gelu_tanh_mul", "glu", "glu_fused", "activation", "silu", "gelu_tanh", "gelu_erf",
           "embedding", "add", "mul", "scale", "convert", "to_bf16", "from_bf16", "argmax",
           "sample", "apply_penalties"]
