"""`fa hw`: run the real kernel on random inputs, like `fa sim`, and report its accuracy and time.

    fa hw --batch 1 --heads 4 --seqlen 1024 --causal      # table
    fa hw --seqlen 300 --seqlen-k 77 --smem padded --json # one JSON object

Prints the relative Frobenius error of O and the max abs error of LSE against the float64
reference, the kernel time (CUDA events), TFLOP/s and the kernel's register count. Without a GPU
it exits with status 2 and one line (fa_hw.NoGPUError, printed by fa_sim/cli.py).
"""

from __future__ import annotations

import argparse
import json

from fa_sim.config import KernelConfig, SmemLayout

from . import check
from .forward import forward


def register(subparsers) -> None:
    p = subparsers.add_parser("hw", help="run the real kernel on the GPU (NVRTC + cuda.core)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seqlen", type=int, default=1024, help="query length Nq")
    p.add_argument("--seqlen-k", type=int, default=None, help="key/value length Nk (default: Nq)")
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--causal", action="store_true", help="top-left causal mask (key k <= query q)")
    p.add_argument("--scale", type=float, default=None, help="softmax scale (default 1/sqrt(head_dim))")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--block-m", type=int, default=64)
    p.add_argument("--block-n", type=int, default=64)
    p.add_argument("--warps", type=int, default=4)
    p.add_argument("--smem", choices=[m.value for m in SmemLayout], default=SmemLayout.SWIZZLED.value)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    config = KernelConfig(block_m=args.block_m, block_n=args.block_n, head_dim=args.head_dim,
                          n_warps=args.warps, smem=args.smem)
    nk = args.seqlen if args.seqlen_k is None else args.seqlen_k
    for name, value in (("batch", args.batch), ("heads", args.heads), ("seqlen", args.seqlen), ("seqlen-k", nk)):
        if value < 1:
            raise ValueError(f"--{name} must be at least 1, got {value}")
    q, k, v = check.random_inputs(args.batch, args.heads, args.seqlen, nk, args.head_dim, args.seed)
    out = forward(q, k, v, causal=args.causal, scale=args.scale, config=config)
    o_ref, lse_ref = check.reference(q, k, v, args.causal, out.scale)
    flops = check.attention_flops(args.batch, args.heads, args.seqlen, args.head_dim, args.causal, nk)
    report = {
        "config": config.tag, "causal": args.causal, "shape": [args.batch, args.heads, args.seqlen, nk, args.head_dim],
        "scale": out.scale, "rel_err_o": check.rel_err(out.o, o_ref), "max_abs_err_lse": check.max_abs_err(out.lse, lse_ref),
        "kernel_ms": out.kernel_ms, "tflops": flops / (out.kernel_ms * 1e-3) / 1e12, "registers": out.registers,
    }
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"fa hw  {report['config']}  causal={args.causal}  (B, H, Nq, Nk, d) = {tuple(report['shape'])}")
    print(f"  rel err O (Frobenius, vs float64) {report['rel_err_o']:.3e}")
    print(f"  max abs err LSE                   {report['max_abs_err_lse']:.3e}")
    print(f"  kernel time                       {report['kernel_ms']:.4f} ms   ({report['tflops']:.1f} TFLOP/s, first launch)")
    print(f"  registers per thread              {report['registers']}")
    return 0
