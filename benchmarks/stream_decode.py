"""One stream's decode speed through Model.generate, as `pykernel run` decodes (sampling,
detokenizing and handing out text included, unlike `pykernel bench`'s tg).

Input: argv = a GGUF file (e.g. `pykernel synth` output); env DEVICE (default cuda), TOKENS
(default 256), SEED (default none, as `pykernel run` without --seed: an unseeded sampler
draws on the GPU; with a seed the host draws), REPEAT_PENALTY (default 1: off; else every
generation's repeat_penalty over the last 64 tokens). Output: per temperature (greedy, then
llama.cpp's default filters at 0.8), decode tok/s of three generations (the first includes
capturing the decode graphs).

    python3 benchmarks/stream_decode.py /tmp/llama-8b-Q4_K_M.gguf
"""
import os
import sys

import llm
from llm.generate import GenerationStats

PROMPT = "Once upon a time, in a land far away, there lived a"


def main(path: str) -> None:
    tokens = int(os.environ.get("TOKENS", "256"))
    seed = int(os.environ["SEED"]) if os.environ.get("SEED") else None
    repeat_penalty = float(os.environ.get("REPEAT_PENALTY", "1"))
    model = llm.load(path, device=os.environ.get("DEVICE", "cuda"), progress=False,
                     n_ctx=2048)
    for temperature in (0.0, 0.8):
        rates = []
        for _ in range(3):
            stats = GenerationStats()
            for _ in model.generate(PROMPT, max_tokens=tokens, temperature=temperature,
                                    seed=seed, repeat_penalty=repeat_penalty,
                                    stats=stats):
                pass
            rates.append(stats.decode_tps)
        print(f"temperature {temperature}: decode tok/s "
              f"{' '.join(f'{r:.1f}' for r in rates)} ({stats.decode_steps} steps)", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
