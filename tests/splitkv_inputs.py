"""Inputs and output bits shared by the split-KV tests (tests/test_splitkv.py, tests/test_decode_auto.py)."""

from __future__ import annotations

import numpy as np


def cache_inputs(b, h, hk, nq, nk, d=64, seed=0):
    """q [b, h, nq, d] and a K/V cache [b, hk, nk, d], fp16 normals of one seed."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, h, nq, d)).astype(np.float16)
    k = rng.standard_normal((b, hk, nk, d)).astype(np.float16)
    v = rng.standard_normal((b, hk, nk, d)).astype(np.float16)
    return q, k, v


def out_bits(res):
    """A run's O and LSE as their bit patterns (O fp16 or bf16, LSE fp32), for bit-for-bit comparisons."""
    return np.asarray(res.o).view(np.uint16 if res.o.dtype == np.float16 else np.uint32), \
        np.asarray(res.lse).view(np.uint32)
