"""Fit MUFU's interpolator tables to the H200's run-1 measurements, and replay run 1 on the model.

    python -m fa_sim.calibrate.sfu_fit fit DIR [--out fa_sim/isa/mufu_data/mufu_tables.json]
    python -m fa_sim.calibrate.sfu_fit check DIR    (every dumped output and sample against the model)
    python -m fa_sim.calibrate.sfu_fit replay DIR   (the compact replay set of tests/data/h200/)

DIR is a run-1 result directory (sfu_summary.json, sfu_<family>.npz). How the unit works is in
fa_sim/isa/mufu_table.py and experiments/sfu_notes.md; this script only finds the numbers.

Per function, run 1 dumped every output of its fundamental domain (a 23-bit fraction f, two
octaves for rsqrt/sqrt). Each output y confines the unit's fixed-point sum Q(f) at 2^-R to an
interval [lo, hi] (Q is truncated to 24 bits, so y's cell is one ulp wide above y). Per segment s
(the top bits of f) the coefficients must satisfy lo <= C0 + C1 xl + C2 sq(xl) <= hi for every
xl: given (C1, C2) the feasible C0 are [max(lo - P), min(hi - P)], so a small search around the
least-squares estimate of (C1, C2) finds every solution. A design is accepted only if every
segment has exactly one (C1, C2); any C0 in its interval reproduces the whole domain (the lowest
is stored; the interval widths are reported).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..isa import mufu_table as mt
from ..isa.mufu import mul_rz_inv2pi
from .sfu_ops import band
from .sfu_results import load_family, read_dumps

MANT = mt.MASK23
FREE = 1 << 60  # interval bound of a point without data
WINDOW = 3  # coefficient search half-width around the least-squares estimate, in coefficient units


@dataclass(frozen=True)
class Design:
    op: str
    xl_bits: int
    sum_bits: int   # R: Q is in units of 2^-R
    c2_unit: int    # C2 is a multiple of this (in units of 2^-R per squarer unit)


DESIGNS = (Design("ex2", 17, 38, 1), Design("rcp", 16, 39, 1), Design("rsqrt", 17, 40, 2),
           Design("sqrt", 17, 40, 1), Design("lg2", 17, 38, 2), Design("sin", 17, 38, 2))


# ---- outputs -> intervals of Q ----

def cell(v_int: np.ndarray) -> np.ndarray:
    """Width of the truncation cell above each non-negative integer (24 significant bits kept)."""
    return np.int64(1) << np.maximum(mt.bit_length(v_int) - 24, 0)


def scaled(bits: np.ndarray, p: int) -> np.ndarray:
    """|fp32 value| * 2^p as int64 (exact for the outputs used here)."""
    v = np.abs(np.asarray(bits, dtype=np.uint32).view(np.float32).astype(np.float64)) * 2.0**p
    if not np.all(v == np.floor(v)):
        raise ValueError(f"outputs are not multiples of 2^-{p}")
    return v.astype(np.int64)


def widen(lo: np.ndarray, hi: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Interval of a value at 2^-(p+k) whose truncation to 2^-p lies in [lo, hi]."""
    return lo << k, ((hi + 1) << k) - 1


#: (family, op) -> {band: (inputs, outputs)}: the dumped bands of one op, as uint32 bit patterns
Dumps = Callable[[str, str], dict[int, tuple[np.ndarray, np.ndarray]]]


def run1_dumps(d: Path) -> Dumps:
    """The dumps of a run-1 result directory (sfu_<family>.npz)."""
    return lambda family, op: read_dumps(load_family(d / f"sfu_{family}.npz")[op])


def domain_direct(dumps: Dumps, op: str, design: Design) -> tuple[np.ndarray, np.ndarray]:
    """ex2, rcp, rsqrt, sqrt: Q's interval for every point of the domain (rsqrt/sqrt: 2^24 points,
    octave bit first); the output is RZ24(Q) at 2^-R directly."""
    family, ftz, octaves = {"ex2": ("ex2", "ex2_ftz", (0,)), "rcp": ("rcp", "rcp_ftz", (0,)),
                            "rsqrt": ("rsq", "rsqrt_ftz", (0, 1)), "sqrt": ("rsq", "sqrt_ftz", (0, 1))}[op]
    dumps = dumps(family, ftz)
    los, his = [], []
    for octave in octaves:
        _, y = dumps[band(0, octave)]
        # ex2 dumps 2^(1+f) in [2, 4): the unit's 2^f is half of it; the others are read as they are
        v = scaled(y, design.sum_bits - (1 if op == "ex2" else 0))
        lo, hi = v, v + cell(v) - 1
        if op == "rsqrt" and octave == 0:  # x = 1 returns exactly 1.0 (special case, not the table)
            lo[0], hi[0] = -FREE, FREE
        los.append(lo)
        his.append(hi)
    return np.concatenate(los), np.concatenate(his)


def domain_lg2(dumps: Dumps, design: Design) -> tuple[np.ndarray, np.ndarray]:
    """L(m) at 2^-36 confined by x in [1,2) (F = L), [2,4) (F = 2^36 + L) and [0.5,1)
    (F = -2^36 + L, read as its ones' complement), intersected; then widened to 2^-R."""
    dumps = dumps("lg2", "lg2_ftz")
    one = np.int64(1) << 36
    v0 = scaled(dumps[band(0, 0)][1], 36)
    lo, hi = v0.copy(), v0 + cell(v0) - 1
    lo[0], hi[0] = 0, one  # x = 1 returns +0 (special case)
    v1 = scaled(dumps[band(0, 1)][1], 36)
    lo, hi = np.maximum(lo, v1 - one), np.minimum(hi, v1 - one + cell(v1) - 1)
    vm = scaled(dumps[band(0, -1)][1], 36)
    lo, hi = np.maximum(lo, one - 1 - (vm + cell(vm) - 1)), np.minimum(hi, one - 1 - vm)
    if np.any(lo > hi):
        raise ValueError("lg2: the three bands disagree about L(m) (fixed-point hypothesis fails)")
    return widen(lo, hi, design.sum_bits - 36)


def domain_sin(dumps: Dumps, design: Design) -> tuple[np.ndarray, np.ndarray]:
    """S(g) = sin(pi/2 * g/2^23) at 2^-37, from every dumped sin and cos output: t = RZ(x/2pi),
    u = the 25-bit angle, quadrant q = u >> 23, g = f or its ones' complement in odd quadrants."""
    lo = np.full(1 << 23, -FREE, dtype=np.int64)
    hi = np.full(1 << 23, FREE, dtype=np.int64)
    for family, shift in (("sin", 0), ("cos", 1 << 23)):
        for x, y in dumps(family, family + "_ftz").values():
            u = (angle(x) + shift) & ((1 << 25) - 1)
            f = u & MANT
            g = np.where((u >> 23) & 1, MANT - f, f)
            v = scaled(y, 37)
            np.maximum.at(lo, g, v)
            np.minimum.at(hi, g, v + cell(v) - 1)
    if np.any(lo > hi):
        raise ValueError("sin: outputs for one angle disagree (quadrant folding hypothesis fails)")
    return widen(lo, hi, design.sum_bits - 37)


def angle(xbits: np.ndarray) -> np.ndarray:
    """The unit's 25-bit angle for fp32 inputs (non-negative x)."""
    t = mul_rz_inv2pi(np.asarray(xbits, dtype=np.uint32).view(np.float32)).astype(np.float64)
    return np.floor(np.where(np.abs(t) < 2.0**24, np.abs(t), 0.0) * 2.0**25).astype(np.int64)


# ---- the integer search ----

def solve_segment(lo: np.ndarray, hi: np.ndarray, design: Design) -> list[tuple[int, int, int, int]]:
    """Every (C1, C2, C0_lo, C0_hi) within WINDOW units of the least-squares estimate."""
    xl = np.arange(lo.size, dtype=np.int64)
    sq = mt.squarer_table(design.xl_bits)
    ok = (hi - lo) < FREE  # points without data carry no constraint
    a = np.stack([np.ones(ok.sum()), xl[ok], sq[ok]], axis=1).astype(np.float64)
    est = np.linalg.lstsq(a, ((lo[ok] + hi[ok]) / 2.0), rcond=None)[0]
    u2 = design.c2_unit
    out = []
    for c1 in range(int(np.floor(est[1])) - WINDOW, int(np.ceil(est[1])) + WINDOW + 1):
        p1 = c1 * xl
        for k2 in range(int(np.floor(est[2] / u2)) - WINDOW, int(np.ceil(est[2] / u2)) + WINDOW + 1):
            p = p1 + (k2 * u2) * sq
            a0, b0 = (lo - p)[ok].max(), (hi - p)[ok].min()
            if a0 <= b0:
                out.append((c1, k2 * u2, int(a0), int(b0)))
    return out


def domain(dumps: Dumps, design: Design) -> tuple[np.ndarray, np.ndarray]:
    """Q's interval at 2^-R for every point of the design's domain (segment by segment)."""
    if design.op == "lg2":
        return domain_lg2(dumps, design)
    if design.op == "sin":
        return domain_sin(dumps, design)
    return domain_direct(dumps, design.op, design)


def fit(dumps: Dumps, design: Design, log=print) -> dict:
    t0 = time.time()
    lo, hi = domain(dumps, design)
    n = 1 << design.xl_bits
    rows, widths, bad = [], [], []
    for s in range(lo.size // n):
        sols = solve_segment(lo[s * n:(s + 1) * n], hi[s * n:(s + 1) * n], design)
        if len(sols) != 1:
            bad.append((s, len(sols)))
            sols = sols or [(0, 0, 0, 0)]
        c1, c2, c0_lo, c0_hi = sols[0]
        rows.append([c0_lo, c1, c2])
        widths.append(c0_hi - c0_lo + 1)
    log(f"{design.op:6s} {len(rows)} segments, xl {design.xl_bits} bits, Q at 2^-{design.sum_bits}: "
        + (f"NOT UNIQUE in {bad}" if bad else "every segment unique")
        + f"; C0 interval widths {min(widths)}..{max(widths)}; {time.time() - t0:.0f} s")
    return {"xl_bits": design.xl_bits, "sum_bits": design.sum_bits, "c2_unit": design.c2_unit,
            "unique": not bad, "c0_interval_width": widths, "rows": rows}


def cmd_fit(args) -> int:
    out = {"source": f"fa_sim.calibrate.sfu_fit fit {args.dir}: H200 (sm_90) run 1 of fa_sim.calibrate.sfu_probe",
           "formula": "Q = C0 + C1*xl + C2*sq(xl) at 2^-sum_bits; see fa_sim/isa/mufu_table.py",
           "tables": {}}
    ops = args.ops.split(",") if args.ops else [dz.op for dz in DESIGNS]
    if args.ops and args.out.is_file():  # refit a subset: keep the other tables
        out["tables"] = json.loads(args.out.read_text())["tables"]
    for design in DESIGNS:
        if design.op in ops:
            out["tables"][design.op] = fit(run1_dumps(args.dir), design)
    if not all(t["unique"] for t in out["tables"].values()):
        print("some segment has no unique solution: tables not written")
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, separators=(",", ":")) + "\n")
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")
    return 0


def cmd_check(args) -> int:
    from fa_sim.isa import mufu

    models = {"ex2_ftz": (mufu.ex2, True), "ex2": (mufu.ex2, False), "lg2_ftz": (mufu.lg2, True),
              "lg2": (mufu.lg2, False), "rcp_ftz": (mufu.rcp, True), "rcp": (mufu.rcp, False),
              "rsqrt_ftz": (mufu.rsqrt, True), "rsqrt": (mufu.rsqrt, False), "sqrt_ftz": (mufu.sqrt, True),
              "sqrt": (mufu.sqrt, False), "sin_ftz": (mufu.sin, True), "sin": (mufu.sin, False),
              "cos_ftz": (mufu.cos, True), "cos": (mufu.cos, False)}
    bad_total = 0
    for family in ("ex2", "lg2", "rcp", "rsq", "sin", "cos"):
        for op, arrays in load_family(args.dir / f"sfu_{family}.npz").items():
            if op not in models:
                continue
            fn, ftz = models[op]
            pairs = [(arrays["samples_x"], arrays["samples_y"])]
            if "dump_meta" in arrays:
                pairs += list(read_dumps(arrays).values())
            n = bad = 0
            for x, y in pairs:
                got = fn(x.view(np.float32), ftz=ftz).view(np.uint32)
                bad += int(np.count_nonzero(got != y))
                n += x.size
            bad_total += bad
            print(f"{op:10s} {n:>10d} recorded outputs, {bad} differ from the model")
    return 1 if bad_total else 0


REPLAY_PER_BAND = 1536  # dumped outputs per band kept for the CPU replay tests (random positions)
REPLAY_OPS = ("ex2_ftz", "ex2", "lg2_ftz", "lg2", "rcp_ftz", "rcp", "rsqrt_ftz", "rsqrt", "sqrt_ftz", "sqrt",
              "sin_ftz", "sin", "cos_ftz", "cos", "tanh")


def cmd_replay(args) -> int:
    """A compact replay set: every recorded sample (all the edge cases) of every op, plus
    REPLAY_PER_BAND random outputs of each dumped band; inputs delta-coded, outputs as measured."""
    rng = np.random.default_rng(0)
    arrays = {}
    for family in ("ex2", "lg2", "rcp", "rsq", "sin", "cos", "tanh"):
        for op, a in load_family(args.dir / f"sfu_{family}.npz").items():
            if op not in REPLAY_OPS:
                continue
            xs, ys = [a["samples_x"]], [a["samples_y"]]
            for bx, by in (read_dumps(a).values() if "dump_meta" in a else ()):
                k = rng.choice(bx.size, min(bx.size, REPLAY_PER_BAND), replace=False)
                xs.append(bx[k])
                ys.append(by[k])
            x, first = np.unique(np.concatenate(xs), return_index=True)
            arrays[f"{op}__dx"] = np.diff(x.astype(np.int64), prepend=0).astype(np.uint32)
            arrays[f"{op}__y"] = np.concatenate(ys)[first]
    arrays["source"] = np.array("H200 (sm_90) run 1 of fa_sim.calibrate.sfu_probe; fa_sim.calibrate.sfu_fit replay")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **arrays)
    n = sum(v.size for k, v in arrays.items() if k.endswith("__y"))
    print(f"wrote {args.out}: {n} recorded outputs of {len(REPLAY_OPS)} ops, {args.out.stat().st_size} bytes")
    return 0


def load_replay(path: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """op -> (inputs, hardware outputs) as uint32, from a file written by `replay`."""
    with np.load(path) as z:
        ops = sorted({k.split("__")[0] for k in z.files if "__" in k})
        return {op: (np.cumsum(z[f"{op}__dx"], dtype=np.uint64).astype(np.uint32), z[f"{op}__y"]) for op in ops}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fit", help="fit the tables and write them")
    f.add_argument("dir", type=Path)
    f.add_argument("--out", type=Path, default=mt.DATA)
    f.add_argument("--ops", help="comma-separated subset (default: all)")
    c = sub.add_parser("check", help="replay every recorded output of run 1 on the model")
    c.add_argument("dir", type=Path)
    r = sub.add_parser("replay", help="write the compact replay set for the CPU tests")
    r.add_argument("dir", type=Path)
    r.add_argument("--out", type=Path, required=True, help="the .npz to write (tests/data/h200/mufu_replay.npz)")
    args = p.parse_args(argv)
    if not (args.dir / "sfu_summary.json").is_file():
        raise SystemExit(f"{args.dir}: not a run-1 result directory (no sfu_summary.json)")
    return {"fit": cmd_fit, "check": cmd_check, "replay": cmd_replay}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
