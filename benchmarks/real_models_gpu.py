"""Real models on the GPU (kernels backend) against llama.cpp's oracles: teacher-forced logits
vs the f32 oracle (relative L2) with Q8_1 and with f32 activations, greedy picks vs llama.cpp's
wherever its own top-2 margin is >= 0.35, and a long-context check (a ~4k-token prompt, 64
greedy tokens: GPU vs the numpy CPU backend).

    python benchmarks/real_models_gpu.py MODEL.gguf GOLDEN_STEM [--long]

GOLDEN_STEM: path without suffix of golden/<name>.json and .f32-logits.npz."""
import argparse
import json
import time

import numpy as np

import llm

NEAR_TIE = 0.35


def teacher_forced(model, gold, oracle):
    errors, bad_picks, checked = [], 0, 0
    for i, case in enumerate(gold["cases"]):
        tokens = oracle[f"tokens_{i}"]
        logits = model.logits(tokens)
        ref = oracle[f"logits_{i}"]
        errors.append(float(np.linalg.norm(logits[:, oracle[f"ids_{i}"]] - ref)
                            / np.linalg.norm(ref)))
        n_prompt = len(case["prompt_tokens"])
        for step, want in enumerate(case["greedy"][:len(tokens) - n_prompt + 1]):
            top = want["top5"]
            if top[0][1] - top[1][1] < NEAR_TIE:
                continue
            checked += 1
            bad_picks += int(np.argmax(logits[n_prompt - 1 + step])) != want["token"]
    return errors, bad_picks, checked


def greedy(model, ids, n):
    session = model.session()
    session.reset()
    logits, _ = session.prefill(ids)
    out, margins = [], []
    for _ in range(n):
        top2 = np.sort(logits)[-2:]
        margins.append(float(top2[1] - top2[0]))
        out.append(int(np.argmax(logits)))
        logits = session.step(out[-1])
    return out, margins


def long_context(path, n_prompt=4000, n_gen=64):
    gpu = llm.load(path, device="cuda", n_ctx=n_prompt + n_gen + 8, activations="f32")
    text = ("The history of computing is a story of people, machines and ideas. " * 400)
    ids = gpu.tokenizer.encode(text)[:n_prompt]
    t = time.perf_counter()
    got_gpu, margins = greedy(gpu, ids, n_gen)
    t_gpu = time.perf_counter() - t
    cpu = llm.load(path, device="cpu", n_ctx=n_prompt + n_gen + 8)
    t = time.perf_counter()
    got_cpu, _ = greedy(cpu, ids, n_gen)
    t_cpu = time.perf_counter() - t
    same = next((k for k, (a, b) in enumerate(zip(got_gpu, got_cpu)) if a != b), n_gen)
    print(f"long context: prompt {len(ids)} tokens, {n_gen} greedy tokens: GPU and CPU agree on "
          f"the first {same} (GPU {t_gpu:.1f} s, CPU {t_cpu:.1f} s)"
          + ("" if same == n_gen else f"; top-2 margin at the first difference "
             f"{margins[same]:.3f}"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("golden")
    ap.add_argument("--long", action="store_true")
    args = ap.parse_args()
    gold = json.load(open(args.golden + ".json"))
    oracle = np.load(args.golden + ".f32-logits.npz")
    for acts in ("q8_1", "f32"):
        model = llm.load(args.model, device="cuda", n_ctx=512, activations=acts)
        for case in gold["cases"]:
            assert model.tokenizer.encode(case["prompt"]) == case["prompt_tokens"]
        errors, bad, checked = teacher_forced(model, gold, oracle)
        print(f"{gold['model']} on GPU, {acts} activations: relative L2 vs f32 oracle per case "
              f"{[f'{e:.2e}' for e in errors]} (max {max(errors):.2e}); greedy picks differing "
              f"from llama.cpp where its margin >= {NEAR_TIE}: {bad} of {checked}")
    if args.long:
        long_context(args.model)


if __name__ == "__main__":
    main()
