"""Decode steps as captured graphs: the one-token forward pass recorded once per KV cache and
replayed per token.

Input: a `Transformer` on the kernels backend, which `GraphRunner` wraps (as tinygrad's TinyJit
wraps a forward), and the `Step`s given to its forward(step, caches). Output: logits (device
array) of each step. Steps are captured and replayed keyed by their kind and shapes (a decode
token per cache, a prompt's length bucket per KV pool, a batch per set of caches and split
plan); what is not graphed runs the inner model's forward as it is. A captured step is the inner
model's forward of a `Step` whose ids and positions are slices of the graph's device input
buffer, so a replay reads the new ones from there. The graph reads the token and its position
from a 2-int device buffer `io = [token, position]`, so a step is one 8-byte host-to-device
copy, the replay, and the caller's device-to-host copy; its last launch writes the greedy next
token into io[0] and advances io[1], so `greedy` decodes with no host-to-device copy at all and
reads 4 bytes per token (the device-token loops are kernels_graph_tokens.py's). Two graphs per
cache: positions below options.short_context run decode attention in one split per head (no
partials, no combine launch: a short context gives too little work to split), later positions
the split attention sized for the whole cache. Both read and advance the same `io`. Short
prompts (2..options.prefill_graph_max tokens, a chat turn) are graphs too: a prefill of ~370
launches costs ~30 us of Python each, more than the GPU needs below ~64 tokens on an 8B model
and ~256 on a 1.5B one (and a graph's launches overlap under PDL). The prompt is padded to a
length bucket (`prefill_bucket`); the graph reads ids, positions and the index of the last real
row from a device buffer, so one graph per bucket serves every prompt length and start in it.
Padding is safe: attention is causal, so the real rows never see the padded ones, and the padded
rows' K/V land past the prompt, where the next token's write replaces them before anything reads
them. A bucket runs eagerly (padded) the first time it is seen and is captured the second, so a
one-shot prompt pays no capture. The prompt graphs belong to the KV pool, not to one cache: a
prompt into another slot of a server's pool re-points the graph's cache arguments at that slot
(graph_slots.py) instead of running and capturing it again. q8_0 caches (their prefill
dequantizes a host-sized row count) and prompts that would run past the context stay eager.
On the CPU target a "graph" is the recorded launch list (same code path, run in CI).
On sm_90+ the graphs are captured with programmatic dependent launch (each kernel's launch
overlaps its predecessor's tail); PYKERNEL_PDL=0 captures plain edges, for comparison.
"""
from __future__ import annotations

import warnings

import numpy as np

import pykernel as pk
from pykernel import compile_pool
from llm import step as S
from llm.backends import kernels_extra as X
from llm.backends.graph_slots import slot_binding
from llm.backends.kernels_graph_tokens import DeviceTokens
from llm.backends.persistent_decode import PersistentSteps
from llm.models.transformer import StepRunner, Transformer
from llm.step import Step


# Prompts of 2..options.prefill_graph_max tokens run as captured graphs (H100, graphs against
# eager at 72-256 tokens: synthetic qwen2-1.5B +34-130%, llama-8B +3-26%; RESULTS.md "Prompts of
# 65-256 tokens"); longer prompts run in steps of that many tokens (prefill_step_tokens), each a
# graph (1024: RESULTS.md "Prompts in 1024-token graph steps"; an 8B step's activations ~0.6 GiB).
# Positions below options.short_context run decode attention without splits (RESULTS.md, "Where
# one split stops paying").
# ... unless the device lacks the memory: a step of T tokens may take up to
# prefill_activation_bound(config, T) bytes of activations, and the step halves (down to
# SMALLEST_STEP) until that fits in half of the device memory free once the KV cache is
# allocated (the rest for the decode graphs, scratch and other processes)
SMALLEST_STEP = 64
# batched decode graphs kept (one per set of sequences stepping together and attention split
# plan: warm_batch captures up to ~8 plans per batch size; each holds its sequences' caches
# alive)
MAX_BATCH_GRAPHS = 256


class DecodeGraph:
    def __init__(self, graph, logits, io):
        self.graph, self.logits, self.io = graph, logits, io


class BatchGraph:
    def __init__(self, io, logits):
        self.io, self.logits, self.graph = io, logits, None


class PrefillGraph:
    """One prompt-length bucket of a KV pool: its input buffer [ids, positions, last row]
    and logits; graph None until the bucket is seen a second time (on any slot), then the
    binding that re-points it at the slot of each prompt (graph_slots; None: it stays with
    the cache it was captured on)."""

    def __init__(self, io, logits):
        self.io, self.logits, self.graph, self.binding = io, logits, None, None


def prefill_activation_bound(config, tokens: int) -> int:
    """An upper bound of the activation bytes the graphs of prompt steps up to `tokens` long
    hold: per token 4-byte values of about 6 model widths and 4 feed-forward widths (q|k|v,
    residual, norm, attention, gate|up, GLU, their Q8_1 copies), for the arena's two layer
    lists, twice for its grown buffers' older generations. H100 measurements after steps of
    16..1024 tokens (`pykernel bench -p 16,512,1000,2048`): SmolLM2-135M 115 MiB (bound 150),
    qwen2-1.5B 489 (703), llama-8B 939 (1280)."""
    return 16 * tokens * (6 * config.n_embd + 4 * config.n_ff)


# An eager pass of several prompts costs the 8B ~30 ms of host time whatever its size (16
# prompts of 15 tokens: 29-36 ms), a prompt's graph 5.6 ms at 15 tokens and ~13 ms at 60
# (H200, benchmarks/prompt_batches.py); with requests arriving 20 ms apart (groups of 1-2
# prompts, serve_load.py STAGGER_MS=20) eager passes carrying the running requests made the
# streams' p99 gap 30-38 ms against 10-19 ms one by one (RESULTS.md "Prompts admitted
# together in one pass"). So fewer prompts than this run one by one; from about 5 short
# prompts on, one pass is the faster (derived from those figures, not timed at 2-4)
MIN_PROMPTS_TOGETHER = 4


def prefill_bucket(n: int) -> int:
    """The padded length of an n-token prompt: n itself up to 8 tokens (the multi-token
    GEMV's range, whose time grows with its tokens: 5 tokens padded to 8 measured as slow as
    8), then multiples of 8 (at most 7 padded rows, whose GEMM columns cost little at these
    sizes: weight-bound)."""
    return n if n <= 8 else -(-n // 8) * 8


def precompile_lengths(most: int) -> list[int]:
    """Prompt pass lengths whose kernels cover those of every length up to `most`: each up to
    16 tokens (the GEMVs' kernels change with every token count), then each multiple of 8,
    since the prompt matmuls' kernels change only there (stdlib gemm_q8_k's tile classes and
    K splits; tests/llm/test_prompt_batches.py checks the claim on the GPU)."""
    return sorted(set(range(1, min(16, most) + 1)) | set(range(8, most + 1, 8)))


class GraphRunner(DeviceTokens, StepRunner):
    """Runs a Transformer on the kernels backend with graph-replayed decode, short prompts and
    batched decode steps: forward(step, caches) replays the step's graph where it has one,
    else runs the model's forward (and captures it on the key's second step)."""

    def __init__(self, model: Transformer):
        self.model = model
        self.cfg, self.spec, self.backend = model.cfg, model.spec, model.backend
        self._fitted_step: int | None = None     # fitted_step's, once a KV cache exists
        self._batch_graphs: dict = {}     # tuple of caches -> BatchGraph, least recent first
        self._persistent = PersistentSteps(self)   # RunnerOptions.persistent_decode

    @property
    def prefill_graph_max(self) -> int:
        """Longest prompt that runs as a graph (0: none): options.prefill_graph_max, or less where
        the device's free memory asks for it (fitted_step); a bucket's graph is captured on its
        second prompt, so benchmarks warm up twice."""
        if not (self.backend.options.prefill_graphs and self.backend.use_graphs):
            return 0
        return self.fitted_step()

    def fitted_step(self) -> int:
        """options.prefill_graph_max halved until prefill_activation_bound fits in half of the free
        device memory (not below SMALLEST_STEP); measured once a KV cache is allocated, and
        kept (on the GPU). The CPU target: options.prefill_graph_max."""
        if self._fitted_step is not None:
            return self._fitted_step
        memory = self.backend.memory
        free = memory.free_bytes()
        step = self.backend.options.prefill_graph_max
        if free is not None:
            while step > SMALLEST_STEP and prefill_activation_bound(self.cfg, step) > free // 2:
                step = max(SMALLEST_STEP, step // 2)
        if free is not None and memory.kv_bytes:   # before a cache exists, free memory shrinks
            self._fitted_step = step
        return step

    @property
    def min_prompts_together(self) -> int:
        """The fewest prompts the batch scheduler runs as one eager pass (forward_prompts)
        rather than one by one through their graphs: MIN_PROMPTS_TOGETHER where prompts run
        as graphs, else 2."""
        return MIN_PROMPTS_TOGETHER if self.prefill_graph_max else 2

    @property
    def prefill_step_tokens(self) -> int:
        """Tokens per prefill step of a long prompt (generate, bench): one graph's bucket at
        most, so every step of a long prompt replays a graph; eagerly (graphs off) the numpy
        backend's step."""
        return self.prefill_graph_max or self.backend.options.prefill_chunk

    def _short(self, pos: int) -> bool:
        """A step at pos runs decode attention in one split (options.short_context)."""
        return pos < self.backend.options.short_context

    def _graph_key(self, pos: int, sampling) -> object:
        """A cache's decode graph for a step at pos: short or long context, and the pick of the
        next token (None: greedy; else the sampler's filter settings, baked into its launches)."""
        if sampling is None:
            return self._short(pos)
        return (self._short(pos), sampling.temperature, sampling.top_k, sampling.top_p,
                sampling.min_p)

    def forward(self, step: Step, caches):
        """The step's logits: a host step of one sequence keeping its last row through its
        decode graph (one token) or its prompt bucket's graph; a batched step through the
        graph of its caches and split plan; anything else (every row's logits, long prompts,
        several prompts together, graphs off) by the model's forward."""
        b = self.backend
        if step.kind == "tokens" and step.on_host and step.keeps_last:
            cache, start, n = caches[0], step.starts[0], step.n
            if n == 1 and b.use_graphs:
                return self.decode_step(int(step.ids[0]), start, cache)
            if self._prefill_graphable(n, start, cache):
                return self.prefill_step(step.ids, start, cache)
        if step.kind == "batch" and step.on_host and b.use_graphs:
            return self._batch_graphed(step, caches)
        if step.kind == "prompts":
            # several prompts' lengths vary too much to keep a graph per combination: eager,
            # with the kernel variants the prompt graphs compiled already
            with self._launch_mode():
                return self.model.forward(step, caches)
        return self.model.forward(step, caches)

    def _batch_graphed(self, step: Step, caches):
        """Batched decode of several sequences (one new token each): a graph per set of caches
        (the per-sequence attention launches are bound to them) and attention split counts
        (planned from the step's lengths, per distinct layer window), read ids and positions
        from a device buffer, run eagerly the first time a key is seen and captured the
        second."""
        b, cfg = self.backend, self.cfg
        positions = np.asarray(step.starts, np.int64)      # host: they plan the splits
        windows = sorted({cfg.layer_window(il) for il in range(cfg.n_layer)})
        key = (tuple(caches), tuple(b.batch_splits(caches, positions, w, cfg.n_head,
                                                    step.splits) for w in windows))
        host = np.concatenate([np.asarray(step.ids).reshape(-1), positions]).astype(np.int32)
        graph = self._batch_graphs.pop(key, None)
        if graph is None:
            if len(self._batch_graphs) >= MAX_BATCH_GRAPHS:     # the least recently used goes
                self._batch_graphs.pop(next(iter(self._batch_graphs)))
            graph = BatchGraph(pk.to_device(host), None)
            graph.logits = self._run_as_captured(self._record_batch, graph.io, step, caches)
        else:
            graph.io.copy_from(host)
            if graph.graph is None:
                with pk.capture_graph(b.stream, pdl=b.options.pdl) as captured:
                    graph.logits = self._record_batch(graph.io, step, caches)  # recorded only
                graph.graph = captured
            graph.graph.replay()
        self._batch_graphs[key] = graph
        return graph.logits

    def precompile_prompts(self, caches, most: int) -> dict:
        """Compile, in worker processes, the kernels of every prompt pass of up to `most`
        tokens over these caches (a server's warm-up: a specialization first met under a
        request costs it seconds): recorded, not run, passes of each of
        precompile_lengths(most). Returns pk.precompile's counts."""
        return pk.precompile(self.record_prompts, caches, precompile_lengths(most))

    def record_prompts(self, caches, lengths) -> None:
        """A prompt pass of each length over these caches (one prompt, or as many as a
        length longer than a cache needs, as prompts admitted together are)."""
        ctx = caches[0].n_ctx
        for n in lengths:
            pieces = [min(ctx, n - i) for i in range(0, n, ctx)]
            if len(pieces) <= len(caches):
                self.forward_prompts([[0] * p for p in pieces], [0] * len(pieces),
                                     caches[:len(pieces)])

    def _launch_mode(self):
        """Launches with (PDL) or without programmatic dependencies, as the graphs record
        them: an eager run in this mode takes the captured steps' kernel variants."""
        stream = self.backend.stream
        return pk.programmatic_launches(stream.device if stream is not None else None,
                                        self.backend.options.pdl)

    def warm_batch(self, caches) -> None:
        """Compile and capture the batched step over these caches for every attention split
        count the step's lengths may plan (batch_split_choices), so that a server's steps find
        their graph captured rather than running eagerly (~25 ms on the 8B) when the plan
        changes. Writes token 0 at position 0 of each cache (rows no request reads)."""
        b, zeros = self.backend, np.zeros(len(caches), np.int64)
        for splits in b.batch_split_choices(caches, self.cfg.n_head):
            step = S.batch(zeros, zeros, len(caches), splits=splits)
            for _ in range(2):               # eager (compiles), then captured
                self.forward(step, caches)

    def drop_batch_graphs(self) -> None:
        """Forget the batched decode graphs (they keep their caches alive)."""
        self._batch_graphs.clear()

    def _record_batch(self, io, step: Step, caches):
        """The batched forward reading its ids and positions from io = [ids..., positions...]
        (the step's host positions still plan its attention splits)."""
        n = step.n
        return self.model.forward(step.with_inputs(io[0:n], io[n:2 * n]), caches)

    def _record(self, io, cache, short: bool, sampling=None):
        """The forward of the token io[0] at position io[1] plus the pick of the next (greedy,
        or a draw of stdlib's sampler with `sampling`'s filters: _device_tokens), written into
        io; returns its logits. short: decode attention in one split."""
        persistent = self._persistent.ready(cache)
        if persistent is not None:   # the whole step is one launch (persistent_decode.py)
            persistent.launch(io)
            logits = persistent.logits_array().reshape(1, -1)
        else:
            step = Step("tokens", io[0:1], io[1:2], None, (1,), direct=short)
            logits = self.model.forward(step, [cache])
        if sampling is None:
            X.argmax_into(logits.reshape(-1), io, advance=True,
                          scratch=self._argmax_scratch(logits.size))
        else:
            X.sample_into(logits.reshape(-1), io, *self._uniforms(cache), sampling)
        return logits

    def _prefill_graphable(self, n: int, start: int, cache) -> bool:
        return (2 <= n <= self.prefill_graph_max and not cache.q8
                and start + prefill_bucket(n) <= cache.n_ctx)

    def prefill_step(self, ids, start: int, cache):
        """Logits (1, n_vocab) of the last of `ids` (positions start..), written into the
        cache, through the bucket's graph (run eagerly the first time, captured the second)."""
        n = len(ids)
        bucket = prefill_bucket(n)
        host = np.zeros(2 * bucket + 1, np.int32)      # padded ids stay 0 (a valid token)
        host[:n] = np.asarray(ids, np.int32).reshape(-1)
        host[bucket:2 * bucket] = np.arange(start, start + bucket, dtype=np.int32)
        host[2 * bucket] = n - 1
        pool = cache.pool.prefill_graphs
        step = cache.own_prefill_graphs.get(bucket) or pool.get(bucket)
        if step is None:
            io = pk.to_device(host)
            step = pool[bucket] = PrefillGraph(io, None)
            step.logits = self._run_as_captured(self._record_prefill, io, bucket, cache,
                                                then_decode=(cache, start + n))
            return step.logits
        step.io.copy_from(host)
        if step.graph is None:
            with pk.capture_graph(self.backend.stream, pdl=self.backend.options.pdl) as graph:
                step.logits = self._record_prefill(step.io, bucket, cache)   # recorded only
            step.graph = graph
            step.binding = slot_binding(graph, cache)
            if step.binding is None and pool.get(bucket) is step:     # stays with this cache
                cache.own_prefill_graphs[bucket] = pool.pop(bucket)
        elif step.binding is not None:
            step.binding.bind(step.graph, cache)
        step.graph.replay()
        return step.logits

    def _run_as_captured(self, record, *args, then_decode=None):
        """The eager run of a step before its capture (kernels compiled, buffers allocated):
        with the PDL kernel variants the capture records, so only those are compiled and
        loaded, and on cuda all of them at once first (pk.precompile: a dry run of the
        capturable step, then compiles on every core; a cold start's ~15 s of compiling).
        then_decode=(cache, pos): a prompt's step, after which a decode at pos follows (in
        generate); where workers compile, the dry run takes that decode step's kernels too, so
        they compile in the same batch (one round of worker start-up, not two)."""
        with self._launch_mode():
            if self.backend.options.precompile and self.backend.device.kind == "cuda":
                try:
                    pk.precompile(self._dry_run, record, args, then_decode)
                except Exception as exc:   # only saves time: the real run compiles what it needs
                    warnings.warn(f"parallel kernel compile skipped: {type(exc).__name__}: {exc}",
                                  RuntimeWarning, stacklevel=2)
            return record(*args)

    def _dry_run(self, record, args, then_decode):
        """What pk.precompile records for _run_as_captured."""
        record(*args)
        if then_decode is not None and compile_pool.worker_count(2) >= 2:
            cache, pos = then_decode
            if self.backend.use_graphs and self._short(pos) not in cache.graphs:
                self._record(pk.to_device(np.zeros(2, np.int32)), cache, self._short(pos))

    def _record_prefill(self, io, bucket: int, cache):
        """The forward of a padded prompt reading io = [ids..., positions..., index of the
        prompt's last row]: its start lives on the device alone, the kept row is that index."""
        step = Step("tokens", io[0:bucket], io[bucket:2 * bucket], None, (bucket,),
                    keep=io[2 * bucket:2 * bucket + 1])
        return self.model.forward(step, [cache])

    def _argmax_scratch(self, n: int) -> tuple:
        """The greedy argmax's scratch, one per backend (so per stream), made on the first,
        uncaptured step."""
        b = self.backend
        if b.argmax_scratch is None:
            b.argmax_scratch = X.argmax_scratch(n)
        return b.argmax_scratch

    def decode_step(self, token: int, pos: int, cache, sampling=None):
        """Logits (1, n_vocab) after `token` at position `pos` (written into the cache); the
        next token goes to the step's io on the device (greedy, or `sampling`'s draw)."""
        graphs, key = cache.graphs, self._graph_key(pos, sampling)
        if key in graphs:
            step = graphs[key]
            step.io.copy_from(np.array([token, pos], np.int32))
            step.graph.replay()
            cache.graph = step
            return step.logits
        io = cache.graph.io if cache.graph is not None else pk.to_device(np.zeros(2, np.int32))
        io.copy_from(np.array([token, pos], np.int32))
        self._persistent.prepare(cache)
        logits = self._run_as_captured(self._record, io, cache, self._short(pos), sampling)
        with pk.capture_graph(self.backend.stream, pdl=self.backend.options.pdl) as graph:
            self._record(io, cache, self._short(pos), sampling)   # recorded, not run
        cache.graph = graphs[key] = DecodeGraph(graph, logits, io)
        return logits


def wrap(transformer: Transformer) -> GraphRunner:
    return GraphRunner(transformer)
