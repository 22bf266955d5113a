"""fa time --backward against the H100's tuned backward timings: large training shapes, many tiles.

    python experiments/timing_backward_tuned.py --predict --gpu h200 [--jobs 2]   # fill the model's predictions
    python experiments/timing_backward_tuned.py --report [--gpu h200]              # the table and the metrics
    python experiments/timing_backward_tuned.py --measure-kernels OUT.json         # on a GPU: per kernel

experiments/timing_backward.py times twelve small d = 64 passes on which the host's launch calls
dominate; this one compares the model with the full backward times that experiments/tune_bwd.py
recorded on an NVIDIA H100 80GB HBM3 (experiments/tune_bwd_h100.json, tune_bwd_h100_r4p.json,
tune_bwd_h100_r4pm.json: the three kernels, dQ atomic, CUDA events, each candidate's median of
`reps` launches per run and three runs round-robin with the other candidates of its shape, on
experiments/hw_sets.BWD_TRAIN's shapes, causal and not). A row is (source file, shape, causal,
tile label); its measured time is the median of its three runs; its prediction is
fa_sim.timing.predict_backward_seeded(..., deterministic=False, config=BackwardConfig.from_label(label)),
what `fa time --backward --dq atomic --config LABEL` prints.

Rows (ROWS): per (shape, causal) a few labels of each source (LABELS), chosen so that one pass of
predictions fits the time on a 2-core machine (a row takes 3-40 s with an empty disk cache, the
largest causal shapes the longest); one file's labels of a shape were timed in one round-robin,
so candidates are compared (the pair test) only within a file. Halves (half_of): BWD_TRAIN's shapes
of each head_dim, ordered by B*H*N, alternate between 'fit' and 'validate' (disjoint shapes, both
sizes classes in each); a model parameter is fitted on 'fit' only.

The predictions are kept in experiments/timing_backward_tuned.json, one per row and GPU model
(`predicted[gpu]`: total and per-kernel ms, and the model's parameters it ran with), so that
--report and tests/test_timing_backward_tuned.py replay the comparison without the model.
--predict fills the rows a model has no prediction for (or all with --redo), saving after each.
The report per half: MAPE, the worst error, Spearman's rank correlation of measured and predicted
times, and the pair test: for each (source, shape, causal), every two candidates whose measured
times differ by at least PAIR_MIN (3 %): does the model name the faster one.

The tuned rows record only the three kernels' total, so where the model errs (it runs about 10 %
fast on them) does not say which kernel. --measure-kernels times each row's three kernels apart on
the GPU it runs on (fa_hw.backward.time_backward_kernels: queued launches between CUDA events, dQ
atomic, the row's config; random normal fp16 inputs, seed 0, O and LSE from fa_hw.forward) and
writes per kernel the median of `reps` launches, with the queued total beside the tune's. --report
prints, where such a file is recorded (KERNELS_MEASURED), each kernel's error per row and its MAPE.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SOURCES = {"base": "tune_bwd_h100.json", "r4p": "tune_bwd_h100_r4p.json"}
# per source and head_dim: the labels predicted (scalar and vector dQ reductions, 4 and 8 warps, one
# and two Q stages, both softmax forms; r4p / r4pm: the fragment-order forms that won the H100's keys)
_SMALL_D = ["64x4s1", "128x8s1r2"]
# left out: N >= 8192 (1-3 min a row), and three shapes whose rows were not all predicted in round 41's time
SKIP = {(2, 16, 8192, 32), (1, 16, 16384, 64), (1, 32, 8192, 128), (1, 16, 12000, 96),
        (16, 16, 2048, 64), (4, 16, 4096, 128), (4, 16, 4096, 96)}
LABELS = {
    "base": {32: _SMALL_D, 64: _SMALL_D, 96: _SMALL_D, 128: ["32x4s1", "64x8s1r2"]},
    "r4p": {32: ["64x8s1fr4p", "128x8s1fr4p"], 64: ["64x8s1fr4p", "128x8s1fr4p"],
            96: ["64x8s1fr4p", "128x8s1fr4p"], 128: ["64x8s1fr4p", "64x8s1r4p"]},
}
PAIR_MIN = 0.03  # the pair test takes candidates whose measured times differ by at least this
OUT = ROOT / "tests" / "data" / "h100" / "timing_backward_tuned.json"
# --measure-kernels' recordings, by the GPU they were measured on (report: per-kernel errors)
KERNELS_MEASURED = [ROOT / "tests" / "data" / g / "timing_backward_tuned_kernels.json" for g in ("h100", "h200")]


def half_of(shape) -> str:
    """'fit' or 'validate': BWD_TRAIN's shapes of shape's head_dim ordered by B*H*N, alternating."""
    from experiments.hw_sets import BWD_TRAIN

    same = sorted((s for s in BWD_TRAIN if s[3] == shape[3]), key=lambda s: (s[0] * s[1] * s[2], s))
    return ("fit", "validate")[same.index(tuple(shape)) % 2]


def select_rows() -> list[dict]:
    """The rows (module docstring), measured side only, in BWD_TRAIN's order."""
    from experiments.hw_sets import BWD_TRAIN

    rows = []
    for source, name in SOURCES.items():
        data = json.loads((ROOT / "experiments" / name).read_text())
        by = {(tuple(r["case"]), r["causal"]): r for r in data["records"]}
        for shape in BWD_TRAIN:
            if shape in SKIP:
                continue
            for causal in (False, True):
                rec = by.get((shape, causal))
                if rec is None:
                    continue
                for label in LABELS[source].get(shape[3], ()):
                    if label not in rec["runs_ms"]:
                        continue
                    runs = rec["runs_ms"][label]
                    rows.append({"source": source, "shape": list(shape), "causal": causal, "label": label,
                                 "half": half_of(shape), "measured_ms": statistics.median(runs), "runs_ms": runs})
    return rows


def row_key(row) -> tuple:
    return row["source"], tuple(row["shape"]), row["causal"], row["label"]


def _predict_one(args):
    shape, causal, label, gpu = args
    from fa_sim.contract.backward import BackwardConfig
    from fa_sim.timing.backward import predict_backward_seeded

    t0 = time.time()
    b, h, n, d = shape
    p = predict_backward_seeded(b, h, n, n, d, causal=causal, deterministic=False, gpu=gpu,
                                config=BackwardConfig.from_label(label, d))
    return {"total_ms": p.kernel_ms, "kernels_ms": {k: v.kernel_ms for k, v in p.kernels.items()},
            "seconds": round(time.time() - t0, 1)}


def load() -> dict:
    return json.loads(OUT.read_text()) if OUT.exists() else {"rows": []}


def save(data: dict) -> None:
    OUT.write_text(json.dumps(data, indent=1) + "\n")


def predict(gpu_name: str, jobs: int, redo: bool, only: str | None, key: str | None = None) -> None:
    from concurrent.futures import ProcessPoolExecutor

    from fa_sim.timing.gpus import GPUS

    gpu = GPUS[gpu_name]
    data = load()
    name, gpu_name = gpu_name, key or gpu_name  # the model, and the key its predictions are kept under
    old = {row_key(r): r for r in data["rows"]}
    rows = []
    for r in select_rows():  # the measured side from the sources, the predictions kept
        r["predicted"] = old.get(row_key(r), {}).get("predicted", {})
        rows.append(r)
    data["rows"] = rows
    data["measured_on"] = "NVIDIA H100 80GB HBM3"
    data.setdefault("models", {})[gpu_name] = {"gpu": name, **{k: v for k, v in vars(gpu).items()}}
    todo = [r for r in rows if (redo or gpu_name not in r["predicted"]) and (only is None or r["half"] == only)]
    # the fitting and validation halves interleaved, the small shapes first (a cut pass stays balanced)
    todo.sort(key=lambda r: (r["shape"][0] * r["shape"][1] * r["shape"][2] * r["shape"][3], row_key(r)))
    print(f"{len(todo)} of {len(rows)} rows to predict on the {name} model as {gpu_name!r}, {jobs} process(es)", flush=True)
    t0 = time.time()
    with ProcessPoolExecutor(jobs) as pool:
        futures = {pool.submit(_predict_one, (tuple(r["shape"]), r["causal"], r["label"], gpu)): r for r in todo}
        from concurrent.futures import as_completed

        for i, fut in enumerate(as_completed(futures), 1):
            r = futures[fut]
            r["predicted"][gpu_name] = fut.result()
            save(data)
            p = r["predicted"][gpu_name]
            print(f"{i}/{len(todo)} {r['source']:<5} {str(tuple(r['shape'])):<20} {'causal' if r['causal'] else 'full':<6} "
                  f"{r['label']:<13} measured {r['measured_ms']:.4f} predicted {p['total_ms']:.4f} "
                  f"({p['total_ms'] / r['measured_ms'] - 1:+.1%}) {p['seconds']:.0f} s, {time.time() - t0:.0f} s in all",
                  flush=True)


def spearman(a, b) -> float:
    import numpy as np

    def rank(x):
        x = np.asarray(x, float)
        order = np.argsort(x, kind="stable")
        r = np.empty(len(x))
        r[order] = np.arange(len(x))
        for v in np.unique(x):  # ties: the mean rank
            r[x == v] = r[x == v].mean()
        return r

    ra, rb = rank(a), rank(b)
    return float(np.corrcoef(ra, rb)[0, 1])


def metrics(rows: list[dict], gpu: str, scale: float = 1.0) -> dict:
    """MAPE, worst error, Spearman and the pair test over the rows predicted on `gpu` (each
    prediction times `scale`, for what-if checks)."""
    rows = [r for r in rows if gpu in r["predicted"]]
    if not rows:
        return {"n": 0}
    errs = [scale * r["predicted"][gpu]["total_ms"] / r["measured_ms"] - 1 for r in rows]
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["source"], tuple(r["shape"]), r["causal"]), []).append(r)
    right = pairs = 0
    for g in groups.values():
        for i, a in enumerate(g):
            for b in g[i + 1:]:
                ma, mb = a["measured_ms"], b["measured_ms"]
                if max(ma, mb) / min(ma, mb) - 1 < PAIR_MIN:
                    continue
                pairs += 1
                pa, pb = a["predicted"][gpu]["total_ms"], b["predicted"][gpu]["total_ms"]
                right += (pa < pb) == (ma < mb)
    return {"n": len(rows), "mape": 100 * statistics.mean(map(abs, errs)), "bias": 100 * statistics.mean(errs),
            "worst": 100 * max(errs, key=abs), "spearman": spearman([r["measured_ms"] for r in rows],
                                                                    [r["predicted"][gpu]["total_ms"] for r in rows]),
            "pairs": pairs, "pairs_right": right}


def describe(m: dict) -> str:
    if not m["n"]:
        return "no rows predicted"
    return (f"{m['n']} rows: MAPE {m['mape']:.1f} % (mean error {m['bias']:+.1f} %, worst {m['worst']:+.1f} %), "
            f"Spearman {m['spearman']:.3f}, pairs {m['pairs_right']} of {m['pairs']} named right")


def report(gpu: str, table: bool) -> None:
    rows = load()["rows"]
    if table:
        print(f"{'half':<8} {'source':<5} {'shape':<20} {'causal':<6} {'label':<13} {'measured ms':>11} "
              f"{'predicted ms':>12} {'error':>7}")
        for r in sorted(rows, key=lambda r: (r["half"], r["shape"][3], row_key(r))):
            if gpu in r["predicted"]:
                p = r["predicted"][gpu]["total_ms"]
                print(f"{r['half']:<8} {r['source']:<5} {str(tuple(r['shape'])):<20} {str(r['causal']):<6} "
                      f"{r['label']:<13} {r['measured_ms']:>11.4f} {p:>12.4f} {p / r['measured_ms'] - 1:>+7.1%}")
    print(f"model {gpu}, measured on the NVIDIA H100 80GB HBM3:")
    for half in ("fit", "validate"):
        print(f"  {half:<8} {describe(metrics([r for r in rows if r['half'] == half], gpu))}")
    print(f"  {'both':<8} {describe(metrics(rows, gpu))}")
    print("  by dQ reductions and mask (both halves):")
    for form in ("scalar", "v2", "v4 fragment order"):
        for causal in (False, True):
            sub = [r for r in rows if dq_form(r["label"]) == form and r["causal"] == causal]
            print(f"    {form:<17} {'causal' if causal else 'full':<6} {describe(metrics(sub, gpu))}")
    fit = [r for r in rows if r["half"] == "fit" and gpu in r["predicted"]]
    if fit:  # what one factor on every prediction would give: how much of the error is a common bias
        k = statistics.median(r["measured_ms"] / r["predicted"][gpu]["total_ms"] for r in fit)
        val = [r for r in rows if r["half"] == "validate"]
        print(f"  what-if (not the model): every prediction x {k:.3f} (the fitting half's median ratio) gives the "
              f"validation half {describe(metrics(val, gpu, k))}")
    report_kernels(gpu)


def measure_kernels(out: Path, warmup: int = 5, reps: int = 20) -> None:
    """Each row's three kernels apart, on this GPU (module docstring) -> out, rewritten after each row."""
    import numpy as np

    import fa_hw
    from fa_hw.backward import time_backward_kernels
    from fa_hw.check import to_numpy
    from fa_hw.runtime import device
    from fa_sim.contract.backward import BackwardConfig

    seen, rows = set(), []
    for r in select_rows():
        key = (tuple(r["shape"]), r["causal"], r["label"])
        if key not in seen:
            seen.add(key)
            rows.append(r)
    data = {"gpu": device().name, "method": "queued", "warmup": warmup, "reps": reps, "rows": []}
    t0 = time.time()
    inputs = {}
    for i, r in enumerate(rows, 1):
        shape, causal, label = tuple(r["shape"]), r["causal"], r["label"]
        if (shape, causal) not in inputs:
            inputs.clear()  # one shape's buffers at a time
            rng = np.random.default_rng(0)
            q, k, v, do = (rng.standard_normal(shape).astype(np.float16) for _ in range(4))
            fwd = fa_hw.forward(q, k, v, causal=causal)
            inputs[(shape, causal)] = (q, k, v, to_numpy(fwd.o), to_numpy(fwd.lse), do)
        cfg = BackwardConfig.from_label(label, shape[3])
        times = time_backward_kernels(*inputs[(shape, causal)], causal=causal, deterministic=False, warmup=warmup,
                                      reps=reps, config=cfg)
        per = dict(zip(KERNEL_NAMES, (statistics.median(t) for t in times)))
        data["rows"].append({"shape": list(shape), "causal": causal, "label": label, "kernels_ms": per,
                             "total_ms": sum(per.values()), "tune_ms": r["measured_ms"]})
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(data, indent=1) + "\n")
        print(f"{i}/{len(rows)} {str(shape):<20} {'causal' if causal else 'full':<6} {label:<13} "
              + " ".join(f"{v:.4f}" for v in per.values())
              + f" total {sum(per.values()):.4f} (tune {r['measured_ms']:.4f}) {time.time() - t0:.0f} s", flush=True)
    print(f"wrote {out} ({data['gpu']})")


KERNEL_NAMES = ("fa2_bwd_preprocess_kernel", "fa2_bwd_kernel", "fa2_bwd_convert_dq_kernel")  # launch order


def report_kernels(gpu: str) -> None:
    """Per kernel: the model's error against each --measure-kernels recording there is."""
    rows = {(tuple(r["shape"]), r["causal"], r["label"]): r for r in load()["rows"] if gpu in r["predicted"]}
    for path in KERNELS_MEASURED:
        if not path.exists():
            continue
        data = json.loads(path.read_text())
        errs = {name: [] for name in KERNEL_NAMES}
        queued = []
        for m in data["rows"]:
            r = rows.get((tuple(m["shape"]), m["causal"], m["label"]))
            if r is None:
                continue
            queued.append(m["total_ms"] / m["tune_ms"] - 1)
            for name in KERNEL_NAMES:
                errs[name].append(r["predicted"][gpu]["kernels_ms"][name] / m["kernels_ms"][name] - 1)
        print(f"  per kernel, against {path.relative_to(ROOT)} ({data['gpu']}, {len(queued)} rows; queued total vs "
              f"the tune's median: {statistics.median(queued):+.1%} median)" if queued else
              f"  per kernel: {path.relative_to(ROOT)} has no row the model predicted")
        for name, e in errs.items():
            if e:
                print(f"    {name:<27} MAPE {100 * statistics.mean(map(abs, e)):5.1f} %, median error "
                      f"{100 * statistics.median(e):+.1f} %, {100 * min(e):+.1f} .. {100 * max(e):+.1f} %")


def dq_form(label: str) -> str:
    """How a label's main kernel adds dQ: 'scalar' (red.f32), 'v2' or 'v4 fragment order'."""
    from fa_sim.contract.backward import parse_label

    dq_red, frag = parse_label(label)[4], parse_label(label)[5]
    return {1: "scalar", 2: "v2"}.get(dq_red, "v4 fragment order" if frag else "v4")


def main(argv=None) -> int:
    from fa_sim.timing.gpus import GPUS

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--predict", action="store_true", help="predict the rows the model has no prediction for")
    ap.add_argument("--report", action="store_true", help="the table and metrics from the recorded predictions")
    ap.add_argument("--gpu", choices=sorted(GPUS), default="h200", help="the GPU model (default h200)")
    ap.add_argument("--key", default=None, help="the name the predictions are kept and reported under (default: "
                    "--gpu); h200_static: the model before its list-schedule dispatch (CTA i on SM i mod 132); "
                    "h200_dispatch: round 41's dispatch experiment (commit 215bd8b, not kept: docs/backward.md)")
    ap.add_argument("--jobs", type=int, default=1, help="--predict: processes (default 1)")
    ap.add_argument("--redo", action="store_true", help="--predict: every row again")
    ap.add_argument("--half", choices=("fit", "validate"), default=None, help="--predict: only this half")
    ap.add_argument("--no-table", action="store_true", help="--report: the metrics only")
    ap.add_argument("--measure-kernels", type=Path, metavar="OUT", default=None,
                    help="on a GPU: each row's three kernels timed apart -> OUT (JSON)")
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error(f"--jobs must be at least 1, got {args.jobs}")
    if args.measure_kernels is not None:
        measure_kernels(args.measure_kernels)
        return 0
    if not (args.predict or args.report):
        ap.error("say --predict (fill predictions, CPU), --report (replay them) or --measure-kernels OUT (GPU)")
    if args.predict:
        predict(args.gpu, args.jobs, args.redo, args.half, args.key)
    if args.report:
        report(args.key or args.gpu, not args.no_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
