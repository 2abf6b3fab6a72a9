"""How much the Q8_1 activation format's block sum adds to a GEMV's error, on the CPU.

Input: none. Output: relative L2 errors of one GEMV (synthetic weights of `pykernel synth`,
512 x 1280, x ~ N(0, 1), 50 draws) against the exact float64 product, per weight format:

    python3 benchmarks/q8_1_min_term.py

Formats with a block minimum (Q4_1 here; Q4_K, Q5_K, Q2_K, Q5_1 alike) compute
sum_blocks(d_w d_x sum(q_w q_x) + m_w s_x). llama.cpp's CUDA quantizer, and ours to match it,
store s_x = the raw sum of the block's 32 activations, not d_x sum(q_x): the quantized x in the
first term and the unquantized x in the second no longer cancel, which this script measures
against the same product with s_x = d_x sum(q_x) and against Q4_0 (no minimum).
"""
from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gguf.constants import GGMLQuantizationType as Q  # noqa: E402
from gguf.quants import dequantize  # noqa: E402

from llm.synth import random_blocks  # noqa: E402

ROWS, K = 512, 1280


def f16(a):
    return np.asarray(a, np.float64).astype(np.float16).astype(np.float64)


def q8_1(x):
    """(d, q, raw sum) per 32-block, as the CUDA quantizer computes them (d, s stored f16)."""
    blocks = x.reshape(-1, 32)
    d = np.abs(blocks).max(1) / 127
    q = np.round(blocks / d[:, None])
    return f16(d), q, f16(blocks.sum(1))


def main(draws: int = 50):
    rng = np.random.default_rng(0)
    raw = random_blocks(rng, Q.Q4_1, ROWS, K)
    w = dequantize(raw, Q.Q4_1).astype(np.float64)
    blocks = raw.reshape(ROWS, K // 32, 20)
    d = blocks[:, :, 0:2].copy().view(np.float16)[..., 0].astype(np.float64)
    m = blocks[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
    nibbles = blocks[:, :, 4:]
    qw = np.concatenate([nibbles & 15, nibbles >> 4], axis=-1).astype(np.float64)
    w0 = dequantize(random_blocks(rng, Q.Q4_0, ROWS, K), Q.Q4_0).astype(np.float64)
    errors = {"raw": [], "quantized": [], "xhat": [], "q4_0": []}
    for _ in range(draws):          # the block-sum error is common to all rows: it varies
        x = rng.standard_normal(K)  # a lot between activation vectors, so average
        dx, qx, s_raw = q8_1(x)
        xhat = (qx * dx[:, None]).reshape(-1)
        main_term = (d[:, :, None] * qw * (qx * dx[:, None])[None]).sum((1, 2))
        exact = w @ x

        def rel(y, ref=exact):
            return np.linalg.norm(y - ref) / np.linalg.norm(ref)
        errors["raw"].append(rel(main_term + (m * s_raw).sum(1)))
        errors["quantized"].append(rel(main_term + (m * f16(dx * qx.sum(1))).sum(1)))
        errors["xhat"].append(rel(w @ xhat))
        errors["q4_0"].append(rel(w0 @ xhat, w0 @ x))
    mean = {k: float(np.mean(v)) for k, v in errors.items()}
    print(f"relative L2 error of one {ROWS} x {K} GEMV, mean (max) over {draws} activation vectors")
    print(f"Q4_1, min term with the raw block sum (llama.cpp CUDA): {mean['raw']:.4f} "
          f"({max(errors['raw']):.4f})")
    print(f"Q4_1, min term with d_x * sum(q_x):                   {mean['quantized']:.4f}")
    print(f"Q4_1, W @ dequantized Q8_1 x:                          {mean['xhat']:.4f}")
    print(f"Q4_0 (no minimum), W @ dequantized Q8_1 x:            {mean['q4_0']:.4f}")


if __name__ == "__main__":
    main()
