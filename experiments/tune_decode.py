"""Time the decode family on the GPU on training decode shapes and write the table config="auto"
reads for split-KV decoding (fa_hw.tuned_decode).

    python experiments/tune_decode.py [--out DIR] [--batches 2 8 32 48] [--kv 3000 12000 50000]
                                      [--heads 8] [--heads-k 8] [--head-dims 128] [--nq 1]
                                      [--runs 3] [--warmup 2] [--reps 10] [--budget-s 240] [--base TABLE]

TRAIN (the defaults): Nq 1, 8 heads, d = 128, fp16, caches of 3000, 12000 and 50000 keys, batch 2, 8, 32
and 48 - disjoint from experiments/bench_decode.py's held-out rows (KV 4096-131072, batch 1, 4, 16,
64), though they share decode classes (fa_hw.tuned_decode.DecodeClass: powers of two), which is what
a class is for. For each shape, on random normal inputs on the device (fa_hw.splitkv.DecodeTimer,
the cache full), every candidate of fa_hw.tuned_decode.decode_candidates(d) runs split-KV decoding
with its own splits="auto" (the heuristic with that config's CTAs per SM), both launches timed
together: --runs round-robin runs (hw_sets.round_robin), each the median of --reps CUDA-event-timed
launches after --warmup. Before timing, each candidate's O is checked against the seed config's
(relative Frobenius difference below SANITY; the configs differ in the roundings only): one that
fails to compile, launch or agree is reported and never chosen.

Choice. Per decode class, the candidate with the smallest geometric mean over the class's shapes of
its time / the seed config's time (the seed, m64n64 of one stage, is what split-KV ran before
config="auto"); `vs_seed` in the entry is the seed's time / the winner's.

Writes to --out (default $OUT, else experiments/out): decode/<gpu_key>.json (fa_hw.tuned_decode
.DecodeTable: ship it as fa_hw/tuned/decode/<gpu_key>.json; `bench_decode.py --tuned-dir OUT` benchmarks
it on the held-out rows first; with --base, entries of classes this run did not time are kept),
tune_decode.json (every time) and tune_decode.md, rewritten after every shape, so that a run stopped
by --budget-s (no new shape starts past it) keeps what it measured.

Runtime on an H100: 11 candidates at d = 128, compiled first in parallel (about 30 s cold); the
largest shape (48 x 8 heads x 50000 keys, 9.8 GB of cache) takes about 5 ms a launch, so about 3 s
per shape of timing; the 12 shapes take about a minute plus the inputs' upload.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from hw_sets import Spread, round_robin

SANITY = 1e-2  # relative Frobenius difference of a candidate's O from the seed config's


def geomean(xs) -> float:
    xs = list(xs)
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def time_shape(batch: int, nk: int, d: int, args, candidates, sms: int) -> dict:
    from fa_sim.config import KernelConfig
    from fa_sim.problem import Problem

    from fa_hw import runtime
    from fa_hw.splitkv import DecodeTimer
    from fa_hw.tuned_decode import DecodeClass

    h, hk, nq = args.heads, args.heads_k, args.nq
    prob = Problem(batch, h, nq, nk, False, d ** -0.5, KernelConfig(head_dim=d), heads_k=hk)
    lens = np.full(batch, nk, np.int32)
    timer = DecodeTimer(prob, "auto", lens, None, sms)
    timer.compile(candidates)
    seed = KernelConfig(head_dim=d)
    o_shape = (batch, h, nq, d)
    outs, failed, plans = {}, {}, {}
    for c in [seed] + [c for c in candidates if c != seed]:
        try:
            sp = timer.launch_plan(c)
            sp.run(timer.stream)
            outs[c] = runtime.download(timer.ptrs[3], np.empty(o_shape, np.float16), timer.stream).astype(np.float64)
            if not np.all(np.isfinite(outs[c])):
                raise ValueError("O not finite")
            if c != seed and seed in outs:
                diff = np.linalg.norm(outs[c] - outs[seed]) / np.linalg.norm(outs[seed])
                if not diff < SANITY:
                    raise ValueError(f"O differs from the seed config's by {diff:.2e} (relative), over {SANITY}")
            plans[c] = sp
        except Exception as exc:  # reported, never chosen
            failed[c.tag] = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
    timers = {c.tag: (lambda sp=sp: statistics.median(sp.time(timer.stream, args.warmup, args.reps)))
              for c, sp in plans.items()}
    runs = round_robin(timers, args.runs)
    cls = DecodeClass.of(timer.plan(seed))
    return {"batch": batch, "heads": h, "heads_k": hk, "nq": nq, "nk": nk, "head_dim": d, "class": cls.key,
            "splits": {c.tag: sp.plan.splits for c, sp in plans.items()},
            "ms": {tag: Spread.of(r).__dict__ for tag, r in runs.items()}, "runs": runs, "failed": failed,
            "seed": seed.tag}


def choose(rows: list[dict]) -> dict:
    """{class: (winner tag, geomean ratio seed/winner, rows)} over the timed rows (module docstring)."""
    by_class: dict = {}
    for r in rows:
        by_class.setdefault(r["class"], []).append(r)
    out = {}
    for key, rs in by_class.items():
        tags = set.intersection(*(set(r["ms"]) for r in rs))
        seed = rs[0]["seed"]
        if seed not in tags:
            continue
        score = {t: geomean(r["ms"][t]["median"] / r["ms"][seed]["median"] for r in rs) for t in tags}
        best = min(sorted(score), key=score.get)
        out[key] = (best, 1.0 / score[best], rs)
    return out


def write(rows, args, gpu, arch, nvrtc, base) -> str:
    from fa_sim.config import KernelConfig

    from fa_hw.device import gpu_key
    from fa_hw.tuned_decode import DecodeClass, DecodeEntry, DecodeTable

    chosen = choose(rows)
    entries = {e.key: e for e in (base.entries if base is not None else ())}
    for key, (tag, vs_seed, rs) in chosen.items():
        entries[key] = DecodeEntry(DecodeClass.parse(key), KernelConfig.from_tag(tag),
                                   rs[0]["splits"][tag], {t: round(s["median"], 5) for t, s in rs[0]["ms"].items()},
                                   round(vs_seed, 4),
                                   tuple((r["batch"], r["heads"], r["heads_k"], r["nq"], r["nk"]) for r in rs))
    table = DecodeTable(gpu, arch, tuple(entries.values()), nvrtc)
    out = Path(args.out)
    (out / "decode").mkdir(parents=True, exist_ok=True)
    (out / "decode" / f"{gpu_key(gpu)}.json").write_text(json.dumps(table.to_json(), indent=1) + "\n")
    (out / "tune_decode.json").write_text(json.dumps({"gpu": gpu, "arch": arch, "args": vars(args), "rows": rows},
                                                     indent=1))
    md = [f"# Decode tuning on {gpu} ({arch})", "",
          f"Nq = {args.nq}, H = {args.heads}, H_k = {args.heads_k}, fp16, the cache full; per candidate the median "
          f"of {args.runs} runs (each the median of {args.reps} launches of both split-KV launches, CUDA events) "
          f"[min, max], ms; its splits (\"auto\" for that config) in parentheses.", ""]
    for r in rows:
        seed = r["ms"].get(r["seed"], {}).get("median")
        md += [f"## B = {r['batch']}, KV = {r['nk']}, d = {r['head_dim']} ({r['class']})", "",
               "| candidate | splits | ms | vs seed |", "|---|---|---|---|"]
        for tag, s in sorted(r["ms"].items(), key=lambda kv: kv[1]["median"]):
            ratio = f"{seed / s['median']:.3f}" if seed else "-"
            md.append(f"| {tag} | {r['splits'][tag]} | {s['median']:.4f} [{s['lo']:.4f}, {s['hi']:.4f}] | {ratio} |")
        md += [f"| {tag} | failed: {why} | | |" for tag, why in r["failed"].items()] + [""]
    md += ["## Chosen", "", "| class | config | vs seed (geomean) | shapes |", "|---|---|---|---|"]
    md += [f"| {key} | {tag} | {vs:.3f} | {len(rs)} |" for key, (tag, vs, rs) in sorted(chosen.items())]
    text = "\n".join(md) + "\n"
    (out / "tune_decode.md").write_text(text)
    return text


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.environ.get("OUT") or str(Path(__file__).parent / "out"))
    p.add_argument("--batches", type=int, nargs="+", default=[2, 8, 32, 48])
    p.add_argument("--kv", type=int, nargs="+", default=[3000, 12000, 50000])
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--heads-k", type=int, default=None)
    p.add_argument("--nq", type=int, default=1)
    p.add_argument("--head-dims", type=int, nargs="+", default=[128])
    p.add_argument("--labels", nargs="+", default=None, help="time only these candidate tags (and the seed)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--budget-s", type=float, default=240.0, help="start no new shape past this many seconds")
    p.add_argument("--base", default=None, help="a decode table whose entries of untimed classes are kept")
    args = p.parse_args(argv)
    args.heads_k = args.heads_k or args.heads
    if args.heads % args.heads_k:
        p.error("--heads-k must divide --heads")
    from fa_sim.config import KernelConfig
    from fa_sim.contract.nvrtc import nvrtc_version

    from fa_hw.runtime import device, device_arch
    from fa_hw.tuned_decode import DecodeTable, decode_candidates

    pools = {}
    for d in args.head_dims:
        pool = decode_candidates(d)
        if args.labels:
            unknown = sorted(set(args.labels) - {c.tag for c in pool})
            if len(unknown) == len(args.labels):
                p.error(f"--labels: none of {args.labels} is a decode candidate at d={d}: {[c.tag for c in pool]}")
            pool = [c for c in pool if c.tag in args.labels or c == KernelConfig(head_dim=d)]
        pools[d] = pool
    base = DecodeTable.load(args.base) if args.base else None
    dev = device()
    gpu, arch, sms = dev.name, device_arch(), dev.properties.multiprocessor_count
    nvrtc = ".".join(map(str, nvrtc_version()))
    t0 = time.perf_counter()
    rows = []
    for d in args.head_dims:
        for batch in args.batches:
            for nk in args.kv:
                if time.perf_counter() - t0 > args.budget_s:
                    print(f"budget: skip B={batch} KV={nk} d={d}", file=sys.stderr)
                    continue
                row = time_shape(batch, nk, d, args, pools[d], sms)
                rows.append(row)
                best = min(row["ms"], key=lambda t: row["ms"][t]["median"])
                print(f"d={d} B={batch:>3} KV={nk:>6} {row['class']}: best {best} "
                      f"{row['ms'][best]['median']:.4f} ms (splits {row['splits'][best]}), seed "
                      f"{row['ms'][row['seed']]['median']:.4f} ms; failed {sorted(row['failed'])}", flush=True)
                write(rows, args, gpu, arch, nvrtc, base)
    print(write(rows, args, gpu, arch, nvrtc, base) if rows else "no shape timed")
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
