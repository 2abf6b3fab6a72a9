"""The ops interface the model code is written against: one forward pass, several backends.

Input to a backend: raw GGUF tensors (`TensorInfo`: ggml type, numpy-order shape, raw bytes) and
activations it created itself. Output: opaque activation handles; only `to_host` returns numpy.
The numpy backend dequantizes weights to float32 once; a GPU ("kernels") backend keeps them in
their GGUF block format on the device and runs quantized GEMV/GEMM, with the same signatures.

Activation shapes, by convention (n = tokens in the step):
    x: (n, n_embd)      q: (n, n_head * head_dim)      k, v: (n, n_head_kv * head_dim[_v])
Weights are matrices of shape (out_features, in_features); `matmul(x, w)` is x @ w.T.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Iterable, Sequence

import numpy as np

from llm.config import RopeParams
from llm.gguf_file import TensorInfo
from llm.options import RunnerOptions
from llm.sampling import check_finite_logits
from llm.step import Step

Act = Any       # a backend's activation (numpy array on the CPU, device buffer on the GPU)
Weight = Any    # a backend's weight handle


KV_CACHE_TYPES = ("f16", "f32", "q8_0")   # --cache-type / kv_dtype= names, llama.cpp's spelling


class KVCache(ABC):
    """Preallocated keys and values for `n_ctx` positions of every layer."""
    n_ctx: int
    n_layer: int

    @property
    @abstractmethod
    def nbytes(self) -> int: ...

    @abstractmethod
    def copy_from(self, other: "KVCache", n_rows: int) -> None:
        """Every layer's keys and values of `other` (a cache of the same shape) into this one:
        at least positions 0 .. n_rows - 1."""


class Backend(ABC):
    name: str = "abstract"
    # True: the model may call rope() once on the adjacent q|k columns (fewer calls); False:
    # rope() is called on q and on k separately (a backend may fuse each with the KV write)
    rope_qk_together: bool = False
    # True: a step's logits live on a device that can draw tokens and list candidates there
    # (sample_rows, top_candidates answer); False: they are host rows already (those return
    # None), so the scheduler copies nothing to try them
    logits_on_device: bool = False
    # the performance switches (llm/options.py); a backend's constructor takes them
    options: RunnerOptions = RunnerOptions()
    # decode steps replay captured device graphs (the kernels backend's default)
    use_graphs: bool = False
    # bytes per cached K/V value, from which model.choose_context sizes a default context
    kv_value_bytes: float = 4
    # what the backend runs beyond a dense transformer (llm.models.archs.model_features names
    # what a model needs): "moe" (expert_matrix, moe_route, moe_experts), "attn_sinks" (the
    # attention ops' sinks argument), "yarn" (YaRN RoPE scaling)
    model_features: frozenset = frozenset()

    # tensor parallelism (llm/parallel/): the rank's Communicator; None: one rank, no sums
    communicator = None

    def kv_device_budget(self) -> int | None:
        """Device bytes a default context's KV cache may take; None: no device limit."""
        return None

    def memory_report(self) -> dict | None:
        """What the weights, KV cache and activations take on the device (name -> bytes), for
        `run` and `bench` to print; None for a host backend."""
        return None

    # --- weights (called once at load) -------------------------------------------------------
    def host_weight_bytes(self, tensors: Iterable[TensorInfo]) -> int:
        """Host memory this backend will allocate for these tensors' weights (checked against
        the free memory before loading; 0: nothing beyond the file's memory map)."""
        return 0

    @abstractmethod
    def matrix(self, parts: Sequence[TensorInfo]) -> Weight:
        """Rows of `parts` stacked into one (sum of out_features, in_features) matrix, so fused
        projections (q|k|v, gate|up) take one matmul. Parts may have different GGUF types."""

    @abstractmethod
    def vector(self, parts: Sequence[TensorInfo]) -> Weight:
        """Norm weights / biases, concatenated (1-D, float32)."""

    @abstractmethod
    def embedding(self, table: TensorInfo) -> Weight:
        """Token (or position) embedding table (n_rows, n_embd) for row lookups. May share
        storage with `matrix([table])` when the output projection is tied to it."""

    def expert_matrix(self, parts: Sequence[TensorInfo]) -> Weight:
        """Stacked experts (n_expert, out_features, in_features) of each part, the parts' rows
        stacked per expert ((n_expert, sum of out_features, in_features): gate|up)."""
        raise NotImplementedError(f"the {self.name} backend has no mixture-of-experts weights")

    def expert_vector(self, parts: Sequence[TensorInfo]) -> Weight:
        """Per-expert biases (n_expert, width) of each part, concatenated per expert."""
        raise NotImplementedError(f"the {self.name} backend has no mixture-of-experts weights")

    @abstractmethod
    def kv_cache(self, n_layer: int, n_ctx: int, n_head_kv: int, head_dim: int,
                 head_dim_v: int) -> KVCache: ...

    def kv_caches(self, n_slots: int, n_layer: int, n_ctx: int, n_head_kv: int, head_dim: int,
                  head_dim_v: int) -> list[KVCache]:
        """Caches of n_slots sequences that decode together (a backend may allocate them as
        one, for attention launches over consecutive ones)."""
        return [self.kv_cache(n_layer, n_ctx, n_head_kv, head_dim, head_dim_v)
                for _ in range(n_slots)]

    # --- ops ---------------------------------------------------------------------------------
    def begin_forward(self, step: Step, caches: Sequence[KVCache]) -> Step:
        """Called by the model before each forward pass: the step as this backend's ops will
        receive it (the kernels backend returns it with ids and positions on the device;
        default: the step itself)."""
        return step

    def end_forward(self, logits: Act) -> Act:
        """Called by the model after each forward pass with its logits; returns them as the
        caller reads them (the kernels backend launches what it had deferred; default: as
        they are)."""
        return logits

    def begin_layer(self, layer: int) -> None:
        """Called by the model before layer `layer`'s ops (default: nothing)."""

    def end_layers(self) -> None:
        """Called by the model after the last layer's ops (default: nothing)."""

    @abstractmethod
    def embed(self, table: Weight, ids, scale: float = 1.0) -> Act:
        """Rows `ids` of the table (a step's ids or positions, host or device ints, as
        begin_forward gave them), times `scale` -> (n, n_embd)."""

    def all_reduce(self, x: Act) -> Act:
        """x summed over the tensor-parallel ranks (after a row-parallel matmul or a
        vocabulary-split embedding; may be in place): x itself with one rank."""
        if self.communicator is None:
            return x
        return self.communicator.all_reduce_sum(x)

    @abstractmethod
    def matmul(self, x: Act, w: Weight, bias: Weight | None = None) -> Act:
        """x (n, in) @ w.T (+ bias) -> (n, out)."""

    @abstractmethod
    def split(self, x: Act, sizes: Sequence[int]) -> list[Act]:
        """Column blocks of x (n, sum(sizes)), in order: separates fused projections."""

    @abstractmethod
    def add(self, a: Act, b: Act) -> Act:
        """a + b (the residual); may reuse a's storage."""

    @abstractmethod
    def rms_norm(self, x: Act, w: Weight, eps: float, group: int = 0) -> Act:
        """x / sqrt(mean(x^2) + eps) * w over each row, or over each `group` columns (per-head
        q/k norm when group = head_dim; w then has `group` entries)."""

    @abstractmethod
    def layer_norm(self, x: Act, w: Weight, b: Weight, eps: float) -> Act: ...

    @abstractmethod
    def rope(self, x: Act, positions, head_dim: int, params: RopeParams,
             freq_factors: Weight | None = None) -> Act:
        """Rotate the first n_rot dims of every head of x (n, heads * head_dim) by the step's
        positions (host or device ints, as begin_forward gave them)."""

    @abstractmethod
    def attention(self, q: Act, k: Act, v: Act, step: Step, caches: Sequence[KVCache],
                  layer: int, scale: float, window: int = 0) -> Act:
        """Write the step's k, v rows into layer's caches, then causal attention of each q row
        over its own cache (only the last `window` positions when window > 0) with grouped KV
        heads -> (n, n_head * head_dim_v). By step.kind:
            tokens   rows at positions start.. of caches[0] (start = step.starts[0], or the
                     device positions' first where starts is None)
            batch    row i at step.positions[i] of caches[i], over its positions 0..that one
            prompts  prompt i's step.counts[i] rows (after those of prompts 0..i-1) at
                     step.starts[i].. of caches[i]
        Given `sinks` ((n_head,): a backend with the "attn_sinks" feature takes this keyword;
        the model passes it only for layers that have sinks), head h's softmax has one more
        logit sinks[h] (unscaled, no value)."""

    def moe_route(self, scores: Act, n_used: int, gating: str) -> tuple[Act, Act]:
        """The router: each row of scores (n, n_expert) -> (ids, weights), both (n, n_used):
        the selected experts, largest first (ties: the lower expert id first), and their
        weights; `gating` is an ArchSpec.moe_gating ("softmax_renorm": softmax over all, the
        top n_used renormalised to sum 1; "topk_softmax": top n_used of the raw scores, a
        softmax over those)."""
        raise NotImplementedError(f"the {self.name} backend has no mixture-of-experts router")

    def moe_experts(self, x: Act, weights, ids: Act, probs: Act, activation: str) -> Act:
        """x (n, n_embd) through the experts `ids` of each row (weights: llm.models.moe's
        MoeWeights) -> (n, n_embd): sum over j of probs[:, j] * (down_e(act(gate_e x + bg,
        up_e x + bu)) + bd) with e = ids[:, j]; activation "swiglu" or "swiglu_oai"."""
        raise NotImplementedError(f"the {self.name} backend has no mixture-of-experts FFN")

    @abstractmethod
    def swiglu(self, gate: Act, up: Act) -> Act:
        """silu(gate) * up."""

    @abstractmethod
    def geglu_tanh(self, gate: Act, up: Act) -> Act:
        """gelu_tanh(gate) * up."""

    @abstractmethod
    def gelu(self, x: Act) -> Act:
        """gelu with the tanh approximation (what ggml_gelu computes)."""

    @abstractmethod
    def last_row(self, x: Act) -> Act:
        """x[-1:] (decode only needs the last position's logits)."""

    @abstractmethod
    def rows(self, x: Act, indices) -> Act:
        """x[indices] (len(indices), width): the rows whose logits a step needs (host ints,
        or a device array where the step's inputs are on the device)."""

    def synchronize(self) -> None:
        """Wait for the work queued on the backend's device (for timings); no-op on the host."""

    @abstractmethod
    def to_host(self, x: Act) -> np.ndarray:
        """float32 numpy copy (or view) of an activation."""

    def to_host_reused(self, x: Act) -> np.ndarray:
        """to_host, possibly as a view of one host buffer that the next call overwrites (for
        rows read at once, as the batch scheduler's logits are; default: to_host)."""
        return self.to_host(x)

    def argmax_rows(self, x: Act) -> np.ndarray:
        """Each row's argmax (the lowest index on ties) as host ints: the greedy tokens of a
        step's logits rows. The kernels backend takes them on its device and copies only the
        ids (a 16-row step's logits are 8 MB at a 128k vocabulary); there a NaN logit is
        never chosen. A row without a finite maximum (on the device: without a number) is
        NonFiniteLogitsError, as the samplers' is; the error names the rows and carries the
        others' picks (NonFiniteLogitsError.rows, .picks)."""
        rows = self.to_host(x)
        picks = np.argmax(rows, axis=-1)
        check_finite_logits(rows, picks)
        return picks

    def top_candidates(self, x: Act, k: int) -> list | None:
        """Each row's largest logits for a host sampler (Sampler.sample_among): per row
        (values, ids) holding its k largest (ties included), or None for a row whose list
        overflowed; None when the backend sends whole rows instead (this default: a host
        backend copies nothing)."""
        return None

    def sample_rows(self, x: Act, samplers, histories) -> np.ndarray | None:
        """Each row's token drawn on the device, for samplers that allow it
        (Sampler.device_row_draws), after each row's penalties over its history (the
        generation's ids; a row's logits may change in place), one uniform from each drawing
        sampler's generator: host ints; None when the backend has no device sampler (this
        default: the samplers are left untouched)."""
        return None

    def logits_rows(self, x: Act, indices: Sequence[int]) -> Act:
        """x[indices] of a step's logits, for the rows that go one way (device draws,
        candidate lists, copies) when the step's rows go different ways; valid until the
        next call (default: rows)."""
        return self.rows(x, np.asarray(indices, np.int64))

    def sample(self, logits: Act, sampler, history) -> int:
        """Next token from the last row of `logits`: a plain greedy sampler's through
        argmax_rows (on the device where the backend has one), a top-k sampler's from the
        row's top_candidates where the backend gives them, a greedy or unseeded top-k
        sampler's with penalties through sample_rows (penalties and pick on the device,
        rather than the whole row on the host; the row's logits change in place), any other
        on the host over a copy of the row."""
        k = sampler.candidate_k
        if k == 1:
            return int(self.argmax_rows(self.last_row(logits))[0])
        if k == 0 and sampler.device_row_draws:
            tokens = self.sample_rows(self.last_row(logits), [sampler], [history])
            if tokens is not None:
                return int(tokens[0])
        if k:
            lists = self.top_candidates(self.last_row(logits), k)
            if lists is not None and lists[0] is not None:
                return sampler.sample_among(*lists[0])
        return sampler.sample(self.to_host(logits)[-1], history)
