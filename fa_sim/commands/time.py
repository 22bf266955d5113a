"""`fa time`: the predicted kernel time of one launch on a GPU model, its limiter and stall
reasons, without a GPU (fa_sim.timing).

    fa time --batch 4 --heads 16 --seqlen 2048                 # the seed config on the H200 model
    fa time --seqlen 4096 --head-dim 128 --config auto --causal
    fa time --config m128n64d64w4-swizzled-s2 --json           # one JSON object, kernel_ms inside
    fa time --heads 8 --heads-k 2 --window 256,256 --softcap 30 --dtype bf16   # issue 38's features

    fa time --backward --heads 4 --seqlen 512 --head-dim 64    # the backward pass's three launches
    fa time --backward --heads 4 --seqlen 512 --dtype bf16     # ... of its bf16 build
    fa time --backward --seqlen 2048 --config 128x8s1fr4p      # a tuned candidate by its label (docs/backward.md)
    fa time --backward --seqlen 2048 --config auto             # the modelled GPU's tuned backward table entry
    fa time --heads 8 --seqlens 70,130,5                       # a packed variable-length batch
    fa time --batch 2 --heads 8 --seqlen 1 --seqlen-k 8192 --splits auto --cache-seqlens 8192,3000

How the prediction is made: NVRTC compiles the kernel for the GPU's arch; the functional run of a
representative CTA on the PTX engine gives every warp's path, and each warp is walked through the
SASS with the control bits ptxas sets (stall counts, scoreboards), every SASS branch decided by the
PTX branch it compiles from (fa_sim.timing.walk: any control flow, an edited .cu, pingpong's warp
groups); one SM is run cycle by cycle with 1, half and all of its resident CTAs (representative CTAs: the
grid's CTAs are not all timed; co-resident CTAs start a fraction of a round apart, as in a running
grid, and the first wave's start-up is timed with its CTAs started together); the grid is then
dispatched over all SMs in launch order with each SM's measured rate per occupancy. Parameters per GPU:
fa_sim/timing/gpus.py (the A100's from public figures, not validated). Accuracy on the H200 and
how it was measured: README, "How long it runs". `--perfetto FILE.json` writes each warp's
instruction issue on one SM as a timeline (Perfetto, chrome://tracing). --heads-k, --window,
--softcap and --dtype bf16 time that build's own SASS (docs/timing.md, "Features"; a window whose
probe twin compiles otherwise is refused in one line).

Packed batches (`--seqlens 70,130,5`, or an `--npz` file with cu_seqlens_q / cu_seqlens_k) and
split-KV decoding (`--splits N|auto`, `--cache-seqlens L,...` or the `--npz` file's cache_seqlens)
are timed launch by launch as the simulator runs them, each with fa_sim.timing.predict_launch (one
CTA per path class run on the PTX engine, every warp's path walked through that launch's SASS, the busiest SM
timed): the packed FA_VARLEN launch, or the split launch and the combine launch; the total is their
sum (docs/timing.md, "Features"). `--splits auto` is the simulator's choice, made for 132 SMs. An
`--npz` file gives the shapes and offsets only (the launches run on seeded inputs).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

from ..contract.errors import KernelSourceError, ToolError
from ..problem import Problem
from ..timing import GPUS, predict
from ..timing.cost import timing_cost
from ..validate import check_launch
from ..timing.predict import issue_timeline
from . import UsageError
from .common import (
    add_config_arguments,
    add_engine_arguments,
    add_problem_arguments,
    auto_requested,
    check_scale,
    config_from_args,
    kernel_from_args,
    heads_k,
    problem_head_dim,
    seqlen_k,
)
from .backward import add_backward_arguments
from .common import add_seqlens_argument, add_splitkv_arguments, inputs_head_dim, packed_inputs, refuse, splitkv
from .inputs import add_inputs_argument
from .outputs import Kind, Output, check_outputs, write_text


def register(subparsers) -> None:
    p = subparsers.add_parser("time", help="predict the kernel time on a GPU model, its limiter and stalls (no GPU)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_problem_arguments(p, seqlen=2048, heads=16)
    add_config_arguments(p)
    add_engine_arguments(p, simulator=False)
    p.add_argument("--gpu", choices=sorted(GPUS), default="h200",
                   help="the GPU model (default h200; one of a100, h200; a100: public figures, not validated)")
    p.add_argument("--json", action="store_true", help="print one JSON object (the prediction under kernel_ms)")
    p.add_argument("--perfetto", metavar="FILE.json", default=None,
                   help="write each warp's instruction issue on one SM (its resident CTAs, 4 rounds) as Chrome "
                        "trace events for Perfetto or chrome://tracing (default: none)")
    p.add_argument("--force", action="store_true", help="overwrite an existing --perfetto file (default: refuse)")
    add_seqlens_argument(p)
    add_splitkv_arguments(p)
    add_inputs_argument(p)
    add_backward_arguments(p)
    p.set_defaults(func=run)


def check_cost(args, prob: Problem) -> None:
    """The timing model's cost for these sizes (fa_sim.timing.cost), refused before any work past
    its limit or this machine's memory, in the options' terms; predict prints the estimate and
    progress of a long one on stderr."""
    sizes = f"--batch {prob.batch} --heads {prob.heads} --seqlen {prob.seqlen_q}" + (
        "" if args.seqlen_k is None else f" --seqlen-k {prob.seqlen_k}")
    try:
        timing_cost(prob).check(sizes, "lower --batch, --heads, --seqlen or --seqlen-k")
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def for_gpu(args, config):
    """The config, when its shared memory fits one CTA on the modelled GPU's arch (KernelConfig.check_arch:
    sm_80 163 KiB, sm_90 227 KiB), else a UsageError naming --gpu, before any compile."""
    try:
        return config.check_arch(GPUS[args.gpu].arch)
    except ValueError as exc:
        raise UsageError(f"--gpu {args.gpu}: {exc}") from None


def launch_problem(args, prob: Problem) -> Problem:
    """The problem, within the GPU's launch limits (fa_sim.validate.check_launch), or a UsageError
    naming the options."""
    try:
        return check_launch(prob)
    except ValueError as exc:
        raise UsageError(f"--batch {args.batch} --heads {args.heads} --seqlen {args.seqlen}: {exc}") from None


def _of_kernel(kernel, fn, *args):
    """fn(*args); with --kernel, a model error about the variant (its SASS structure, a path the
    functional run takes that no SASS path explains, a deadlock of the SM model) names --kernel and the
    file: the model's own words alone say neither. Errors that name the file already (the kernel
    contract's, NVRTC's) pass as they are."""
    try:
        return fn(*args)
    except (ValueError, RuntimeError) as exc:
        if kernel is None or isinstance(exc, (KernelSourceError, ToolError)):
            raise
        raise UsageError(f"--kernel {kernel}: the timing model cannot time this variant: {exc} "
                         "(docs/timing.md, \"Time from the run\")") from None


def _backward_auto(args):
    """--config auto with --backward: fa_hw.tuned_backward.lookup for the modelled GPU's driver name and
    arch (the H200 model borrows the H100's sm_90 table; the A100 model has none: DEFAULT_TILES)."""
    gpu = GPUS[args.gpu]

    def auto(head_dim: int, dtype: str):
        from fa_hw.tuned_backward import lookup

        return lookup(head_dim, args.causal, seqlen_k(args), gpu=gpu.marketing_name, arch=gpu.arch, dtype=dtype)
    return auto


def run(args: argparse.Namespace) -> int:
    from . import backward

    backward.check_options(args)
    if args.backward:  # check_options refused --seqlens, --splits, --cache-seqlens and --pack-gqa
        if args.npz is not None:
            raise UsageError(f"{args.npz_option} does not apply with fa time --backward (it times seeded inputs "
                             "of the shape options)")
        return backward.time_(args, _backward_auto(args))
    if (args.npz is not None or args.seqlens is not None or args.splits is not None or args.cache_seqlens is not None
            or args.pack_gqa is not None):
        return run_features(args)
    d = problem_head_dim(args)
    check_scale(args, d)
    nk = seqlen_k(args)
    source = None
    if auto_requested(args):
        from fa_hw.tuned import auto_config

        gpu = GPUS[args.gpu]
        choice = auto_config(d, args.causal, nk, gpu=gpu.marketing_name, arch=gpu.arch)
        config, source = dataclasses.replace(choice.config, dtype=args.dtype), choice.source
    else:
        config = for_gpu(args, config_from_args(args, head_dim=d))
    kernel = kernel_from_args(args)
    perfetto = None if args.perfetto is None else Output("--perfetto", Path(args.perfetto), Kind.FILE)
    check_outputs(args, perfetto)
    try:
        prob = Problem(args.batch, args.heads, args.seqlen, nk, args.causal, 1.0, config, heads_k=heads_k(args),
                       window=args.window, softcap=args.softcap)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    prob = launch_problem(args, prob)
    check_cost(args, prob)
    pred = _of_kernel(kernel, predict, prob, args.gpu, kernel)
    if perfetto is not None and pred.notes.get("timed_as") == "launch":
        raise UsageError("--perfetto draws the probe model's SM run, and this launch was timed as any launch "
                         f"(fa_sim.timing.predict_launch, which writes no timeline): {pred.notes['why']}")
    if perfetto is not None:
        write_text(perfetto.path, json.dumps(_of_kernel(kernel, issue_timeline, prob, args.gpu, kernel)))
        print(f"wrote {perfetto.path}", file=sys.stderr)
    if args.json:
        print(json.dumps({"config": config.tag, "config_source": source, "causal": args.causal, "gpu": args.gpu,
                          "features": prob.features(),
                          "shape": [args.batch, args.heads, args.seqlen, nk, d],
                          "kernel": None if kernel is None else str(kernel), **pred.to_json()}))
        return 0
    print(f"fa time  {config.tag}  (B, H, Nq, Nk, d) = ({args.batch}, {args.heads}, {args.seqlen}, {nk}, {d})"
          f"  {'causal' if args.causal else 'non-causal'}{''.join('  ' + f for f in prob.features())}"
          f"  on the {args.gpu} model"
          + ("" if GPUS[args.gpu].validated else " (not validated)")
          + ("" if kernel is None else f"  kernel {kernel.name}"))
    if source is not None:
        print(f"  config auto: {source}")
    print(f"  predicted kernel time   {pred.kernel_ms:.4f} ms   ({pred.tflops:.1f} TFLOP/s)")
    print(f"  limiter                 {pred.limiter}")
    print(f"  launch shape            {pred.notes['launch']}")
    if pred.notes.get("timed_as") == "launch":
        print(f"  why not the probes      {pred.notes['why']}")
    print(f"  occupancy               {pred.occupancy} CTAs per SM, {pred.achieved_occupancy:.0%} of the SM's warps "
          "achieved")
    print(f"  issue slots used        {pred.issue_slots:.0%}")
    pipes = sorted(pred.pipes.items(), key=lambda kv: -kv[1])
    print("  pipe utilisation        " + "  ".join(f"{n} {v:.0%}" for n, v in pipes if v >= 0.005))
    print("  warp stalls per issued instruction (Nsight Compute's reasons):")
    for name, v in sorted(pred.stalls.items(), key=lambda kv: -kv[1]):
        print(f"    {name:<20}{v:6.2f}")
    return 0


def run_features(args: argparse.Namespace) -> int:
    """fa time with --seqlens, --splits / --cache-seqlens or --npz: a packed batch or split-KV decoding
    launch by launch (fa_sim.timing.predict_varlen / predict_splitkv), or a dense --npz file's shape
    timed as the options would be."""
    from ..timing import predict_splitkv, predict_varlen

    refuse(args, ("kernel",), "to a packed batch or split-KV decoding: they are timed on fa2_fwd.cu's own build, "
                              "as the simulator runs them")
    refuse(args, ("perfetto",), "to a packed batch or split-KV decoding (their launches are timed by "
                                "fa_sim.timing.predict_launch, which writes no timeline)")
    if getattr(args, "config", None) == "auto":
        raise UsageError("--config auto does not apply to a packed batch or split-KV decoding: give the config's "
                         "options (fa_hw.tuned has no table for them)")
    split = splitkv(args)  # the file's cache_seqlens too; no --causal / --window
    loaded = packed_inputs(args, split)  # args.cu_seqlens: from a packed file or --seqlens
    d = inputs_head_dim(args, loaded)
    check_scale(args, d)
    config = for_gpu(args, config_from_args(args, head_dim=d))
    if args.cu_seqlens is None and not split:  # a dense --npz file: its shapes, timed as the options would be
        q, k = (np.shape(x) for x in loaded[:2])
        try:
            prob = Problem(q[0], q[1], q[2], k[2], args.causal, 1.0, config, heads_k=k[1], window=args.window,
                           softcap=args.softcap)
        except ValueError as exc:
            raise UsageError(f"{args.npz_option} {args.npz}: {exc}") from None
        prob = launch_problem(args, prob)
        check_cost(args, prob)
        return report_plain(args, config, prob, predict(prob, args.gpu))
    try:
        if args.cu_seqlens is not None:
            from ..varlen import make_varlen_problem

            total_q, total_k = (int(c[-1]) for c in args.cu_seqlens)
            hk = heads_k(args) if loaded is None else int(np.shape(loaded[1])[1])
            h = args.heads if loaded is None else int(np.shape(loaded[0])[1])
            prob = make_varlen_problem((1, h, total_q, d), (1, hk, total_k, d), (1, hk, total_k, d), *args.cu_seqlens,
                                       args.causal, args.scale, config, args.window, args.softcap)
            pred = predict_varlen(prob, args.gpu)
        else:
            from ..splitkv import check_splitkv

            if loaded is None:
                b, h, nq, nk, hk = args.batch, args.heads, args.seqlen, seqlen_k(args), heads_k(args)
            else:
                (b, h, nq, _), (_, hk, nk, _) = (np.shape(x) for x in loaded[:2])
            prob = launch_problem(args, Problem(b, h, nq, nk, False, args.scale or d ** -0.5, config, heads_k=hk,
                                                softcap=args.softcap))
            pred = predict_splitkv(check_splitkv(prob, split["splits"], split["cache_seqlens"],
                                                 pack_gqa=split.get("pack_gqa")), args.gpu)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return report_launches(args, config, prob, pred)


def report_plain(args, config, prob: Problem, pred) -> int:
    """The plain prediction of an --npz file's shape, as run() prints it."""
    b, h, nq, nk, d = prob.batch, prob.heads, prob.seqlen_q, prob.seqlen_k, prob.head_dim
    if args.json:
        print(json.dumps({"config": config.tag, "config_source": None, "causal": prob.causal, "gpu": args.gpu,
                          "features": prob.features(), "shape": [b, h, nq, nk, d], "kernel": None, **pred.to_json()}))
        return 0
    print(f"fa time  {config.tag}  (B, H, Nq, Nk, d) = ({b}, {h}, {nq}, {nk}, {d})  "
          f"{'causal' if prob.causal else 'non-causal'}{''.join('  ' + f for f in prob.features())}  on the "
          f"{args.gpu} model")
    print(f"  predicted kernel time   {pred.kernel_ms:.4f} ms   ({pred.tflops:.1f} TFLOP/s)")
    print(f"  limiter                 {pred.limiter}")
    return 0


def report_launches(args, config, prob: Problem, pred) -> int:
    """Each launch of a packed batch or split-KV decoding, and their total."""
    n = pred.notes
    if pred.feature == "packed":
        what = (f"packed batch: Nq {','.join(map(str, n['seqlens_q']))}  Nk {','.join(map(str, n['seqlens_k']))}  "
                f"H {prob.heads}  d {prob.head_dim}")
    else:
        what = (f"split-KV: (B, H, Nq, Nk, d) = ({prob.batch}, {prob.heads}, {prob.seqlen_q}, {prob.seqlen_k}, "
                f"{prob.head_dim})  cache_seqlens {','.join(map(str, n['cache_seqlens']))}  splits {n['splits']}"
                + (" (auto, for 132 SMs)" if n["splits_auto"] else "")
                + (f"  GQA packed ({prob.heads // prob.heads_k} Q heads as one)" if n["pack_gqa"] else ""))
    if args.json:
        print(json.dumps({"config": config.tag, "causal": prob.causal, "gpu": args.gpu, "features": prob.features(),
                          **pred.to_json()}))
        return 0
    print(f"fa time  {config.tag}  {what}  {'causal' if prob.causal else 'non-causal'}"
          f"{''.join('  ' + f for f in prob.features() if not f.startswith('varlen'))}  on the {args.gpu} model"
          + ("" if GPUS[args.gpu].validated else " (not validated)"))
    if pred.feature == "packed":
        print(f"  CTAs                    {n['working_ctas']} of the grid's {n['grid_ctas']} run K/V rounds "
              f"({n['cta_rounds']} rounds); the others exit at once")
    else:
        print(f"  split grid              {' x '.join(map(str, n['split_grid']))} CTAs, "
              f"{n['kv_tiles_per_split']} K/V tiles per split")
    for name, p in pred.kernels.items():
        ctas = p.notes["ctas"]
        print(f"  {name:<22}  {p.kernel_ms:.4f} ms  {ctas} CTA{'s' if ctas != 1 else ''}, {p.occupancy} per SM  "
              f"{p.limiter}")
    print(f"  predicted total time    {pred.kernel_ms:.4f} ms   ({len(pred.kernels)} launch"
          f"{'es' if len(pred.kernels) > 1 else ''}, one after the other)")
    return 0
