"""The runner's `pykernel` subcommands: run, chat, serve, perplexity, tokenize, info.

Input: parsed argparse arguments. Output: text on stdout (the continuation, the reply, ids, the
file's tables), progress and statistics on stderr, and an exit code (0 ok, 1 error). Errors the
user can act on (bad file, unknown model, prompt too long, unsafe template, missing backend, a
model too big for the memory) are printed as one line `pykernel: error: ...` without a
traceback.
"""
from __future__ import annotations

import signal
import sys

from llm.backends import BackendUnavailable
from llm.cli_bench import CACHE_HELP, CACHE_TYPES, TP_HELP
from llm.chat import ChatTemplateError
from llm.generate import ContextError, GenerationStats
from llm.gguf_file import GGUFError, GGUFFile
from llm.model_files import DEFAULT_MODEL, ModelFileError, model_names, resolve_model
from llm.sampling import NonFiniteLogitsError

# MemoryError: HostMemoryError / GPUMemoryError name what did not fit and by how much
USER_ERRORS = (GGUFError, ModelFileError, ContextError, ChatTemplateError, BackendUnavailable,
               NonFiniteLogitsError, ValueError, OSError, MemoryError)
DEFAULT_PROMPT = "Once upon a time,"


def _add_model_args(p, with_device: bool = True) -> None:
    p.add_argument("--model", "-m", default=DEFAULT_MODEL,
                   help=f"GGUF path or model name ({', '.join(model_names())}; default "
                        f"{DEFAULT_MODEL})")
    if with_device:
        p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                       help="auto: cuda when a GPU and the kernels backend are usable, else cpu")
        p.add_argument("--backend", choices=("numpy", "kernels"), default=None,
                       help="default: numpy on cpu, kernels on cuda")
        p.add_argument("--ctx", type=int, default=None,
                       help="context size in tokens (default: the model's, capped to memory)")
        p.add_argument("--cache-type", choices=CACHE_TYPES, default=None, help=CACHE_HELP)
        p.add_argument("--tp", type=int, default=1, help=TP_HELP)


def _add_sampling_args(p, n_default: int) -> None:
    p.add_argument("-n", "--n-predict", type=int, default=n_default, help="max new tokens")
    p.add_argument("--temp", type=float, default=0.8, help="temperature (0: greedy)")
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--min-p", type=float, default=0.05)
    p.add_argument("--repeat-penalty", type=float, default=1.0)
    p.add_argument("--repeat-last-n", type=int, default=64)
    p.add_argument("--presence-penalty", type=float, default=0.0)
    p.add_argument("--frequency-penalty", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def register(sub) -> None:
    """Add run, chat, serve, tokenize and info to the `pykernel` subparsers."""
    run = sub.add_parser("run", help="generate a continuation of a prompt")
    run.add_argument("prompt", nargs="?", help="prompt text (default: stdin if piped)")
    _add_model_args(run)
    _add_sampling_args(run, 128)
    run.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    run.add_argument("--system", default=None, help="system message (with --chat)")
    run.set_defaults(func=cmd_run)

    chat = sub.add_parser("chat", help="interactive chat (reads stdin; /reset, /quit)")
    _add_model_args(chat)
    _add_sampling_args(chat, 256)
    chat.add_argument("--system", default=None, help="system message")
    chat.set_defaults(func=cmd_chat)

    serve = sub.add_parser("serve", help="serve the model over an OpenAI-compatible HTTP API")
    _add_model_args(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8080, help="port (default 8080; 0: any)")
    serve.add_argument("-n", "--n-predict", type=int, default=256,
                       help="max_tokens when a request gives none")
    serve.add_argument("-np", "--parallel", type=int, default=1,
                       help="requests decoded together, each in its own slot of the context "
                            "(--ctx is split between them; default 1)")
    serve.set_defaults(func=cmd_serve)

    ppl = sub.add_parser("perplexity", help="perplexity over a text file (llama-perplexity's "
                                            "method)")
    _add_model_args(ppl)
    ppl.set_defaults(ctx=512)
    ppl.add_argument("-f", "--file", required=True, help="text file (- : stdin)")
    ppl.add_argument("--chunks", type=int, default=0, help="score only the first N chunks")
    ppl.set_defaults(func=cmd_perplexity)

    tok = sub.add_parser("tokenize", help="print the token ids of a text")
    tok.add_argument("text")
    _add_model_args(tok, with_device=False)
    tok.add_argument("--pieces", action="store_true", help="print id and piece per line")
    tok.add_argument("--no-special", action="store_true", help="do not add BOS/EOS")
    tok.add_argument("--parse-special", action="store_true",
                     help="turn special-token texts like <|im_start|> into their ids")
    tok.set_defaults(func=cmd_tokenize)

    info = sub.add_parser("info", help="print a GGUF file's metadata and tensor table")
    info.add_argument("file", help="GGUF path or model name")
    info.add_argument("--full", action="store_true", help="do not shorten long values")
    info.set_defaults(func=cmd_info)


def error_line(exc: BaseException) -> str:
    """The one-line message for exc; never empty (a bare MemoryError() has no text)."""
    text = str(exc)
    return text if text.strip() else f"{type(exc).__name__} ({exc!r})"


def _fail(exc: BaseException) -> int:
    print(f"pykernel: error: {error_line(exc)}", file=sys.stderr)
    return 1


def _guarded(fn):
    def wrapper(args) -> int:
        try:
            return fn(args)
        except USER_ERRORS as exc:
            return _fail(exc)
        except KeyboardInterrupt:
            print(file=sys.stderr)
            return 130
    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


def _load(args):
    from llm.model import load
    device, model = args.device, None
    options = {"kv_dtype": args.cache_type} if args.cache_type else {}
    if args.tp != 1:
        options["tp"] = args.tp
    if device == "auto":
        try:
            model = load(args.model, device="cuda", backend=args.backend, n_ctx=args.ctx,
                         **options)
            device = "cuda"
        except BackendUnavailable:
            device = "cpu"
    if model is None:
        model = load(args.model, device=device, backend=args.backend, n_ctx=args.ctx, **options)
    cfg = model.config
    print(f"model: {model.path} ({cfg.arch}, {cfg.n_layer} layers, {cfg.n_embd} wide, "
          f"{model.backend.name} backend on {device}; loaded in {model.load_seconds:.2f} s)",
          file=sys.stderr)
    print(model.context_note, file=sys.stderr)
    return model


def _sampling(args) -> dict:
    return dict(temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                repeat_penalty=args.repeat_penalty, repeat_last_n=args.repeat_last_n,
                presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty,
                seed=args.seed, stop=args.stop)


def _print_stats(stats: GenerationStats) -> None:
    print(f"prompt: {stats.prompt_tokens} tokens in {stats.prompt_seconds:.2f} s "
          f"({stats.prompt_tps:.1f} tok/s); decode: {stats.generated_tokens} tokens in "
          f"{stats.decode_seconds:.2f} s ({stats.decode_tps:.1f} tok/s); "
          f"stop: {stats.stop_reason}", file=sys.stderr)


def _emit(pieces) -> None:
    for piece in pieces:
        sys.stdout.write(piece)
        sys.stdout.flush()


@_guarded
def cmd_run(args) -> int:
    """Stream a continuation of the prompt to stdout; timings to stderr."""
    prompt = args.prompt
    if prompt is None:
        if sys.stdin is not None and not sys.stdin.isatty():
            prompt = sys.stdin.read()
        else:
            prompt = DEFAULT_PROMPT
            print(f"no prompt given; using {prompt!r}", file=sys.stderr)
    model = _load(args)
    stats = GenerationStats()
    if args.chat:
        messages = ([{"role": "system", "content": args.system}] if args.system else [])
        messages.append({"role": "user", "content": prompt})
        ids = model.chat_ids(messages)
        _emit(model.generate(ids, max_tokens=args.n_predict, stats=stats, **_sampling(args)))
    else:
        _emit(model.generate(prompt, max_tokens=args.n_predict, stats=stats, **_sampling(args)))
    sys.stdout.write("\n")
    sys.stdout.flush()
    _print_stats(stats)
    _print_memory(model)
    return 0


def _print_memory(model) -> None:
    """GPU backends report what the weights, KV cache and activations take on the device."""
    report = model.backend.memory_report()
    if report is not None:
        from llm.backends.kernels_memory import format_report
        print(format_report(report), file=sys.stderr)


@_guarded
def cmd_chat(args) -> int:
    """Interactive chat over stdin: one user message per line; /reset, /quit."""
    model = _load(args)
    system = [{"role": "system", "content": args.system}] if args.system else []
    history = list(system)
    interactive = sys.stdin.isatty()
    print("chat: type a message; /reset clears the history, /quit exits", file=sys.stderr)
    while True:
        if interactive:
            print("> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        if not line:
            break
        text = line.strip()
        if text in ("/quit", "/exit"):
            break
        if text == "/reset":
            history = list(system)
            print("(history cleared)", file=sys.stderr)
            continue
        if not text:
            continue
        history.append({"role": "user", "content": text})
        stats, pieces = GenerationStats(), []
        for piece in model.generate(model.chat_ids(history), max_tokens=args.n_predict,
                                    stats=stats, **_sampling(args)):
            pieces.append(piece)
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
        sys.stdout.flush()
        history.append({"role": "assistant", "content": "".join(pieces)})
        _print_stats(stats)
    return 0


@_guarded
def cmd_serve(args) -> int:
    """Serve /v1/completions, /v1/chat/completions, /v1/models, /health until interrupted."""
    from llm.server import make_server
    model = _load(args)
    if model.backend.name == "kernels":
        batched = f" and the batched decode of 2..{args.parallel} requests" \
            if args.parallel > 1 else ""
        print(f"compiling the prompt steps{batched} ...", file=sys.stderr, flush=True)
    server = make_server(model, args.host, args.port, parallel=args.parallel, warm_up=True)
    server.default_max_tokens = args.n_predict
    host, port = server.server_address[:2]

    def stop(signum, frame):
        raise KeyboardInterrupt      # SIGTERM (service managers, kill) stops as Ctrl-C does
    signal.signal(signal.SIGTERM, stop)
    slots = server.scheduler
    print(f"serving {server.model_name} on http://{host}:{port}/v1, {slots.slots} slot(s) of "
          f"{slots.slot_ctx} tokens (Ctrl-C or SIGTERM stops)", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("server stopped", file=sys.stderr)
    finally:
        server.server_close()
    return 0


@_guarded
def cmd_perplexity(args) -> int:
    """Chunks of --ctx tokens (default 512), the second half of each scored; the running
    estimate per chunk on stderr, `Final estimate: PPL = X +/- E` on stdout."""
    from llm.perplexity import perplexity
    if args.file == "-":
        text = sys.stdin.read()
    else:
        with open(args.file, encoding="utf-8", errors="replace") as f:
            text = f.read()
    model = _load(args)

    def progress(chunk: int, chunks: int, estimate: float) -> None:
        end = "\n" if chunk == chunks else ""
        print(f"[{chunk}]{estimate:.4f},", end=end, file=sys.stderr, flush=True)
    result = perplexity(model, text, n_ctx=args.ctx, max_chunks=args.chunks, progress=progress)
    print(f"Final estimate: PPL = {result.ppl:.4f} +/- {result.ppl_error:.5f} "
          f"({result.tokens_scored} tokens in {result.chunks} chunks of {result.n_ctx})")
    return 0


@_guarded
def cmd_tokenize(args) -> int:
    """Print the ids (or id and piece per line) of the text under the model's tokenizer."""
    from llm.model import load_tokenizer
    tok = load_tokenizer(GGUFFile(resolve_model(args.model)))
    ids = tok.encode(args.text, add_special=not args.no_special, parse_special=args.parse_special)
    if args.pieces:
        for token_id, piece in zip(ids, tok.pieces(ids)):
            print(f"{token_id:>7} {piece!r}")
    else:
        print(ids)
    return 0


@_guarded
def cmd_info(args) -> int:
    """Metadata, then a tensor table (name, type, shape, bytes), then the model summary."""
    from llm.info import describe
    sys.stdout.write(describe(GGUFFile(resolve_model(args.file, progress=True)), args.full))
    return 0
