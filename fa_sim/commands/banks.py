"""`fa banks`: shared-memory bank conflicts of the kernel, counted with Nsight Compute's rules
(docs/hardware_facts.md), per instruction class, kernel phase and instruction; `--compare` sets the
three smem layouts side by side (so --smem does not apply with it); `--plot DIR` writes the
conflict figure (PNG and SVG), checked before the simulation, refused over existing files unless
--force. `--npz FILE` counts on q, k, v from a file instead of random ones, as in `fa sim`. The
feature options (--dtype bf16, --heads-k, --window, --softcap) count that feature's build; a packed
batch (`--seqlens 5,70`, or an --npz file with cu_seqlens_q, cu_seqlens_k) the FA_VARLEN build on
the PTX engine over the packed grid; split-KV decoding (`--splits N|auto`, `--cache-seqlens`) its
split launch (fa2_combine.cu uses no shared memory) (docs/features.md, "The commands").

LDGSTS (cp.async) is listed apart: Nsight Compute counts no bank conflicts for it, yet the padded
layout costs it extra wavefronts (10.5 per instruction instead of 4 for the seed tile); JSON names
them "excess_wavefronts", the tables print them on their own line.

`--backward` counts the backward pass's main kernel (fa2_bwd_kernel, docs/backward.md; as the atomic
dQ mode builds it, with its dQ GEMM) on q, k, v and
a seeded dO (or the --npz file's do), per class, phase and round (its rounds are Q blocks);
`--instructions` adds the per-instruction table there. --compare, --plot and the forward's config
options but --head-dim and --dtype do not apply to it (--dtype bf16: the bf16 build's counts).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

from ..config import KernelConfig, SmemLayout
from ..events import Op
from ..run import FrontEnd, PtxFrontEnd
from ..splitkv import packs_gqa
from . import UsageError
from .common import (
    add_seqlens_argument,
    add_splitkv_arguments,
    add_config_arguments,
    add_engine_arguments,
    add_problem_arguments,
    check_input_memory,
    config_from_args,
    engine_from_args,
    features,
    heads_k,
    inputs_head_dim,
    packed_engine,
    packed_inputs,
    packed_problem,
    packed_random_inputs,
    problem_shape,
    refuse,
    run_inputs,
    splitkv,
)
from .backward import add_backward_arguments
from .inputs import HelpFormatter, add_inputs_argument
from .outputs import Kind, Output, check_outputs, save_figure
from .preflight import announce, check_engine, problem_of, qkv_shapes

FIGURE = "bank_conflicts_by_class"
FORMATS = ("png", "svg")


def register(subparsers) -> None:
    p = subparsers.add_parser("banks", help="shared-memory bank conflicts per instruction class and phase",
                              description=__doc__, formatter_class=HelpFormatter)
    add_problem_arguments(p, scale=False)
    add_config_arguments(p)
    add_engine_arguments(p)
    add_inputs_argument(p)
    add_seqlens_argument(p)
    add_splitkv_arguments(p)
    p.add_argument("--compare", action="store_true", help="all three smem layouts side by side (default: --smem only)")
    p.add_argument("--json", action="store_true", help="print JSON instead of the tables")
    p.add_argument("--plot", metavar="DIR", default=None,
                   help=f"write the conflict figure {FIGURE}.png/.svg into DIR, created if missing (default: none)")
    p.add_argument("--force", action="store_true", help="overwrite existing figure files (default: refuse)")
    add_backward_arguments(p, dq_mode=False)
    p.add_argument("--instructions", action="store_true",
                   help="with --backward: also the per-instruction table (default off; the forward always prints it)")
    p.set_defaults(func=run)


def _report(config: KernelConfig, inputs, causal: bool, front: FrontEnd, feats: dict, cu_seqlens=None,
            split: dict | None = None):
    """The bank report of one run (split-KV decoding: that of its split launch, the one with shared
    memory: fa2_combine.cu has none), and the number of splits that ran (None without split-KV)."""
    from ..observers import runs
    from ..observers.banks import BankCounter

    counter = BankCounter()
    res = runs.simulate(*inputs, causal=causal, config=config, observers=[counter], engine=front, **feats,
                        cu_seqlens=cu_seqlens, **(split or {}))
    check_computes(res.counts, front, config)
    return counter.report(), res.splits  # split-KV: the split launch names its problem (fa_sim.ptx.launch's problem=)


SHARED_OPS = (Op.LDGSTS, Op.LDSM, Op.LDS, Op.STS)  # the classes whose bank conflicts are counted


def check_computes(counts, front: FrontEnd, config: KernelConfig) -> None:
    """A kernel that stored no output element (no st.global ran in the whole grid), or issued no
    shared-memory instruction, computed nothing: its all-zero table would read as 'no conflicts'.
    UsageError naming the kernel (a --kernel variant's file) instead."""
    kernel = (f"--kernel {front.kernel.origin}" if isinstance(front, PtxFrontEnd) and front.kernel is not None
              else "the kernel")
    ran = {op for (op, _, _), n in counts.items() if n}
    if Op.STG not in ran:
        raise UsageError(f"{kernel} ({config.tag}) stored no output element: no st.global ran in the whole grid, so "
                         "it computes nothing and has no bank conflicts to count; check the kernel's body")
    if not ran & set(SHARED_OPS):
        raise UsageError(f"{kernel} ({config.tag}) issued no shared-memory instruction "
                         f"({', '.join(op.value for op in SHARED_OPS)}): there are no bank conflicts to count")


def header_tag(base: KernelConfig, compare: bool) -> str:
    """The config tag a table's header names: the config's own, or with --compare its tag with the
    layouts it sets side by side in the smem place ('m64n64d64w4-{swizzled,plain,padded}-s2')."""
    if not compare:
        return base.tag
    layouts = "{" + ",".join(s.value for s in SmemLayout) + "}"
    return base.tag.replace(f"-{base.smem.value}", f"-{layouts}", 1)


def run(args) -> int:
    from ..observers import bank_tables
    from . import backward

    backward.check_options(args, ("compare", "plot", "kernel"))
    if args.backward:
        return backward.banks(args)
    refuse(args, ("instructions",), "without --backward (the forward's tables always list the instructions)")
    if args.compare:
        refuse(args, ("smem",), "with --compare, which counts all three layouts")
    plot = None if args.plot is None else Output("--plot", Path(args.plot), Kind.DIR,
                                                 tuple(f"{FIGURE}.{f}" for f in FORMATS))
    check_outputs(args, plot)
    split = splitkv(args)  # split-KV decoding: the split launch (FA_SPLITKV) is counted
    if split and (args.engine == "program" or args.kernel is not None):
        raise UsageError("--splits / --cache-seqlens (split-KV decoding) run fa2_fwd.cu and fa2_combine.cu on the PTX "
                         "engine, here: without --engine program or --kernel")
    files = packed_inputs(args, split)  # args.cu_seqlens: a packed batch of --seqlens or of the --npz file
    d = inputs_head_dim(args, files)
    base = config_from_args(args, head_dim=d)
    packed = packed_engine(args)  # a packed batch runs on the PTX engine
    front = PtxFrontEnd() if split else engine_from_args(args, base)
    layouts = list(SmemLayout) if args.compare else [base.smem]
    for s in layouts:  # every check before the inputs are made (commands/preflight.py)
        check_engine(front, dataclasses.replace(base, smem=s), args.causal)
    if packed:
        prob = packed_problem(args, files, base)
    else:
        if files is None:
            check_input_memory(args)
        shapes = (tuple(np.shape(x) for x in files) if files is not None
                  else qkv_shapes(problem_shape(args), heads_k(args)))
        try:
            prob = problem_of(shapes, args.causal, None, base, **features(args))
        except ValueError as exc:  # the file's shapes (k's heads not dividing q's, ...)
            raise UsageError(str(exc)) from None
    announce("banks", prob, reference=False, runs=len(layouts))
    q, k, v = (packed_random_inputs(args, prob, base.dtype) if packed and files is None
               else run_inputs(args, base, files))
    runs = {s.value: _report(dataclasses.replace(base, smem=s), (q, k, v), args.causal, front, features(args),
                             args.cu_seqlens, split) for s in layouts}
    reports = {s: r for s, (r, _) in runs.items()}
    splits = next(iter(runs.values()))[1]
    b, h, nq, nk = prob.batch, prob.heads, prob.seqlen_q, prob.seqlen_k
    if packed:
        lens = ",".join(map(str, prob.seqlens_q)) + ("" if prob.cu_seqlens[0] == prob.cu_seqlens[1] else
                                                      " / Nk " + ",".join(map(str, prob.seqlens_k)))
        size = f"packed (H,d) = ({h},{d}) of {b} sequences, Nq {lens}"
    else:
        size = f"(B,H,N,d) = ({b},{h},{nq},{d})" + ("" if nk == nq else f", Nk={nk}")
    if split:
        lens = split["cache_seqlens"]
        size += f", splits={splits}" + ("" if lens is None else " cache_seqlens=" + ",".join(map(str, lens))) + \
            (" GQA packed" if packs_gqa(prob, split.get("pack_gqa")) else "") + \
            " (the split launch; fa2_combine.cu uses no shared memory)"
    shape = (f"{size}{' causal' if args.causal else ''}"
             f"{''.join(', ' + f for f in prob.features())}, "
             f"config {header_tag(base, args.compare)}" + (f", PTX of {front.kernel.name if front.kernel else 'fa2_fwd.cu'}"
                                                       if isinstance(front, PtxFrontEnd) else ""))
    if args.json:
        out = {s: r.to_json() for s, r in reports.items()}
        packed_json = ({} if not packed else {"cu_seqlens_q": list(prob.cu_seqlens[0]),
                                               "cu_seqlens_k": list(prob.cu_seqlens[1])})
        meta = {"problem": {"batch": b, "heads": h, "seqlen": nq, "seqlen_k": nk, "head_dim": d, "seed": args.seed,
                            "heads_k": prob.heads_k, "window": None if args.window is None else list(args.window),
                            "softcap": args.softcap, **packed_json,
                            **({} if not split else {"splits": splits, "cache_seqlens": None if split["cache_seqlens"]
                                                     is None else [int(x) for x in split["cache_seqlens"]],
                                                     "pack_gqa": packs_gqa(prob, split.get("pack_gqa"))})},
                "config": base.to_json(), "causal": args.causal}
        print(json.dumps({**meta, "layouts": out} if args.compare else {**meta, **out[base.smem.value]}, indent=1))
    elif args.compare:
        print(bank_tables.format_compare(reports, f"fa banks --compare: {shape}"))
    else:
        print(bank_tables.format_report(reports[base.smem.value], f"fa banks: {shape}"))
    if plot is not None:
        from ..observers import figures

        for path in save_figure(figures.conflicts_by_class(reports), plot.path / FIGURE, FORMATS):
            print(f"wrote {path}", file=sys.stderr)
    return 0
