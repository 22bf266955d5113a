"""Time every candidate backward tile per head_dim on the GPU and write the table fa_hw.attention's
backward reads (fa_hw.tuned_backward).

    python experiments/tune_bwd.py [--out DIR] [--runs 3] [--warmup 2] [--reps 8] [--head-dims 32 64 96 128]
                                   [--cases 0 3] [--budget-s 180]

For each training shape (experiments/hw_sets.py BWD_TRAIN: the forward's TRAIN and four head_dim 96
shapes; the benchmark's held-out TEST set is never timed here) and causal flag: fp16 q, k, v, dO
standard normal, O and LSE from fa2_fwd.cu (fa_hw.attention's forward), then SDPA-flash's backward (torch
autograd on a saved forward) and fa2_bwd.cu under every candidate of fa_hw.tuned_backward.CANDIDATES
[head_dim] (atomic dQ, as fa_hw.attention runs it: the three kernels enqueued on torch's stream,
fa_hw.backward's enqueue path), in --runs round-robin runs (hw_sets.round_robin; a run is the median
of --reps CUDA-event-timed calls after --warmup). A candidate's ratio on a shape is the median over
runs of the default's (DEFAULT_TILES) time / its time, and of SDPA-flash's time / its time.

Checked before timing, per candidate: it compiles and launches, its dK and dV equal bit for bit
those of the first candidate of its softmax form (DEFAULT_TILES for "fmul_fsub"; they do not depend
on the tiles: fa_hw.tuned_backward's docstring; the PTX engine shows it in
tests/test_backward_tiles.py) and its dQ is within SANITY_REL_ERR of the default's (the atomic dQ's
order differs with block_n, the "ffma" form's P in the last bits). A candidate that fails is
reported and never chosen. Labels: block_m x n_warps s q_stages, an "f" after them for softmax
"ffma" (128x8s1f), then "r2" or "r4" for vector dQ reductions (dq_red 2, 4: sm_90 only; 128x8s1fr2), then "p" for
dq_accum in the fragment order (dq_frag: 64x8s1r4p), "m" for 32-row warp tiles of the dQ GEMM (dq_warp_rows 32:
64x8s1r4pm), "l" for LSE and D by cp.async (lse_async: 64x8s1fr4pl, 64x8s1fr4pml), "z" for swizzled instead of padded
shared-memory tiles (smem_swizzle: 64x8s1r4pmz, 128x8s1fr4pz); fa_sim.contract.backward's label and parse_label, the
syntax `--config LABEL --backward` takes (LABEL_FORMS).

Choice. Per key (head_dim, causal, size class of fa_hw.tuned) the candidate with the best worst
ratio against SDPA-flash over the key's shapes (the goal is every row), ties broken by the geometric
mean; the default stays where no candidate beats it on that measure.

Writes to --out (default $OUT, else experiments/out): backward/<gpu_key>.json (fa_hw.tuned_backward
.Table: ship it as fa_hw/tuned/backward/<gpu_key>.json; `bench_hw.py --backward --tuned-dir OUT`
benchmarks it on the held-out set first; with --base, the same GPU's shipped table, the keys this run did not
time keep that table's entries), tune_bwd.json (every time) and tune_bwd.md (per shape and
causal flag the candidates' ms and ratios, and the chosen entries), rewritten after every shape, so
that a run stopped by --budget-s (no new shape starts past it) keeps what it measured.

Runtime: the defaults time 40 calls per candidate and shape (warmup and reps, an unrecorded pass and
3 runs); over BWD_TRAIN's 38 (shape, causal) pairs and 18-22 candidates per head_dim on sm_90 (10-14
before the dq_red ones, 7-12 before the softmax "ffma" ones; 20-25 with the dq_frag ones, 21-29 with the loop options (lse_async, dq_warp_rows: d=64, 128),
23-30 with the swizzled ones (smem_swizzle: the winners' "z" forms, fa_hw.tuned_backward.SWIZZLE_OF); --labels times a
few) that is about 170 s of backward passes on
an H100 at the default's speed, plus the builds (compiled first, in parallel processes) and the
forward passes: about 4 minutes; device_round36.sh's step gives it TUNEBWD_S=420 TUNEBWD_BUDGET=380 by
default (--budget-s starts no shape past it, and the table keeps what was measured).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import multiprocessing
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hw_sets import BWD_TRAIN, Spread, check_sets, ratios, round_robin  # noqa: E402
# the candidates' labels: one syntax with the fa commands' `--config LABEL --backward` (LABEL_FORMS)
from fa_sim.contract.backward import label as _label  # noqa: E402,F401  (tests/test_backward_tiles.py names it)
from fa_sim.contract.backward import label_of as _label_of, parse_label as _parse_label  # noqa: E402

SANITY_REL_ERR = 1e-2  # dQ against the default's: the two differ in the order of fp32 atomics only


def _compile(args) -> str:
    """Compile one build into the disk cache (a worker process: NVRTC runs in parallel)."""
    from fa_sim.contract.backward import BackwardBuild, BackwardConfig, compile_backward

    d, bm, nw, st, sm, red, frag, la, wr, swz, causal, arch = args
    build = BackwardBuild(BackwardConfig(d, block_m=bm, n_warps=nw, q_stages=st, softmax=sm, dq_red=red, dq_frag=frag,
                                         lse_async=la, dq_warp_rows=wr, smem_swizzle=swz), causal, False, arch)
    try:
        usage = compile_backward(build).usage
    except Exception as exc:  # reported by the timing pass, which compiles again
        return f"{build.describe()}: {exc}"
    spills = {k: u.stack_bytes for k, u in usage.items() if u.stack_bytes}
    return f"{build.describe()}: spills {spills}" if spills else ""


def _chosen(cands, labels):
    """cands without those not in `labels` (None: all); the first, the default, always stays."""
    return [x for i, x in enumerate(cands) if labels is None or i == 0
            or _label_of(x) in labels]


def precompile(cases, arch: str, labels=None) -> None:
    from fa_hw.tuned_backward import candidates

    jobs = sorted({(c[3], x.block_m, x.n_warps, x.q_stages, x.softmax, x.dq_red, x.dq_frag, x.lse_async, x.dq_warp_rows,
                    x.smem_swizzle, causal, arch) for c in cases
                   for x in _chosen(candidates(c[3], arch=arch), labels) for causal in (False, True)})
    t0 = time.time()
    ctx = multiprocessing.get_context("spawn")  # CUDA is initialised in this process: no fork
    with concurrent.futures.ProcessPoolExecutor(max_workers=min(16, os.cpu_count() or 1), mp_context=ctx) as pool:
        notes = [n for n in pool.map(_compile, jobs) if n]
    print(f"compiled {len(jobs)} builds in {time.time() - t0:.1f}s" + "".join(f"\n  {n}" for n in notes), flush=True)


def time_calls(fn, warmup: int, reps: int) -> float:
    """Median ms of `reps` calls of fn after `warmup`, each between two CUDA events."""
    import statistics

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


def run_case(case, causal: bool, args) -> dict:
    """One shape and causal flag: {"flash": runs, "<bm>x<nw>": runs, ...}, notes, the candidates."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from fa_hw.backward import _run_torch
    from fa_hw.forward import enqueue_forward
    from fa_hw.tuned_backward import candidates

    b, h, n, d = case
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn((b, h, n, d), generator=gen, device="cuda", dtype=torch.float16) for _ in range(4))
    scale = d ** -0.5
    o, lse = enqueue_forward(q, k, v, causal=causal, scale=scale)  # fa_hw.attention's forward
    from fa_hw.runtime import device_arch

    cands = _chosen(candidates(d, arch=device_arch()), args.labels)  # dq_red 2, 4 only where they compile (sm_90)
    timers, notes = {}, {}
    ref = {}  # softmax form -> (label, (dq, dk, dv)) of its first candidate that ran
    for cfg in cands:
        label = _label_of(cfg)
        try:
            g = _run_torch(q, k, v, o, lse, do, cfg, causal, scale, False, timed=False)[0]
            torch.cuda.synchronize()
        except Exception as exc:
            notes[label] = " ".join(str(exc).split())[:160]
            continue
        first = next(iter(ref.values()), None)  # the default's (or the first that ran): the dQ sanity check
        if cfg.softmax not in ref:
            ref[cfg.softmax] = (label, g)
        else:
            _, dk0, dv0 = ref[cfg.softmax][1]
            if not (torch.equal(g[1], dk0) and torch.equal(g[2], dv0)):
                notes[label] = f"dK or dV differ from {ref[cfg.softmax][0]}'s bits"
                continue
        if first is not None:
            dq0 = first[1][0]
            err = float((g[0].double() - dq0.double()).norm() / dq0.double().norm())
            if not err < SANITY_REL_ERR:
                notes[label] = f"dQ differs from {first[0]}'s by {err:.1e} (relative Frobenius)"
                continue
        del g
        timers[label] = (lambda cfg=cfg: time_calls(
            lambda: _run_torch(q, k, v, o, lse, do, cfg, causal, scale, False, timed=False), args.warmup, args.reps))
    qg, kg, vg = (x.detach().clone().requires_grad_() for x in (q, k, v))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        of = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)

    def flash():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return time_calls(lambda: torch.autograd.grad(of, (qg, kg, vg), do, retain_graph=True), args.warmup,
                              args.reps)

    runs = round_robin({"flash": flash, **timers}, args.runs)
    del q, k, v, do, ref, of
    torch.cuda.empty_cache()
    return {"case": list(case), "causal": causal, "runs_ms": runs, "notes": notes,
            "default": _label_of(cands[0])}


def choose(records) -> list:
    """Per (head_dim, causal, size): the entry of the candidate with the best worst ratio to
    SDPA-flash over the key's shapes, ties by the geometric mean (module docstring)."""
    from fa_hw.tuned import size_class
    from fa_hw.tuned_backward import Entry

    keys = {}
    for r in records:
        keys.setdefault((r["case"][3], r["causal"], size_class(r["case"][2])), []).append(r)
    entries = []
    for (d, causal, size), recs in sorted(keys.items()):
        labels = set.intersection(*(set(r["runs_ms"]) - {"flash"} for r in recs))
        best = None
        for label in sorted(labels):
            vs_flash = [ratios(r["runs_ms"]["flash"], r["runs_ms"][label]).median for r in recs]
            vs_def = [ratios(r["runs_ms"][r["default"]], r["runs_ms"][label]).median for r in recs
                      if r["default"] in r["runs_ms"]]
            score = (min(vs_flash), _gmean(vs_flash))
            if best is None or score > best[0]:
                best = (score, label, _gmean(vs_def) if vs_def else None, _gmean(vs_flash))
        if best is None:
            continue
        bm, nw, st, sm, red, frag, la, wr, swz = _parse_label(best[1])
        entries.append(Entry(d, causal, size, bm, nw, st, round(best[2], 4) if best[2] else None, round(best[3], 4),
                             tuple(tuple(r["case"]) for r in recs), softmax=sm, dq_red=red, dq_frag=frag,
                             lse_async=la, dq_warp_rows=wr, smem_swizzle=swz))
    return entries


def load_base(path, gpu: str, arch: str) -> tuple:
    """--base's entries; the table must be this GPU's (its entries were measured there), checked before
    any timing."""
    if path is None:
        return ()
    from fa_hw.tuned_backward import Table

    if not Path(path).is_file():
        raise SystemExit(f"--base {path}: no such file (a backward table, e.g. fa_hw/tuned/backward/<gpu>.json)")
    table = Table.load(Path(path))
    if (table.gpu, table.arch) != (gpu, arch):
        raise SystemExit(f"--base {path} is {table.gpu}'s ({table.arch}) table; this run tunes {gpu} ({arch}): "
                         "only the same GPU's entries may be kept")
    return table.entries


def merged(entries: list, base) -> list:
    """The run's entries, and the base table's for every key the run chose nothing for."""
    have = {(e.head_dim, e.causal, e.size) for e in entries}
    return list(entries) + [e for e in base if (e.head_dim, e.causal, e.size) not in have]


def _gmean(xs) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def markdown(records, entries, gpu: str, args) -> str:
    lines = [f"# Backward tiles on {gpu}", "",
             f"experiments/tune_bwd.py: fa2_bwd.cu's three kernels (atomic dQ) per candidate (block_m x n_warps "
             f"s q_stages, f: softmax ffma, r2/r4: dQ by red.v2/.v4, p: dq_accum in the fragment order, m: 32-row dQ warp tiles, l: LSE and D by cp.async; block_n = 16 n_warps), {args.runs} round-robin runs of the median of {args.reps} calls; ms: median "
             "over runs; x def: DEFAULT_TILES' time / this one's; x flash: SDPA-flash's backward time / this one's.", ""]
    for r in records:
        runs = r["runs_ms"]
        flash = runs["flash"]
        lines.append(f"## {tuple(r['case'])} {'causal' if r['causal'] else 'non-causal'} "
                     f"(SDPA-flash {Spread.of(flash).median:.3f} ms)")
        lines.append("")
        lines.append("| tiles | ms | x def | x flash |")
        lines.append("|---|---|---|---|")
        for label, ms in runs.items():
            if label == "flash":
                continue
            vs_def = ratios(runs[r["default"]], ms).median if r["default"] in runs else float("nan")
            mark = " (default)" if label == r["default"] else ""
            lines.append(f"| {label}{mark} | {Spread.of(ms).fmt('.3f')} | {vs_def:.3f} | "
                         f"{ratios(flash, ms).fmt('.3f')} |")
        for label, note in r["notes"].items():
            lines.append(f"| {label} | not timed: {note} | | |")
        lines.append("")
    lines += ["## Chosen (backward/<gpu>.json)", "", "| head_dim | causal | size | block_m x n_warps s q_stages | x default | "
              "x flash (geomean) |", "|---|---|---|---|---|---|"]
    for e in entries:
        lines.append(f"| {e.head_dim} | {e.causal} | {e.size} | {_label_of(e)} | "
                     f"{e.vs_default if e.vs_default is not None else 'n/a'} | {e.vs_flash} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.environ.get("OUT") or "experiments/out")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--reps", type=int, default=8)
    p.add_argument("--head-dims", nargs="*", type=int, default=[32, 64, 96, 128])
    p.add_argument("--cases", nargs="*", type=int, default=None, help="indices into BWD_TRAIN")
    p.add_argument("--budget-s", type=float, default=180.0, help="start no new shape after this many seconds")
    p.add_argument("--labels", nargs="*", default=None,
                   help="time only these candidates (tune_bwd labels, e.g. 64x8s1r2 64x8s1r4p) besides the default, "
                        "which every shape keeps as the reference; default: all")
    p.add_argument("--base", type=Path, default=None,
                   help="a backward table of this same GPU (e.g. the shipped fa_hw/tuned/backward/<gpu>.json) whose "
                        "entries are kept for the (head_dim, causal, size) keys this run does not time")
    args = p.parse_args(argv)
    check_sets()
    from fa_hw.tuned_backward import CANDIDATES

    bad = [d for d in args.head_dims if d not in CANDIDATES]
    if bad or min(args.runs, args.reps) < 1 or args.warmup < 0:
        raise SystemExit(f"--head-dims must be among {sorted(CANDIDATES)} (got {bad}); --runs and --reps >= 1, "
                         "--warmup >= 0")
    if args.labels is not None:
        from fa_hw.tuned_backward import candidates as _cands

        known = {_label_of(x) for d in args.head_dims for x in _cands(d)}
        unknown = sorted(set(args.labels) - known)
        if unknown:
            raise SystemExit(f"--labels {unknown} are no candidates of head dims {args.head_dims}; "
                             f"known: {' '.join(sorted(known))}")
    cases = [c for i, c in enumerate(BWD_TRAIN) if c[3] in args.head_dims and (args.cases is None or i in args.cases)]
    import torch

    from fa_hw.device import gpu_key
    from fa_hw.runtime import device_arch
    from fa_hw.tuned_backward import Table
    from fa_sim.contract.nvrtc import nvrtc_version

    t0 = time.time()
    gpu, arch = torch.cuda.get_device_name(), device_arch()
    base = load_base(args.base, gpu, arch)
    out = Path(args.out)
    (out / "backward").mkdir(parents=True, exist_ok=True)
    precompile(cases, arch, args.labels)
    records = []
    for case in cases:
        for causal in (False, True):
            if time.time() - t0 > args.budget_s:
                print(f"budget of {args.budget_s:.0f}s spent: {tuple(case)} causal={causal} and later not timed")
                break
            r = run_case(case, causal, args)
            records.append(r)
            flash = Spread.of(r["runs_ms"]["flash"]).median
            cells = "  ".join(f"{lab} {Spread.of(ms).median:.3f}ms {flash / Spread.of(ms).median:.2f}x"
                              for lab, ms in r["runs_ms"].items() if lab != "flash")
            print(f"{str(tuple(case)):20s} causal={causal!s:5s} flash {flash:.3f}ms  {cells}"
                  + "".join(f"  [{k}: {v}]" for k, v in r["notes"].items()) + f"  ({time.time() - t0:.0f}s)", flush=True)
            entries = merged(choose(records), base)
            table = Table(gpu, arch, tuple(entries), ".".join(map(str, nvrtc_version())))
            (out / "backward" / f"{gpu_key(gpu)}.json").write_text(json.dumps(table.to_json(), indent=1) + "\n")
            (out / "tune_bwd.json").write_text(json.dumps({"gpu": gpu, "arch": arch, "records": records}, indent=1))
            text = markdown(records, entries, gpu, args)
            (out / "tune_bwd.md").write_text(text)
        else:
            continue
        break
    print(text.split("## Chosen")[-1] if records else "nothing timed")
    print(f"wrote {out / 'backward' / (gpu_key(gpu) + '.json')}, {out / 'tune_bwd.md'} in {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
