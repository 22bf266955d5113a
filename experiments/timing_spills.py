"""The timing model on the launches that use local memory (issue 35, item 4): the 255-register
configs of tests/data/h200/timing_cases.json (spills), by half, and the rolled edits of
experiments/timing_edits.py (qk_rolled, pv_rolled: held out of every fit).

    python experiments/timing_spills.py              # the 255-register cases and the two rolled edits
    python experiments/timing_spills.py --no-edits   # the 255-register cases only
    python experiments/timing_spills.py --half fit --l2 96 48 32 24 16 --no-edits
                                                     # the fit of GpuModel.l2_bytes_per_cycle
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))

SPILL_REGISTERS = 255  # ptxas's cap: a config at it spills (or keeps a small stack)


def spill_cases():
    import json

    import timing_validate as tv

    rows = json.loads(tv.DATA.read_text())["cases"]
    keys = {r["key"] for r in rows if r.get("registers", 0) >= SPILL_REGISTERS}
    return [c for c in tv.load(tv.DATA) if c.key in keys]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--no-edits", action="store_true", help="skip the rolled edits")
    ap.add_argument("--gpu", default="h200")
    ap.add_argument("--half", choices=("fit", "validate"), help="only the cases of this half")
    ap.add_argument("--l2", type=float, nargs="+", help="GpuModel.l2_bytes_per_cycle values to try in turn")
    args = ap.parse_args(argv)
    import timing_validate as tv

    from fa_sim.timing import gpu_model

    base = gpu_model(args.gpu)
    cases = [c for c in spill_cases() if args.half in (None, c.half)]
    for l2 in args.l2 or [base.l2_bytes_per_cycle]:
        gpu = base.with_(l2_bytes_per_cycle=l2)
        pred = tv.predictions(cases, gpu)
        for half in ("fit", "validate"):
            errs = []
            for c, p in zip(cases, pred):
                if c.half == half:
                    errs.append(p / c.ms - 1)
                    print(f"{half:<9} {c.key:<56} {c.ms:8.4f} {p:8.4f} {p / c.ms - 1:+7.1%}")
            if errs:
                print(f"l2_bytes_per_cycle {l2:g}, {half}: MAPE {100 * np.mean(np.abs(errs)):.1f} % over "
                      f"{len(errs)} cases", flush=True)
    if not args.no_edits:
        import timing_edits as te

        te.predict(te.json.loads(te.DEFAULT_OUT.read_text()), args.gpu, ["qk_rolled", "pv_rolled"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
