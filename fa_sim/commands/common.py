"""Arguments and inputs shared by the subcommands that run the kernel on a problem
(`fa sim`, `fa hw`, `fa compare`): the problem shape, the kernel shape, seeded random inputs."""

from __future__ import annotations

import numpy as np

from ..config import KernelConfig, SmemLayout
from ..reference import random_inputs as _random_inputs


def add_problem_arguments(p, seqlen: int = 128, heads: int = 1, scale: bool = True) -> None:
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=heads)
    p.add_argument("--seqlen", type=int, default=seqlen, help=f"query length Nq (default {seqlen})")
    p.add_argument("--seqlen-k", type=int, default=None, help="key/value length Nk (default: Nq)")
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--causal", action="store_true", help="top-left aligned causal mask (key <= query)")
    if scale:
        p.add_argument("--scale", type=float, default=None, help="softmax scale (default 1/sqrt(d))")
    p.add_argument("--seed", type=int, default=0)


def add_config_arguments(p) -> None:
    p.add_argument("--block-m", type=int, default=64)
    p.add_argument("--block-n", type=int, default=64)
    p.add_argument("--warps", type=int, default=4)
    p.add_argument("--smem", default=SmemLayout.SWIZZLED.value, choices=[s.value for s in SmemLayout])


def seqlen_k(args) -> int:
    """Nk from the arguments (default Nq), after checking every size is at least 1."""
    nk = args.seqlen if args.seqlen_k is None else args.seqlen_k
    for name, value in (("batch", args.batch), ("heads", args.heads), ("seqlen", args.seqlen), ("seqlen-k", nk)):
        if value < 1:
            raise ValueError(f"--{name} must be >= 1, got {value}")
    return nk


def random_inputs(args) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Standard-normal fp16 q [B,H,Nq,d], k and v [B,H,Nk,d] from --seed (fa_sim.reference)."""
    return _random_inputs(args.batch, args.heads, args.seqlen, seqlen_k(args), args.head_dim, args.seed)


def config_from_args(args, head_dim: int | None = None) -> KernelConfig:
    return KernelConfig(block_m=args.block_m, block_n=args.block_n, n_warps=args.warps, smem=args.smem,
                        head_dim=args.head_dim if head_dim is None else head_dim)


def load_npz(path, names=("q", "k", "v")) -> dict[str, np.ndarray]:
    """The named arrays of an .npz file; a missing or unreadable file or array is a ValueError."""
    try:
        with np.load(path) as data:
            missing = [n for n in names if n not in data]
            if missing:
                raise ValueError(f"{path} lacks array(s) {', '.join(missing)} (needs {', '.join(names)})")
            return {n: data[n] for n in names}
    except (OSError, EOFError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None


def load_qkv(path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q, k, v [B, H, N, d] from an .npz; a missing array or one of another rank is a ValueError."""
    data = load_npz(path)
    for name, x in data.items():
        if x.ndim != 4:
            raise ValueError(f"{path}: {name} must have rank 4 [batch, heads, seqlen, head_dim], got shape {x.shape}")
    return data["q"], data["k"], data["v"]


def parse_ops(text: str | None):
    """--ops 'LDSM,SHFL' -> frozenset of events.Op (None: all)."""
    from ..events import Op

    if not text:
        return None
    names = [t.strip().upper() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in Op.__members__]
    if bad:
        raise ValueError(f"unknown instruction class(es) {', '.join(bad)}; choose from {', '.join(Op.__members__)}")
    return frozenset(Op[n] for n in names)
