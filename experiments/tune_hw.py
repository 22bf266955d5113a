"""Time candidate kernel configs on the GPU and write the table that config="auto" reads (fa_hw.tuned).

    python experiments/tune_hw.py --gpu-name "NVIDIA H100 80GB HBM3" [--out DIR] [--runs 3] [--warmup 5]
                                  [--reps 20] [--cases 0 3] [--quick]

--gpu-name (required) is the GPU the table is for, as the driver names it; on any other GPU the run
stops before anything is timed (a table is named by the GPU it ran on: <gpu_key>.json).

For each TRAINING shape (experiments/hw_sets.py TRAIN; the held-out TEST set is never timed here)
and causal flag, SDPA-flash and every candidate of that head_dim (`candidates`) are timed in --runs
round-robin runs on the same inputs (hw_sets.round_robin); a candidate's ratio on a shape is the
median over runs of SDPA-flash time / our time. Per key (head_dim, causal, size class of
fa_hw.tuned) the winner has the best worst ratio over the key's shapes (the target is every row),
ties broken by the best geometric mean. A
candidate that fails to compile or launch, or whose O differs from SDPA-flash's by more than
SANITY_REL_ERR (a broken build, not rounding: the two differ by ~4e-4 in the recorded runs), is
reported and never chosen; experiments/bench_hw.py checks the chosen ones against float64.

Writes to --out (default $OUT, else experiments/out): <gpu>.json (fa_hw.tuned.Table: ship it as
fa_hw/tuned/<gpu>.json) and tune_hw.md (every time, per shape and causal flag; the chosen entries;
per shape, how near the best of the configs fa_hw.autotune would time without this table comes to
the best of all). Besides fa_hw.tuned's candidates it times the autotuner's (fa_hw.tuned.autotune_candidates).

Candidates (fa_hw.tuned.CANDIDATES; issue 11, the H200 profiles of experiments/out/device1): the seed tile gives each warp
16 query rows, one ldmatrix.x4 per two MMAs, and is shared-memory bound (L1/TEX 74 %); 32 rows per
warp (block_m 128, 4 warps) halves that, as FlashAttention-2 does. Around those tiles: kv_stages 2
and 3 (one barrier per round, next tiles in flight), defer_pv (the previous round's PV MMAs beside
this round's exponentials), q_in_regs where registers allow, heavy_first for causal launches, and
the block_n that keeps registers under 255 without spills (d=128: n32; n64 spills a little). The
seed and the pre-tuning best family members stay in the set as references. Issue 19 adds, on the
best of those tiles, lazy_sum (-ls), poly_exp (-e1, -e2) and the pingpong tiles (m256 ... w8 -pp),
and the d=32 candidates.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

from bench_hw import ours_timer, rel_err_gpu, sdpa_timers
from hw_sets import TRAIN, Spread, check_sets, ratios, round_robin
from fa_hw import check
from fa_hw.runtime import device, device_arch
from fa_hw.tuned import Entry, Table, autotune_candidates, gpu_key, size_class
from fa_hw.tuned import candidates as tuned_candidates
from fa_sim.config import KernelConfig
from fa_sim.contract.nvrtc import nvrtc_version

SANITY_REL_ERR = 2e-3
QUICK = {32: 3, 64: 3, 128: 3}  # --quick (a smoke run): the first candidates of each head_dim


def candidates(head_dim: int, causal: bool, quick: bool = False) -> list[KernelConfig]:
    """fa_hw.tuned.candidates (the list and why it is that is there), then those the autotuner
    would time on a GPU without a table (fa_hw.tuned.autotune_candidates, from the shipped tables, for
    each size class) that are not among them, so that the report can say how near the autotuner's
    best comes to the best of the full set (`autotune_rows`); cut short for --quick."""
    out = tuned_candidates(head_dim, causal)
    if quick:
        return out[: QUICK.get(head_dim, 0)]
    for nk in SIZE_KEYS:
        out += [c for c in autotune_candidates(head_dim, causal, nk) if c not in out]
    return out


SIZE_KEYS = (1024, 4096, 8192)  # one key length per size class of fa_hw.tuned


def autotune_rows(results: dict) -> list[str]:
    """Per shape and causal flag: the fastest of all candidates against the fastest of those the
    autotuner times (fa_hw.tuned.autotune_candidates, from the tables shipped when this runs)."""
    lines = ["| B, H, N, d | causal | best of all | ms | best of the autotuner's | ms | slower by |",
             "|---|---|---|---:|---|---:|---:|"]
    for (case, causal), (_, rows) in results.items():
        ok = {r["tag"]: r["ms"] for r in rows if r["ms"] is not None and r["note"] is None}
        pool = [c.tag for c in autotune_candidates(case[3], causal, case[2]) if c.tag in ok]
        if not ok or not pool:
            continue
        best, mine = min(ok, key=ok.get), min(pool, key=ok.get)
        lines.append(f"| {tuple(case)} | {causal} | {best} | {ok[best]:.3f} | {mine} | {ok[mine]:.3f} | "
                     f"{ok[mine] / ok[best] - 1:+.1%} |")
    return lines


def measure_case(case, causal, args) -> tuple[Spread, list[dict]]:
    """SDPA-flash's ms over the runs and one row per candidate: tag, ms and ratio to flash (median
    over runs, with min and max), error against SDPA-flash, note."""
    import torch

    b, h, n, d = case
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn((b, h, n, d), generator=gen, device="cuda", dtype=torch.float16) for _ in range(3))
    timers, outs, notes = sdpa_timers(q, k, v, causal, args.warmup, args.reps, ("sdpa-flash",))
    if "sdpa-flash" not in timers:
        raise RuntimeError(notes.get("sdpa-flash", "SDPA-flash did not run"))
    ref = outs.pop("sdpa-flash")
    rows = {}
    for cfg in candidates(d, causal, args.quick):
        row = dict(config=cfg.to_json(), tag=cfg.tag, ms=None, vs_flash=None, err_vs_flash=None, note=None)
        try:
            timers[cfg.tag], regs, o = ours_timer(q, k, v, causal, cfg, args.warmup, args.reps)
            err = rel_err_gpu(o, ref)
            row.update(err_vs_flash=err, regs=regs)
            if not err <= SANITY_REL_ERR:
                row["note"] = f"O differs from SDPA-flash by {err:.1e}: not chosen"
        except Exception as exc:  # a config that does not build or run here: recorded, not chosen
            row["note"] = " ".join(f"{type(exc).__name__}: {exc}".split())[:160]
        rows[cfg.tag] = row
    runs = round_robin(timers, args.runs)
    flash = Spread.of(runs["sdpa-flash"])
    for tag, row in rows.items():
        if tag in runs:
            ms, vs = Spread.of(runs[tag]), ratios(runs["sdpa-flash"], runs[tag])
            row.update(ms=ms.median, ms_min=ms.lo, ms_max=ms.hi, vs_flash=vs.median, vs_min=vs.lo, vs_max=vs.hi)
        print(f"  {str(case):20s} causal={causal!s:5s} {tag:36s} "
              f"{'fail' if row['ms'] is None else format(row['ms'], '8.3f') + ' ms ' + format(row['vs_flash'], '5.3f') + 'x'}"
              f"{'  ' + row['note'] if row['note'] else ''}", flush=True)
    del q, k, v, ref
    torch.cuda.empty_cache()
    return flash, list(rows.values())


def warm_cache(head_dims, quick: bool) -> None:
    """Compile every candidate build in parallel before the first is timed."""
    from fa_sim.contract import KernelBuild
    from fa_sim.contract.cubins import compile_many

    arch = device_arch()
    builds = {KernelBuild(c, causal, arch)
              for d in head_dims for causal in (False, True) for c in candidates(d, causal, quick)}
    compile_many(sorted(builds, key=str), os.cpu_count())


def choose(results: dict) -> list[Entry]:
    """results[(case, causal)] = (flash_ms, rows) -> the best entry per (head_dim, causal, size)."""
    keys: dict[tuple, list] = {}
    for (case, causal), (flash_ms, rows) in results.items():
        keys.setdefault((case[3], causal, size_class(case[2])), []).append((case, flash_ms, rows))
    out = []
    for (d, causal, size), measured in sorted(keys.items()):
        score: dict[str, list[float]] = {}
        for case, _, rows in measured:
            for r in rows:
                ok = r["ms"] is not None and r["note"] is None
                score.setdefault(r["tag"], []).append(math.log(r["vs_flash"]) if ok else -math.inf)
        # the issue asks for every row: the best worst shape first, then the best geometric mean
        tag, logs = max(score.items(), key=lambda kv: (min(kv[1]), sum(kv[1]) / len(kv[1])))
        if not all(math.isfinite(x) for x in logs):
            print(f"no candidate ran on every shape of d={d} causal={causal} {size}: no entry", flush=True)
            continue
        flops = sum(check.attention_flops(c[0], c[1], c[2], c[3], causal) for c, _, _ in measured)
        ms = sum(next(r["ms"] for r in rows if r["tag"] == tag) for _, _, rows in measured)
        out.append(Entry(d, causal, size, KernelConfig.from_tag(tag), flops / (ms * 1e-3) / 1e12,
                         math.exp(sum(logs) / len(logs)), tuple(tuple(c) for c, _, _ in measured)))
    return out


def markdown(results: dict, entries: list[Entry], gpu: str, runs: int) -> str:
    lines = [f"GPU: {gpu}. Training shapes (experiments/hw_sets.py TRAIN) only. Every backend timed in {runs} "
             "round-robin runs on the same inputs (a run: the median of CUDA-event times per launch); ms and x flash "
             "(SDPA-flash time / ours, per run) are the median over runs [min, max].", "",
             "| B, H, N, d | causal | config | ms [min, max] | x flash [min, max] | err vs flash | regs/CTAs | note |",
             "|---|---|---|---:|---:|---:|---:|---|"]
    for (case, causal), (flash, rows) in results.items():
        lines.append(f"| {tuple(case)} | {causal} | SDPA-flash | {flash.fmt()} | 1.00 | - | - | |")
        for r in sorted(rows, key=lambda r: r["ms"] or math.inf):
            ms = "fail" if r["ms"] is None else f"{r['ms']:.3f} [{r['ms_min']:.3f}, {r['ms_max']:.3f}]"
            x = "-" if r["vs_flash"] is None else f"{r['vs_flash']:.3f} [{r['vs_min']:.3f}, {r['vs_max']:.3f}]"
            e = "-" if r["err_vs_flash"] is None else f"{r['err_vs_flash']:.1e}"
            lines.append(f"| {tuple(case)} | {causal} | {r['tag']} | {ms} | {x} | {e} | {r.get('regs', '-')} | {r['note'] or ''} |")
    lines += ["", "Chosen (fa_hw.tuned entries: best worst shape, then geometric mean; x flash = the geometric mean):", "",
              "| head_dim | causal | size | config | TFLOP/s | x flash |", "|---:|---|---|---|---:|---:|"]
    lines += [f"| {e.head_dim} | {e.causal} | {e.size} | {e.config.tag} | {e.tflops:.1f} | {e.vs_flash:.2f} |" for e in entries]
    lines += ["", "config='auto' without a table (fa_hw.autotune: the candidates it would time on this GPU before "
              "this table ships) against all candidates:", ""] + autotune_rows(results)
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.environ.get("OUT") or "experiments/out")
    p.add_argument("--runs", type=int, default=3, help="round-robin runs per candidate and shape")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--cases", nargs="*", type=int, default=None, help="indices into hw_sets.TRAIN")
    p.add_argument("--quick", action="store_true", help="three candidates per head_dim (a smoke run)")
    p.add_argument("--gpu-name", required=True, metavar="NAME",
                   help="the GPU the table is for, as the driver names it (e.g. 'NVIDIA H100 80GB HBM3'); "
                        "the run stops at once on any other GPU")
    args = p.parse_args(argv)
    check_sets()
    dev = device()
    if dev.name != args.gpu_name:
        print(f"tune_hw.py: --gpu-name {args.gpu_name!r}, but this GPU is {dev.name!r}: nothing timed "
              f"(run it on the GPU named, or name this one)", file=sys.stderr)
        return 2
    warm_cache([d for d in {c[3] for c in TRAIN}], args.quick)
    results = {}
    for i, case in enumerate(TRAIN):
        if args.cases is None or i in args.cases:
            for causal in (False, True):
                try:
                    results[(tuple(case), causal)] = measure_case(case, causal, args)
                except Exception as exc:  # SDPA-flash itself failed here: this shape has no reference
                    print(f"{case} causal={causal}: not measured ({' '.join(str(exc).split())[:200]})", flush=True)
    entries = choose(results)
    major, minor = nvrtc_version()
    table = Table(dev.name, device_arch(), tuple(entries), f"{major}.{minor}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{gpu_key(dev.name)}.json").write_text(json.dumps(table.to_json(), indent=1) + "\n")
    (out / "tune_hw.md").write_text(markdown(results, entries, dev.name, args.runs))
    for e in entries:
        print(f"chosen: d={e.head_dim} causal={e.causal!s:5s} {e.size:6s} {e.config.tag:36s} "
              f"{e.tflops:6.1f} TFLOP/s {e.vs_flash:.2f}x flash", flush=True)
    print(f"wrote {out / (gpu_key(dev.name) + '.json')} and {out / 'tune_hw.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
