"""Test helper: the oracle the wgmma GEMMs' CPU emulation is bit-exact against."""
import numpy as np


def k_order_reference(a, b):
    """sum_k a[m, k] * b[n, k] in f32, k = 0, 1, ...: the products are exact in f32 (a, b
    widened from 16-bit floats), so only the summation order rounds."""
    c = np.zeros((a.shape[0], b.shape[0]), np.float32)
    for k in range(a.shape[1]):
        c = c + np.outer(a[:, k], b[:, k]).astype(np.float32)
    return c
