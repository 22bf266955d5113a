"""`fa banks`: shared-memory bank conflicts of the kernel, counted with Nsight Compute's rules
(notes/gpu_facts.md), per instruction class, kernel phase and instruction; `--compare` sets the
three smem layouts side by side; `--plot DIR` writes the figures."""

from __future__ import annotations

import argparse
import dataclasses
import json

from ..config import KernelConfig, SmemLayout
from .common import add_config_arguments, add_problem_arguments, config_from_args, seqlen_k


def register(subparsers) -> None:
    p = subparsers.add_parser("banks", help="shared-memory bank conflicts per instruction class and phase",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_problem_arguments(p, scale=False)
    add_config_arguments(p)
    p.add_argument("--compare", action="store_true", help="all three smem layouts side by side")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--plot", metavar="DIR", help="write the conflict figures (PNG and SVG) into DIR")
    p.set_defaults(func=run)


def _config(args, smem: str) -> KernelConfig:
    return dataclasses.replace(config_from_args(args), smem=SmemLayout(smem))


def run(args) -> int:
    from ..observers import bank_tables, runs

    problem = runs.Problem(args.batch, args.heads, args.seqlen, seqlen_k(args), args.head_dim, args.seed)
    layouts = [m.value for m in SmemLayout] if args.compare else [args.smem]
    reports = {s: runs.run_banks(_config(args, s), problem, args.causal) for s in layouts}
    nk = seqlen_k(args)
    keys = "" if nk == args.seqlen else f", Nk={nk}"
    shape = (f"(B,H,N,d) = ({args.batch},{args.heads},{args.seqlen},{args.head_dim}){keys}"
             f"{' causal' if args.causal else ''}, config {_config(args, layouts[0]).tag.rsplit('-', 1)[0]}")
    if args.json:
        out = {s: r.to_json() for s, r in reports.items()}
        meta = {"problem": dataclasses.asdict(problem), "causal": args.causal}
        print(json.dumps({**meta, "layouts": out} if args.compare else {**meta, **out[layouts[0]]}, indent=1))
    elif args.compare:
        print(bank_tables.format_compare(reports, f"fa banks --compare: {shape}"))
    else:
        print(bank_tables.format_report(reports[layouts[0]], f"fa banks: {shape}"))
    if args.plot:
        from ..observers import figures

        for path in figures.save(figures.conflicts_by_class(reports), f"{args.plot}/bank_conflicts_by_class",
                                 ("png", "svg")):
            print(f"wrote {path}")
    return 0
