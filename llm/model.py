"""`llm.load(name or path) -> Model`: a GGUF model ready for logits, generation and chat.

Input: a GGUF path or a model name (`llm.model_files`), a device and a backend. Output: `Model`
with `tokenizer`, `config`, `logits(ids)`, `generate(prompt, ...)` (streamed text pieces) and
`chat(messages, ...)`. The KV cache is sized to the requested context, by default the model's
training context capped so the cache fits in a quarter of the available memory (`context_note`
says which).
"""
from __future__ import annotations

import os
import time
from typing import Iterator, Sequence

import numpy as np

from llm import chat as chat_templates
from llm.backends import BackendUnavailable, create_backend
from llm.config import ModelConfig, load_config
from llm.generate import ContextError, GenerationStats, Session, stream
from llm.gguf_file import GGUFError, GGUFFile
from llm.gguf_reader_view import MetadataReader
from llm.host_memory import available_memory, check_weights_fit
from llm.model_files import resolve_model
from llm.models.archs import ARCH_SPECS, model_features
from llm.models.transformer import StepRunner, Transformer
from llm.models.weights import load_weights
from llm.sampling import Sampler, SamplingParams
from llm.tokenizer import Tokenizer

KV_BUDGET_FRACTION = 0.25
KV_BUDGET_MAX = 4 << 30


def _available_memory() -> int:
    return available_memory()


def choose_context(cfg: ModelConfig, requested: int | None, value_bytes: float = 4,
                   device_budget: int | None = None) -> tuple[int, str]:
    """(n_ctx, a sentence saying how it was chosen). The default is the training context capped
    so float32 K/V values fit a quarter of the free host memory (at most 4 GiB), whatever the
    cache type; with device_budget (a GPU backend: bytes of device memory the cache may take)
    also so the cache's actual bytes (value_bytes per value: 2 f16, 34 / 32 Q8_0) fit it."""
    per_token = cfg.kv_bytes_per_token
    actual = cfg.kv_bytes_per_token * value_bytes / 4
    if requested is not None:
        if requested <= 0:
            raise ValueError(f"context size must be positive, got {requested}")
        return requested, (f"context {requested} tokens (requested; KV cache "
                           f"{requested * actual / 2**20:.0f} MiB)")
    budget = min(int(_available_memory() * KV_BUDGET_FRACTION), KV_BUDGET_MAX)
    fit = max(budget // per_token // 256 * 256, 256)
    where = f"{budget / 2**30:.1f} GiB"
    if device_budget is not None:
        device_fit = max(int(device_budget // actual) // 256 * 256, 256)
        if device_fit < fit:
            fit, where = device_fit, f"{device_budget / 2**30:.1f} GiB of device memory"
    n_ctx = min(cfg.n_ctx_train, fit)
    why = "the model's training context" if n_ctx == cfg.n_ctx_train else (
        f"the training context {cfg.n_ctx_train} capped to fit {where}")
    return n_ctx, f"context {n_ctx} tokens ({why}; KV cache {n_ctx * actual / 2**20:.0f} MiB)"


class Model:
    def __init__(self, path, gguf: GGUFFile, config: ModelConfig, transformer: StepRunner,
                 tokenizer, backend, n_ctx: int, context_note: str, load_seconds: float):
        self.path, self.gguf, self.config = path, gguf, config
        self.transformer, self.tokenizer, self.backend = transformer, tokenizer, backend
        self.n_ctx, self.context_note, self.load_seconds = n_ctx, context_note, load_seconds
        self._session: Session | None = None
        self.last_stats = GenerationStats()

    # --- raw model -----------------------------------------------------------------------------
    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """float32 (len(ids), n_vocab) logits of a fresh sequence."""
        ids = self._check_ids(ids)
        if self.transformer.spec.learned_positions and len(ids) > self.config.n_ctx_train:
            raise ContextError(f"{len(ids)} tokens exceed the {self.config.n_ctx_train} learned "
                               f"positions of this {self.config.arch} model")
        cache = self.backend.kv_cache(self.config.n_layer, len(ids), self.config.n_head_kv,
                                      self.config.head_dim, self.config.head_dim_v)
        rows = []
        chunk = self.backend.options.prefill_chunk
        for start in range(0, len(ids), chunk):
            out = self.transformer.forward_tokens(ids[start:start + chunk], start, cache,
                                                  all_logits=True)
            rows.append(self.backend.to_host(out))
        return np.concatenate(rows, axis=0)

    def _check_ids(self, ids) -> np.ndarray:
        arr = np.asarray(ids, dtype=np.int64).reshape(-1)
        if arr.size == 0:
            raise ValueError("expected at least one token id")
        bad = arr[(arr < 0) | (arr >= self.config.n_vocab)]
        if bad.size:
            raise ValueError(f"token id {int(bad[0])} is outside the vocabulary "
                             f"[0, {self.config.n_vocab})")
        return arr

    def session(self) -> Session:
        """The model's default sequence (reused between calls so shared prefixes are cached)."""
        if self._session is None:
            self._session = Session(self.transformer, self.backend, self.n_ctx)
        return self._session

    # --- text ----------------------------------------------------------------------------------
    def generate(self, prompt: str | Sequence[int], max_tokens: int = 128,
                 temperature: float = 0.8, top_k: int = 40, top_p: float = 0.95,
                 min_p: float = 0.05, repeat_penalty: float = 1.0, repeat_last_n: int = 64,
                 presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                 seed: int | None = None, stop: Sequence[str] = (), add_special: bool = True,
                 stats: GenerationStats | None = None) -> Iterator[str]:
        """Stream the continuation of `prompt` (text, or token ids used as they are)."""
        if isinstance(stop, str):
            stop = [stop]
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt, add_special=add_special, parse_special=False)
        else:
            ids = self._check_ids(prompt).tolist()
        sampler = Sampler(SamplingParams(
            temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
            repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
            presence_penalty=presence_penalty, frequency_penalty=frequency_penalty, seed=seed))
        self.last_stats = stats if stats is not None else GenerationStats()
        return stream(self.session(), self.tokenizer, ids, sampler, max_tokens, stop,
                      self.last_stats)

    @property
    def chat_template(self) -> str:
        template = self.gguf.get("tokenizer.chat_template")
        return template if isinstance(template, str) and template else \
            chat_templates.fallback_template(self.config.arch)

    def _special_text(self, token_id) -> str:
        if token_id is None or token_id < 0:
            return ""
        return self.tokenizer.token_to_piece(token_id).decode("utf-8", errors="replace")

    def chat_prompt(self, messages: Sequence[dict], add_generation_prompt: bool = True) -> str:
        return chat_templates.render(
            self.chat_template, messages, add_generation_prompt,
            bos_token=self._special_text(self.tokenizer.bos_id),
            eos_token=self._special_text(self.tokenizer.eos_id),
            source=f"{self.path}: chat template")

    def chat_ids(self, messages: Sequence[dict],
                 parse_special_in_messages: bool = False) -> list[int]:
        """The chat prompt's ids; control tokens come from the template's text only, unless
        parse_special_in_messages (llm.chat.prompt_ids)."""
        return chat_templates.prompt_ids(
            self.tokenizer, self.chat_template, messages,
            bos_token=self._special_text(self.tokenizer.bos_id),
            eos_token=self._special_text(self.tokenizer.eos_id),
            source=f"{self.path}: chat template",
            parse_special_in_messages=parse_special_in_messages)

    def chat(self, messages: Sequence[dict], max_tokens: int = 256, **options) -> str:
        """The assistant's reply to `messages` (rendered with the model's chat template)."""
        return "".join(self.generate(self.chat_ids(messages), max_tokens=max_tokens, **options))

    def chat_stream(self, messages: Sequence[dict], max_tokens: int = 256,
                    **options) -> Iterator[str]:
        return self.generate(self.chat_ids(messages), max_tokens=max_tokens, **options)


def load_tokenizer(gguf: GGUFFile) -> Tokenizer:
    """The tokenizer described by a parsed file's metadata (GGUFError when it is unusable)."""
    try:
        return Tokenizer.from_gguf(MetadataReader(gguf))
    except ValueError as exc:
        message = str(exc)
        prefix = f"{gguf.path}: "
        message = message[len(prefix):] if message.startswith(prefix) else message
        raise GGUFError(gguf.path, "tokenizer", message) from None


def check_backend_runs(config: ModelConfig, spec, backend) -> None:
    """BackendUnavailable (so `--device auto` falls back to the CPU) when the model needs ops
    the backend lacks, before any weight is loaded."""
    missing = model_features(config, spec) - backend.model_features
    if missing:
        raise BackendUnavailable(
            f"{config.arch} needs the numpy backend for now: the {backend.name} backend lacks "
            f"{', '.join(sorted(missing))} (use --backend numpy, or backend='numpy')")


def load(model: str | os.PathLike = "smollm2", device: str = "cpu", backend: str | None = None,
         n_ctx: int | None = None, progress: bool = True, tp: int = 1,
         **backend_options) -> Model:
    """Load a GGUF model by path or name ("smollm2", "gemma3-270m") on `device`; tp > 1
    splits it over that many tensor-parallel ranks (llm/parallel/: threads of this process
    on the CPU, one process per GPU on "cuda")."""
    t0 = time.perf_counter()
    path = resolve_model(model, progress=progress)
    backend_impl = create_backend(device, backend, **backend_options)
    gguf = GGUFFile(path)
    config = load_config(gguf)
    tokenizer = load_tokenizer(gguf)
    spec = ARCH_SPECS[config.arch]
    check_backend_runs(config, spec, backend_impl)
    check_weights_fit(path, backend_impl.name,
                      backend_impl.host_weight_bytes(gguf.tensors.values()),
                      _available_memory())
    if tp != 1:
        from llm.parallel.model import load_sharded
        transformer, backend_impl = load_sharded(
            path, gguf, config, spec, tp, backend_impl,
            lambda: create_backend(device, backend, **backend_options), backend_options)
    else:
        transformer = Transformer(config, spec, load_weights(gguf, config, spec, backend_impl),
                                  backend_impl)
    if backend_impl.name == "kernels":  # decode steps replay a captured device graph
        from llm.backends.kernels_graph import wrap
        transformer = wrap(transformer)
    if spec.learned_positions and n_ctx is not None and n_ctx > config.n_ctx_train:
        raise ContextError(f"context {n_ctx} exceeds the {config.n_ctx_train} learned positions "
                           f"of this {config.arch} model")
    device_budget = backend_impl.kv_device_budget()
    n_ctx, note = choose_context(config, n_ctx, backend_impl.kv_value_bytes,
                                 device_budget)
    return Model(path, gguf, config, transformer, tokenizer, backend_impl, n_ctx, note,
                 time.perf_counter() - t0)
