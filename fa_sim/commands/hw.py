"""`fa hw`: run the real kernel on random inputs, like `fa sim`, and report its accuracy and time.

    fa hw --batch 1 --heads 4 --seqlen 1024 --causal      # table
    fa hw --seqlen 300 --seqlen-k 77 --smem padded --json # one JSON object
    fa hw --seqlen 4096 --head-dim 128 --config auto      # the GPU's fastest measured config (fa_hw.tuned)

Prints the relative Frobenius error of O and the max abs error of LSE against the float64
reference (fa_sim.accuracy: streamed in blocks; any non-finite O or LSE is reported with its cause,
null in JSON, exit status 1), the kernel time (CUDA events), TFLOP/s and the kernel's register
count. Without a GPU it exits with status 2 and one line (fa_hw.NoGPUError, printed by
fa_sim/cli.py); so it does without the `hw` extra (the line says what to install).

`--backward` runs fa_hw.forward, then the backward pass fa_hw.backward (fa2_bwd.cu, docs/backward.md)
on q, k, v and dO seeded after them, and prints dQ, dK, dV's errors against float64 with their
derived bound (exit 1 above it), each kernel's time and registers; `--dq atomic` sums dQ by
red.global.add.f32 (default deterministic: the dQ kernel's ordered loop over the K/V blocks).

The GPU backend is imported when the command runs, not when the CLI starts: the other commands
do not depend on it.
"""

from __future__ import annotations

import argparse
import json

from ..accuracy import measure
from ..config import KernelConfig
from .common import (
    add_config_arguments,
    add_engine_arguments,
    add_problem_arguments,
    add_splitkv_arguments,
    auto_requested,
    check_input_memory,
    check_scale,
    config_from_args,
    features,
    heads_k,
    kernel_from_args,
    problem_head_dim,
    problem_shape,
    run_inputs,
    seqlen_k,
    splitkv,
)
from .backward import add_backward_arguments
from .preflight import announce, problem_of, qkv_shapes


def register(subparsers) -> None:
    p = subparsers.add_parser("hw", help="run the real kernel on the GPU (NVRTC + cuda.core)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_problem_arguments(p, seqlen=1024, heads=4)
    add_config_arguments(p)
    add_engine_arguments(p, simulator=False)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_splitkv_arguments(p)
    add_backward_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import fa_hw  # lazy on purpose: the GPU backend, only when the user asks for the GPU
    from fa_hw import check
    from fa_hw.runtime import check_launch
    from fa_hw.tuned import auto_for_device

    from . import backward

    backward.check_options(args, ("kernel",))
    split = splitkv(args)
    if split and (args.backward or auto_requested(args) or args.kernel is not None):
        from . import UsageError

        raise UsageError("--splits / --cache-seqlens (split-KV decoding) run fa_hw's own kernel: without --backward, "
                         "--config auto or --kernel")
    if args.backward:
        from .backward_gpu import hw
        return hw(args)
    nk = seqlen_k(args)
    source = None
    if auto_requested(args):
        from fa_hw.autotune import Features

        # the launch's checks (the features among them) before any timing; the candidates run its
        # features and dtype (the choice comes back in --dtype)
        plain = problem_of(qkv_shapes(problem_shape(args), heads_k(args)), args.causal, args.scale,
                           KernelConfig(head_dim=args.head_dim, dtype=args.dtype), **features(args))
        choice = auto_for_device(args.head_dim, args.causal, nk, args.seqlen, args.batch * args.heads,
                                 Features.of(plain))
        config, source = choice.config, choice.source
    else:
        config = config_from_args(args)
    kernel = kernel_from_args(args)
    d = problem_head_dim(args)  # --head-dim, or the head_dim a --config tag names
    check_scale(args, d)
    # every check before the inputs are made (fa_sim/commands/preflight.py): memory, the GPU and the
    # kernel's cubin, then the float64 reference's estimate
    check_input_memory(args)
    check_launch(config, args.causal, kernel)
    prob = problem_of(qkv_shapes(problem_shape(args), heads_k(args)), args.causal, args.scale, config, **features(args))
    announce("hw", prob, simulation=False)
    q, k, v = run_inputs(args, config)
    out = fa_hw.forward(q, k, v, causal=args.causal, scale=args.scale, config=config, kernel=kernel, **features(args),
                        **split)
    if split:  # each sequence against float64 on its own keys
        from ..splitkv import measure_splitkv

        acc = measure_splitkv(type("R", (), {"o": check.to_numpy(out.o), "lse": check.to_numpy(out.lse),
                                             "causal": False, "scale": out.scale, "config": out.config}),
                              q, k, v, split["cache_seqlens"], args.softcap or 0.0)
        lens = split["cache_seqlens"]
        flops = prob.flops * (1.0 if lens is None else float(sum(lens)) / (prob.batch * prob.seqlen_k))
    else:
        acc = measure(check.to_numpy(out.o), check.to_numpy(out.lse), q, k, v, args.causal, out.scale, out.config,
                      window=args.window, softcap=args.softcap or 0.0)
        flops = prob.flops  # the pairs the mask (causal, window) keeps
    report = {
        "config": config.tag, "config_source": source, "kernel": None if kernel is None else str(kernel), "causal": args.causal, "shape": [args.batch, args.heads, args.seqlen, nk, d],
        "heads_k": prob.heads_k, "window": list(prob.window), "softcap": prob.softcap,
        **({"splits": out.splits} if split else {}),
        "scale": out.scale, **acc.to_json(),
        "kernel_ms": out.kernel_ms, "tflops": flops / (out.kernel_ms * 1e-3) / 1e12, "registers": out.registers,
    }
    if args.json:
        print(json.dumps(report, allow_nan=False))
        return 0 if acc.ok else 1
    print(f"fa hw  {report['config']}  causal={args.causal}  (B, H, Nq, Nk, d) = {tuple(report['shape'])}"
          + "".join(f"  {f}" for f in prob.features())
          + (f"  splits={out.splits}" if split else "")
          + ("" if kernel is None else f"  kernel {kernel.name}"))
    if source is not None:
        print(f"  config auto: {source}")
    print(f"  rel err O (Frobenius, vs float64) {_num(acc.rel_err_o)}")
    print(f"  max abs err LSE                   {_num(acc.max_abs_err_lse)}")
    for line in acc.failures():  # non-finite results and errors above their documented bound
        print(f"  {line}")
    print(f"  kernel time                       {report['kernel_ms']:.4f} ms   ({report['tflops']:.1f} TFLOP/s, first launch)")
    print(f"  registers per thread              {report['registers']}")
    return 0 if acc.ok else 1


def _num(x: float | None) -> str:
    return "not finite (see below)" if x is None else f"{x:.3e}"
