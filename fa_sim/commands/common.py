"""Arguments and inputs shared by the subcommands that run the kernel on a problem
(`fa sim`, `fa hw`, `fa compare`): the problem shape, the kernel shape, seeded random inputs."""

from __future__ import annotations

import numpy as np

from ..config import KernelConfig, SmemLayout


def add_problem_arguments(p, seqlen: int = 128) -> None:
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=1)
    p.add_argument("--seqlen", type=int, default=seqlen, help=f"query length Nq (default {seqlen})")
    p.add_argument("--seqlen-k", type=int, default=None, help="key/value length Nk (default: Nq)")
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--causal", action="store_true", help="top-left aligned causal mask (key <= query)")
    p.add_argument("--scale", type=float, default=None, help="softmax scale (default 1/sqrt(d))")
    p.add_argument("--seed", type=int, default=0)


def add_config_arguments(p) -> None:
    p.add_argument("--block-m", type=int, default=64)
    p.add_argument("--block-n", type=int, default=64)
    p.add_argument("--warps", type=int, default=4)
    p.add_argument("--smem", default=SmemLayout.SWIZZLED.value, choices=[s.value for s in SmemLayout])


def random_inputs(args) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Standard-normal fp16 q [B,H,Nq,d], k and v [B,H,Nk,d] from --seed."""
    for name in ("batch", "heads", "seqlen"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    nk = args.seqlen if args.seqlen_k is None else args.seqlen_k
    if nk < 1:
        raise ValueError("--seqlen-k must be >= 1")
    rng = np.random.default_rng(args.seed)
    shape_q = (args.batch, args.heads, args.seqlen, args.head_dim)
    shape_k = (args.batch, args.heads, nk, args.head_dim)
    return tuple(rng.standard_normal(s).astype(np.float16) for s in (shape_q, shape_k, shape_k))


def config_from_args(args, head_dim: int | None = None) -> KernelConfig:
    return KernelConfig(block_m=args.block_m, block_n=args.block_n, n_warps=args.warps, smem=args.smem,
                        head_dim=args.head_dim if head_dim is None else head_dim)
