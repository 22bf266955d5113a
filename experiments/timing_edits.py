"""Edits of fa2_fwd.cu as a user writes them, timed on the GPU and by the timing model (issue 35).

    python experiments/timing_edits.py --list                  # the edits and what the simulator found
    python experiments/timing_edits.py --check                 # CPU: each edit on the PTX engine (bits, hazards)
    python experiments/timing_edits.py --measure [--out F]     # GPU: -> tests/data/h200/timing_edits.json
    python experiments/timing_edits.py --predict [--measured F] [--edit NAME ...]
                                                               # fa_sim.timing.predict beside the measurements
    ... --set fuzz                                             # the same for experiments/variants/edits_fuzz/
                                                               # (-> tests/data/h100/timing_edits_fuzz.json)
    ... --set fuzz2                                            # experiments/variants/edits_fuzz2/
                                                               # (-> tests/data/h100/timing_edits_fuzz2.json)

Each edit is a patch of fa_hw/kernels/fa2_fwd.cu in experiments/variants/edits/ (the format of
fa_sim/contract/patch.py, taken by every `--kernel` and `kernel=`). They change the seed config's
schedule (kv_stages 1, the default) or the helpers every schedule uses. `EDITS` records, for each,
what the PTX engine found on (1, 2, 200, 200), d = 64, seed config, non-causal: whether O and LSE
equal the seed kernel's bit for bit, and the hazards the hazard checker reports ((kind, tile));
`--check` recomputes it and tests/test_timing_edits.py checks a few. `--set fuzz` takes the second
set instead, the fa2_fwd.cu patches of experiments/variants/edits_fuzz/ (a later edit fuzz: loops
written otherwise, local memory, atomics, `__noinline__` helpers, data-dependent branches; `FUZZ`
records the same facts for them), measured into its own file. `--set fuzz2` takes the third,
experiments/variants/edits_fuzz2/ (round 45: a switch on the round's kind, a goto loop, a two-pass
softmax, a static shared-memory buffer for O, K unswizzled, `__launch_bounds__` min-blocks 8, a
partial unroll, a module counter, P packed by hand; `FUZZ2`), not yet measured.

--measure times each edit and the seed kernel (fa_hw.profile.measure_time: CUDA events around each
launch after warm-up, the median of 3 batches of 20) on the seed config at `SHAPES` (random
normal fp16 inputs, a fixed seed), the seed first and last (its drift over the run). --predict
calls fa_sim.timing.predict(Problem, gpu, kernel=the patch) for the same launches and prints
measured against predicted with the error; an edit the model refuses prints its error on its row.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere: this checkout's fa_sim / fa_hw
    sys.path.insert(0, str(ROOT))

EDIT_DIR = ROOT / "experiments" / "variants" / "edits"
FUZZ_DIR = ROOT / "experiments" / "variants" / "edits_fuzz"
DEFAULT_OUT = ROOT / "tests" / "data" / "h200" / "timing_edits.json"
FUZZ_OUT = ROOT / "tests" / "data" / "h100" / "timing_edits_fuzz.json"  # measured on an H100 (round 44)
FUZZ2_DIR = ROOT / "experiments" / "variants" / "edits_fuzz2"
FUZZ2_OUT = ROOT / "tests" / "data" / "h100" / "timing_edits_fuzz2.json"  # to be measured on an H100
# (B, H, Nq, Nk, causal): 132 SMs x 4 resident seed CTAs; the second not a multiple of the tiles
SHAPES = ((4, 16, 2048, 2048, False), (2, 16, 3000, 3000, True))
CHECK_SHAPE = (1, 2, 200, 200)  # what EDITS records (head_dim 64, seed config, non-causal)
SEED = 35

# name -> (O equal to the seed's bits, LSE equal, hazards {(HazardKind name, tile)}) on CHECK_SHAPE
EDITS = {
    "extra_barrier": (True, True, set()),
    "missing_bar_pv": (True, True, {("RAW_NO_BARRIER", "sV"), ("WAR", "sK"), ("WAR", "sO")}),
    "missing_bar_epilogue": (True, True, {("RAW_NO_BARRIER", "sO")}),
    "pv_rolled": (True, True, set()),
    "qk_rolled": (True, True, set()),
    "qk_twice": (False, False, set()),
    "softmax_expf": (False, False, set()),
    "softmax_fma_sum": (False, False, set()),
    "extra_shuffles": (True, True, set()),
    "no_prefetch": (True, True, set()),
    "warp0_copies_k": (True, True, set()),
    "epilogue_early_exit": (True, True, set()),
    "copy_column_major": (True, True, set()),
    "epilogue_twice": (True, True, set()),
    "lse_fast_log": (True, False, set()),
}
# the same facts for edits_fuzz/'s patches of fa2_fwd.cu (its two fa2_bwd.cu patches are timed with
# `fa time --backward --kernel`); kv_while and syncwarp_qk compile to the seed's SASS opcode counts
FUZZ = {
    "atomics": (True, True, set()),
    "debug_store": (True, True, set()),
    "divergent_loop": (True, True, set()),
    "kv_break": (True, True, set()),
    "kv_nested": (True, True, set()),
    "kv_reverse": (False, False, set()),
    "kv_unroll2": (True, True, set()),
    "kv_while": (True, True, set()),
    "local_array": (True, True, set()),
    "noinline_mask": (True, True, set()),
    "noinline_quad_max": (True, True, set()),
    "quad_max_broadcast": (True, True, set()),
    "skip_dead_round": (True, True, set()),
    "syncwarp_qk": (True, True, set()),
    "volatile_flag": (True, True, set()),
    "warp_early_return": (False, True, set()),
}
# edits_fuzz2/'s patches of fa2_fwd.cu (its bwd_* patches are timed with `fa time --backward --kernel`);
# quad_max_loop and pack_by_hand compile to the seed's SASS opcode counts
FUZZ2 = {
    "debug_counter": (True, True, set()),
    "goto_loop": (True, True, set()),
    "k_plain_layout": (True, True, set()),
    "min_blocks_8": (True, True, set()),
    "noinline_store": (True, True, set()),
    "o_buffer_no_sync": (True, True, {("RAW_NO_BARRIER", "sObuf")}),
    "o_own_buffer": (True, True, set()),
    "pack_by_hand": (True, True, set()),
    "quad_max_loop": (True, True, set()),
    "softmax_unroll4": (True, True, set()),
    "switch_round": (True, True, set()),
    "two_pass_max": (False, False, set()),
}
SETS = {"edits": (EDITS, DEFAULT_OUT), "fuzz": (FUZZ, FUZZ_OUT), "fuzz2": (FUZZ2, FUZZ2_OUT)}  # --set: (the facts,
# --measure's file)


def patch_path(name: str) -> Path:
    return (FUZZ2_DIR if name in FUZZ2 else FUZZ_DIR if name in FUZZ else EDIT_DIR) / f"{name}.patch"


def description(name: str) -> str:
    """The patch's first line (what the edit does, as its author wrote it)."""
    return patch_path(name).read_text().splitlines()[0]


def _inputs(shape, seed: int = SEED):
    b, h, nq, nk = shape[:4]
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((b, h, n, 64)).astype(np.float16) for n in (nq, nk, nk))


def check(names) -> dict:
    """Each edit on the PTX engine at CHECK_SHAPE: {name: (O equal, LSE equal, hazards)}."""
    from fa_sim import simulate
    from fa_sim.observers.hazards import HazardChecker

    q, k, v = _inputs(CHECK_SHAPE)
    base = simulate(q, k, v, causal=False, engine="ptx")
    out = {}
    for name in names:
        hazards = HazardChecker()
        res = simulate(q, k, v, causal=False, kernel=str(patch_path(name)), observers=[hazards])
        out[name] = (bool(np.array_equal(res.o.view(np.uint16), base.o.view(np.uint16))),
                     bool(np.array_equal(res.lse.view(np.uint32), base.lse.view(np.uint32))),
                     {(kind.name, str(where)) for kind, where in hazards.report().kinds()})
    return out


def measure(names, warmup: int = 10, reps: int = 20, batches: int = 3) -> dict:
    from fa_hw.device import device
    from fa_hw.profile import measure_time
    from fa_sim.config import KernelConfig

    config = KernelConfig()
    rows = []
    for shape in SHAPES:
        q, k, v = _inputs(shape)
        causal = shape[4]
        for name in ["seed", *names, "seed"]:
            kernel = None if name == "seed" else str(patch_path(name))
            t0 = time.time()
            ms, batch = measure_time(q, k, v, causal, None, config, kernel, warmup, reps, batches)
            rows.append({"edit": name, "shape": list(shape[:4]), "causal": causal, "config": config.tag, "ms": ms,
                         "batch_ms": list(batch)})
            print(f"{name:<22} {shape} {ms:.4f} ms (batches {', '.join(f'{x:.4f}' for x in batch)}; "
                  f"{time.time() - t0:.1f} s)", flush=True)
    return {"gpu": device().name, "warmup": warmup, "reps": reps, "batches": batches, "rows": rows}


def predict(measured: dict | None, names, gpu: str = "h200") -> list[dict]:
    from fa_sim.config import KernelConfig
    from fa_sim.problem import Problem
    from fa_sim.timing import predict as predict_problem

    config = KernelConfig()
    seed_ms: dict = {}
    by_key: dict = {}
    for r in (measured or {}).get("rows", ()):
        key = (r["edit"], tuple(r["shape"]), r["causal"])
        by_key.setdefault(key, []).append(r["ms"])
    rows = []
    print(f"{'edit':<22} {'shape':<22} {'measured ms':>12} {'vs seed':>8} {'predicted ms':>13} {'vs seed':>8} "
          f"{'error':>8}  seconds")
    for shape in SHAPES:
        b, h, nq, nk, causal = shape
        prob = Problem(b, h, nq, nk, causal, 1.0, config)
        for name in ["seed", *names]:
            t0 = time.time()
            m = by_key.get((name, (b, h, nq, nk), causal))
            meas = statistics.median(m) if m else None
            row = {"edit": name, "shape": [b, h, nq, nk], "causal": causal, "measured_ms": meas}
            try:
                row["predicted_ms"] = float(predict_problem(prob, gpu, None if name == "seed" else str(patch_path(name)))
                                            .kernel_ms)
            except Exception as exc:  # a refusal is a result of its own: print it on the row
                row["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:160]}"
            if name == "seed":
                seed_ms[shape] = row
            base = seed_ms.get(shape, {})
            cells = [f"{name:<22} {str((b, h, nq, nk)) + (' c' if causal else ''):<22}",
                     f"{meas:>12.4f}" if meas else f"{'-':>12}",
                     f"{meas / base['measured_ms'] - 1:>+8.1%}" if meas and base.get("measured_ms") else f"{'':>8}"]
            if "predicted_ms" in row:
                p = row["predicted_ms"]
                cells += [f"{p:>13.4f}",
                          f"{p / base['predicted_ms'] - 1:>+8.1%}" if base.get("predicted_ms") else f"{'':>8}",
                          f"{p / meas - 1:>+8.1%}" if meas else f"{'':>8}"]
                print(" ".join(cells) + f"  {time.time() - t0:.1f}")
            else:
                print(" ".join(cells) + f"  not predicted: {row['error']}")
            rows.append(row)
    errors = [abs(r["predicted_ms"] / r["measured_ms"] - 1) for r in rows if r.get("predicted_ms") and r["measured_ms"]]
    refused = sum("error" in r for r in rows)
    if errors:
        print(f"MAPE {100 * statistics.mean(errors):.1f} % over {len(errors)} launches, worst {100 * max(errors):.1f} %; "
              f"{refused} refused")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--list", action="store_true", help="print the edits and what the simulator found")
    mode.add_argument("--check", action="store_true", help="run each edit on the PTX engine (CPU)")
    mode.add_argument("--measure", action="store_true", help="time the edits on the GPU")
    mode.add_argument("--predict", action="store_true", help="predict the edits with fa_sim.timing")
    ap.add_argument("--set", choices=sorted(SETS), default="edits",
                    help="edits: experiments/variants/edits/ (default); fuzz: experiments/variants/edits_fuzz/; "
                         "fuzz2: experiments/variants/edits_fuzz2/")
    ap.add_argument("--out", type=Path, help=f"--measure's JSON (default {DEFAULT_OUT}, with --set fuzz {FUZZ_OUT}, "
                                             f"--set fuzz2 {FUZZ2_OUT})")
    ap.add_argument("--measured", type=Path, help="--predict's measurements to compare with (default: --out's)")
    ap.add_argument("--gpu", default="h200", help="--predict: the timing model's GPU")
    ap.add_argument("--edit", action="append", choices=sorted([*EDITS, *FUZZ, *FUZZ2]), metavar="NAME",
                    help="--predict / --check: only this edit of the set (and the seed kernel); repeat for several")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--batches", type=int, default=3)
    args = ap.parse_args(argv)
    table, default_out = SETS[args.set]
    if min(args.warmup + 1, args.reps, args.batches) < 1:
        ap.error("--warmup must be >= 0, --reps and --batches >= 1")
    if args.edit and (args.measure or args.list):
        ap.error("--edit goes with --predict or --check (--measure runs every edit of the set, beside the seed)")
    stray = [n for n in args.edit or () if n not in table]
    if stray:
        ap.error(f"--edit {', '.join(stray)}: not in --set {args.set} ({', '.join(table)})")
    names = args.edit or list(table)
    if args.list:
        for name, (o_eq, lse_eq, hazards) in table.items():
            bits = "O, LSE equal" if o_eq and lse_eq else "O equal, LSE differs" if o_eq else \
                "O differs, LSE equal" if lse_eq else "bits differ"
            print(f"{name:<22} {bits:<21} hazards: {', '.join(f'{k} {t}' for k, t in sorted(hazards)) or 'none'}")
        return 0
    if args.check:
        got = check(names)
        wrong = [n for n in names if got[n] != table[n]]
        for n, (o_eq, lse_eq, hazards) in got.items():
            print(f"{n:<22} O equal {o_eq!s:<5} LSE equal {lse_eq!s:<5} hazards {sorted(hazards) or 'none'}"
                  + ("   <- differs from the recorded facts" if n in wrong else ""))
        return 1 if wrong else 0
    out = args.out or default_out
    if args.measure:
        data = measure(names, args.warmup, args.reps, args.batches)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {out} ({data['gpu']})")
        return 0
    measured_path = args.measured or out
    measured = json.loads(measured_path.read_text()) if measured_path.exists() else None
    if measured is None:
        print(f"no measurements at {measured_path}: predictions only (run --measure on a GPU first)", file=sys.stderr)
    predict(measured, names, args.gpu)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
