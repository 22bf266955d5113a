"""Issue 38's forward features (bf16, GQA, sliding window, softcap), timed on the GPU and by the
timing model (docs/timing.md, "Features").

    python experiments/timing_features.py --list                   # the cases
    python experiments/timing_features.py --measure [--out F]      # GPU: -> tests/data/h200/timing_features.json
    python experiments/timing_features.py --predict [--measured F] # fa_sim.timing.predict beside the measurements

Each case is the seed config (m64n64d64w4-swizzled, head_dim 64) or the d = 128 one on a shape, with
one feature or several. --measure times each case (fa_hw.forward.prepare's launch plan: CUDA events
around each launch after warm-up, the median of 3 batches of 20; random normal inputs, a fixed
seed, bf16 cases rounded to bf16), each shape's plain case first and last (its drift over the run).
--predict calls fa_sim.timing.predict on the same launches and prints measured against predicted,
the change against the shape's plain case on both sides, and the error; a case the model refuses
prints its error on its row.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere: this checkout's fa_sim / fa_hw
    sys.path.insert(0, str(ROOT))

DEFAULT_OUT = ROOT / "tests" / "data" / "h200" / "timing_features.json"
SEED = 38

# (B, H, Nq, Nk, head_dim, causal): a few waves of the seed config's CTAs; one with tails
SHAPES = ((4, 16, 2048, 2048, 64, False), (2, 16, 4096, 4096, 64, True), (2, 16, 3000, 3000, 128, False))
# name -> the features (dtype, heads_k as H // group, window, softcap)
CASES = {
    "plain": {},
    "bf16": {"dtype": "bf16"},
    "gqa4": {"group": 4},
    "mqa": {"group": 16},
    "softcap30": {"softcap": 30.0},
    "window256": {"window": (256, 256)},
    "window1024_left": {"window": (1024, -1)},
    "all": {"dtype": "bf16", "group": 4, "window": (512, 512), "softcap": 30.0},
}


def _launch(shape, case: dict):
    """(Problem, q, k, v, window, softcap) of a case: the inputs as fa_hw takes them."""
    from fa_sim.config import KernelConfig
    from fa_sim.problem import Problem
    from fa_sim.validate import round_to_bf16

    b, h, nq, nk, d, causal = shape
    dtype = case.get("dtype", "fp16")
    hk = h // case.get("group", 1)
    window = case.get("window")
    if window is not None and causal:
        window = (window[0], -1)  # causal: FlashAttention-2's right side is 0 (the causal mask itself)
    config = dataclasses.replace(KernelConfig(head_dim=d), dtype=dtype)
    prob = Problem(b, h, nq, nk, causal, 1.0, config, heads_k=hk, window=window, softcap=case.get("softcap"))
    rng = np.random.default_rng(SEED)
    q, k, v = (rng.standard_normal((b, heads, n, d)).astype(np.float32) for heads, n in ((h, nq), (hk, nk), (hk, nk)))
    if dtype == "bf16":
        q, k, v = (np.asarray(round_to_bf16(x), np.float32) for x in (q, k, v))
    else:
        q, k, v = (x.astype(np.float16) for x in (q, k, v))
    return prob, q, k, v, window, case.get("softcap")


def measure(warmup: int = 10, reps: int = 20, batches: int = 3) -> dict:
    from fa_hw.device import device
    from fa_hw.forward import prepare

    rows = []
    for shape in SHAPES:
        for name in [*CASES, "plain"]:
            prob, q, k, v, window, softcap = _launch(shape, CASES[name])
            t0 = time.time()
            plan, dev, _ = prepare(q, k, v, prob.causal, None, prob.config, window=window, softcap=softcap,
                                   dtype=prob.config.dtype)
            batch = tuple(statistics.median(plan.time(dev.stream, warmup, reps)) for _ in range(batches))
            ms = statistics.median(batch)
            rows.append({"case": name, "shape": list(shape[:5]), "causal": shape[5], "config": prob.config.tag,
                         "features": prob.features(), "ms": ms, "batch_ms": list(batch)})
            print(f"{name:<16} {shape} {ms:.4f} ms (batches {', '.join(f'{x:.4f}' for x in batch)}; "
                  f"{time.time() - t0:.1f} s)", flush=True)
    return {"gpu": device().name, "warmup": warmup, "reps": reps, "batches": batches, "rows": rows}


def predict(measured: dict | None, gpu: str = "h200", cases=None) -> list[dict]:
    from fa_sim.timing import predict as predict_problem

    by_key: dict = {}
    for r in (measured or {}).get("rows", ()):
        by_key.setdefault((r["case"], tuple(r["shape"]), r["causal"]), []).append(r["ms"])
    rows = []
    print(f"{'case':<16} {'shape':<28} {'measured ms':>12} {'vs plain':>9} {'predicted ms':>13} {'vs plain':>9} "
          f"{'error':>8}  seconds")
    for shape in SHAPES:
        base: dict = {}
        for name in (CASES if cases is None else cases):
            prob = _launch(shape, CASES[name])[0]
            t0 = time.time()
            m = by_key.get((name, tuple(shape[:5]), shape[5]))
            meas = statistics.median(m) if m else None
            row = {"case": name, "shape": list(shape[:5]), "causal": shape[5], "measured_ms": meas}
            try:
                row["predicted_ms"] = float(predict_problem(prob, gpu).kernel_ms)
            except Exception as exc:  # a refusal is a result of its own: print it on the row
                row["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:160]}"
            if name == "plain":
                base = row
            cells = [f"{name:<16} {str(shape[:5]) + (' c' if shape[5] else ''):<28}",
                     f"{meas:>12.4f}" if meas else f"{'-':>12}",
                     f"{meas / base['measured_ms'] - 1:>+9.1%}" if meas and base.get("measured_ms") else f"{'':>9}"]
            if "predicted_ms" in row:
                p = row["predicted_ms"]
                cells += [f"{p:>13.4f}",
                          f"{p / base['predicted_ms'] - 1:>+9.1%}" if base.get("predicted_ms") else f"{'':>9}",
                          f"{p / meas - 1:>+8.1%}" if meas else f"{'':>8}"]
                print(" ".join(cells) + f"  {time.time() - t0:.1f}", flush=True)
            else:
                print(" ".join(cells) + f"  not predicted: {row['error']}", flush=True)
            rows.append(row)
    errors = [abs(r["predicted_ms"] / r["measured_ms"] - 1) for r in rows if r.get("predicted_ms") and r["measured_ms"]]
    refused = sum("error" in r for r in rows)
    if errors:
        print(f"MAPE {100 * statistics.mean(errors):.1f} % over {len(errors)} launches, "
              f"worst {100 * max(errors):.1f} %; {refused} refused")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--list", action="store_true", help="print the cases")
    mode.add_argument("--measure", action="store_true", help="time the cases on the GPU")
    mode.add_argument("--predict", action="store_true", help="predict the cases with fa_sim.timing")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"--measure's JSON (default {DEFAULT_OUT})")
    ap.add_argument("--measured", type=Path, default=DEFAULT_OUT, help="--predict's measurements to compare with")
    ap.add_argument("--gpu", default="h200", help="--predict: the timing model's GPU")
    ap.add_argument("--cases", default=None, help="--predict: only these cases, comma-separated (plain always runs: "
                    "the 'vs plain' columns), e.g. softcap30,all")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--batches", type=int, default=3)
    args = ap.parse_args(argv)
    cases = None if args.cases is None else ["plain"] + [c for c in args.cases.split(",") if c and c != "plain"]
    unknown = sorted(set(cases or ()) - set(CASES))
    if unknown:
        ap.error(f"--cases: unknown {', '.join(unknown)}; the cases are {', '.join(CASES)}")
    if min(args.warmup + 1, args.reps, args.batches) < 1:
        ap.error("--warmup must be >= 0, --reps and --batches >= 1")
    if args.list:
        for shape in SHAPES:
            for name in CASES:
                prob = _launch(shape, CASES[name])[0]
                print(f"{name:<16} {prob.describe()}")
        return 0
    if args.measure:
        data = measure(args.warmup, args.reps, args.batches)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {args.out} ({data['gpu']})")
        return 0
    measured = json.loads(args.measured.read_text()) if args.measured.exists() else None
    if measured is None:
        print(f"no measurements at {args.measured}: predictions only", file=sys.stderr)
    predict(measured, args.gpu, cases)
    return 0


if __name__ == "__main__":
    sys.exit(main())
