"""Packed variable-length inputs for the tests: random fp16 q, k, v in the packed layout and their
offsets, and one sequence cut out as a dense batch of one."""

from __future__ import annotations

import numpy as np

from fa_sim.varlen import cu_seqlens_of


def packed_inputs(lq, lk, h: int, hk: int, d: int, seed: int = 0):
    """q [total_q, h, d], k and v [total_k, hk, d] (standard normal, fp16) and cu_seqlens_q, cu_seqlens_k."""
    rng = np.random.default_rng(seed)
    cq, ck = cu_seqlens_of(lq), cu_seqlens_of(lk)
    q = rng.standard_normal((int(cq[-1]), h, d)).astype(np.float16)
    k = rng.standard_normal((int(ck[-1]), hk, d)).astype(np.float16)
    v = rng.standard_normal((int(ck[-1]), hk, d)).astype(np.float16)
    return q, k, v, cq, ck


def dense_sequence(x, cu, b: int):
    """Sequence b of a packed [total, H, d] array as a dense [1, H, N, d] one."""
    return np.ascontiguousarray(x[cu[b]:cu[b + 1]].transpose(1, 0, 2)[None])
