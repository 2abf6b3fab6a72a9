"""BPE encode throughput on ~1 MB of generated English-like text (one core).

Usage: python3 benchmarks/tokenizer_throughput.py [VOCAB.gguf] [--mb 1.0] [--seed 0]
Default vocab: SmolLM2-135M-Instruct (fetched into the model cache like the tests do).
Prints MB/s for a first text (empty word cache) and a second one (cache warm from the first),
from this process's CPU time (the per-core number; other load on the machine does not count)
and from wall-clock time.
The text mixes Zipf-distributed common words with random made-up words, numbers, punctuation,
capitals and line breaks, so the word cache sees a realistic share of misses.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from llm.tokenizer import Tokenizer  # noqa: E402

COMMON = (
    "the of and to a in is it you that he was for on are with as I his they be at one have "
    "this from or had by hot word but what some we can out other were all there when up use "
    "your how said an each she which do their time if will way about many then them write "
    "would like so these her long make thing see him two has look more day could go come did "
    "number sound no most people my over know water than call first who may down side been "
    "now find any new work part take get place made live where after back little only round "
    "man year came show every good me give our under name very through just form sentence "
    "great think say help low line differ turn cause much mean before move right boy old too "
    "same tell does set three want air well also play small end put home read hand port large "
    "spell add even land here must big high such follow act why ask men change went light "
    "kind off need house picture try us again animal point mother world near build self earth "
    "father head stand own page should country found answer school grow study still learn "
    "plant cover food sun four between state keep eye never last let thought city tree cross "
    "farm hard start might story saw far sea draw left late run don't while press close night "
    "real life few north open seem together next white children begin got walk example ease "
    "paper group always music those both mark often letter until mile river car feet care "
    "second book carry took science eat room friend began idea fish mountain stop once base"
).split()
PUNCT = [",", ".", ";", ":", "!", "?", " -", "'s", "\"", ")"]


def generate_text(n_bytes: int, rng: np.random.Generator) -> str:
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    ranks = np.arange(1, len(COMMON) + 1)
    zipf = (1.0 / ranks) / (1.0 / ranks).sum()
    parts: list[str] = []
    size = 0
    while size < n_bytes:
        kind = rng.random()
        if kind < 0.9:
            word = COMMON[rng.choice(len(COMMON), p=zipf)]
        elif kind < 0.97:
            word = "".join(rng.choice(letters, size=rng.integers(3, 11)))
        else:
            word = str(rng.integers(0, 100000))
        if rng.random() < 0.08:
            word = word.capitalize()
        piece = " " + word
        if rng.random() < 0.12:
            piece += PUNCT[rng.integers(len(PUNCT))]
        if rng.random() < 0.02:
            piece += "\n\n" if rng.random() < 0.3 else "\n"
        parts.append(piece)
        size += len(piece)
    return "".join(parts)


def measure(tok: Tokenizer, text: str) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds of this process, number of ids) for one encode."""
    wall, cpu = time.perf_counter(), time.process_time()
    ids = tok.encode(text, add_special=False)
    return time.perf_counter() - wall, time.process_time() - cpu, len(ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("vocab", nargs="?", help="GGUF file (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--mb", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.vocab is None:
        from tests.llm import tokenizer_data
        args.vocab = tokenizer_data.smollm2_path()
    tok = Tokenizer.from_gguf(args.vocab)
    rng = np.random.default_rng(args.seed)
    n_bytes = int(args.mb * 1e6)
    first, second = generate_text(n_bytes, rng), generate_text(n_bytes, rng)
    for label, text in (("text 1, empty word cache", first),
                        ("text 2, cache holds text 1's words", second)):
        wall, cpu, n_ids = measure(tok, text)
        mb = len(text.encode("utf-8")) / 1e6
        print(f"{label}: {mb:.2f} MB -> {n_ids} tokens; CPU {cpu:.3f} s = {mb / cpu:.2f} MB/s "
              f"per core; wall {wall:.3f} s = {mb / wall:.2f} MB/s")


if __name__ == "__main__":
    main()
