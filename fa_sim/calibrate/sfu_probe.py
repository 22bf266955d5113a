"""Exhaustive measurement of the H200's special-function unit (MUFU), for a bit-exact model (issue 10).

On the GPU (run 1, measurement):   python -m fa_sim.calibrate.sfu_probe run --out $OUT
On the GPU (run 2, a candidate):   python -m fa_sim.calibrate.sfu_probe verify --model FILE.cu --out $OUT
Anywhere (no GPU):                 python -m fa_sim.calibrate.sfu_probe sass      (compile for sm_90, check SASS)
Anywhere:                          python -m fa_sim.calibrate.sfu_probe show DIR  (table, decode + CRC-check dumps)

Run 1, per fp32 op, over all 2^32 inputs on the device: hw(x) against the correctly rounded value
(from double precision), a histogram of signed ulp differences by sign+exponent band, the first
mismatch of each band, which low input bits ever change the output (per band), structure
hypotheses (sfu_ops.Op.hypotheses), then the outputs of whole bands (adaptive stride, sfu_results)
and 20-45k recorded samples per op with all the edge cases (~440k in all). The 16-bit forms: all
2^16 outputs, the fp32 unit on the same values, and the packed x2 forms against the scalar ones on
all 2^32 inputs. Results: sfu_summary.json and one sfu_<family>.npz per family (8 files; the
families stay within sfu_ops.FAMILY_BUDGET, 61.5 MB in all; dump bands past a budget are left out
lowest priority first and listed); one line per op while it runs, the full table at the end.
Run 2 sweeps the same way against the candidate's `__device__ float model_<op>(float)` functions
and writes sfu_verify.json.
Expected device time: compile ~5-15 s; per op a few 2^32 sweeps of milliseconds to ~0.2 s (the
double-precision sin/cos references are the slowest) plus the dumps' transfer and encoding
(~1-4 s on 16 cores): run 1 about 1-1.5 minutes, run 2 about 20-30 s.

SASS for sm_90 (ptxas 13.0, nvdisasm; `sass` re-checks it): the .ftz forms are the raw unit,
  ex2.approx.ftz.f32   MUFU.EX2            lg2.approx.ftz.f32   MUFU.LG2
  rcp.approx.ftz.f32   MUFU.RCP            rsqrt.approx.ftz.f32 MUFU.RSQ
  sqrt.approx.ftz.f32  MUFU.SQRT           tanh.approx.f32      MUFU.TANH
  sin/cos.approx(.ftz).f32  FMUL.RZ x * 0.15915494 (1/2pi in fp32), then MUFU.SIN / MUFU.COS
and the non-ftz forms wrap the same unit to reach subnormals (P = x >= -126 or |x| >= 2^-126,
unordered compares true, so NaN takes the plain path):
  ex2.approx.f32    FSETP.GEU; @!P FMUL x*0.5; MUFU.EX2; @!P FMUL y*y
  lg2.approx.f32    FSETP.GEU |x|; @!P FMUL x*2^24; MUFU.LG2; @!P FADD y-24
  rsqrt.approx.f32  FSETP.GEU |x|; @!P FMUL x*2^24; MUFU.RSQ; @!P FMUL y*2^12
  sqrt.approx.f32   FSETP.GEU |x|; @!P FMUL x*2^24; MUFU.SQRT; @!P FMUL y*2^-12
  rcp.approx.f32    s = |x| < 2^-126 ? 2^24 : 1, s = |x| > 2^126 ? 0.25 : s; y = s * MUFU.RCP(x*s)
  ex2.approx.f16 / ftz.bf16, tanh.approx.f16 / bf16: MUFU.EX2.F16 / .BF16, MUFU.TANH.F16 / .BF16,
  one per half (the x2 forms issue two).
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import os
import platform
import re
import sys
import time
from pathlib import Path

import numpy as np

from .sfu_ops import (BY_NAME, FAMILIES, FAMILY_BUDGET, HALF_OPS, OPS, band, band_label, program_source,
                      sample_inputs)
from .sfu_results import (FamilyFile, band_inputs, check_summary, class_summary,
                         dump_arrays, dump_stride_log2, encode_band, fit_budget, format_table, ignored_bits,
                         half_compare, half_reference, half_to_f32_bits, load_family, read_dumps, round_to_half,
                         sweep_summary, write_json)

SUMMARY = "sfu_summary.json"
VERIFY = "sfu_verify.json"
RESERVE_OP = 750_000     # bytes a later fp32 op of the same family adds at most (counters 0.3 MB, samples)
RESERVE_HALF = 450_000   # bytes a 16-bit form adds (its 2^16 outputs and the fp32 unit's on them)
N_EXAMPLES = 32


def family_path(out: Path, family: str) -> Path:
    return out / f"sfu_{family}.npz"


def _examples(u: np.ndarray, hw: np.ndarray, exp: np.ndarray) -> list[dict]:
    rows = []
    for a, y, r in zip(u[:N_EXAMPLES].tolist(), hw.tolist(), exp.tolist()):
        x = float(np.uint32(a).view(np.float32))
        rows.append({"band": band_label(a >> 23), "x": f"0x{a:08x}", "x_value": repr(x),
                     "hw": f"0x{y:08x}", "expected": f"0x{r:08x}"})
    return rows


def _sweep_row(dev, op, model: bool) -> tuple[dict, dict]:
    sw = dev.sweep(op.name, model=model)
    ex_u = np.sort(sw.first_bad[sw.first_bad != 0xFFFFFFFF])
    ex_hw, ex_exp = dev.eval(op.name, ex_u, model=model)
    arrays = {"sweep_hist": sw.hist, "sweep_changes": sw.changes, "sweep_dmin": sw.dmin, "sweep_dmax": sw.dmax,
              "sweep_first": sw.first_bad, "ex_u": ex_u, "ex_hw": ex_hw, "ex_expected": ex_exp}
    mism_bands = {band_label(b): int(sw.hist[b].sum() - sw.hist[b, 16] - sw.hist[b, 35])
                  for b in np.flatnonzero(sw.first_bad != 0xFFFFFFFF).tolist()}
    row = {"op": op.name, "ptx": op.ptx, "sass": list(op.sass),
           "sweep": sweep_summary(sw.hist, sw.dmin, sw.dmax), "classes": class_summary(sw.hist),
           "ignored_1_2": dump_stride_log2(sw.changes[band(0, 0)]),
           "ignored_bits": ignored_bits(sw.changes, [band(s, e) for s in (0, 1) for e in range(-3, 4)]),
           "mismatch_by_band": mism_bands, "examples": _examples(ex_u, ex_hw, ex_exp)}
    return row, arrays


def _encoded_bands(dev, op, changes: np.ndarray, pool, lookahead: int):
    """Encoded dump bands in priority order; at most `lookahead` evaluated ahead of the consumer."""
    pending = collections.deque()
    for b in op.dump:
        s = dump_stride_log2(changes[b])
        bits, _ = dev.eval(op.name, band_inputs(b, s), expected=False)
        pending.append(pool.submit(encode_band, b, s, bits))
        if len(pending) >= lookahead:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


def _dumps(dev, op, changes: np.ndarray, budget: int) -> tuple[dict, list[dict], list[str]]:
    """Outputs of the op's dump bands at their lossless stride, encoded in parallel, cut to budget."""
    workers = os.cpu_count() or 4
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        bands = _encoded_bands(dev, op, changes, pool, workers)
        kept = fit_budget(bands, budget)
        bands.close()  # stop evaluating; jobs already submitted finish with the pool
    meta = [{"band": band_label(e.band), "stride_log2": e.stride_log2, "count": e.count, "bytes": e.nbytes,
             "escapes": e.n_escapes} for e in kept]
    return dump_arrays(kept), meta, [band_label(b) for b in op.dump[len(kept):]]


def _stage(row: dict, name: str, fn) -> None:
    """Run one stage of an op; a failure is recorded in the row and the later stages still run."""
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - one stage failing must not lose the others
        row.setdefault("stage_errors", {})[name] = f"{type(exc).__name__}: {exc}"


def probe_op(dev, op, fam: FamilyFile, reserve: int, sharers: int = 1) -> dict:
    """Run 1 for one op; its arrays go to `fam` as soon as each stage has them. Its dumps get
    1/sharers of what the family budget leaves after `reserve` bytes for the family's later ops."""
    t0 = time.time()
    row, arrays = _sweep_row(dev, op, model=False)
    fam.put(op.name, arrays)

    def check():
        ck = dev.check(op.name)
        fam.put(op.name, {"check_mism": ck.mism, "check_appl": ck.appl, "check_first": ck.first})
        row["checks"] = check_summary(op.hypotheses, ck.mism, ck.appl, ck.first)

    def samples():
        x = sample_inputs(op)
        y, _ = dev.eval(op.name, x, expected=False)
        fam.put(op.name, {"samples_x": x, "samples_y": y})
        row["samples"] = int(x.size)

    def dumps():
        budget = (FAMILY_BUDGET[op.family] - fam.used() - reserve) // sharers
        arrays, row["dumps"], row["dumps_dropped"] = _dumps(dev, op, fam.arrays[f"{op.name}__sweep_changes"], budget)
        fam.put(op.name, arrays)

    _stage(row, "check", check)
    _stage(row, "samples", samples)
    if op.dump:
        _stage(row, "dumps", dumps)
    row["seconds"] = time.time() - t0
    return row


def probe_half(dev, h, fam: FamilyFile) -> dict:
    """All 2^16 outputs of a 16-bit form, the fp32 unit on the same values, the x2 form against them."""
    t0 = time.time()
    table = dev.half_all(h.name)
    x2_bad, x2_first = dev.half_x2(h.name, table)
    u = np.arange(65536, dtype=np.uint16)
    y32, _ = dev.eval(h.f32_op, half_to_f32_bits(h, u), expected=False)
    fam.put(h.name, {"table": table, "f32_outputs": y32})
    return {"op": h.name, "ptx": h.ptx, "sass": h.sass, "inputs": 65536,
            "vs_correctly_rounded": half_compare(h, table, half_reference(h, u)),
            "f32_op": h.f32_op, "vs_f32_rounded": half_compare(h, table, round_to_half(h, y32)),
            "x2_mismatches": x2_bad, "x2_first": None if x2_bad == 0 else f"0x{x2_first:08x}",
            "seconds": time.time() - t0}


def _environment(dev) -> dict:
    env = {"device": getattr(dev, "device_name", "?"), "arch": getattr(dev, "arch", "?"),
           "host": platform.node(), "time": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "numpy": np.__version__}
    try:
        import cuda.core
        env["cuda.core"] = cuda.core.__version__
        from cuda.bindings import nvrtc
        env["nvrtc"] = ".".join(map(str, nvrtc.nvrtcVersion()[1:]))
    except Exception as exc:  # noqa: BLE001 - environment notes are best effort
        env["versions_error"] = repr(exc)
    return env


def _sass_check(cubin: bytes) -> dict:
    """Which ops compiled to the SASS recorded in sfu_ops (on the device: its own ptxas)."""
    from .sfu_device import op_sass, sass_by_kernel

    kernels = sass_by_kernel(cubin)
    out = {op.name: list(op_sass(kernels.get("sass_" + op.name, []))) for op in OPS}
    out.update({h.name: list(op_sass(kernels.get("half_all_" + h.name, []))) for h in HALF_OPS})
    return out


def run_probe(dev, out: Path, ops, halves, log=print) -> list[dict]:
    """Run 1 on `dev`; writes sfu_summary.json and the family files under `out`, returns the rows."""
    out.mkdir(parents=True, exist_ok=True)
    summary = {"environment": _environment(dev), "ops": [], "half_ops": []}
    try:
        summary["sass"] = _sass_check(dev.cubin)
    except Exception as exc:  # noqa: BLE001 - nvdisasm may be missing on the device; not fatal
        summary["sass"] = {"error": repr(exc)}
    families = {f: FamilyFile(family_path(out, f)) for f in FAMILIES}
    log(format_table([]).splitlines()[0])
    for i, op in enumerate(ops):
        rest = [o for o in ops[i:] if o.family == op.family]
        reserve = RESERVE_OP * (len(rest) - 1) + RESERVE_HALF * sum(h.family == op.family for h in halves)
        sharers = max(1, sum(bool(o.dump) for o in rest))  # the family's dumping ops share its budget
        try:
            row = probe_op(dev, op, families[op.family], reserve, sharers)
        except Exception as exc:  # noqa: BLE001 - one op failing must not lose the others
            row = {"op": op.name, "error": f"{type(exc).__name__}: {exc}"}
        summary["ops"].append(row)
        write_json(out / SUMMARY, summary)
        log(format_table([row]).splitlines()[-1])
    for h in halves:
        try:
            row = probe_half(dev, h, families[h.family])
        except Exception as exc:  # noqa: BLE001
            row = {"op": h.name, "error": f"{type(exc).__name__}: {exc}"}
        summary["half_ops"].append(row)
        write_json(out / SUMMARY, summary)
    return summary["ops"] + summary["half_ops"]


def verify_model(dev, out: Path, ops, log=print) -> list[dict]:
    """Run 2: every input of every op the model defines, hw against the model, bit for bit."""
    out.mkdir(parents=True, exist_ok=True)
    result = {"environment": _environment(dev), "ops": []}
    for op in ops:
        t0 = time.time()
        try:
            row, _ = _sweep_row(dev, op, model=True)
            row["mismatches"] = row["sweep"]["total"] - row["sweep"]["exact"]
            row["seconds"] = time.time() - t0
        except Exception as exc:  # noqa: BLE001
            row = {"op": op.name, "error": f"{type(exc).__name__}: {exc}"}
        result["ops"].append(row)
        write_json(out / VERIFY, result)
        log(format_table([row]).splitlines()[-1])
    return result["ops"]


# ---- command line ----

def _report(rows: list[dict], halves: list[dict]) -> str:
    lines = ["", format_table(rows), ""]
    for r in rows:
        for c in r.get("checks", []):
            lines.append(f"  {r['op']:10s} {c['hypothesis']:44s} {c['mismatches']:>11d} / {c['applicable']:<11d}"
                         f" first {c['first_mismatch']}")
        if r.get("dumps_dropped"):
            d = r["dumps_dropped"]
            lines.append(f"  {r['op']:10s} {len(r['dumps'])} bands dumped; {len(d)} left out by the budget, from {d[0]}")
        for stage, err in r.get("stage_errors", {}).items():
            lines.append(f"  {r['op']:10s} {stage} FAILED: {err}")
    for h in halves:
        if "error" in h:
            lines.append(f"{h['op']:11s} FAILED: {h['error']}")
            continue
        cr, f32 = h["vs_correctly_rounded"], h["vs_f32_rounded"]
        lines.append(f"{h['op']:11s} 2^16 inputs: {cr['exact']} = CR, {cr['abs_d_le_1']} within 1 ulp, max |d| "
                     f"{cr['max_abs_d']}; {f32['exact']} = {h['f32_op']} rounded; x2: {h['x2_mismatches']} mismatches")
    return "\n".join(lines)


def _select(names: str | None) -> list:
    if not names:
        return list(OPS)
    unknown = [n for n in names.split(",") if n not in BY_NAME]
    if unknown:
        raise SystemExit(f"unknown op(s) {', '.join(unknown)}; choose from {', '.join(BY_NAME)}")
    return [BY_NAME[n] for n in names.split(",")]


def _out_dir(path: Path) -> Path:
    if path.exists() and not path.is_dir():
        raise SystemExit(f"--out {path} is a file; give a directory (created if missing)")
    path.mkdir(parents=True, exist_ok=True)
    if not os.access(path, os.W_OK):
        raise SystemExit(f"--out {path} is not writable")
    return path


def _backend(source: str):
    from .sfu_device import CudaBackend

    t0 = time.time()
    dev = CudaBackend(source)
    print(f"{dev.device_name} ({dev.arch}): program compiled and loaded in {time.time() - t0:.1f} s", flush=True)
    return dev


def cmd_run(args) -> int:
    out, ops = _out_dir(args.out), _select(args.ops)
    halves = [] if args.ops else list(HALF_OPS)
    dev = _backend(program_source())
    rows = run_probe(dev, out, ops, halves, log=lambda s: print(s, flush=True))
    print(_report([r for r in rows if r["op"] in BY_NAME], [r for r in rows if r["op"] not in BY_NAME]))
    return 0 if all("error" not in r and "stage_errors" not in r for r in rows) else 1


MODEL_FN = re.compile(r"__device__[^;{()]*\bmodel_(\w+)\s*\(")


def cmd_verify(args) -> int:
    if not args.model.is_file():
        raise SystemExit(f"--model {args.model}: no such file (a .cu defining __device__ float model_<op>(float))")
    src = args.model.read_text()
    defined = [n for n in MODEL_FN.findall(src) if n in BY_NAME]
    ops = [op for op in _select(args.ops) if op.name in defined]
    if not ops:
        raise SystemExit(f"{args.model} defines no model_<op> for the ops asked; known ops: {', '.join(BY_NAME)}")
    out = _out_dir(args.out)
    dev = _backend(program_source(model_source=src, model_ops=ops))
    rows = verify_model(dev, out, ops, log=lambda s: print(s, flush=True))
    print(_report(rows, []))
    for r in rows:
        print(f"{r['op']:11s} " + ("FAILED" if "error" in r else f"{r['mismatches']} mismatches of 2^32"))
    return 0 if all(r.get("mismatches", 1) == 0 for r in rows) else 1


def cmd_sass(args) -> int:
    from .sfu_device import compile_cubin

    t0 = time.time()
    got = _sass_check(compile_cubin(program_source(), args.arch))
    print(f"compiled for {args.arch} in {time.time() - t0:.1f} s")
    want = {op.name: list(op.sass) for op in OPS} | {h.name: [h.sass] for h in HALF_OPS}
    bad = 0
    for name, seq in got.items():
        ok = seq == want[name]
        bad += not ok
        print(f"  {'ok ' if ok else 'BAD'} {name:10s} {' '.join(seq)}" + ("" if ok else f"   (expected {' '.join(want[name])})"))
    return 1 if bad else 0


def cmd_show(args) -> int:
    path = args.dir / SUMMARY
    if not path.is_file():
        raise SystemExit(f"{path}: not found (the output of `run --out {args.dir}`)")
    summary = json.loads(path.read_text())
    print(json.dumps(summary["environment"]))
    print(_report(summary["ops"], summary.get("half_ops", [])))
    for fam in FAMILIES:
        p = family_path(args.dir, fam)
        if not p.is_file():
            print(f"{p.name}: missing")
            continue
        for op, arrays in load_family(p).items():
            if "dump_meta" in arrays:
                dumps = read_dumps(arrays)
                print(f"{p.name} {op}: {len(dumps)} dumped bands, {sum(v[1].size for v in dumps.values())} outputs, CRC ok")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run 1 on the GPU: measure every op")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--ops", help="comma-separated subset (default: all, plus the 16-bit forms)")
    v = sub.add_parser("verify", help="run 2 on the GPU: a candidate model against the hardware")
    v.add_argument("--model", type=Path, required=True)
    v.add_argument("--out", type=Path, required=True)
    v.add_argument("--ops", help="comma-separated subset of the ops the model defines")
    s = sub.add_parser("sass", help="compile for an arch (no GPU needed) and check each op's SASS")
    s.add_argument("--arch", default="sm_90")
    w = sub.add_parser("show", help="print a run's table and check its dumps decode")
    w.add_argument("dir", type=Path)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return {"run": cmd_run, "verify": cmd_verify, "sass": cmd_sass, "show": cmd_show}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
