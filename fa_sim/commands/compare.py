"""`fa compare`: the simulator against the GPU on the same seeded inputs, checkpoint by checkpoint.

Runs fa_sim.simulate and fa_hw.forward (debug build) on the same inputs, recording the
checkpoints of the chosen CTAs (default: the first and the last CTA of the grid), and prints per
checkpoint the fraction of bit-identical values, the largest difference in ulps against its
documented bound (fa_sim.crosscheck.BOUNDS) and the first mismatch; then O and LSE statistics.
Exit status 0 only when every checkpoint is within its bound, 1 otherwise.

`--save FILE` keeps the GPU side (inputs, O, LSE, checkpoint buffer) in an .npz; `--gpu-npz FILE`
compares against such a file instead of launching, so the comparison runs on machines without a
GPU. `--banks` sets the simulator's shared-memory counts beside Nsight Compute's (needs ncu).
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from ..crosscheck import SavedRun, build_report, format_report, simulate_with_checkpoints
from ..problem import Problem
from .common import add_config_arguments, add_problem_arguments, config_from_args, random_inputs


def register(subparsers) -> None:
    p = subparsers.add_parser("compare", help="simulator against GPU, checkpoint by checkpoint",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_problem_arguments(p)
    add_config_arguments(p)
    p.add_argument("--ctas", default=None, help="comma-separated linear CTA ids to checkpoint (default: first,last)")
    p.add_argument("--save", metavar="FILE", default=None, help="save the GPU side to an .npz")
    p.add_argument("--gpu-npz", metavar="FILE", default=None, help="compare against a saved GPU run (no GPU needed)")
    p.add_argument("--banks", action="store_true", help="bank conflicts: simulator beside Nsight Compute")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def _ctas(text, n_ctas: int) -> list[int]:
    if text is None:
        return sorted({0, n_ctas - 1})
    try:
        ctas = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise ValueError(f"--ctas takes comma-separated integers, got {text!r}") from None
    if not ctas or any(not 0 <= c < n_ctas for c in ctas) or len(set(ctas)) != len(ctas):
        raise ValueError(f"--ctas must be distinct CTA ids in 0..{n_ctas - 1}, got {text!r}")
    return ctas


def _gpu_side(args, q, k, v, config, ctas):
    """(o, lse, checkpoint buffer, scale, config) from the GPU or from a saved run, whose softmax
    form (part of the kernel it ran) the simulator then follows."""
    if args.gpu_npz is not None:
        run = SavedRun.load(args.gpu_npz)
        config = run.with_config(config)
        for name, mine in (("q", q), ("k", k), ("v", v)):
            if getattr(run, name).shape != mine.shape or not np.array_equal(getattr(run, name), mine):
                raise ValueError(f"{args.gpu_npz} was recorded on other inputs ({name} differs); "
                                 f"pass the same shape/--seed options it was saved with")
        if list(run.ctas) != list(ctas) or run.config != config or run.causal != args.causal:
            raise ValueError(f"{args.gpu_npz} holds config {run.config.tag}, causal={run.causal}, "
                             f"CTAs {list(run.ctas)}: pass the same options")
        return run.o, run.lse, run.checkpoints, run.scale, config
    import fa_hw

    out = fa_hw.forward(q, k, v, causal=args.causal, scale=args.scale, config=config, checkpoint_ctas=ctas)
    if args.save is not None:
        SavedRun(q, k, v, out.o, out.lse, out.checkpoints, tuple(ctas), config, args.causal, out.scale).save(args.save)
    return out.o, out.lse, out.checkpoints, out.scale, config


def run(args) -> int:
    q, k, v = random_inputs(args)
    config = config_from_args(args)
    b, h, nq, _ = q.shape
    ctas = _ctas(args.ctas, Problem(b, h, nq, k.shape[2], args.causal, 1.0, config).n_ctas)
    o, lse, gpu_buf, scale, config = _gpu_side(args, q, k, v, config, ctas)
    sim_res, sim_buf = simulate_with_checkpoints(q, k, v, args.causal, scale, config, ctas)
    report = build_report(q, k, v, args.causal, config, ctas, sim_res, sim_buf, o, lse, gpu_buf)
    banks = None
    if args.banks:
        from fa_hw.profile import bank_comparison, format_bank_comparison

        banks = bank_comparison(q, k, v, args.causal, scale, config)
    if args.json:
        obj = report.to_json()
        if banks is not None:
            obj["banks"] = banks.to_json()
        print(json.dumps(obj))
    else:
        print(format_report(report))
        if banks is not None:
            print(format_bank_comparison(banks))
    return 0 if report.ok else 1
