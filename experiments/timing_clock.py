"""Does the H200's SM clock fall with the kernel's load, in the recorded data? (issue 17)

    python experiments/timing_clock.py                                   # Nsight Compute's clocks only
    python experiments/timing_validate.py --fit-clock --json P.json --rates-cache R.pkl
    python experiments/timing_clock.py --predictions P.json --rates-cache R.pkl   # and the event times

The timing model has one effective SM clock (GpuModel.clock_ghz). Two option signs are decided
by the clock in Nsight Compute's re-measurement (docs/timing.md, "Limits"): the question is whether
a clock that falls with a load proxy would give them, fitted on the fitting half.

1. Nsight Compute (tests/data/h200/timing_ncu.json, timing_ncu_small.json): each profiled launch's
   clock is its SM cycles over its duration (sm__cycles_elapsed.max / gpu__time_duration.sum),
   set beside the load proxies recorded with it (issue slots, tensor pipe, warps active, DRAM).
2. The event-timed cases (timing_cases.json, the free clock) have no cycles of their own, so
   their clock is not observable; what is: the model's residual log(measured / predicted) against
   the model's load proxy (issue slots used per SM per cycle at full occupancy, and the tensor
   pipe's share), fitted on the fitting half (a clock linear in the proxy) and scored on the other.
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "h200"
PROXIES = {"issue": "smsp__issue_active.avg.pct_of_peak_sustained_active",
           "tensor": "sm__inst_executed_pipe_tensor_op_hmma.avg.pct_of_peak_sustained_active",
           "warps": "sm__warps_active.avg.pct_of_peak_sustained_active",
           "dram": "dram__bytes.sum.per_second"}


def clock(kernel: dict) -> float:
    """A profiled launch's SM clock in GHz: its SM cycles per nanosecond of its duration."""
    return kernel["sm__cycles_elapsed.max"] / kernel["gpu__time_duration.sum"]


def ncu_clocks() -> str:
    """Nsight Compute's clock of each profiled launch, by group, and its correlation with the proxies."""
    full = json.loads((DATA / "timing_ncu.json").read_text())["kernels"]
    small = json.loads((DATA / "timing_ncu_small.json").read_text())["kernels"]
    lines = ["Nsight Compute's SM clock (cycles / duration) of each profiled launch:"]
    c = np.array([clock(k) for k in full])
    lines.append(f"  timing_ncu.json, {len(c)} grids over every SM: {c.min():.3f}-{c.max():.3f} GHz, mean {c.mean():.3f}, "
                 f"sd {c.std() / c.mean():.1%}")
    for name, metric in PROXIES.items():
        x = np.array([k[metric] for k in full])
        lines.append(f"    against {name:6s} ({x.min():.3g}-{x.max():.3g}): correlation {np.corrcoef(x, c)[0, 1]:+.2f}, "
                     f"clock change over the range {np.polyfit(x, c, 1)[0] * (x.max() - x.min()) / c.mean():+.1%}")
    for label, sel in (("one CTA", lambda k: k["launch__grid_size"] == 1),
                       ("132 CTAs or more (every SM)", lambda k: 132 <= k["launch__grid_size"]),
                       ("2-131 CTAs", lambda k: 1 < k["launch__grid_size"] < 132)):
        g = np.array([clock(k) for k in small if sel(k)])
        if len(g):
            lines.append(f"  timing_ncu_small.json, {label}: {len(g)} launches, {g.min():.3f}-{g.max():.3f} GHz, "
                         f"mean {g.mean():.3f}")
    return "\n".join(lines)


def event_residuals(predictions: Path, rates_cache: Path) -> str:
    """The model's residual on the event-timed cases against its own load proxies."""
    sys.path.insert(0, str(ROOT / "experiments"))
    import timing_validate as tv

    from fa_sim.timing.gpus import H200
    from fa_sim.timing.predict import kernel_model, occupancy

    if rates_cache.exists():
        tv.RATES_CACHE.update(pickle.loads(rates_cache.read_bytes()))
    pred = json.loads(predictions.read_text())["predicted_ms"]
    rows = []
    for c in tv.load():
        if c.small or c.key not in pred:
            continue
        prob = c.problem()
        model = kernel_model(prob.config, prob.causal, H200.arch, str(ROOT / c.kernel) if c.kernel else None)
        k, per = occupancy(model, H200), tv._rates(prob.config, prob.causal, c.kernel, tv._sm_part(H200)).per_round[-1]
        starts = model.round_starts(8)
        walk = model.cta_walk(8)[starts[3]:starts[4]]  # a steady round
        issue = k * prob.config.n_warps * len(walk) / (4 * per)
        tensor = k * prob.config.n_warps * sum(i.opcode.startswith("HMMA") for i in walk) * H200.hmma_cycles / (4 * per)
        rows.append((c.half, c.key, np.log(c.ms / pred[c.key]), issue, tensor))
    lines = ["The event-timed cases: log(measured / predicted) against the model's load proxy",
             "(a clock linear in the proxy, fitted on the fitting half):"]
    for j, name in ((3, "issue slots"), (4, "tensor pipe")):
        fit = [r for r in rows if r[0] == "fit"]
        x, y = np.array([r[j] for r in fit]), np.array([r[2] for r in fit])
        slope, icpt = np.polyfit(x, y, 1)
        lines.append(f"  {name}: range {x.min():.2f}-{x.max():.2f}; fitting half: correlation {np.corrcoef(x, y)[0, 1]:+.2f}, "
                     f"slope {slope:+.3f} per unit (the clock {-slope * (x.max() - x.min()):+.1%} over the range)")
        for half in ("fit", "validate"):
            sel = [r for r in rows if r[0] == half]
            xs, ys = np.array([r[j] for r in sel]), np.array([r[2] for r in sel])
            before = np.mean(np.abs(np.exp(-ys) - 1))
            after = np.mean(np.abs(np.exp(-(ys - (icpt + slope * xs))) - 1))
            lines.append(f"    {half}: MAPE {before:.2%} with one clock, {after:.2%} with the clock linear in it")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--predictions", type=Path, help="timing_validate.py --json output")
    ap.add_argument("--rates-cache", type=Path, default=Path("/nonexistent"), help="timing_validate.py --rates-cache file")
    args = ap.parse_args(argv)
    print(ncu_clocks())
    if args.predictions:
        print(event_residuals(args.predictions, args.rates_cache))
    return 0


if __name__ == "__main__":
    sys.exit(main())
