"""The inputs that pin every coefficient of the MUFU tables, and the unit's outputs there.

    python -m fa_sim.calibrate.sfu_binding record --out FILE   (GPU: the unit's outputs; the file
                                                               tests/data/h200/mufu_binding.npz)
    python -m fa_sim.calibrate.sfu_binding model --out FILE    (no GPU: the model's outputs, marked
                                                               as such in the file)
    python -m fa_sim.calibrate.sfu_binding inputs              (no GPU: how many inputs per op)

The fit (sfu_fit) keeps a segment's (C1, C2) because it alone leaves C0 a non-empty interval
[max(lo - P), min(hi - P)] over the segment's points (P = C1 xl + C2 sq(xl)), and stores the
lowest C0. The points where that max and that min are reached bind the coefficients, and a
random replay sample rarely hits them (one unit of ex2's C0[16] changes 4 of the segment's
131,072 outputs in [1, 2)). Per segment this module takes them for the stored (C1, C2), which
pins C0 from below and above, and for each neighbour (C1 + d, C2) and (C1, C2 + d), d = +-1,
+-2, +-3 and +-2^k: a neighbour leaves the stored C0 no room, so C0 lies below the neighbour's
max (the changed model leaves the output's cell at the arg-max) or above its min (at the
arg-min). With the unit's outputs at those inputs, a change of any one coefficient changes a
replayed output, unless it changes no output at all (C0 moved within its interval).

The intervals come from the model's outputs on the fit's own domains, read by the fit's domain
code: the model equals the H200 on all 2^32 inputs of every op (experiments/sfu_verify_h200.txt).
The replay test (tests/test_mufu_binding.py) compares the model with the recorded outputs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from ..isa import mufu
from ..isa import mufu_table as mt
from .sfu_fit import DESIGNS, FREE, Design, domain
from .sfu_ops import BY_NAME, band, program_source
from .sfu_results import band_inputs

#: the raw unit's op (ftz form) whose outputs read each table
UNIT_OP = {"ex2": "ex2_ftz", "rcp": "rcp_ftz", "rsqrt": "rsqrt_ftz", "sqrt": "sqrt_ftz", "lg2": "lg2_ftz",
           "sin": "sin_ftz"}
#: exponents of the positive bands that make each op's domain (sfu_fit.domain_direct, domain_lg2)
DOMAIN_BANDS = {"ex2_ftz": (0,), "rcp_ftz": (0,), "rsqrt_ftz": (0, 1), "sqrt_ftz": (0, 1), "lg2_ftz": (0, 1, -1)}
SMALL_STEPS = (1, 2, 3)
FORMAT = 1


def unit(op: str, x: np.ndarray) -> np.ndarray:
    """The model's outputs of one ftz op on uint32 bit patterns."""
    fn = getattr(mufu, op.removesuffix("_ftz"))
    return fn(np.asarray(x, np.uint32).view(np.float32), ftz=True).view(np.uint32)


def sin_inputs() -> np.ndarray:
    """One fp32 input per angle g in [0, 2^23) of the first quadrant: x[g] has the unit's
    25-bit angle floor(RZ(x / 2pi) 2^25) = g (x < pi/2, where x's ulp is finer than an angle step)."""
    g = np.arange(1 << mt.FRAC_BITS, dtype=np.int64)
    inv = np.float64(np.float32(0.15915494))
    x = ((g + 0.5) * 2.0**-25 / inv).astype(np.float32)
    for _ in range(8):  # a few ulps either way settle the last points
        got = _angle(x)
        if np.array_equal(got, g):
            return x.view(np.uint32)
        x = np.where(got < g, np.nextafter(x, np.float32(4)), np.where(got > g, np.nextafter(x, np.float32(0)), x))
    raise RuntimeError("sin_inputs: no fp32 input found for some angles")


def _angle(x: np.ndarray) -> np.ndarray:
    t = mufu.mul_rz_inv2pi(x).astype(np.float64)
    return np.floor(t * 2.0**25).astype(np.int64)


def model_dumps(family: str, op: str) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """sfu_fit.Dumps from the model: every input of each band the fit reads (sin: one input per angle)."""
    if op == "sin_ftz":
        x = sin_inputs()
        return {band(0, 0): (x, unit(op, x))}
    if op == "cos_ftz":
        return {}
    out = {}
    for e in DOMAIN_BANDS[op]:
        x = band_inputs(band(0, e), 0)
        out[band(0, e)] = (x, unit(op, x))
    return out


def domain_inputs(design: Design) -> np.ndarray:
    """[domain points, k] uint32: the inputs whose outputs confine Q at each point of the domain."""
    if design.op == "sin":
        return sin_inputs()[:, None]
    f = np.arange(1 << mt.FRAC_BITS, dtype=np.uint32)
    cols = [(np.uint32(band(0, e)) << np.uint32(23)) | f for e in DOMAIN_BANDS[UNIT_OP[design.op]]]
    if design.op == "lg2":  # one point L(m), read in three bands
        return np.stack(cols, axis=1)
    return np.concatenate(cols)[:, None]  # rsqrt, sqrt: the octaves one after the other


def segments(design: Design, x: np.ndarray) -> np.ndarray:
    """The table row (segment) each input of the design's unit op reads, for inputs of its domain."""
    u = np.asarray(x, np.uint32).astype(np.int64)
    if design.op == "sin":
        return _angle(np.asarray(x, np.uint32).view(np.float32)) >> design.xl_bits
    bank = ((u >> 23) - 127) & 1 if design.op in ("rsqrt", "sqrt") else 0  # the octave's bank of rows
    return (bank << (mt.FRAC_BITS - design.xl_bits)) + ((u & mt.MASK23) >> design.xl_bits)


def steps(magnitude: int) -> np.ndarray:
    """Coefficient changes tried: +-1, +-2, +-3 and +-2^k up to twice the coefficient's size."""
    pos = sorted(set(SMALL_STEPS) | {1 << k for k in range(2, max(int(abs(magnitude)).bit_length(), 2) + 2)})
    return np.array(pos + [-d for d in pos], dtype=np.int64)


def binding_points(lo: np.ndarray, hi: np.ndarray, design: Design, row) -> np.ndarray:
    """Indices into one segment's points: the arg-max of lo - P and the arg-min of hi - P for the
    stored (C1, C2) and each single-coefficient neighbour (solve_segment's search, at its extremes)."""
    c0, c1, c2 = (int(v) for v in row)
    xl = np.arange(lo.size, dtype=np.int64)
    sq = mt.squarer_table(design.xl_bits)[:lo.size]
    ok = np.flatnonzero((hi - lo) < FREE)  # points without data carry no constraint
    p = c1 * xl[ok] + c2 * sq[ok]
    a, b = lo[ok] - p, hi[ok] - p
    if not a.max() <= c0 <= b.min():
        raise ValueError(f"{design.op}: stored C0 {c0} is outside its interval [{a.max()}, {b.min()}]")
    picks = [np.argmax(a), np.argmin(b)]
    for var, coef in ((xl[ok], c1), (sq[ok], c2)):
        d = steps(coef)[:, None]
        picks += list(np.argmax(a[None, :] - d * var[None, :], axis=1))
        picks += list(np.argmin(b[None, :] - d * var[None, :], axis=1))
    return np.unique(ok[np.array(picks)])


def design_inputs(design: Design, table: mt.Table) -> np.ndarray:
    """Sorted unique inputs of the design's unit op that pin every row of its table."""
    lo, hi = domain(model_dumps, design)
    n = 1 << design.xl_bits
    points = [s * n + binding_points(lo[s * n:(s + 1) * n], hi[s * n:(s + 1) * n], design, row)
              for s, row in enumerate(table.rows())]
    return np.unique(domain_inputs(design)[np.concatenate(points)].ravel())


def binding_inputs(log=None) -> dict[str, np.ndarray]:
    """Unit op -> its binding inputs (uint32), for every table."""
    tables, out = mt.tables(), {}
    for design in DESIGNS:
        t0 = time.time()
        out[UNIT_OP[design.op]] = design_inputs(design, tables[design.op])
        if log:
            log(f"{UNIT_OP[design.op]:10s} {out[UNIT_OP[design.op]].size:6d} inputs for "
                f"{len(tables[design.op].c0)} segments ({time.time() - t0:.1f} s)")
    return out


def save(path: Path, inputs: dict, outputs: dict, origin: str, source: str) -> None:
    arrays = {f"{op}__x": x for op, x in inputs.items()} | {f"{op}__y": outputs[op] for op in inputs}
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, format=np.int64(FORMAT), origin=np.array(origin), source=np.array(source), **arrays)
    print(f"wrote {path}: {sum(x.size for x in inputs.values())} inputs of {len(inputs)} ops ({origin})")


def load(path: Path) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], str]:
    """op -> (inputs, outputs) as uint32, and the file's origin ("model" or the device's name)."""
    with np.load(path) as z:
        if int(z["format"]) != FORMAT:
            raise ValueError(f"{path}: format {int(z['format'])}, expected {FORMAT}")
        ops = sorted({k.split("__")[0] for k in z.files if "__" in k})
        return {op: (z[f"{op}__x"], z[f"{op}__y"]) for op in ops}, str(z["origin"])


def cmd_record(args) -> int:
    from .sfu_device import CudaBackend

    inputs = binding_inputs(log=print)
    dev = CudaBackend(program_source(ops=[BY_NAME[op] for op in inputs], half_ops=()))
    outputs = {op: dev.eval(op, x, expected=False)[0] for op, x in inputs.items()}
    for op, x in inputs.items():
        print(f"{op:10s} {np.count_nonzero(outputs[op] != unit(op, x))} of {x.size} differ from the model")
    save(args.out, inputs, outputs, f"{dev.device_name} ({dev.arch})",
         "python -m fa_sim.calibrate.sfu_binding record: the unit's outputs at the binding inputs")
    return 0


def cmd_model(args) -> int:
    inputs = binding_inputs(log=print)
    save(args.out, inputs, {op: unit(op, x) for op, x in inputs.items()}, "model",
         "GENERATED FROM THE MODEL (fa_sim.isa.mufu), not measured: python -m fa_sim.calibrate.sfu_binding model; "
         "the GPU recording replaces it (python -m fa_sim.calibrate.sfu_binding record)")
    return 0


def cmd_inputs(args) -> int:
    binding_inputs(log=print)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name, text in (("record", "the GPU's outputs at the binding inputs"),
                       ("model", "the model's outputs at the binding inputs (no GPU; marked as the model's)")):
        c = sub.add_parser(name, help=text)
        c.add_argument("--out", type=Path, required=True, help="the .npz to write")
    sub.add_parser("inputs", help="compute the binding inputs and count them")
    args = p.parse_args(argv)
    return {"record": cmd_record, "model": cmd_model, "inputs": cmd_inputs}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
