"""fa time --backward against the GPU: the backward's three kernels measured, then predicted.

    python experiments/timing_backward.py --measure --out FILE.json   # on a GPU: each kernel's time
    python experiments/timing_backward.py --predict [--measured FILE.json]   # the model beside it (CPU)

The shapes are small enough for the timing model to run every CTA of each launch on the PTX engine
(fa_sim.timing.predict_launch refuses launches past its instruction limit) and large enough to fill
a 132-SM GPU with at least one wave of the main kernel (ceil(Nk / 64) x B*H CTAs): d = 64, both dQ
modes, causal and not. --measure (inputs: fa_sim.reference.random_inputs_backward seed 0, O and LSE
from fa_hw.forward) times each kernel as the forward's measurements are (fa_hw.backward's
time_backward_kernels: WARMUP launches, then REPS back to back with a CUDA event between them, all
enqueued behind a blocking kernel (fa_hw/blocking.py, since round 45), so the host's launch calls hide
behind the GPU's queue) and keeps each kernel's median (`kernel_ms`,
`"method": "queued"`); beside it `kernel_ms_single`, the median of fa_hw.backward's own kernel_ms (one
launch per kernel from an idle, synchronised stream: it adds the host's time to issue each launch,
about 5-40 us on the H100 host, which no GPU model predicts). --predict runs
fa_sim.timing.predict_backward on the same inputs (the forward's O and LSE from the simulator) and
prints both, per kernel and in total, and the MAPE per kernel. tests/data/h100/timing_backward.json
holds both (queued and single), measured on an NVIDIA H100 80GB HBM3 in round 38.
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

SHAPES = [(1, 8, 1024, 64), (2, 8, 1024, 64), (1, 16, 2048, 64)]  # B, H, N, d
CASES = [(s, causal, det) for s in SHAPES for causal in (False, True) for det in (True, False)]
WARMUP, REPS = 3, 15


def _inputs(shape):
    from fa_sim.reference import random_inputs_backward

    b, h, n, d = shape
    return random_inputs_backward(b, h, n, n, d, seed=0)


def measure() -> dict:
    import importlib

    import fa_hw

    time_kernels = importlib.import_module("fa_hw.backward").time_backward_kernels
    rows = []
    for shape, causal, det in CASES:
        q, k, v, do = _inputs(shape)
        fwd = fa_hw.forward(q, k, v, causal=causal)
        from fa_hw.check import to_numpy

        o, lse = to_numpy(fwd.o), to_numpy(fwd.lse)
        times = []
        for i in range(WARMUP + REPS):
            res = fa_hw.backward(q, k, v, o, lse, do, causal=causal, deterministic=det)
            if i >= WARMUP:
                times.append(res.kernel_ms)
        single = [statistics.median(t[j] for t in times) for j in range(3)]
        per = [statistics.median(t) for t in time_kernels(q, k, v, o, lse, do, causal=causal, deterministic=det,
                                                           warmup=WARMUP, reps=REPS)]
        rows.append({"shape": list(shape), "causal": causal, "deterministic": det, "kernel_ms": per,
                     "total_ms": sum(per), "kernel_ms_single": single, "registers": res.registers})
        print(shape, "causal" if causal else "full", "det" if det else "atomic",
              " ".join(f"{t:.4f}" for t in per), f"total {sum(per):.4f} ms", flush=True)
    from fa_hw import runtime

    return {"gpu": runtime.device().name, "method": "queued", "warmup": WARMUP, "reps": REPS, "rows": rows}


def predict(measured: dict | None) -> list[dict]:
    from fa_sim import simulate
    from fa_sim.timing import predict_backward

    by = {(tuple(r["shape"]), r["causal"], r["deterministic"]): r for r in (measured or {}).get("rows", ())}
    if measured:
        how = ("queued launches" if measured.get("method") == "queued"
               else "single launches from an idle stream (the host's launch time included)")
        print(f"measured: {measured.get('gpu', '?')}, {how}")
    out, errs, kerr = [], [], {}
    print(f"{'shape':<20} {'causal':<6} {'dQ':<7} {'measured ms':>12} {'predicted ms':>13} {'error':>8}  per kernel "
          f"(measured / predicted)  seconds")
    for shape, causal, det in CASES:
        t0 = time.time()
        q, k, v, do = _inputs(shape)
        fwd = simulate(q, k, v, causal=causal, engine="ptx")
        p = predict_backward(q, k, v, fwd.o, fwd.lse, do, causal=causal, deterministic=det)
        m = by.get((shape, causal, det))
        pk = [x.kernel_ms for x in p.kernels.values()]
        row = {"shape": list(shape), "causal": causal, "deterministic": det, "predicted_ms": p.kernel_ms,
               "predicted_kernels_ms": pk, "measured_ms": m["total_ms"] if m else None}
        err = f"{p.kernel_ms / m['total_ms'] - 1:>+8.1%}" if m else f"{'-':>8}"
        if m:
            errs.append(abs(p.kernel_ms / m["total_ms"] - 1))
            for name, a, b in zip(p.kernels, m["kernel_ms"], pk):
                kerr.setdefault(name, []).append(b / a - 1)
        kern = " ".join(f"{a:.4f}/{b:.4f}" for a, b in zip(m["kernel_ms"], pk)) if m else " ".join(f"-/{b:.4f}" for b in pk)
        print(f"{str(shape):<20} {str(causal):<6} {'det' if det else 'atomic':<7} "
              f"{m['total_ms'] if m else float('nan'):>12.4f} {p.kernel_ms:>13.4f} {err}  {kern}  {time.time() - t0:.0f}",
              flush=True)
        out.append(row)
    if errs:
        print(f"MAPE {100 * statistics.mean(errs):.1f} % over {len(errs)} backward passes, worst {100 * max(errs):.1f} %")
        for name, e in kerr.items():
            print(f"  {name:<27} MAPE {100 * statistics.mean(map(abs, e)):5.1f} % over {len(e)}, "
                  f"errors {100 * min(e):+.1f} .. {100 * max(e):+.1f} %")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--measure", action="store_true", help="time the kernels on this GPU")
    ap.add_argument("--predict", action="store_true", help="the timing model's predictions (CPU)")
    ap.add_argument("--out", type=Path, default=None, help="--measure: the JSON file to write")
    ap.add_argument("--measured", type=Path, default=ROOT / "tests" / "data" / "h100" / "timing_backward.json")
    args = ap.parse_args(argv)
    if args.measure:
        if args.out is None:
            ap.error("--measure needs --out FILE.json")
        data = measure()
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(data, indent=1))
        print(f"wrote {args.out}")
    if args.predict:
        predict(json.loads(args.measured.read_text()) if args.measured.exists() else None)
    if not (args.measure or args.predict):
        ap.error("say --measure (GPU) or --predict (CPU)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
