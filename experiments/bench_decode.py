"""Decoding with split-KV (issue 38 item 6): fa_hw's config="auto" with splits="auto" against the seed
config's splits="auto", splits=1 and torch SDPA-flash.

    python experiments/bench_decode.py [--runs 3] [--warmup 5] [--reps 20] [--heads 8] [--heads-k 8]
                                       [--head-dim 128] [--batches 1 4 16 64] [--kv 4096 16384 65536 131072]
                                       [--max-gib 40] [--tuned-dir DIR] [--out DIR]

Rows: every (batch, KV length) of --batches x --kv whose K and V caches fit in --max-gib, Nq = 1,
fp16, --heads Q heads and --heads-k K/V heads (GQA when fewer; SDPA then gets enable_gqa=True), the
cache full (cache_seqlens = the KV length for every sequence, so that SDPA computes the same thing).
Backends: ours with config="auto" and splits="auto" ("tuned": fa_hw.tuned_decode's config for the
row's decode class - the table of --tuned-dir's decode/ folder, default the shipped fa_hw/tuned/decode,
else autotuned on the row's inputs - with the heuristic's splits for that config; each row prints the
chosen config and where it came from), ours with the seed config and splits="auto" ("auto":
fa_sim.splitkv.num_splits_heuristic on this GPU's SM count: the split kernel and fa2_combine.cu, timed
together), ours with the seed config and splits=1 (one CTA per (batch, head): the
kernel without split-KV), with GQA (--heads-k below --heads) ours with splits="auto" and the Q heads not packed
(pack_gqa=False: one CTA per Q head, K/V read once per Q head; "auto" packs them, fa_sim.splitkv),
and SDPA with the FLASH_ATTENTION backend. Each backend's time is the
median of --reps launches bracketed by CUDA events after --warmup, in --runs runs interleaved
round-robin (hw_sets.round_robin); a row gives the median over the runs and [min, max], and the
per-run ratios tuned / splits=1, tuned / SDPA-flash and tuned / auto (speed-ups: time of the other
over ours). The goal of issue 38: ours (tuned) >= 1.5x splits=1 and >= 1.0x SDPA-flash on every row.
Every output is checked against a float64 reference computed on the GPU for the first and last
sequence of the batch (relative Frobenius error; the bar is 1e-3). Writes bench_decode.json and bench_decode.md to --out
(default $OUT, else experiments/out).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from hw_sets import Spread, round_robin

from fa_hw import tuned_decode
from fa_hw.runtime import device, device_arch
from fa_hw.splitkv import prepare_splitkv

ERR_BAR = 1e-3
GOAL_VS_ONE_SPLIT, GOAL_VS_FLASH = 1.5, 1.0


def time_torch(fn, warmup: int, reps: int) -> float:
    """Median ms of `reps` calls of fn, each bracketed by CUDA events on torch's current stream."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    marks = [torch.cuda.Event(enable_timing=True) for _ in range(reps + 1)]
    marks[0].record()
    for i in range(reps):
        fn()
        marks[i + 1].record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in zip(marks, marks[1:]))


def reference_err(q, k, v, o, scale: float) -> float:
    """Relative Frobenius error of o against float64 attention, over the first and last sequence."""
    import torch

    h, hk = q.shape[1], k.shape[1]
    num = den = 0.0
    for b in sorted({0, q.shape[0] - 1}):
        kb = k[b].double().repeat_interleave(h // hk, dim=0)
        vb = v[b].double().repeat_interleave(h // hk, dim=0)
        p = torch.softmax(q[b].double() @ kb.transpose(-1, -2) * scale, dim=-1)
        ref = p @ vb
        num += float(((o[b].double() - ref) ** 2).sum())
        den += float((ref ** 2).sum())
        del kb, vb, p
    return (num / den) ** 0.5


def bench_row(batch: int, nk: int, args) -> dict:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    g = torch.Generator(device="cuda").manual_seed(batch * 1_000_003 + nk)
    h, hk, d = args.heads, args.heads_k, args.head_dim
    q = torch.randn((batch, h, 1, d), generator=g, device="cuda", dtype=torch.float16)
    k = torch.randn((batch, hk, nk, d), generator=g, device="cuda", dtype=torch.float16)
    v = torch.randn((batch, hk, nk, d), generator=g, device="cuda", dtype=torch.float16)
    lens = torch.full((batch,), nk, dtype=torch.int32)
    scale = d ** -0.5
    timers, outs, notes, splits, configs = {}, {}, {}, {}, {}
    variants = [("tuned", "auto", "auto", None), ("auto", None, "auto", None), ("splits=1", None, 1, None)] + (
        [("auto-unpacked", None, "auto", False)] if hk != h else [])
    for label, config, n, pack in variants:
        sp = prepare_splitkv(q, k, v, config=config, splits=n, cache_seqlens=lens, pack_gqa=pack)
        stream = sp.dev.stream
        sp.launch(stream)
        sp.sync(stream)
        outs[label], splits[label] = sp.dev.o.clone(), sp.plan.splits
        configs[label] = sp.plan.problem.config.tag
        if label == "tuned":
            notes["tuned"] = sp.source
        timers[label] = lambda sp=sp, stream=stream: time_torch(lambda: sp.launch(stream), args.warmup, args.reps)

    def sdpa():
        return F.scaled_dot_product_attention(q, k, v, scale=scale, **({"enable_gqa": True} if hk != h else {}))

    try:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            outs["sdpa-flash"] = sdpa()

        def flash_timer():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return time_torch(sdpa, args.warmup, args.reps)

        timers["sdpa-flash"] = flash_timer
    except Exception as exc:  # a torch build whose flash backend does not take this shape
        notes["sdpa-flash"] = " ".join(str(exc).split())[:160]
    torch.cuda.synchronize()
    runs = round_robin(timers, args.runs)
    row = {"batch": batch, "nq": 1, "nk": nk, "heads": h, "heads_k": hk, "head_dim": d, "splits_auto": splits["auto"],
           "splits_tuned": splits["tuned"], "config_tuned": configs["tuned"], "config_seed": configs["auto"],
           "ms": {label: Spread.of(r).__dict__ for label, r in runs.items()}, "runs": runs, "notes": notes,
           "rel_err": {label: reference_err(q, k, v, o, scale) for label, o in outs.items()}}
    row["speedup_vs_one_split"] = Spread.of(o / a for o, a in zip(runs["splits=1"], runs["tuned"])).__dict__
    row["speedup_vs_seed_auto"] = Spread.of(o / a for o, a in zip(runs["auto"], runs["tuned"])).__dict__
    if "auto-unpacked" in runs:
        row["splits_auto_unpacked"] = splits["auto-unpacked"]
        row["speedup_vs_unpacked"] = Spread.of(u / a for u, a in zip(runs["auto-unpacked"], runs["auto"])).__dict__
    if "sdpa-flash" in runs:
        row["speedup_vs_flash"] = Spread.of(f / a for f, a in zip(runs["sdpa-flash"], runs["tuned"])).__dict__
    del q, k, v
    torch.cuda.empty_cache()
    return row


def markdown(rows: list[dict], gpu: str, args) -> str:
    def fmt(s):
        return f"{s['median']:.3f} [{s['lo']:.3f}, {s['hi']:.3f}]"

    out = [f"# Split-KV decoding on {gpu}", "",
           f"Nq = 1, H = {args.heads}, H_k = {args.heads_k}, d = {args.head_dim}, fp16; median of {args.runs} runs "
           f"(each the median of {args.reps} launches, CUDA events) [min, max]; errors against float64.", "",
           "\"tuned\" is config=\"auto\" with splits=\"auto\" (fa_hw.tuned_decode: its config and splits per row); "
           "\"seed auto\" the seed config with splits=\"auto\"; the ratios are speed-ups of tuned.", "",
           "| B | KV | config (auto) | splits (tuned) | tuned ms | seed auto: splits, ms | splits=1 ms | SDPA-flash ms "
           "| tuned vs splits=1 | tuned vs flash | tuned vs seed auto | max rel err | GQA unpacked: splits, ms, seed "
           "auto vs it |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        flash = fmt(r["ms"]["sdpa-flash"]) if "sdpa-flash" in r["ms"] else r["notes"].get("sdpa-flash", "-")
        vs_flash = fmt(r["speedup_vs_flash"]) if "speedup_vs_flash" in r else "-"
        unpacked = (f"{r['splits_auto_unpacked']}, {fmt(r['ms']['auto-unpacked'])}, {fmt(r['speedup_vs_unpacked'])}"
                    if "speedup_vs_unpacked" in r else "-")
        out.append(f"| {r['batch']} | {r['nk']} | {r['config_tuned']} | {r['splits_tuned']} | "
                   f"{fmt(r['ms']['tuned'])} | "
                   f"{r['splits_auto']}, {fmt(r['ms']['auto'])} | {fmt(r['ms']['splits=1'])} | {flash} | "
                   f"{fmt(r['speedup_vs_one_split'])} | {vs_flash} | {fmt(r['speedup_vs_seed_auto'])} | "
                   f"{max(r['rel_err'].values()):.2e} | {unpacked} |")
    ok_one = all(r["speedup_vs_one_split"]["median"] >= GOAL_VS_ONE_SPLIT for r in rows)
    ok_flash = all(r.get("speedup_vs_flash", {"median": 0})["median"] >= GOAL_VS_FLASH for r in rows)
    ok_err = all(max(r["rel_err"].values()) <= ERR_BAR for r in rows)
    sources = sorted({r["notes"].get("tuned", "") for r in rows} - {""})
    out += ["", "Configs from: " + "; ".join(sources)] if sources else []
    out += ["", f"Goal tuned >= {GOAL_VS_ONE_SPLIT}x splits=1 on every row: {'met' if ok_one else 'NOT met'}; "
                f"tuned >= {GOAL_VS_FLASH}x SDPA-flash: {'met' if ok_flash else 'NOT met'}; every error <= "
                f"{ERR_BAR:g}: {'yes' if ok_err else 'NO'}."]
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--heads-k", type=int, default=None)
    p.add_argument("--head-dim", type=int, default=128, choices=(32, 64, 96, 128, 160, 192, 256))
    p.add_argument("--name", default="bench_decode", help="file names of the outputs: NAME.json, NAME.md")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 64])
    p.add_argument("--kv", type=int, nargs="+", default=[4096, 16384, 65536, 131072])
    p.add_argument("--max-gib", type=float, default=40.0, help="skip rows whose K and V caches exceed this")
    p.add_argument("--tuned-dir", default=None,
                   help="read config='auto''s decode table from DIR/decode (tune_decode.py --out DIR); default the "
                        "shipped fa_hw/tuned/decode")
    p.add_argument("--out", default=os.environ.get("OUT") or str(Path(__file__).parent / "out"))
    args = p.parse_args(argv)
    if args.tuned_dir is not None:
        tuned_decode.use_directory(Path(args.tuned_dir) / "decode")
    args.heads_k = args.heads_k or args.heads
    if args.heads % args.heads_k:
        p.error("--heads-k must divide --heads")
    dev = device()
    gpu = f"{dev.name} ({device_arch()}, {dev.properties.multiprocessor_count} SMs)"
    rows = []
    for batch in args.batches:
        for nk in args.kv:
            gib = 2 * batch * args.heads_k * nk * args.head_dim * 2 / 2**30
            if gib > args.max_gib:
                print(f"skip B={batch} KV={nk}: K and V take {gib:.1f} GiB > --max-gib {args.max_gib}", file=sys.stderr)
                continue
            row = bench_row(batch, nk, args)
            rows.append(row)
            print(f"B={batch:>3} KV={nk:>6} config auto {row['config_tuned']} splits={row['splits_tuned']:>3} "
                  f"({row['notes'].get('tuned')}); seed splits={row['splits_auto']:>3}  "
                  + "  ".join(f"{k} {v['median']:.3f} ms" for k, v in row["ms"].items())
                  + f"  tuned/one {row['speedup_vs_one_split']['median']:.2f}x"
                  + f"  tuned/seed-auto {row['speedup_vs_seed_auto']['median']:.2f}x"
                  + (f"  tuned/flash {row['speedup_vs_flash']['median']:.2f}x" if "speedup_vs_flash" in row else ""),
                  flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps({"gpu": gpu, "args": vars(args), "rows": rows}, indent=1))
    md = markdown(rows, gpu, args)
    (out / f"{args.name}.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
