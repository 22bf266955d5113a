"""`fa hw`: run the real kernel on random inputs, like `fa sim`, and report its accuracy and time.

    fa hw --batch 1 --heads 4 --seqlen 1024 --causal      # table
    fa hw --seqlen 300 --seqlen-k 77 --smem padded --json # one JSON object
    fa hw --seqlen 4096 --head-dim 128 --config auto      # the GPU's fastest measured config (fa_hw.tuned)
    fa hw --heads 8 --heads-k 2 --seqlens 70,130,5        # a packed variable-length batch
    fa hw --batch 8 --heads 8 --seqlen 1 --seqlen-k 16384 --head-dim 128 --config auto --splits auto
                                                          # decoding: fa_hw.tuned_decode's config, its splits

Prints the relative Frobenius error of O and the max abs error of LSE against the float64
reference (fa_sim.accuracy: streamed in blocks; any non-finite O or LSE is reported with its cause,
null in JSON, exit status 1), the kernel time (CUDA events), TFLOP/s and the kernel's register
count. Without a GPU it exits with status 2 and one line (fa_hw.NoGPUError, printed by
fa_sim/cli.py); so it does without the `hw` extra (the line says what to install).

`--npz FILE` takes q, k, v from a file instead of random ones, as in `fa sim` (the file fixes the
shape; its cache_seqlens array with --splits). A packed variable-length batch (`--seqlens 70,130,5`,
Nk = Nq per sequence, or an --npz file with q [total_q, H, d], k and v [total_k, H_k, d],
cu_seqlens_q and cu_seqlens_k) runs fa2_fwd.cu's FA_VARLEN build; its errors are measured sequence
by sequence (fa_sim.varlen.measure_packed: the largest over the sequences, each held to its own
bound) and its TFLOP/s count each sequence's own pairs.

`--backward` runs fa_hw.forward, then the backward pass fa_hw.backward (fa2_bwd.cu, docs/backward.md)
on q, k, v and dO seeded after them, and prints dQ, dK, dV's errors against float64 with their
derived bound (exit 1 above it), each kernel's time and registers; `--dq atomic` sums dQ by
red.global.add.f32 (default deterministic: the dQ kernel's ordered loop over the K/V blocks);
`--dtype bf16` runs both passes in bf16 against the bf16 bound.

The GPU backend is imported when the command runs, not when the CLI starts: the other commands
do not depend on it.
"""

from __future__ import annotations

import argparse
import json

from ..accuracy import measure
from ..config import KernelConfig
from ..splitkv import packs_gqa
import numpy as np

from . import UsageError
from .common import (
    add_config_arguments,
    add_engine_arguments,
    add_problem_arguments,
    add_seqlens_argument,
    add_splitkv_arguments,
    auto_requested,
    check_input_memory,
    check_scale,
    config_from_args,
    features,
    heads_k,
    inputs_head_dim,
    kernel_from_args,
    packed_inputs,
    packed_problem,
    packed_random_inputs,
    problem_shape,
    run_inputs,
    splitkv,
)
from .backward import add_backward_arguments
from .inputs import HelpFormatter, add_inputs_argument
from .preflight import announce, problem_of, qkv_shapes


def register(subparsers) -> None:
    p = subparsers.add_parser("hw", help="run the real kernel on the GPU (NVRTC + cuda.core)",
                              description=__doc__, formatter_class=HelpFormatter)
    add_problem_arguments(p, seqlen=1024, heads=4)
    add_config_arguments(p)
    add_engine_arguments(p, simulator=False)
    add_inputs_argument(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_seqlens_argument(p)
    add_splitkv_arguments(p)
    add_backward_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import fa_hw  # lazy on purpose: the GPU backend, only when the user asks for the GPU
    from fa_hw import check
    from fa_hw.runtime import check_launch

    from . import backward

    backward.check_options(args, ("kernel",))
    split = splitkv(args)  # --splits, --cache-seqlens (or the --npz file's cache_seqlens), --pack-gqa
    if split and (args.backward or args.kernel is not None):
        raise UsageError("--splits / --cache-seqlens (split-KV decoding) run fa_hw's own kernel: without --backward "
                         "or --kernel")
    split_auto = bool(split) and auto_requested(args)  # fa_hw.tuned_decode's config, chosen by fa_hw.forward
    if split_auto:
        if getattr(args, "splits", None) not in (None, "auto"):
            raise UsageError(f"--config auto with split-KV decoding chooses the splits for its config: give --splits "
                             f"auto (or no --splits), not --splits {args.splits}")
        split["splits"] = "auto"
    if args.backward:
        from .backward_gpu import hw
        return hw(args)
    loaded = packed_inputs(args, split)  # the --npz arrays (args.cu_seqlens of a packed file) or --seqlens
    packed = args.cu_seqlens is not None
    d = inputs_head_dim(args, loaded)  # the file's, --head-dim, or the head_dim a --config tag names
    shapes = (qkv_shapes(problem_shape(args), heads_k(args)) if loaded is None
              else [tuple(np.shape(x)) for x in loaded])
    source = None
    if split_auto:  # the checks and inputs of the seed config; fa_hw.forward chooses on the placed inputs
        config = KernelConfig(head_dim=d, dtype=args.dtype)
    elif auto_requested(args):
        if packed:
            raise UsageError("--config auto does not apply to a packed batch (--seqlens or an --npz file's "
                             "cu_seqlens): fa_hw.tuned has no table for it; give the config's options")
        from fa_hw.autotune import Features
        from fa_hw.tuned import auto_for_device

        # the launch's checks (the features among them) before any timing; the candidates run its
        # features and dtype (the choice comes back in --dtype)
        plain = _problem(args, shapes, KernelConfig(head_dim=d, dtype=args.dtype))
        choice = auto_for_device(d, args.causal, plain.seqlen_k, plain.seqlen_q, plain.batch * plain.heads,
                                 Features.of(plain))
        config, source = choice.config, choice.source
    else:
        config = config_from_args(args, head_dim=d)
    kernel = kernel_from_args(args)
    check_scale(args, d)
    # every check before the inputs are made (fa_sim/commands/preflight.py): the arguments and the
    # launch, memory, the GPU and the kernel's cubin, then the float64 reference's estimate
    if loaded is None and not packed:
        check_input_memory(args)
    prob = packed_problem(args, loaded, config) if packed else _problem(args, shapes, config)
    check_launch(config, args.causal, kernel)
    announce("hw", prob, simulation=False)
    if packed and loaded is None:
        q, k, v = packed_random_inputs(args, prob, config.dtype)
    else:
        q, k, v = run_inputs(args, config, loaded)
    cu = dict(cu_seqlens_q=args.cu_seqlens[0], cu_seqlens_k=args.cu_seqlens[1]) if packed else {}
    out = fa_hw.forward(q, k, v, causal=args.causal, scale=args.scale, config="auto" if split_auto else config,
                        kernel=kernel, **features(args), **split, **cu)
    if split_auto:
        config, source = out.config, out.config_source
    o, lse = check.to_numpy(out.o), check.to_numpy(out.lse)
    if split:  # each sequence against float64 on its own keys
        from ..splitkv import measure_splitkv

        acc = measure_splitkv(type("R", (), {"o": o, "lse": lse, "causal": False, "scale": out.scale,
                                             "config": out.config}),
                              q, k, v, split["cache_seqlens"], args.softcap or 0.0)
        lens = split["cache_seqlens"]
        flops = prob.flops * (1.0 if lens is None else float(sum(lens)) / (prob.batch * prob.seqlen_k))
    elif packed:  # sequence by sequence, as fa sim --seqlens
        from ..varlen import measure_packed

        acc = measure_packed(o, lse, q, k, v, *args.cu_seqlens, args.causal, out.scale, out.config,
                             window=args.window, softcap=args.softcap or 0.0)
        flops = prob.flops  # summed over the sequences
    else:
        acc = measure(o, lse, q, k, v, args.causal, out.scale, out.config, window=args.window,
                      softcap=args.softcap or 0.0)
        flops = prob.flops  # the pairs the mask (causal, window) keeps
    shape = [prob.batch, prob.heads, prob.seqlen_q, prob.seqlen_k, d]  # packed: the longest Nq and Nk
    report = {
        "config": config.tag, "config_source": source, "kernel": None if kernel is None else str(kernel),
        "causal": args.causal, "shape": shape,
        "heads_k": prob.heads_k, "window": list(prob.window), "softcap": prob.softcap,
        **({"cu_seqlens_q": list(prob.cu_seqlens[0]), "cu_seqlens_k": list(prob.cu_seqlens[1])} if packed else {}),
        **({"splits": out.splits, "pack_gqa": packs_gqa(prob, split.get("pack_gqa"))} if split else {}),
        "scale": out.scale, **acc.to_json(),
        "kernel_ms": out.kernel_ms, "tflops": flops / (out.kernel_ms * 1e-3) / 1e12, "registers": out.registers,
    }
    if args.json:
        print(json.dumps(report, allow_nan=False))
        return 0 if acc.ok else 1
    if packed:
        lens = ",".join(map(str, prob.seqlens_q)) + ("" if prob.cu_seqlens[0] == prob.cu_seqlens[1] else
                                                      " / Nk " + ",".join(map(str, prob.seqlens_k)))
        what = f"packed (H, d) = ({prob.heads}, {d}) of {prob.batch} sequences, Nq {lens}"
    else:
        what = f"(B, H, Nq, Nk, d) = {tuple(shape)}"
    print(f"fa hw  {report['config']}  causal={args.causal}  {what}"
          + "".join(f"  {f}" for f in prob.features() if not f.startswith("varlen"))
          + (f"  splits={out.splits}" if split else "")
          + ("  GQA packed" if split and report["pack_gqa"] else "")
          + ("" if kernel is None else f"  kernel {kernel.name}"))
    if source is not None:
        print(f"  config auto: {source}")
    print(f"  rel err O (Frobenius, vs float64) {_num(acc.rel_err_o)}" + ("   (largest over the sequences)" if packed
                                                                          else ""))
    print(f"  max abs err LSE                   {_num(acc.max_abs_err_lse)}")
    for line in acc.failures():  # non-finite results and errors above their documented bound
        print(f"  {line}")
    print(f"  kernel time                       {report['kernel_ms']:.4f} ms   ({report['tflops']:.1f} TFLOP/s, first launch)")
    print(f"  registers per thread              {report['registers']}")
    return 0 if acc.ok else 1


def _problem(args, shapes, config: KernelConfig):
    """The dense launch of q, k, v of these shapes (the --npz file's or the options'), checked as
    fa_hw.forward checks it; a ValueError (k's heads not dividing q's, ...) is one UsageError."""
    try:
        return problem_of(shapes, args.causal, args.scale, config, **features(args))
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _num(x: float | None) -> str:
    return "not finite (see below)" if x is None else f"{x:.3e}"
