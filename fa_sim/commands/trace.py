"""`fa trace`: one lane's story through one round: every instruction it executed, the tile
coordinates, byte addresses and banks it touched, the values it received, its shuffle partners,
and its S, m, l, P~ and O slots at their (query, key) / (query, d) coordinates.

The CTA, warp, lane (or thread) and round are checked against the grid before the simulation
runs: a round the CTA does not execute is refused with the rounds it does run and why (Nk in
blocks of block_n; under --causal a CTA stops after the block holding its last query).
`--save DIR` writes the trace archive (traces/README.md), `--perfetto FILE` Chrome/Perfetto
trace-event JSON: both are checked before the simulation (an existing file is refused unless
--force), written atomically, and reported on stderr ("wrote PATH"), so stdout holds the story.
`--npz FILE` takes q, k, v from a file, as in `fa sim`.

A packed batch (`--seqlens 5,70`, or an --npz file with cu_seqlens_q and cu_seqlens_k, as in `fa
sim`) runs FA_VARLEN's checkpoint build on the PTX engine: --cta is a CTA of its grid (Q blocks of the
longest sequence, H, B), or with --sequence S a CTA of sequence S (blockIdx.x + n_m_blocks * head), and
the story's header says which sequence, head and Q block it computes and which rows of the packed q,
k, v those are (fa_sim.varlen.describe_cta); a CTA past its sequence's queries is refused (it exits at
once). The S/m/l/P/O sections are at the sequence's coordinates, and a line gives the lane's queries as
packed rows of q and the round's keys as packed rows of k, v. Split-KV decoding (`--splits N|auto`,
`--cache-seqlens`, `--pack-gqa`, as in `fa sim`) follows a lane of the split launch's checkpoint build
(FA_SPLITKV with FA_CHECKPOINTS): --cta is a CTA of its grid (Q blocks, batch-heads, splits), or with
--split S a CTA of split S (blockIdx.x + n_m_blocks * batch-head), and the header says which split,
batch, head and Q block it computes and which K/V tiles of the cache its split covers (fa_sim.splitkv.
SplitPlan.describe_cta); round t is the split's block first + t, key coordinates are the cache's, the
sections are the split's (m, l, O over its keys), and with more than one split the story ends with the
combine step of the lane's rows (the splits' LSEs, the weights, l, and per O column the partial and the
final O); an empty split (past its sequence's keys) is refused. docs/features.md, "The commands".

`--backward` follows the lane through round R (Q block) of CTA C (K/V block) of the backward main
kernel fa2_bwd_kernel instead (as the atomic dQ mode builds it, with its dQ GEMM): its S^T, P^T, dP^T, dS^T slots at their (key, query) coordinates,
its dV and dK accumulators after the round at (key, column), and its dQ partial at (query,
column), read from the mma events of the PTX engine (fa_sim/observers/backward_lane.py; dO
seeded after q, k, v or the --npz file's do). --ops, --save, --perfetto, --kernel and the forward's
config options but --head-dim and --dtype do not apply to it; --dtype bf16 traces the bf16 build
(P and dS as the bf16 its mmas consume).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from ..config import WARP_SIZE
from ..kernels import Problem
from . import UsageError
from .common import (
    add_seqlens_argument,
    add_splitkv_arguments,
    splitkv,
    warp_and_lane,
    add_config_arguments,
    add_engine_arguments,
    add_problem_arguments,
    check_input_memory,
    config_from_args,
    engine_from_args,
    features,
    heads_k,
    inputs_head_dim,
    int_in,
    kernel_from_args,
    packed_engine,
    packed_inputs,
    packed_problem,
    packed_random_inputs,
    parse_ops,
    problem_shape,
    random_inputs,
    refuse,
    run_inputs,
)
from .backward import add_backward_arguments
from .inputs import HelpFormatter, add_inputs_argument
from .outputs import Kind, Output, check_outputs, save_directory, write_text
from .preflight import announce, check_engine, problem_of, qkv_shapes

ARCHIVE_FILES = ("manifest.json", "arrays.npz")  # fa_sim.observers.trace_io.save_trace


def register(subparsers) -> None:
    p = subparsers.add_parser("trace", help="one lane through one round, instruction by instruction",
                              description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--cta", type=int_in("--cta", 0), default=0,
                   help="linear CTA id in the grid, blockIdx.x + ceil(Nq/block_m) * (batch * H + head); the Q block "
                        "it computes (m_block, in the story's header) is blockIdx.x, or under --heavy-first --causal "
                        "ceil(Nq/block_m) - 1 - blockIdx.x; a packed batch (--seqlens): blockIdx.x + "
                        "ceil(max Nq/block_m) * (head + H * sequence); split-KV (--splits): blockIdx.x + "
                        "ceil(Nq/block_m) * (batch * H + head + B * H * split), H the K/V heads when GQA is packed "
                        "(default 0; 0 .. CTAs-1)")
    p.add_argument("--warp", type=int_in("--warp", 0), default=0, help="warp of the CTA (default 0; 0 .. warps-1)")
    p.add_argument("--lane", type=int_in("--lane", 0), default=0, help="lane of the warp (default 0; 0 .. 31)")
    p.add_argument("--thread", type=int_in("--thread", 0), default=None,
                   help="thread of the CTA, 32 * warp + lane, instead of --warp/--lane (default: by --warp/--lane; "
                        "0 .. 32 * warps - 1)")
    p.add_argument("--round", type=int_in("--round", 0), default=0,
                   help="K/V iteration t (default 0; 0 .. the CTA's rounds - 1)")
    p.add_argument("--sequence", type=int_in("--sequence", 0), default=None,
                   help="a packed batch's sequence (--seqlens, or an --npz with cu_seqlens); --cta then counts the "
                        "sequence's CTAs, blockIdx.x + ceil(max Nq/block_m) * head (default: --cta is the grid's; "
                        "0 .. sequences-1)")
    p.add_argument("--split", type=int_in("--split", 0), default=None,
                   help="split-KV's split (--splits); --cta then counts the split's CTAs, blockIdx.x + "
                        "ceil(Nq/block_m) * (batch * H + head) (default: --cta is the grid's; 0 .. splits-1)")
    add_problem_arguments(p, scale=False)
    add_config_arguments(p)
    add_engine_arguments(p)
    add_inputs_argument(p)
    add_seqlens_argument(p)
    add_splitkv_arguments(p)
    p.add_argument("--ops", default=None,
                   help="comma-separated instruction classes to keep, e.g. LDSM,SHFL (default: all)")
    p.add_argument("--json", action="store_true", help="print the story as JSON instead of the table")
    p.add_argument("--save", metavar="DIR", default=None,
                   help="also write the trace archive (manifest.json + arrays.npz) into DIR, created if missing "
                        "(default: none)")
    p.add_argument("--perfetto", metavar="FILE", default=None,
                   help="also write Chrome/Perfetto trace-event JSON to FILE, for ui.perfetto.dev (default: none)")
    p.add_argument("--force", action="store_true", help="overwrite existing output files (default: refuse)")
    add_backward_arguments(p, dq_mode=False)
    p.set_defaults(func=run)


def _round_error(launch: Problem, cta: int, rnd: int) -> UsageError | None:
    """Why round `rnd` is not one CTA `cta` runs (SCHEDULE.md's n_block_max), or None; a packed
    launch's CTA by the rule of its sequence (a CTA past its sequence's queries runs none)."""
    cfg, m_block = launch.config, int(launch.m_block_of(cta))
    prob = launch
    if launch.varlen:
        from ..varlen import describe_cta

        if not int(launch.rounds_per_cta([cta])[0]):
            return UsageError(f"--cta {cta} runs no round: {describe_cta(launch, cta)}")
        prob = launch.sequence(cta // (launch.n_m_blocks * launch.heads))
    n = int(prob.n_rounds_of(m_block))
    if rnd < n:
        return None
    runs = "round 0 only" if n == 1 else f"rounds 0..{n - 1}"
    if prob.has_window:
        first = int(prob.n_block_min(m_block))
        why = (f"its queries' window ({prob.window[0]}, {prob.window[1]}) holds K/V blocks "
               f"{first}..{first + n - 1} only "
               f"(block_n = {cfg.block_n}; round t runs block {first} + t)")
    elif n < prob.n_rounds:  # causal: the block holding the CTA's last query ends the loop
        last = (m_block + 1) * cfg.block_m - 1
        why = (f"under --causal its queries {m_block * cfg.block_m}..{last} see keys 0..{last} only "
               f"(block_n = {cfg.block_n}); CTAs of later query blocks run up to {prob.n_rounds} rounds")
    else:
        why = f"Nk = {prob.seqlen_k} keys in blocks of block_n = {cfg.block_n}"
    who = f"CTA {cta}" + (f" (blockIdx.x {cta % launch.n_m_blocks}: Q block m_block {m_block} under --heavy-first "
                          f"--causal)" if launch.reversed_m_blocks else "")
    if launch.varlen:
        who += f" (sequence {cta // (launch.n_m_blocks * launch.heads)}, Nq {prob.seqlen_q}, Nk {prob.seqlen_k})"
    return UsageError(f"--round {rnd} is not a round of {who}: it runs {runs}; {why}")


def _within(args, option: str, index: int, count: int, per: int, what: str, cta_text: str) -> None:
    """--sequence / --split: check the index and --cta within it (`per` CTAs each), then make args.cta
    the grid's linear id."""
    if index >= count:
        raise UsageError(f"{option} {index} is outside the {what}: {count} of them, 0..{count - 1}")
    if args.cta >= per:
        raise UsageError(f"--cta {args.cta} is outside {option} {index}'s CTAs: with {option}, --cta is {cta_text}, "
                         f"0..{per - 1}")
    args.cta += per * index


def _check_split_selection(args, plan) -> tuple[int, int]:
    """(warp, lane) after checking CTA, warp, lane, thread and round against split-KV's split launch
    (fa_sim.splitkv.SplitPlan: a CTA's rounds are its split's K/V blocks of its sequence); --split S
    makes --cta the S-th split's CTA."""
    x, y, z = plan.grid
    if args.split is not None:
        _within(args, "--split", args.split, z, x * y, f"split launch's splits (--splits {z})",
                f"blockIdx.x + {x} * (batch * H + head) ({x} Q blocks x {y} batch-heads)")
    n_ctas = int(np.prod(plan.grid))
    if args.cta >= n_ctas:
        x, y, z = plan.grid
        raise UsageError(f"--cta {args.cta} is outside the split launch's grid: {n_ctas} CTAs, 0..{n_ctas - 1} ({x} Q "
                         f"blocks x {y} batch-heads x {z} splits)")
    warp, lane = warp_and_lane(args, plan.problem.config.n_warps)
    n = plan.cta(args.cta)[4]
    if not n:
        raise UsageError(f"--cta {args.cta} runs no round: {plan.describe_cta(args.cta)}")
    if args.round >= n:
        runs = "round 0 only" if n == 1 else f"rounds 0..{n - 1}"
        raise UsageError(f"--round {args.round} is not a round of CTA {args.cta}: it runs {runs}; "
                         f"{plan.describe_cta(args.cta)}")
    return warp, lane


def _check_selection(args, prob: Problem) -> tuple[int, int]:
    """(warp, lane) after checking CTA, warp, lane, thread and round against the grid; a packed
    batch's --sequence S makes --cta the S-th sequence's CTA."""
    cfg = prob.config
    if args.sequence is not None:
        _within(args, "--sequence", args.sequence, prob.batch, prob.n_m_blocks * prob.heads, "packed batch's sequences",
                f"blockIdx.x + {prob.n_m_blocks} * head ({prob.n_m_blocks} Q blocks of the longest sequence x "
                f"{prob.heads} heads)")
    if args.cta >= prob.n_ctas:
        grid = (f" (grid {prob.n_m_blocks} Q blocks of the longest sequence x {prob.heads} heads x {prob.batch} "
                f"sequences)" if prob.varlen else "")
        raise UsageError(f"--cta {args.cta} is outside the grid: {prob.n_ctas} CTAs, 0..{prob.n_ctas - 1}{grid}")
    warp, lane = warp_and_lane(args, cfg.n_warps)
    error = _round_error(prob, args.cta, args.round)
    if error is not None:
        raise error
    return warp, lane


def run(args) -> int:
    from ..observers import runs, story, trace_io
    from ..observers.trace import TraceFilter
    from . import backward

    backward.check_options(args, ("ops", "save", "perfetto", "kernel", "sequence", "split"))
    if args.backward:
        return backward.trace(args)
    kernel_from_args(args)  # the file, before anything is read or made
    ops = parse_ops(args.ops)  # before any work: an empty list would trace nothing
    split = splitkv(args)  # split-KV decoding: the split launch (FA_SPLITKV) is traced
    if args.split is not None and not split:
        raise UsageError("--split applies to split-KV decoding only (--splits N|auto or --cache-seqlens)")
    if split and (args.engine == "program" or args.kernel is not None):
        raise UsageError("--splits / --cache-seqlens (split-KV decoding) run fa2_fwd.cu and fa2_combine.cu on the PTX "
                         "engine, here: without --engine program or --kernel")
    inputs = packed_inputs(args, split)  # None: random, drawn after the checks; args.cu_seqlens of a packed batch
    if args.sequence is not None and args.cu_seqlens is None:
        raise UsageError("--sequence applies to a packed batch only (--seqlens, or an --npz file with cu_seqlens_q "
                         "and cu_seqlens_k)")
    cfg = config_from_args(args, head_dim=inputs_head_dim(args, inputs))
    save = None if args.save is None else Output("--save", Path(args.save), Kind.DIR, ARCHIVE_FILES)
    perfetto = None if args.perfetto is None else Output("--perfetto", Path(args.perfetto), Kind.FILE)
    check_outputs(args, save, perfetto)
    packed = packed_engine(args)  # a packed batch runs on the PTX engine
    if packed:
        selected = packed_problem(args, inputs, cfg)
    else:
        b, h, nq, nk, _ = problem_shape(args) if inputs is None else (*inputs[0].shape[:3], inputs[1].shape[2], 0)
        hk = heads_k(args) if inputs is None else inputs[1].shape[1]
        try:
            selected = Problem(b, h, nq, nk, args.causal, 1.0, cfg, hk, **features(args))
            if split:  # the split launch: its grid, GQA packed or not, and each split's K/V blocks
                from ..splitkv import check_splitkv

                plan = check_splitkv(selected, split["splits"], split["cache_seqlens"], pack_gqa=split.get("pack_gqa"))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if split:
        args.engine = "ptx"
        warp, lane = _check_split_selection(args, plan)
    else:
        warp, lane = _check_selection(args, selected)
    front = engine_from_args(args, cfg)
    check_engine(front, cfg, args.causal)
    if packed:
        announce("trace", selected, reference=False)
        inputs = packed_random_inputs(args, selected, cfg.dtype) if inputs is None else run_inputs(args, cfg, inputs)
    elif inputs is None:  # made after every check (commands/preflight.py)
        check_input_memory(args)
        announce("trace", problem_of(qkv_shapes(problem_shape(args), heads_k(args)), args.causal, None, cfg,
                                     **features(args)), reference=False)
        inputs = random_inputs(args, cfg.dtype)
    else:
        inputs = run_inputs(args, cfg, inputs)
    filt = TraceFilter(ctas=(args.cta,), warps=(warp,), lanes=(lane,), rounds=(args.round,), ops=ops)
    tr = runs.run_trace(cfg, filt, causal=args.causal, inputs=inputs, engine=front, **features(args),
                        cu_seqlens=args.cu_seqlens, **split)
    st = story.lane_story(tr, args.cta, warp, lane, args.round)
    print(json.dumps(story.story_json(st), indent=1) if args.json else story.format_story(st))
    if save is not None:
        print(f"wrote {save_directory(save.path, lambda tmp: trace_io.save_trace(tr, tmp))}", file=sys.stderr)
    if perfetto is not None:
        print(f"wrote {write_text(perfetto.path, json.dumps(trace_io.to_perfetto(tr)))}", file=sys.stderr)
    return 0
