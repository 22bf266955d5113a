"""The H200's SM clock and power while a case runs back to back (issue 17's clock-decided signs).

    python experiments/timing_clock_sustained.py --only "$(cat experiments/timing_wrong_signs.txt)" --out DIR

The timing model has one SM clock. Nsight Compute profiles one launch at a time (at a locked or,
with --clock-control none, an idle-warm clock), so it cannot say at which clock the event-timed
batches of experiments/timing_measure.py ran. Here each case from timing_measure.cases() is launched
back to back for about --seconds of GPU time (CUDA events per launch, as timing_measure does) while
`nvidia-smi` samples the SM clock and the board power every 20 ms; the case's clock and power are
the medians of the samples inside its window (the first quarter, the clock settling, left out).
Writes DIR/timing_clock_sustained.json and prints a line per case.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing_measure import ROOT, _inputs, _precompile, cases


class Sampler:
    """nvidia-smi's SM clock (MHz) and power (W) every 20 ms, stamped with time.monotonic()."""

    def __init__(self):
        self.samples: list[tuple[float, float, float]] = []
        self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                                      "-lms", "20"], stdout=subprocess.PIPE, text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                mhz, watts = (float(x) for x in line.split(","))
            except ValueError:
                continue
            self.samples.append((time.monotonic(), mhz, watts))

    def window(self, t0: float, t1: float) -> tuple[float, float, int]:
        start = t0 + (t1 - t0) / 4
        inside = [(m, w) for t, m, w in self.samples if start <= t <= t1]
        if not inside:
            return float("nan"), float("nan"), 0
        return statistics.median(m for m, _ in inside), statistics.median(w for _, w in inside), len(inside)

    def close(self):
        self.proc.terminate()


def run(case, seconds: float, sampler: Sampler) -> dict:
    from fa_hw.forward import prepare

    q, k, v = _inputs(case)
    plan, dev, _ = prepare(q, k, v, case.causal, None, case.config(),
                           kernel=str(ROOT / case.kernel) if case.kernel else None)
    probe = statistics.median(plan.time(dev.stream, 5, 20))
    reps = max(20, int(seconds * 1e3 / probe))
    t0 = time.monotonic()
    ms = plan.time(dev.stream, 0, reps)
    t1 = time.monotonic()
    time.sleep(0.1)  # the sampler's last lines
    mhz, watts, n = sampler.window(t0, t1)
    return {"key": case.key, "kernel_ms": statistics.median(ms), "reps": reps, "sm_mhz": mhz, "power_w": watts,
            "samples": n}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", type=re.compile, required=True, metavar="REGEX", help="cases whose key matches")
    p.add_argument("--seconds", type=float, default=1.5, help="GPU time per case (default 1.5)")
    p.add_argument("--out", type=Path, default=ROOT / "experiments" / "out")
    args = p.parse_args(argv)
    selected = [c for c in cases() if args.only.search(c.key)]
    if not selected:
        raise SystemExit(f"--only {args.only.pattern!r} matches no case (timing_measure.py --list)")
    _precompile(selected)
    sampler = Sampler()
    rows = []
    try:
        for c in selected:
            rows.append(run(c, args.seconds, sampler))
            r = rows[-1]
            print(f"{c.key:60s} {r['kernel_ms']:.4f} ms  {r['sm_mhz']:.0f} MHz  {r['power_w']:.0f} W  "
                  f"({r['reps']} launches, {r['samples']} samples)", flush=True)
    finally:
        sampler.close()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "timing_clock_sustained.json").write_text(json.dumps({"cases": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
