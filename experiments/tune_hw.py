"""Time candidate kernel configs on the GPU and write the table that config="auto" reads (fa_hw.tuned).

    python experiments/tune_hw.py --gpu-name "NVIDIA H100 80GB HBM3" [--out DIR] [--runs 3] [--warmup 5]
                                  [--reps 20] [--cases 0 3] [--quick]
    python experiments/tune_hw.py --gpu-name "NVIDIA H100 80GB HBM3" --features [--base TABLE] [--out DIR]
                                  [--cases I ...] [--max-candidates N | --labels TAG ...]

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

--features (issue 38) tunes the feature classes instead (fa_hw.tuned.FeatureClass: head_dim 96-256,
bf16, GQA, softcap) on hw_sets.FEATURE_TRAIN, shapes none of which experiments/bench_features.py
benchmarks (`check_feature_sets`), planned for about 200 s of an H100, not yet run (120 builds
compiled in parallel, 20 cases of 6 candidates). Each is timed with its features and dtype against SDPA-flash on the same
inputs (bf16 in bf16; GQA with enable_gqa; softcap against SDPA-flash without it, which only
normalises: the ranking is by time); its O must be within bench_features.ERR_BAR of float64
(bench_features.reference). Candidates are pruned to `feature_candidates` (at most --max-candidates,
default fa_hw.tuned.MAX_AUTOTUNE_CANDIDATES; 0: all): what the autotuner would time for the plain kernel of
that key, so the plain tables' winners and their neighbours, then CANDIDATES[d] from its end (all of
it where no table holds head_dim d). --labels TAG ... times exactly those configs instead, each case
the labels of its head_dim (heavy_first set in the causal cases, cleared in the others); a bad tag, or
a selected case (--cases) whose head_dim no label has, is one usage line before any GPU work. The
entries are merged into --base (default: the shipped table of this GPU, any GPU: the H200's
fa_hw/tuned/h200.json too; its entries of the same keys are replaced; no shipped table: the new
entries alone) and written as <gpu>.json, with tune_features.md.

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
import statistics
import sys
from pathlib import Path

from dataclasses import replace

from bench_hw import ours_timer, rel_err_gpu, sdpa_timers, time_torch
from hw_sets import FEATURE_TRAIN, TRAIN, Spread, check_sets, ratios, round_robin
from fa_hw import check
from fa_hw.runtime import device, device_arch
from fa_hw.tuned import (MAX_AUTOTUNE_CANDIDATES, TUNED_DIR, Entry, FeatureClass, Table, autotune_candidates, gpu_key,
                         size_class, table_for)
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


def feature_class(feats: dict) -> FeatureClass:
    """The fa_hw.tuned class of a FEATURE_TRAIN / bench_features row's features (dtype, heads_k vs
    heads is read by the caller into 'gqa')."""
    return FeatureClass(feats.get("dtype", "fp16"), "gqa" if feats.get("gqa") else "mha", bool(feats.get("softcap")))


def case_class(case) -> FeatureClass:
    b, h, n, d, feats = case
    return feature_class({**feats, "gqa": feats.get("heads_k", h) != h})


def check_feature_sets(rows: dict, train=FEATURE_TRAIN) -> None:
    """FEATURE_TRAIN shares no (B, H, N, d) with bench_features.py's rows (`rows`: its ROWS), and
    every (head_dim, size class, feature class) of a row that a feature class answers (window rows
    use the plain entries) has a training shape."""
    bench = [c for cases in rows.values() for c in cases]
    shared = sorted({tuple(c[:4]) for c in train} & {tuple(c[:4]) for c in bench})
    have = {(c[3], size_class(c[2]), case_class(c)) for c in train}
    need = {(c[3], size_class(c[2]), case_class(c)) for c in bench if "window" not in c[4]}
    need = {k for k in need if not (k[2].plain and k[0] in (32, 64, 128))}  # the plain tuning's keys
    if shared or need - have:
        raise ValueError(f"bad feature shapes: also benchmarked {shared}; "
                         f"benchmarked keys without training shapes {sorted(need - have, key=str)}")


def feature_candidates(head_dim: int, causal: bool, seqlen_k: int, limit: int = MAX_AUTOTUNE_CANDIDATES,
                       directory=TUNED_DIR, labels=None) -> list[KernelConfig]:
    """The pruned pool of a feature class (module docstring), in fp16 (the timed build takes the
    class's dtype), at most `limit` (0: no limit): fa_hw.tuned.autotune_candidates of the plain
    kernel's key (the plain tables of `directory`), then fa_hw.tuned.candidates from the end of the
    list (issue 19's pingpong and lazy_sum tiles are last) until `limit`. `labels` (KernelConfigs,
    --labels): exactly those of this head_dim instead, heavy_first set when causal and cleared when
    not (as fa_hw.tuned.candidates times causal launches; it changes nothing without causal)."""
    if labels is not None:
        return list(dict.fromkeys(replace(c, heavy_first=bool(causal)) for c in labels if c.head_dim == head_dim))
    pool = autotune_candidates(head_dim, causal, seqlen_k, directory)
    pool += [c for c in reversed(tuned_candidates(head_dim, causal)) if c not in pool]
    return pool[:limit] if limit else pool


def parse_labels(tags, cases) -> list[KernelConfig]:
    """--labels: each tag a valid fp16 config (KernelConfig.from_tag), and every selected
    FEATURE_TRAIN case's head_dim given at least one, every tag's head_dim used by a case; a
    ValueError in one line otherwise (before any GPU work)."""
    out = []
    for tag in tags:
        try:
            cfg = KernelConfig.from_tag(tag)
        except ValueError as exc:
            raise ValueError(f"--labels {tag}: {exc}") from None
        if cfg.dtype != "fp16":
            raise ValueError(f"--labels {tag}: give the fp16 tag (each case's build takes the case's dtype)")
        out.append(cfg)
    dims, given = sorted({c[3] for c in cases}), {c.head_dim for c in out}
    if set(dims) - given:
        raise ValueError(f"--labels names no config of head_dim {sorted(set(dims) - given)}, which the selected "
                         f"FEATURE_TRAIN cases have (their head_dims: {dims}); add one or select cases with --cases")
    if given - set(dims):
        raise ValueError(f"--labels names configs of head_dim {sorted(given - set(dims))}, which no selected "
                         f"FEATURE_TRAIN case has (their head_dims: {dims}); select such cases with --cases")
    return out


def autotune_rows(results: dict) -> list[str]:
    """Per shape and causal flag: the fastest of all candidates against the fastest of those the
    autotuner times (fa_hw.tuned.autotune_candidates, from the tables shipped when this runs)."""
    lines = ["| B, H, N, d | causal | best of all | ms | best of the autotuner's | ms | slower by |",
             "|---|---|---|---:|---|---:|---:|"]
    for key, (_, rows) in results.items():
        case, causal = key[:2]
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


def measure_feature_case(case, causal, args) -> tuple[Spread, list[dict]]:
    """measure_case for a FEATURE_TRAIN case: its dtype, K/V heads and softcap; the candidates are
    `feature_candidates`, each checked against float64 (bench_features.reference, ERR_BAR)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from bench_features import ERR_BAR, reference
    from fa_hw.forward import prepare

    b, h, n, d, feats = case
    dtype, hk, cap = feats.get("dtype", "fp16"), feats.get("heads_k", h), feats.get("softcap")
    tdtype = torch.bfloat16 if dtype == "bf16" else torch.float16
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn((b, h, n, d), generator=gen, device="cuda", dtype=tdtype)
    k, v = (torch.randn((b, hk, n, d), generator=gen, device="cuda", dtype=tdtype) for _ in range(2))
    ref = reference(q, k, v, causal, None, cap)

    def flash():  # SDPA-flash of the same dtype and heads; without the softcap, which it does not have
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=hk != h)

    def flash_timer():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return time_torch(flash, args.warmup, args.reps)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        flash()
    timers, rows = {"sdpa-flash": flash_timer}, {}
    for cfg in feature_candidates(d, causal, n, args.max_candidates, labels=args.labels):
        row = dict(config=cfg.to_json(), tag=cfg.tag, ms=None, vs_flash=None, err_vs_flash=None, note=None)
        try:
            plan, dev, _ = prepare(q, k, v, causal, None, replace(cfg, dtype=dtype), softcap=cap, dtype=dtype)
            plan.launch(dev.stream)
            plan.sync(dev.stream)
            err = float((dev.o.double() - ref).norm() / ref.norm())
            row.update(err_vs_flash=err, regs=plan.loaded.registers)  # here: the error against float64
            if not err <= ERR_BAR[dtype]:
                row["note"] = f"O differs from float64 by {err:.1e} (bar {ERR_BAR[dtype]:g}): not chosen"
            timers[cfg.tag] = lambda plan=plan, dev=dev: statistics.median(plan.time(dev.stream, args.warmup, args.reps))
        except Exception as exc:  # a config that does not build or run here: recorded, not chosen
            row["note"] = " ".join(f"{type(exc).__name__}: {exc}".split())[:160]
        rows[cfg.tag] = row
    runs = round_robin(timers, args.runs)
    fc = case_class(case)
    for tag, row in rows.items():
        if tag in runs:
            ms, vs = Spread.of(runs[tag]), ratios(runs["sdpa-flash"], runs[tag])
            row.update(ms=ms.median, ms_min=ms.lo, ms_max=ms.hi, vs_flash=vs.median, vs_min=vs.lo, vs_max=vs.hi)
        print(f"  {str(case[:4]):20s} causal={causal!s:5s}{fc.describe():14s} {tag:34s} "
              f"{'fail' if row['ms'] is None else format(row['ms'], '8.3f') + ' ms ' + format(row['vs_flash'], '5.3f') + 'x'}"
              f"{'  ' + row['note'] if row['note'] else ''}", flush=True)
    del q, k, v, ref
    torch.cuda.empty_cache()
    return Spread.of(runs["sdpa-flash"]), list(rows.values())


def feature_builds(arch: str, limit: int, train=FEATURE_TRAIN, labels=None) -> set:
    """Every KernelBuild --features times (what tune_features compiles first)."""
    from fa_sim.contract import KernelBuild

    out = set()
    for b, h, n, d, feats in train:
        group = h // feats.get("heads_k", h)
        for causal in (False, True):
            for c in feature_candidates(d, causal, n, limit, labels=labels):
                out.add(KernelBuild(replace(c, dtype=feats.get("dtype", "fp16")), causal, arch, kv_group=group,
                                    softcap=float(feats.get("softcap") or 0.0)))
    return out


def merge(base: Table | None, entries: list[Entry], gpu: str, arch: str, nvrtc: str) -> Table:
    """`base`'s entries (a table of this GPU and arch, else none) with those of the same keys replaced."""
    keep = () if base is None else tuple(e for e in base.entries if e.key not in {n.key for n in entries})
    return Table(gpu, arch, keep + tuple(entries), nvrtc)


def warm_cache(head_dims, quick: bool) -> None:
    """Compile every candidate build in parallel before the first is timed."""
    from fa_sim.contract import KernelBuild
    from fa_sim.contract.cubins import compile_many

    arch = device_arch()
    builds = {KernelBuild(c, causal, arch)
              for d in head_dims for causal in (False, True) for c in candidates(d, causal, quick)}
    compile_many(sorted(builds, key=str), os.cpu_count())


def choose(results: dict) -> list[Entry]:
    """results[(case, causal)] or, for --features, results[(case, causal, FeatureClass)] = (flash_ms,
    rows) -> the best entry per (head_dim, causal, size, feature class)."""
    keys: dict[tuple, list] = {}
    for key, (flash_ms, rows) in results.items():
        case, causal = key[:2]
        fc = key[2] if len(key) > 2 else FeatureClass()
        keys.setdefault((case[3], causal, size_class(case[2]), fc), []).append((case, flash_ms, rows))
    out = []
    for (d, causal, size, fc), measured in sorted(keys.items(), key=lambda kv: str(kv[0])):
        score: dict[str, list[float]] = {}
        for case, _, rows in measured:
            for r in rows:
                ok = r["ms"] is not None and r["note"] is None
                score.setdefault(r["tag"], []).append(math.log(r["vs_flash"]) if ok else -math.inf)
        # the issue asks for every row: the best worst shape first, then the best geometric mean
        tag, logs = max(score.items(), key=lambda kv: (min(kv[1]), sum(kv[1]) / len(kv[1])))
        if not all(math.isfinite(x) for x in logs):
            print(f"no candidate ran on every shape of d={d} causal={causal} {size}{fc.describe()}: no entry", flush=True)
            continue
        flops = sum(check.attention_flops(c[0], c[1], c[2], c[3], causal) for c, _, _ in measured)
        ms = sum(next(r["ms"] for r in rows if r["tag"] == tag) for _, _, rows in measured)
        out.append(Entry(d, causal, size, KernelConfig.from_tag(tag), flops / (ms * 1e-3) / 1e12,
                         math.exp(sum(logs) / len(logs)), tuple(tuple(c) for c, _, _ in measured), fc))
    return out


def markdown(results: dict, entries: list[Entry], gpu: str, runs: int) -> str:
    lines = [f"GPU: {gpu}. Training shapes (experiments/hw_sets.py TRAIN) only. Every backend timed in {runs} "
             "round-robin runs on the same inputs (a run: the median of CUDA-event times per launch); ms and x flash "
             "(SDPA-flash time / ours, per run) are the median over runs [min, max].", "",
             "| B, H, N, d | causal | config | ms [min, max] | x flash [min, max] | err vs flash | regs/CTAs | note |",
             "|---|---|---|---:|---:|---:|---:|---|"]
    for key, (flash, rows) in results.items():
        case, causal = key[:2]
        if len(key) > 2:
            causal = f"{causal}{key[2].describe()}"
        lines.append(f"| {tuple(case)} | {causal} | SDPA-flash | {flash.fmt()} | 1.00 | - | - | |")
        for r in sorted(rows, key=lambda r: r["ms"] or math.inf):
            ms = "fail" if r["ms"] is None else f"{r['ms']:.3f} [{r['ms_min']:.3f}, {r['ms_max']:.3f}]"
            x = "-" if r["vs_flash"] is None else f"{r['vs_flash']:.3f} [{r['vs_min']:.3f}, {r['vs_max']:.3f}]"
            e = "-" if r["err_vs_flash"] is None else f"{r['err_vs_flash']:.1e}"
            lines.append(f"| {tuple(case)} | {causal} | {r['tag']} | {ms} | {x} | {e} | {r.get('regs', '-')} | {r['note'] or ''} |")
    lines += ["", "Chosen (fa_hw.tuned entries: best worst shape, then geometric mean; x flash = the geometric mean):", "",
              "| head_dim | causal | size | config | TFLOP/s | x flash |", "|---:|---|---|---|---:|---:|"]
    lines += [f"| {e.head_dim} | {e.causal}{e.features.describe()} | {e.size} | {e.config.tag} | {e.tflops:.1f} | "
              f"{e.vs_flash:.2f} |" for e in entries]
    lines += ["", "config='auto' without a table (fa_hw.autotune: the candidates it would time on this GPU before "
              "this table ships) against all candidates:", ""] + autotune_rows(results)
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.environ.get("OUT") or "experiments/out")
    p.add_argument("--runs", type=int, default=3, help="round-robin runs per candidate and shape")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--cases", nargs="*", type=int, default=None, help="indices into hw_sets.TRAIN (with --features: into FEATURE_TRAIN); default all")
    p.add_argument("--quick", action="store_true", help="three candidates per head_dim (a smoke run)")
    p.add_argument("--features", action="store_true",
                   help="tune issue 38's feature classes on hw_sets.FEATURE_TRAIN (module docstring) and merge "
                        "them into --base")
    p.add_argument("--base", default=None, metavar="TABLE",
                   help="--features: the table the entries are merged into (default: the shipped table of this GPU)")
    p.add_argument("--max-candidates", type=int, default=None, metavar="N",
                   help=f"--features: candidates per case at most, 0 for the whole pool "
                        f"(default {MAX_AUTOTUNE_CANDIDATES})")
    p.add_argument("--labels", nargs="+", default=None, metavar="TAG",
                   help="--features: time exactly these configs (fp16 tags; heavy_first set in the causal cases, "
                        "cleared in the others), each case those of its head_dim, instead of the pruned pool; every "
                        "selected case's head_dim needs one (select cases with --cases)")
    p.add_argument("--gpu-name", required=True, metavar="NAME",
                   help="the GPU the table is for, as the driver names it (e.g. 'NVIDIA H100 80GB HBM3'); "
                        "the run stops at once on any other GPU")
    args = p.parse_args(argv)
    if args.max_candidates is not None and args.max_candidates < 0:
        p.error(f"--max-candidates {args.max_candidates}: give 0 (the whole pool) or more")
    n_cases = len(FEATURE_TRAIN if args.features else TRAIN)
    if args.cases is not None and not all(0 <= i < n_cases for i in args.cases):
        p.error(f"--cases {args.cases}: indices 0-{n_cases - 1} of hw_sets.{'FEATURE_TRAIN' if args.features else 'TRAIN'}")
    for name, what in (("base", "the table the entries are merged into"), ("labels", "the configs timed"),
                       ("max_candidates", "the size of the pool timed")):
        if getattr(args, name) is not None and not args.features:
            p.error(f"--{name.replace('_', '-')} is for --features ({what})")
    if args.labels is not None and args.max_candidates is not None:
        p.error("--labels times exactly the configs given: leave out --max-candidates")
    if args.max_candidates is None:
        args.max_candidates = MAX_AUTOTUNE_CANDIDATES
    if args.labels is not None:
        try:
            args.labels = parse_labels(args.labels, [c for i, c in enumerate(FEATURE_TRAIN)
                                                     if args.cases is None or i in args.cases])
        except ValueError as exc:
            p.error(str(exc))
    check_sets()
    if args.features:
        from bench_features import ROWS
        check_feature_sets(ROWS)
        try:  # a bad --base: one line, before any work
            base = Table.load(args.base) if args.base is not None else None
        except ValueError as exc:
            print(f"tune_hw.py: {exc}", file=sys.stderr)
            return 2
    dev = device()
    if dev.name != args.gpu_name:
        print(f"tune_hw.py: --gpu-name {args.gpu_name!r}, but this GPU is {dev.name!r}: nothing timed "
              f"(run it on the GPU named, or name this one)", file=sys.stderr)
        return 2
    if args.features:
        return tune_features(args, dev, base)
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


def tune_features(args, dev, base: Table | None) -> int:
    """main's --features: compile, time every FEATURE_TRAIN case and causal flag, merge, write."""
    import time

    from fa_sim.contract.cubins import compile_many

    t0, arch = time.time(), device_arch()
    base = base if base is not None else table_for(dev.name)
    if base is not None and (base.gpu != dev.name or base.arch != arch):
        print(f"--base is a table of {base.gpu} ({base.arch}), not of this {dev.name} ({arch}): not merged", flush=True)
        base = None
    train = [c for i, c in enumerate(FEATURE_TRAIN) if args.cases is None or i in args.cases]
    builds = sorted(feature_builds(arch, args.max_candidates, train, args.labels), key=str)
    compile_many(builds, os.cpu_count())
    print(f"compiled {len(builds)} builds ({time.time() - t0:.0f} s)", flush=True)
    results = {}
    for case in train:
        for causal in (False, True):
            try:
                results[(tuple(case[:4]), causal, case_class(case))] = measure_feature_case(case, causal, args)
            except Exception as exc:  # SDPA-flash failed here: no reference time for this case
                print(f"{case} causal={causal}: not measured ({' '.join(str(exc).split())[:200]})", flush=True)
    entries = choose(results)
    major, minor = nvrtc_version()
    table = merge(base, entries, dev.name, arch, f"{major}.{minor}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{gpu_key(dev.name)}.json").write_text(json.dumps(table.to_json(), indent=1) + "\n")
    (out / "tune_features.md").write_text(markdown(results, entries, dev.name, args.runs).replace(
        "Training shapes (experiments/hw_sets.py TRAIN)", "Feature training shapes (experiments/hw_sets.py FEATURE_TRAIN)"
    ).replace("err vs flash", "err vs float64"))
    for e in entries:
        print(f"chosen: d={e.head_dim} causal={e.causal!s:5s} {e.size:6s}{e.features.describe():14s} {e.config.tag:34s} "
              f"{e.tflops:6.1f} TFLOP/s {e.vs_flash:.2f}x flash", flush=True)
    print(f"wrote {out / (gpu_key(dev.name) + '.json')} ({len(entries)} feature entries merged into "
          f"{len(table.entries) - len(entries)} of the base) and {out / 'tune_features.md'} ({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
