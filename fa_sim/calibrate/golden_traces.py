"""Regenerate the golden traces of traces/golden/ (see traces/README.md).

    python -m fa_sim.calibrate.golden_traces            # rewrite them from the current simulator
    python -m fa_sim.calibrate.golden_traces --out DIR  # write them to DIR instead
    python -m fa_sim.calibrate.golden_traces --check    # exit 1 if the simulator no longer reproduces them

Inputs are integer-valued fp16 (exact products and sums), so the goldens depend on the kernel's
schedule and data movement, not on floating-point luck; only values behind expf/logf can move in
the last bits between numpy builds, and the comparison allows for that (tests/test_trace_golden.py).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..config import KernelConfig
from ..observers import story, trace_io
from ..observers.runs import run_trace
from ..observers.trace import Trace, TraceFilter

GOLDEN = Path(__file__).resolve().parents[2] / "traces" / "golden"  # in a checkout of the repository
SEQLEN = 128


@dataclass(frozen=True)
class Golden:
    name: str
    filter: TraceFilter
    causal: bool
    lane: int  # whose story is kept as text

    def inputs(self):
        rng = np.random.default_rng(2026)
        return tuple(rng.integers(-3, 4, (1, 1, SEQLEN, 64)).astype(np.float16) for _ in range(3))

    def trace(self) -> Trace:
        return run_trace(KernelConfig(), self.filter, causal=self.causal, inputs=self.inputs())

    def story_text(self, tr: Trace) -> str:
        return story.format_story(story.lane_story(tr, 0, 0, self.lane, 0)) + "\n"


GOLDENS = (
    Golden("seed_cta0_w0_l0_r0", TraceFilter(ctas=(0,), warps=(0,), lanes=(0,), rounds=(0,)), False, 0),
    Golden("causal_cta0_w0_l0-3_r0", TraceFilter(ctas=(0,), warps=(0,), lanes=(0, 1, 2, 3), rounds=(0,)), True, 0),
)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare the story texts with --out's, write nothing")
    ap.add_argument("--out", type=Path, default=GOLDEN, help="directory of the goldens (default: traces/golden)")
    args = ap.parse_args(argv)
    stale = []
    for g in GOLDENS:
        tr = g.trace()
        text = g.story_text(tr)
        if args.check:
            if (args.out / f"{g.name}.txt").read_text() != text:
                stale.append(g.name)
            continue
        args.out.mkdir(parents=True, exist_ok=True)
        trace_io.save_trace(tr, args.out / g.name)
        (args.out / f"{g.name}.txt").write_text(text)
        print(f"wrote {args.out / g.name} and {g.name}.txt")
    if stale:
        print("stale goldens:", ", ".join(stale))
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
