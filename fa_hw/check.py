"""Accuracy yardsticks for fa_hw: a float64 attention reference (top-left causal, as the kernel)
and the error measures `fa hw`, the tests and the cross-check report."""

from __future__ import annotations

import numpy as np

from fa_sim import crosscheck
from fa_sim.reference import attention
from fa_sim.reference import random_inputs as reference_inputs


def reference(q, k, v, causal: bool = False, scale: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """float64 O [B,H,Nq,d] and LSE [B,H,Nq] (natural log); key k visible to query q iff k <= q."""
    return attention(q, k, v, causal=causal, scale=scale)


def rel_err(x, ref) -> float:
    """Relative Frobenius error ||x - ref|| / ||ref||."""
    x, ref = np.asarray(x, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    return float(np.linalg.norm(x - ref) / max(np.linalg.norm(ref), 1e-300))


def max_abs_err(x, ref) -> float:
    return float(np.max(np.abs(np.asarray(x, dtype=np.float64) - np.asarray(ref, dtype=np.float64))))


def f16_ulps(a, b) -> np.ndarray:
    """Distance in fp16 ulps (units in the last place) between two fp16 arrays, elementwise."""
    return crosscheck.f16_ulps(a, b)


def to_numpy(x) -> np.ndarray:
    """numpy view/copy of a numpy array, torch tensor (any device) or cupy array."""
    if isinstance(x, np.ndarray):
        return x
    module = type(x).__module__.split(".")[0]
    if module == "torch":
        return x.detach().cpu().numpy()
    if module == "cupy":
        return x.get()
    return np.asarray(x)


def random_inputs(batch: int, heads: int, seqlen: int, seqlen_k: int, head_dim: int, seed: int = 0):
    """Standard normal q, k, v in float16 (numpy): fa_sim.reference.random_inputs."""
    return reference_inputs(batch, heads, seqlen, seqlen_k, head_dim, seed)


def attention_flops(batch: int, heads: int, seqlen: int, head_dim: int, causal: bool, seqlen_k: int | None = None) -> float:
    """4 * B * H * Nq * Nk * d (QK and PV), halved for causal (the benchmark convention)."""
    flops = 4.0 * batch * heads * seqlen * (seqlen if seqlen_k is None else seqlen_k) * head_dim
    return flops / 2 if causal else flops
