"""`fa sim`: run the simulator on random or given inputs and measure it against float64.

Random inputs (standard normal, fp16) come from --batch --heads --seqlen --seqlen-k --head-dim
--seed; `--npz FILE` reads q, k, v ([B, H, N, d]) instead, and the shape options are then
refused (the file fixes the shape and the head dim). The kernel shape comes from --block-m
--block-n --warps --smem --softmax. Sizes that cannot fit in this machine's memory are refused up
front. Prints the relative Frobenius error of O and the max abs LSE error against
fa_sim.reference.attention, warp-instruction counts per class and wall time; `--json` prints one
object {rel_err_o, max_abs_err_lse, max_rel_err_lse, nonfinite, above_bound, seconds,
instructions}. Where O or LSE is not finite although float64 is, each case is reported with its
cause (fa_sim.accuracy), the numbers are null in JSON, and the exit status is 1; so is an error
above its documented bound (O's relative error above 1e-3, an LSE row above
fa_sim.accuracy.lse_error_bound: a kernel that returns at once, say), reported as ABOVE BOUND. `--check-hazards` attaches the shared-memory
hazard checker (fa_sim.observers.hazards), prints its report (JSON: an extra key "hazards") and
exits 1 when it finds any. `--workers N` (default: one per core) shares the grid's waves out over
local processes, `--cluster ADDRESS` over a Dask cluster (fa_sim.parallel): the numbers are
bit-identical to one process; a worker or cluster lost is one error line naming the shard.

A packed variable-length batch (fa_sim.varlen; docs/features.md) runs on the PTX engine: an
`--npz` file holding q [total_q, H, d], k and v [total_k, H_k, d] with cu_seqlens_q and
cu_seqlens_k (int32 offsets), or random inputs of the lengths `--seqlens 70,130,5` (Nk = Nq per
sequence; --heads, --heads-k, --head-dim, --seed apply); its errors are measured per sequence.

`--backward` runs the backward pass after the forward on the same inputs (fa_sim/commands/backward.py:
dO seeded after q, k, v, or the --npz file's do) and prints dQ, dK, dV's errors against float64
(fa_sim.reference.attention_backward): max |error|, that over max |gradient|, and the largest
error over the derived elementwise bound (docs/backward.md), each kernel's warp instructions and
the wall time; exit status 1 when an error is above its bound (ABOVE BOUND) or not finite. `--dq
atomic` sums dQ by red.global.add.f32 instead of the deterministic mode's dQ kernel; `--check-hazards`
checks the main kernel (and the dQ kernel in the deterministic mode); `--kernel FILE` is then a
variant of fa2_bwd.cu; JSON: {gradients: {dq, dk, dv: {max_abs_err, rel_err, err_over_bound,
nonfinite}}, above_bound, dq_mode, dtype, config, seconds, instructions, kernel[, hazards (the main
kernel's), hazards_by_kernel]}. `--dtype bf16` runs the forward and the backward in bf16 (the seeded
draws rounded to bf16, or the file's bf16 values) against the bf16 bound (docs/backward.md, section 7).
"""

from __future__ import annotations

import json

import numpy as np

from ..accuracy import Accuracy, measure
from ..events import COUNTED_OPS
from ..run import PtxFrontEnd
from ..simulate import SimResult, simulate
from ..splitkv import packs_gqa
from .common import (
    add_seqlens_argument,
    add_config_arguments,
    add_engine_arguments,
    add_parallel_arguments,
    add_problem_arguments,
    add_splitkv_arguments,
    check_input_memory,
    check_scale,
    config_from_args,
    engine_from_args,
    features,
    packed_inputs,
    packed_problem,
    packed_random_inputs,
    heads_k,
    inputs_head_dim,
    kernel_from_args,
    problem_shape,
    refuse,
    run_inputs,
    splitkv,
)
from . import UsageError
from .backward import add_backward_arguments
from .inputs import HelpFormatter, add_inputs_argument
from .preflight import announce, check_cluster, check_engine, problem_of, qkv_shapes


def register(subparsers) -> None:
    p = subparsers.add_parser("sim", help="run the lane-accurate simulator and compare with float64",
                              description=__doc__, formatter_class=HelpFormatter)
    add_problem_arguments(p)
    add_config_arguments(p)
    add_engine_arguments(p)
    add_inputs_argument(p)
    p.add_argument("--mma", default="exact", choices=["exact", "h200"],
                   help="tensor-core accumulation: exact sum rounded once (fast) or the H200's fitted model "
                        "(bit-exact, about 50x slower) (default exact; one of exact, h200)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--check-hazards", action="store_true",
                   help="attach the shared-memory hazard checker; exit 1 if it finds any race")
    add_seqlens_argument(p)
    add_splitkv_arguments(p)
    add_parallel_arguments(p)
    add_backward_arguments(p)
    p.set_defaults(func=run)


def errors(res: SimResult, q, k, v, window=None, softcap=None, cu_seqlens_q=None, cu_seqlens_k=None) -> Accuracy:
    """O and LSE against the float64 reference on the fp16 (bf16: as float32) inputs the kernel saw
    (streamed in blocks, fa_sim.accuracy), with the cause of anything non-finite; a packed batch
    sequence by sequence (fa_sim.varlen.measure_packed)."""
    q, k, v = (np.asarray(x, dtype=np.float16 if res.dtype == "fp16" else np.float32) for x in (q, k, v))
    if cu_seqlens_q is not None:
        from ..varlen import measure_packed

        return measure_packed(res.o, res.lse, q, k, v, cu_seqlens_q, cu_seqlens_k, res.causal, res.scale, res.config,
                              window=window, softcap=softcap or 0.0)
    return measure(res.o, res.lse, q, k, v, res.causal, res.scale, res.config, window=window, softcap=softcap or 0.0)


def _inputs(args, loaded, config, front):
    """(the problem, the --npz arrays or random inputs made after every check: commands/preflight.py)."""
    check_engine(front, config, args.causal)
    if loaded is None:
        check_input_memory(args)
    check_cluster(args.cluster)
    if args.cu_seqlens is not None:  # a packed batch: the file's, or random inputs of --seqlens
        prob = packed_problem(args, loaded, config)
    else:
        shapes = qkv_shapes(problem_shape(args), heads_k(args)) if loaded is None else [np.shape(x) for x in loaded]
        try:
            prob = problem_of(shapes, args.causal, args.scale, config, **features(args))
        except ValueError as exc:  # the file's shapes (k's heads not dividing q's, ...)
            raise UsageError(str(exc)) from None
    announce("sim", prob, args.mma)
    if args.seqlens is not None:
        return prob, packed_random_inputs(args, prob, config.dtype)
    return prob, run_inputs(args, config, loaded)


def run(args) -> int:
    from . import backward

    backward.check_options(args, ("workers", "cluster"))
    if args.backward and args.seqlens is not None:
        raise UsageError("--seqlens does not apply with --backward: fa2_bwd.cu has no packed batches")
    split = splitkv(args)
    if split and (args.backward or args.engine == "program" or args.kernel is not None or args.cluster is not None):
        raise UsageError("--splits / --cache-seqlens (split-KV decoding) run fa2_fwd.cu and fa2_combine.cu on the PTX "
                         "engine, here: without --backward, --engine program, --kernel or --cluster")
    if args.backward:
        return backward.sim(args)
    kernel_from_args(args)  # the file, before anything is read or made
    loaded = packed_inputs(args, split)  # args.cu_seqlens: from a packed file or --seqlens
    d = inputs_head_dim(args, loaded)
    config = config_from_args(args, head_dim=d)
    check_scale(args, d)
    checker = None
    if args.check_hazards:
        from ..observers.hazards import (
            HazardChecker,  # the simulator core does not need the observers
        )
        checker = HazardChecker()
    packed = {}
    if args.cu_seqlens is not None:  # a packed batch: the PTX engine, in this process
        if args.cluster is not None:
            raise UsageError("--cluster does not apply to a packed batch (cu_seqlens): it runs in this process")
        if args.engine == "program":
            raise UsageError("--engine program does not run a packed batch (cu_seqlens): fa2_fwd.cu's FA_VARLEN "
                             "offsets are not modelled by the hand-written program; run it with --engine ptx")
        packed = dict(cu_seqlens_q=args.cu_seqlens[0], cu_seqlens_k=args.cu_seqlens[1])
        args.engine = "ptx"
    front = PtxFrontEnd() if split else engine_from_args(args, config)
    prob, (q, k, v) = _inputs(args, loaded, config, front)
    res = simulate(q, k, v, causal=args.causal, scale=args.scale, config=config,
                   observers=() if checker is None else (checker,), mma_model=args.mma, engine=front,
                   workers=None if packed or split else args.workers, cluster=args.cluster, **features(args),
                   **packed, **split)
    if split:  # each sequence against float64 on its own keys
        from ..splitkv import measure_splitkv

        dt = np.float16 if res.dtype == "fp16" else np.float32
        acc = measure_splitkv(res, *(np.asarray(x, dt) for x in (q, k, v)), split["cache_seqlens"],
                              args.softcap or 0.0)
    else:
        acc = errors(res, q, k, v, **features(args), **packed)
    counts = {op.value: int(res.instructions[op]) for op in COUNTED_OPS}
    report = None if checker is None else checker.report()
    status = 1 if (report is not None and not report.ok) or not acc.ok else 0
    if args.json:
        kernel = getattr(front, "kernel", None)
        out = {**acc.to_json(), **({"splits": res.splits, "pack_gqa": packs_gqa(prob, split.get("pack_gqa"))}
                                   if split else {}), "seconds": res.seconds, "instructions": counts, "engine": front.engine.value,
               "kernel": None if kernel is None else str(kernel)}
        if report is not None:
            out["hazards"] = report.to_json()
        print(json.dumps(out, allow_nan=False))  # non-finite numbers are null (fa_sim.accuracy)
        return status
    if packed:
        b, (nq, h, _) = len(args.cu_seqlens[0]) - 1, res.o.shape
        extra = f" packed total_q={nq} total_k={np.shape(k)[0]}" + (f" H_k={np.shape(k)[1]}" if np.shape(k)[1] != h
                                                                      else "")
        nq, nk = int(np.diff(args.cu_seqlens[0]).max()), int(np.diff(args.cu_seqlens[1]).max())
    else:
        b, h, nq, _ = res.o.shape
        nk = np.shape(k)[2]
        extra = f" H_k={np.shape(k)[1]}" if np.shape(k)[1] != h else ""
    extra += (
        f" window={args.window[0]},{args.window[1]}" if args.window is not None else "") + (
        f" softcap={args.softcap:g}" if args.softcap is not None else "") + (
        f" splits={res.splits}" if split else "") + (
        " GQA packed" if split and packs_gqa(prob, split.get("pack_gqa")) else "") + (
        f" cache_seqlens={','.join(map(str, split['cache_seqlens']))}" if split and split["cache_seqlens"] is not None
        else "")
    print(f"fa sim: B={b} H={h} {'max ' if packed else ''}Nq={nq} Nk={nk} d={d} "
          f"{'causal' if res.causal else 'non-causal'} scale={res.scale:.6g}{extra} config {config.tag}"
          + (f" engine ptx ({front.kernel.name if front.kernel is not None else 'fa2_fwd.cu'})"
             if isinstance(front, PtxFrontEnd) else ""))
    print(f"  relative Frobenius error of O  {_num(acc.rel_err_o)}")
    print(f"  max |LSE error|                {_num(acc.max_abs_err_lse)}   (relative {_num(acc.max_rel_err_lse)})")
    for line in acc.failures():
        print(f"  {line}")
    print("  warp instructions")
    for name, n in counts.items():
        print(f"    {name:<8}{n:>14,}")
    print(f"  wall time                      {res.seconds:.3f} s")
    if report is not None:
        from ..observers.hazards import format_hazards
        print(format_hazards(report))
    return status


def _num(x: float | None) -> str:
    return "not finite (see below)" if x is None else f"{x:.3e}"
