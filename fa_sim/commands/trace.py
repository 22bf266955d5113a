"""`fa trace`: one lane's story through one round: every instruction it executed, the tile
coordinates, byte addresses and banks it touched, the values it received, its shuffle partners,
and its S, m, l, P~ and O slots at their (query, key) / (query, d) coordinates."""

from __future__ import annotations

import argparse
import json

import numpy as np

from .common import add_config_arguments, add_problem_arguments, config_from_args, load_qkv, parse_ops, seqlen_k


def register(subparsers) -> None:
    p = subparsers.add_parser("trace", help="one lane through one round, instruction by instruction",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cta", type=int, default=0, help="linear CTA id (m_block + n_m_blocks * batch_head)")
    p.add_argument("--warp", type=int, default=0)
    p.add_argument("--lane", type=int, default=0)
    p.add_argument("--thread", type=int, help="thread id in the CTA (overrides --warp/--lane)")
    p.add_argument("--round", type=int, default=0, help="K/V iteration t")
    add_problem_arguments(p, scale=False)
    add_config_arguments(p)
    p.add_argument("--input", metavar="NPZ", help="q, k, v arrays instead of random normal inputs")
    p.add_argument("--ops", help="comma-separated instruction classes to keep, e.g. LDSM,SHFL")
    p.add_argument("--json", action="store_true", help="print the story as JSON")
    p.add_argument("--save", metavar="DIR", help="also write the trace archive (manifest.json + arrays.npz)")
    p.add_argument("--perfetto", metavar="FILE", help="also write Chrome/Perfetto trace-event JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..observers import runs, story, trace_io
    from ..observers.trace import TraceFilter

    cfg = config_from_args(args)
    warp, lane = (args.thread // 32, args.thread % 32) if args.thread is not None else (args.warp, args.lane)
    ops = parse_ops(args.ops)
    filt = TraceFilter(ctas=(args.cta,), warps=(warp,), lanes=(lane,), rounds=(args.round,), ops=ops)
    problem = runs.Problem(args.batch, args.heads, args.seqlen, seqlen_k(args), args.head_dim, args.seed)
    inputs = load_qkv(args.input) if args.input else None
    n_ctas = -(-np.shape(inputs[0])[2] // cfg.block_m) * int(np.prod(np.shape(inputs[0])[:2])) if inputs else \
        -(-args.seqlen // cfg.block_m) * args.batch * args.heads
    if not 0 <= args.cta < n_ctas:
        raise ValueError(f"--cta {args.cta} is outside the grid of {n_ctas} CTAs (0..{n_ctas - 1})")
    tr = runs.run_trace(cfg, filt, problem, args.causal, inputs)
    st = story.lane_story(tr, args.cta, warp, lane, args.round)
    print(json.dumps(story.story_json(st), indent=1) if args.json else story.format_story(st))
    if args.save:
        print(f"wrote {trace_io.save_trace(tr, args.save)}")
    if args.perfetto:
        print(f"wrote {trace_io.save_perfetto(tr, args.perfetto)}")
    return 0
