"""The timing model's warp stall reasons beside Nsight Compute's, on the recorded profiles (issue 17).

    python experiments/timing_stalls.py                # the 12 kernels of tests/data/h200/timing_ncu.json
    python experiments/timing_stalls.py --only w8      # keys matching a regular expression
    python experiments/timing_stalls.py --json S.json  # the numbers as one JSON object

Nsight Compute's `smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio` and the
model's `Prediction.stalls` are the same quantity: warp-cycles in a state per issued instruction.
Per kernel the GPU's row and the model's; then, per reason, the mean of each over the kernels and
the median of model / GPU. Times can agree while the reasons disagree (the SM parameters are
fitted to times, not to stall reasons): the summary says where the model's SM differs from the
GPU's, which is where an option's sign can come out wrong (docs/timing.md, "Limits").

`dispatch_stall`, which the model does not have, is set beside the GPU's issue activity and
warps active, and beside a candidate cause: register-bank conflicts. The last column is the share of the kernel's dynamic instructions (one CTA of 4
rounds) with two or more source registers in one of the two register banks (register number mod 2;
Jia et al., "Dissecting the NVIDIA Volta GPU Architecture via Microbenchmarking", arXiv:1804.06826)
that the operand reuse cache does not supply (an operand slot whose register the previous
instruction marked for reuse in the same slot; the control bits, fa_sim.timing.sass).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fa_sim.config import KernelConfig  # noqa: E402
from fa_sim.problem import Problem  # noqa: E402
from fa_sim.timing.gpus import H200  # noqa: E402
from fa_sim.timing import predict  # noqa: E402
from fa_sim.timing.predict import kernel_model  # noqa: E402

DATA = ROOT / "tests" / "data" / "h200" / "timing_ncu.json"
REASONS = ("wait", "short_scoreboard", "long_scoreboard", "barrier", "math_pipe_throttle", "mio_throttle",
           "not_selected", "dispatch_stall", "no_instruction")
NCU = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
ISSUE = "smsp__issue_active.avg.pct_of_peak_sustained_active"
WARPS = "sm__warps_active.avg.pct_of_peak_sustained_active"
_REG = re.compile(r"^-?\|?R(\d+)(?:\.\w+)*\|?$")  # a general register operand (RZ excluded)


def problem(key: str) -> Problem:
    """The launch of a profile's key, 'tag/BxHxNqxNkxd/causal|full'."""
    tag, shape, mode = key.split("/")
    b, h, nq, nk, _ = (int(x) for x in shape.split("x"))
    return Problem(b, h, nq, nk, mode == "causal", 1.0, KernelConfig.from_tag(tag))


def _sources(operands: str) -> list[int | None]:
    """The register numbers of an instruction's first three source operands (None: not a register)."""
    ops = [o.strip() for o in operands.split(",")][1:4]
    out = []
    for op in ops:
        m = _REG.match(op)
        out.append(int(m.group(1)) if m else None)
    return out


def bank_conflicted(instrs, controls) -> float:
    """The share of `instrs` (one warp's dynamic SASS) with two or more source registers, not
    supplied by the reuse cache, in one register bank."""
    cached: dict[int, int] = {}  # operand slot -> register the previous instruction kept for reuse
    conflicted = 0
    for ins in instrs:
        regs = _sources(ins.operands)
        banks: dict[int, set] = {}
        for slot, r in enumerate(regs):
            if r is not None and cached.get(slot) != r:
                banks.setdefault(r % 2, set()).add(r)
        conflicted += any(len(rs) >= 2 for rs in banks.values())
        reuse = controls[ins.addr].reuse
        cached = {slot: r for slot, r in enumerate(regs) if r is not None and reuse >> slot & 1}
    return conflicted / max(1, len(instrs))


def compare(only: str = "") -> list[dict]:
    """Per profiled kernel: the GPU's and the model's stall reasons, issue-slot use, bank conflicts."""
    rows = []
    for k in json.loads(DATA.read_text())["kernels"]:
        if only and not re.search(only, k["key"]):
            continue
        prob = problem(k["key"])
        pred = predict(prob, H200.name)
        model = kernel_model(prob.config, prob.causal, H200.arch)
        rows.append({"key": k["key"], "gpu": {r: k[NCU.format(r)] for r in REASONS},
                     "model": {r: pred.stalls.get(r, 0.0) for r in REASONS},
                     "issue_gpu": k[ISSUE] / 100, "issue_model": pred.issue_slots,
                     "warps_active_gpu": k[WARPS] / 100, "warps_active_model": pred.achieved_occupancy,
                     "bank_conflicted": bank_conflicted(model.cta_walk(4), model.controls)})
    return rows


def report(rows: list[dict]) -> str:
    short = [r.replace("_scoreboard", "_sb").replace("_throttle", "_thr").replace("math_pipe", "math")
             for r in REASONS]
    lines = [f"| kernel | | {' | '.join(short)} | issue | bank-conflicted |",
             "|---|---|" + "---|" * (len(REASONS) + 2)]
    for row in rows:
        for side in ("gpu", "model"):
            vals = " | ".join(f"{row[side][r]:.2f}" for r in REASONS)
            first = row["key"] if side == "gpu" else ""
            extra = f"{row['bank_conflicted']:.1%}" if side == "gpu" else ""
            lines.append(f"| {first} | {side} | {vals} | {row['issue_' + side]:.0%} | {extra} |")
    lines += ["", "| reason | GPU mean | model mean | model / GPU, median over kernels |", "|---|---|---|---|"]
    for r in REASONS:
        g = np.array([row["gpu"][r] for row in rows])
        m = np.array([row["model"][r] for row in rows])
        ratio = f"{np.median(m[g > 0] / g[g > 0]):.2f}" if (g > 0).any() else "-"
        lines.append(f"| {r} | {g.mean():.2f} | {m.mean():.2f} | {ratio} |")
    d = np.array([row["gpu"]["dispatch_stall"] for row in rows])
    c = np.array([row["bank_conflicted"] for row in rows])
    if len(rows) > 2:
        lines += ["", (f"dispatch_stall against bank-conflicted instructions over {len(rows)} kernels: correlation "
                       f"{np.corrcoef(d, c)[0, 1]:+.2f} (dispatch_stall {d.min():.2f}-{d.max():.2f} per instruction, "
                       f"conflicts on {c.min():.1%}-{c.max():.1%} of the instructions)")]
        for name, key in (("issue activity", "issue_gpu"), ("warps active", "warps_active_gpu")):
            x = np.array([row[key] for row in rows])
            lines.append(f"dispatch_stall against the GPU's {name} ({x.min():.0%}-{x.max():.0%}): correlation "
                         f"{np.corrcoef(d, x)[0, 1]:+.2f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", metavar="REGEX", help="the kernels whose key matches (default: all)")
    ap.add_argument("--json", type=Path, default=None, metavar="FILE", help="also write the rows here")
    args = ap.parse_args(argv)
    try:
        re.compile(args.only)
    except re.error as exc:
        ap.error(f"--only is not a regular expression: {exc}")
    rows = compare(args.only)
    if not rows:
        ap.error(f"--only {args.only!r} matches none of the {DATA.name} kernels")
    print(report(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
