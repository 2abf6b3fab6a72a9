"""numpy float64 reference of the MoE feed-forward (the kernels' contract, experts.py).

    moe_ffn_reference(x, gate, up, down, ids, route_w, act, gate_bias, up_bias, down_bias,
                      res) -> (y, h)
x (tokens, n_embd); gate / up (n_expert, n_ff, n_embd) and down (n_expert, n_embd, n_ff)
dequantized; ids / route_w (tokens, k) from router.route_reference; biases (n_expert, rows)
or None. y (tokens, n_embd); h (tokens, k, n_ff): each pair's hidden row (act of gate, up).
"""
from __future__ import annotations

import numpy as np

OAI_ALPHA, OAI_LIMIT = 1.702, 7.0


def glu_reference(g: np.ndarray, u: np.ndarray, act: str) -> np.ndarray:
    """silu(g) * u, or gpt-oss's: g = min(g, 7), u = clamp(u, -7, 7), g sigmoid(1.702 g) (u + 1)."""
    if act == "silu":
        return g / (1 + np.exp(-g)) * u
    if act == "oai":
        g = np.minimum(g, OAI_LIMIT)
        u = np.clip(u, -OAI_LIMIT, OAI_LIMIT)
        return g / (1 + np.exp(-OAI_ALPHA * g)) * (u + 1)
    raise ValueError(f"moe: act must be 'silu' or 'oai', got {act!r}")


def moe_ffn_reference(x, gate, up, down, ids, route_w, act="silu", gate_bias=None,
                      up_bias=None, down_bias=None, res=None):
    x = np.asarray(x, np.float64)
    tokens, k = ids.shape
    n_ff = gate.shape[1]
    y = np.zeros((tokens, down.shape[1])) if res is None else np.asarray(res, np.float64).copy()
    h = np.zeros((tokens, k, n_ff))
    for t in range(tokens):
        for j in range(k):
            e = int(ids[t, j])
            g = gate[e].astype(np.float64) @ x[t] + _bias(gate_bias, e)
            u = up[e].astype(np.float64) @ x[t] + _bias(up_bias, e)
            h[t, j] = glu_reference(g, u, act)
            y[t] += float(route_w[t, j]) * (down[e].astype(np.float64) @ h[t, j]
                                            + _bias(down_bias, e))
    return y, h


def _bias(bias, e: int):
    return 0.0 if bias is None else np.asarray(bias[e], np.float64)
