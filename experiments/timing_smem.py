"""The timing model's shared-memory path against the H200 (issue 35, item 4): the conflicted plain
layout and padded against swizzled.

    python experiments/timing_smem.py                 # the report below, shipped parameters
    python experiments/timing_smem.py --json S.json   # its numbers as one JSON object
    python experiments/timing_smem.py --no-stalls     # skip the stall split (one SM run less)

What it prints:
- the plain layout over the seed (m64n64d64w4-swizzled) and over the swizzled layout, for every
  config and shape the measured set (tests/data/h200/timing_cases.json) has in both layouts:
  measured and predicted ratio, and which half (fit / validate) each case is in;
- padded against swizzled on the same config and shape (the same set, timed apart): the measured
  and predicted ratio, whether the predicted sign is right;
- the stall split (warp-cycles per issued instruction) of the model on the seed's plain layout
  beside the seed's swizzled run and beside Nsight Compute's profile of the seed
  (tests/data/h200/timing_ncu.json: no plain layout was profiled there).

Predictions use `experiments/timing_validate.py`'s functions (the same rates and clock), so the
numbers are those the validation reports.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))

import timing_validate as tv  # noqa: E402

from fa_sim.timing.gpus import H200  # noqa: E402
from fa_sim.timing.predict import predict  # noqa: E402

SEED = "m64n64d64w4-swizzled"
NCU = ROOT / "tests" / "data" / "h200" / "timing_ncu.json"
NCU_STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
REASONS = ("wait", "short_scoreboard", "long_scoreboard", "barrier", "math_pipe_throttle", "mio_throttle",
           "not_selected")
_LAYOUT = re.compile(r"^(m\d+n\d+d\d+w\d+)-(plain|padded|swizzled)(.*)$")


def layout_pairs(cases, layout: str) -> list[tuple]:
    """(case in `layout`, the swizzled case of the same config, options, shape and mode)."""
    by = {c.key: c for c in cases if not c.small}
    out = []
    for c in by.values():
        tag, rest = c.key.split("/", 1)
        m = _LAYOUT.match(tag)
        if m and m[2] == layout:
            twin = by.get(f"{m[1]}-swizzled{m[3]}/{rest}")
            if twin is not None and twin.kernel == c.kernel:
                out.append((c, twin))
    return sorted(out, key=lambda p: p[0].key)


def stall_split(key: str, gpu) -> dict:
    """The model's stalls per issued instruction on the launch of `key` ('tag/BxHxNqxNkxd/mode')."""
    pred = predict(tv_problem(key), gpu)
    return {r: round(pred.stalls.get(r, 0.0), 3) for r in ("selected", *REASONS)}


def tv_problem(key: str):
    from fa_sim.config import KernelConfig
    from fa_sim.problem import Problem

    tag, shape, mode = key.split("/")
    b, h, nq, nk, _ = (int(x) for x in shape.split("x"))
    return Problem(b, h, nq, nk, mode == "causal", 1.0, KernelConfig.from_tag(tag))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--no-stalls", action="store_true")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--set", nargs="*", default=[], metavar="NAME=VALUE",
                    help="GPU parameters changed for a trial (fa_sim/timing/gpus.py's field names)")
    args = ap.parse_args(argv)
    tv.JOBS = args.jobs
    changes = {}
    for item in args.set:
        name, _, value = item.partition("=")
        if not hasattr(H200, name) or not value:
            raise SystemExit(f"--set takes NAME=VALUE with a GpuModel field name, got {item!r}")
        changes[name] = type(getattr(H200, name))(float(value)) if not isinstance(getattr(H200, name), str) else value
    gpu = H200.with_(**changes)
    cases = tv.load()
    plain, padded = layout_pairs(cases, "plain"), layout_pairs(cases, "padded")
    seeds = {c.key.split("/", 1)[1]: c for c in cases if c.tag == SEED and not c.small}
    plain_seed = [(p, seeds[p.key.split("/", 1)[1]]) for p, _ in plain
                  if p.tag == SEED.replace("swizzled", "plain") and p.key.split("/", 1)[1] in seeds]
    want = sorted({c.key: c for pair in plain + padded for c in pair}.values(), key=lambda c: c.key)
    pred = dict(zip((c.key for c in want), (float(x) for x in tv.predictions(want, gpu))))
    out: dict = {"plain_over_swizzled": [], "padded_over_swizzled": []}
    print("plain layout over swizzled (the seed is m64n64d64w4-swizzled), timed apart on the H200")
    print(f"{'case':<48} {'half':<9} {'measured':>9} {'predicted':>9}")
    for p, s in plain:
        m, q = p.ms / s.ms, pred[p.key] / pred[s.key]
        out["plain_over_swizzled"].append({"key": p.key, "half": p.half, "measured": m, "predicted": q,
                                           "plain_error": pred[p.key] / p.ms - 1})
        print(f"{p.key:<48} {p.half:<9} {m:>8.2f}x {q:>8.2f}x  (plain {pred[p.key] / p.ms - 1:+.1%})")
    right = 0
    print("\npadded layout over swizzled, same config and shape, timed apart on the H200")
    for p, s in padded:
        m, q = p.ms / s.ms - 1, pred[p.key] / pred[s.key] - 1
        ok = (m > 0) == (q > 0)
        right += ok
        out["padded_over_swizzled"].append({"key": p.key, "half": p.half, "measured": m, "predicted": q, "right": bool(ok)})
        print(f"{p.key:<48} {p.half:<9} measured {m:+6.1%} predicted {q:+6.1%} {'right' if ok else 'WRONG'}")
    print(f"padded against swizzled: {right} of {len(padded)} signs right")
    out["padded_signs_right"], out["padded_pairs"] = int(right), len(padded)
    ncu = {k["key"]: k for k in json.loads(NCU.read_text())["kernels"]}
    plain_seed.sort(key=lambda ps: ps[1].key not in ncu)  # the seed's profiled shape first
    if not args.no_stalls and plain_seed:
        key = plain_seed[0][0].key
        seed_key = plain_seed[0][1].key
        model_plain, model_seed = stall_split(key, gpu), stall_split(seed_key, gpu)
        gpu_seed = {r: ncu[seed_key][NCU_STALL.format(r)] for r in REASONS} if seed_key in ncu else {}
        print(f"\nstalls per issued instruction: the model on {key} and on {seed_key}; Nsight Compute on the latter")
        print(f"{'reason':<20} {'model plain':>12} {'model seed':>11} {'ncu seed':>9}")
        for r in REASONS:
            print(f"{r:<20} {model_plain[r]:>12.2f} {model_seed[r]:>11.2f} {gpu_seed.get(r, float('nan')):>9.2f}")
        for name, s in (("model plain", model_plain), ("model seed", model_seed), ("ncu seed", gpu_seed)):
            tot = sum(s.get(r, 0) for r in REASONS)
            if tot:
                print(f"  {name}: short_scoreboard {s['short_scoreboard'] / tot:.0%}, mio_throttle "
                      f"{s['mio_throttle'] / tot:.0%}, barrier {s['barrier'] / tot:.0%} of the stalls")
        out["stalls"] = {"plain": {"key": key, "model": model_plain},
                         "seed": {"key": seed_key, "model": model_seed, "ncu": gpu_seed}}
    errs = {h: [abs(pred[c.key] / c.ms - 1) for c in want if c.half == h] for h in ("fit", "validate")}
    print("\nMAPE over these cases (the shipped clock and overhead): " + ", ".join(
        f"{h} {sum(e) / len(e):.1%} ({len(e)})" for h, e in errs.items() if e))
    out["cases"] = {c.key: {"half": c.half, "measured_ms": c.ms, "predicted_ms": pred[c.key]} for c in want}
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
