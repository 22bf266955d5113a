"""config="auto" by the timing model: how often its pick is within 3 % of the measured best.

    python experiments/timing_auto.py --measure --out DIR   # on the GPU: every candidate of every problem
    python experiments/timing_auto.py                       # the report, from tests/data/h200/timing_auto.json

The problems: head_dim 32, 64 and 128, causal and not, key lengths 1500 and 5000 (shapes
fa_hw/tuned's table was not tuned on), each at batch 4 and 16 heads (fa_sim.timing.rank.RANK_SHAPE).
The candidates are those the model ranks when no table answers (fa_hw.tuned.model_choice:
fa_hw.tuned.model_candidates, or the family's swizzled configs at that head_dim; the recorded
tests/data/h200/timing_auto.json holds every config of fa_hw.tuned.candidates, the pool before it
became the autotuner's, and the report ranks whatever a recording holds). --measure times each
(experiments/timing_measure.measure: CUDA events, medians of 3 batches) and writes timing_auto.json;
the report ranks the same candidates with the model and counts the problems whose predicted-fastest
config is within 3 % of the measured fastest.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from timing_measure import Case, _precompile, measure

from fa_hw.tuned import model_candidates
from fa_sim.timing.rank import RANK_SHAPE, family_candidates, rank

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "h200" / "timing_auto.json"
PROBLEMS = [(d, causal, nk) for d in (32, 64, 128) for causal in (False, True) for nk in (1500, 5000)]
WITHIN = 0.03


def pool(head_dim: int, causal: bool, seqlen_k: int) -> list:
    return model_candidates(head_dim, causal, seqlen_k) or family_candidates(head_dim)


def cases() -> list[tuple[tuple, Case]]:
    b, h = RANK_SHAPE
    return [((d, causal, nk), Case(c.tag, (b, h, nk, nk, d), causal)) for d, causal, nk in PROBLEMS
            for c in pool(d, causal, nk)]


def report(rows: list[dict]) -> str:
    from fa_sim.config import KernelConfig

    lines = ["| d | causal | Nk | candidates | measured best | model's pick | its measured time vs best |",
             "|---|---|---|---|---|---|---|"]
    hits = 0
    for d, causal, nk in PROBLEMS:
        mine = {r["tag"]: r["kernel_ms"] for r in rows if tuple(r["problem"]) == (d, causal, nk)}
        ranked = rank(tuple(KernelConfig.from_tag(t) for t in mine), nk, causal, "h200")
        best = min(mine, key=mine.get)
        pick = ranked[0].config.tag
        ratio = mine[pick] / mine[best] - 1
        hits += ratio <= WITHIN
        lines.append(f"| {d} | {causal} | {nk} | {len(mine)} | {best} {mine[best]:.4f} ms | {pick} | {ratio:+.1%} |")
    lines.append(f"\nthe model's pick within {WITHIN:.0%} of the measured best: {hits} of {len(PROBLEMS)} problems")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--measure", action="store_true", help="time every candidate on this GPU")
    ap.add_argument("--out", type=Path, default=ROOT / "experiments" / "out")
    args = ap.parse_args(argv)
    if not args.measure:
        print(report(json.loads(DATA.read_text())["rows"]))
        return 0
    todo = cases()
    _precompile([c for _, c in todo])
    rows = []
    for problem, case in todo:
        r = measure(case, 5, 20, 3)
        rows.append({"problem": list(problem), "tag": case.tag, "kernel_ms": r["kernel_ms"], "batch_ms": r["batch_ms"]})
        print(problem, case.tag, f"{r['kernel_ms']:.4f} ms", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "timing_auto.json").write_text(json.dumps({"gpu": "NVIDIA H200", "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
