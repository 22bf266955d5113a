"""A FlashAttention-2 forward pass in Triton: the classic fused-attention tutorial kernel.

One program per (BLOCK_M query rows, batch*head): load the Q tile once, walk the K/V tiles with the
online softmax (running max m, running sum l, unnormalised accumulator), normalise at the end and
store O (fp16) and LSE (fp32, natural log) -- the algorithm of the spec, at tile level rather than
lane level. Scores are kept in the log2 domain (exp2 with s*log2(e)), as the tutorial does.

Used by experiments/bench_sim.py to compare our lane-level simulator with Triton's tile-level
interpreter. TRITON_INTERPRET must be set before triton is imported: this module sets it to 1
(the CPU interpreter, CPU torch tensors) unless the environment already says otherwise.
"""

from __future__ import annotations

import math
import os
import sys

if "triton" not in sys.modules:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

BLOCK_M = 64
BLOCK_N = 64
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


@triton.jit
def _attn_fwd(Q, K, V, O, LSE, sm_scale,
              stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
              stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_om,
              n_heads, n_q, n_k,
              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    b, h = bh // n_heads, bh % n_heads
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q_ptrs = Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :]
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh
    q = tl.load(q_ptrs, mask=offs_m[:, None] < n_q, other=0.0)  # [BLOCK_M, HEAD_DIM] fp16

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # running max of s*S*log2(e)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * 1.4426950408889634
    hi = n_k
    if CAUSAL:  # top-left alignment: key k visible iff k <= q; later blocks are skipped
        hi = tl.minimum(n_k, (start_m + 1) * BLOCK_M)
    for start_n in range(0, hi, BLOCK_N):
        keys = start_n + offs_n
        k = tl.load(k_base + keys[:, None] * stride_kn + offs_d[None, :], mask=keys[:, None] < n_k, other=0.0)
        qk = tl.dot(q, tl.trans(k))  # [BLOCK_M, BLOCK_N] fp32
        valid = keys[None, :] < n_k
        if CAUSAL:
            valid = valid & (keys[None, :] <= offs_m[:, None])
        qk = tl.where(valid, qk * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + keys[:, None] * stride_vn + offs_d[None, :], mask=keys[:, None] < n_k, other=0.0)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(tl.float16), v, acc)
        m_i = m_new

    acc = acc / l_i[:, None]
    rows = offs_m < n_q
    o_ptrs = O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :]
    tl.store(o_ptrs, acc.to(tl.float16), mask=rows[:, None])
    tl.store(LSE + bh * n_q + offs_m, (m_i + tl.math.log2(l_i)) * 0.6931471805599453, mask=rows)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """q [B, H, Nq, d], k and v [B, H, Nk, d] fp16 -> (o [B, H, Nq, d] fp16, lse [B, H, Nq] fp32)."""
    if q.dim() != 4 or k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"need q [B,H,Nq,d], k and v [B,H,Nk,d]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    q, k, v = (x.to(torch.float16).contiguous() for x in (q, k, v))
    n_batch, n_heads, n_q, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    o = torch.empty_like(q)
    lse = torch.empty((n_batch, n_heads, n_q), dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(n_q, BLOCK_M), n_batch * n_heads)
    _attn_fwd[grid](q, k, v, o, lse, scale,
                    q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                    v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1), o.stride(2),
                    n_heads, n_q, k.shape[2],
                    HEAD_DIM=d, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, CAUSAL=causal)
    return o, lse
