"""Packed variable-length batches (issue 38 item 5; docs/features.md "Variable lengths").

FlashAttention-2's flash_attn_varlen_func: q [total_q, H, d], k and v [total_k, H_k, d], the
sequences packed one after the other without padding; cu_seqlens_q and cu_seqlens_k (int32, B + 1
offsets, starting at 0, non-decreasing, the last the total) say where sequence b starts:
rows cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 of q are its queries (keys likewise). Sequence b
is the dense problem of its own lengths (Nq_b, Nk_b): masks (causal, window) are per sequence,
with this kernel's top-left alignment (key j visible to query i iff j <= i, counted from each
sequence's start; FlashAttention-2 aligns to the bottom right, which differs when Nq_b != Nk_b).
A sequence may have no queries (Nq_b = 0: its CTAs exit at once); one with queries needs a key.

The kernel (FA_VARLEN) reads its buffers head-major: q, o [H, total_q, d], k, v [H_k, total_k, d],
lse [H, total_q] (FlashAttention-2's varlen softmax_lse layout). `head_major` views the packed
inputs that way (the backends copy them contiguous), and O comes back as [total_q, H, d].
"""

from __future__ import annotations

import numpy as np

from .problem import Problem, check_heads_k
from .validate import INT32_MAX, MAX_GRID_DIM, check_causal, check_config, check_scale

__all__ = ["check_cu_seqlens", "head_major", "packed_o", "make_varlen_problem", "cu_seqlens_of", "describe_cta"]


def _host_ints(cu, name: str) -> np.ndarray:
    """cu as a host numpy array (torch / cupy tensors are copied to the host; they are tiny)."""
    if hasattr(cu, "get") and type(cu).__module__.startswith("cupy"):
        cu = cu.get()
    elif callable(getattr(cu, "cpu", None)) and type(cu).__module__.startswith("torch"):
        cu = cu.detach().cpu().numpy()
    try:
        return np.asarray(cu)
    except Exception:
        raise ValueError(f"{name} must be an int32 array of batch + 1 offsets, got {type(cu).__name__}") from None


def check_cu_seqlens(cu, name: str, total: int) -> np.ndarray:
    """cu_seqlens as an int32 numpy array: 1-D, int32, at least 2 offsets (batch >= 1), starting at 0,
    non-decreasing, the last = total (the packed rows); one ValueError line naming what is wrong."""
    a = _host_ints(cu, name)
    what = f"{name} must be a 1-D int32 array of batch + 1 offsets, starting at 0, non-decreasing, ending at {total}"
    if a.dtype != np.int32:
        raise ValueError(f"{what}; got dtype {a.dtype} (pass np.int32 / torch.int32 offsets)")
    if a.ndim != 1 or len(a) < 2:
        raise ValueError(f"{what}; got shape {a.shape}")
    if a[0] != 0:
        raise ValueError(f"{what}; got {name}[0] = {int(a[0])}")
    drop = np.flatnonzero(np.diff(a.astype(np.int64)) < 0)
    if len(drop):
        i = int(drop[0])
        raise ValueError(f"{what}; it decreases at {name}[{i}] = {int(a[i])} > {name}[{i + 1}] = {int(a[i + 1])}")
    if a[-1] != total:
        raise ValueError(f"{what} (the packed rows); got {name}[-1] = {int(a[-1])}")
    return a


def cu_seqlens_of(lengths) -> np.ndarray:
    """Lengths of the sequences -> their cu_seqlens (int32, starting at 0)."""
    n = np.asarray(lengths, dtype=np.int64)
    if n.ndim != 1 or not len(n) or (n < 0).any() or n.sum() > INT32_MAX:
        raise ValueError(f"sequence lengths must be a non-empty list of integers >= 0, got {lengths!r:.60}")
    return np.concatenate([[0], np.cumsum(n)]).astype(np.int32)


def head_major(x, name: str, total_name: str):
    """A packed input [total, heads, d] as the rank-4 view [1, heads, total, d] the kernel's buffers
    have (a view: numpy, torch or cupy; the validation of fa_sim.validate then reads it as any input).
    One ValueError line for another rank."""
    shape = getattr(x, "shape", None)
    if shape is None:
        x = np.asarray(x)
        shape = x.shape
    if len(shape) != 3:
        raise ValueError(f"{name} of a packed batch (cu_seqlens) must have rank 3 [{total_name}, heads, head_dim], "
                         f"got shape {tuple(int(n) for n in shape)}")
    if callable(getattr(x, "permute", None)):  # torch
        return x.permute(1, 0, 2).unsqueeze(0)
    return x.transpose(1, 0, 2)[None]


def packed_o(o_head_major):
    """O [1 or H, ..., total_q, d] head-major -> [total_q, H, d] (numpy, torch or cupy), contiguous."""
    o = o_head_major.reshape(o_head_major.shape[-3], o_head_major.shape[-2], o_head_major.shape[-1])
    if callable(getattr(o, "permute", None)):
        return o.permute(1, 0, 2).contiguous()
    return o.transpose(1, 0, 2).copy()


def make_varlen_problem(q_shape, k_shape, v_shape, cu_seqlens_q, cu_seqlens_k, causal, scale, config,
                        window=None, softcap=None, *, dtype: str | None = None) -> Problem:
    """The packed launch of head-major shapes ([1, H, total_q, d], [1, H_k, total_k, d]: `head_major`)
    and offsets, after every check that reads no values of q, k, v; one ValueError line each."""
    q, k, v = (tuple(int(n) for n in s) for s in (q_shape, k_shape, v_shape))
    if k != v:
        raise ValueError(f"k and v must have the same shape [total_k, heads_k, head_dim], got "
                         f"{(k[2], k[1], k[3])} and {(v[2], v[1], v[3])}")
    if q[3] != k[3]:
        raise ValueError(f"q and k disagree in head_dim: {q[3]} vs {k[3]}")
    for name, s, total in (("q", q, "total_q"), ("k", k, "total_k")):
        if 0 in (s[1], s[3]):
            raise ValueError(f"{name} has shape {(s[2], s[1], s[3])} [{total}, heads, head_dim]: heads and head_dim "
                             "must be at least 1")
    cq = check_cu_seqlens(cu_seqlens_q, "cu_seqlens_q", q[2])
    ck = check_cu_seqlens(cu_seqlens_k, "cu_seqlens_k", k[2])
    if len(cq) != len(ck):
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must both have batch + 1 offsets, got {len(cq)} and {len(ck)}")
    lq, lk = np.diff(cq.astype(np.int64)), np.diff(ck.astype(np.int64))
    if q[2] < 1:
        raise ValueError("a packed batch needs at least one query (total_q = 0)")
    empty = np.flatnonzero((lq > 0) & (lk == 0))
    if len(empty):
        b = int(empty[0])
        raise ValueError(f"sequence {b} has {int(lq[b])} queries but no key (cu_seqlens_k[{b}] = cu_seqlens_k[{b + 1}] = "
                         f"{int(ck[b])}); every sequence with queries needs at least one key")
    batch = len(cq) - 1
    for what, n, axis in (("batch (len(cu_seqlens) - 1)", batch, 2), ("heads", q[1], 1)):
        if n > MAX_GRID_DIM[axis]:
            raise ValueError(f"{what} = {n:,} is over {MAX_GRID_DIM[axis]:,}, the grid's {'xyz'[axis]} limit "
                             f"(a packed launch's grid is ceil(max Nq / block_m) x heads x batch)")
    d = q[3]
    return Problem(batch, q[1], int(lq.max()), int(lk.max()), check_causal(causal), check_scale(scale, d),
                   check_config(config, d, dtype), check_heads_k(k[1], q[1]), window, softcap,
                   cu_seqlens=(tuple(int(x) for x in cq), tuple(int(x) for x in ck)))


def sequence_view(x, cu, b: int):
    """Sequence b of a packed [total, H, d] array as a dense [1, H, N_b, d] one (a view)."""
    return x[int(cu[b]):int(cu[b + 1])].transpose(1, 0, 2)[None]


def measure_packed(o, lse, q, k, v, cu_seqlens_q, cu_seqlens_k, causal: bool, scale: float, config,
                   window=None, softcap: float = 0.0):
    """fa_sim.accuracy.measure of each sequence of a packed run (o [total_q, H, d], lse [H, total_q]),
    as one Accuracy: the largest relative error of O and LSE errors over the sequences (each held to
    its own documented bound), the findings of all, a finding's batch index the sequence's."""
    from dataclasses import replace

    from .accuracy import Accuracy, measure

    parts = []
    for b in range(len(cu_seqlens_q) - 1):
        if cu_seqlens_q[b + 1] == cu_seqlens_q[b]:
            continue
        acc = measure(sequence_view(o, cu_seqlens_q, b), lse[None, :, int(cu_seqlens_q[b]):int(cu_seqlens_q[b + 1])],
                      sequence_view(q, cu_seqlens_q, b), sequence_view(k, cu_seqlens_k, b),
                      sequence_view(v, cu_seqlens_k, b), causal, scale, config, window=window, softcap=softcap)
        moved = lambda fs: tuple(f if f.first is None else replace(f, first=(b, *f.first[1:])) for f in fs)  # noqa: E731
        parts.append(replace(acc, nonfinite=moved(acc.nonfinite), above_bound=moved(acc.above_bound)))

    def worst(name):
        values = [getattr(p, name) for p in parts]
        return None if any(x is None for x in values) else max(values)

    return Accuracy(worst("rel_err_o"), worst("max_abs_err_lse"), worst("max_rel_err_lse"),
                    sum((p.nonfinite for p in parts), ()), sum((p.above_bound for p in parts), ()))


def describe_cta(prob: Problem, cta: int) -> str:
    """What CTA `cta` of a packed launch computes, in words: grid (Q blocks of the longest sequence,
    H, B), linear id blockIdx.x + n_m_blocks (h + H b): sequence b, head h, Q block m_block, and the
    rows of the packed q and k it reads (or that it exits at once, its Q block past the sequence)."""
    per_seq = prob.n_m_blocks * prob.heads
    b, h = divmod(cta // prob.n_m_blocks, prob.heads)
    m_block = int(prob.m_block_of(cta))
    (cq, ck), bm = prob.cu_seqlens, prob.config.block_m
    nq, nk = cq[b + 1] - cq[b], ck[b + 1] - ck[b]
    who = f"CTA {cta}: sequence {b} (CTAs {b * per_seq}..{(b + 1) * per_seq - 1}), head {h}, Q block {m_block}"
    if m_block * bm >= nq:
        return (f"{who}; it exits at once: sequence {b} has {nq} queries, Q blocks "
                f"{'none' if nq == 0 else f'0..{-(-nq // bm) - 1}'} (block_m {bm})")
    last = min(nq, (m_block + 1) * bm) - 1
    return (f"{who}: queries {m_block * bm}..{last} of the sequence (rows {cq[b] + m_block * bm}..{cq[b] + last} of "
            f"the packed q); the sequence's keys 0..{nk - 1} are rows {ck[b]}..{ck[b + 1] - 1} of the packed k, v")
