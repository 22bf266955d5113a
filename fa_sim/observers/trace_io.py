"""Trace archives (manifest JSON + npz arrays) and Chrome/Perfetto trace-event export.

Archive format `flashsim-trace` version 1 (traces/README.md): a directory holding
`manifest.json` (launch, filter, one entry per record and checkpoint: the typed scalar fields)
and `arrays.npz` (every array of every record, keyed `r{seq}.{field}` / `c{index}.{field}`).
Register arrays are keyed by position (`r{seq}.in{i}`, `r{seq}.out{i}`); their names and dtypes
live in the manifest, so no register name has to be a valid file name.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from ..events import Checkpoint, Op, Phase, Site, Tensor, Tile, decode_f16x2
from .trace import CheckpointRecord, GmemRecord, SmemRecord, Trace, TraceFilter, TraceRecord

FORMAT = "flashsim-trace"
VERSION = 1
SMEM_ARRAYS = ("addr", "mask", "row", "col", "elem_row", "elem_col")
GMEM_ARRAYS = ("row", "col", "mask")


def _record_manifest(rec: TraceRecord, arrays: dict) -> dict:
    key = f"r{rec.seq}"
    arrays[f"{key}.cta"], arrays[f"{key}.active"] = rec.cta, rec.active
    entry = {"seq": rec.seq, "op": rec.op.name, "phase": rec.phase.name, "round": rec.round, "pc": rec.pc,
             "ptx": rec.ptx, "label": rec.label, "repeat": rec.repeat, "wait_n": rec.wait_n,
             "site": None if rec.site is None else rec.site.name, "smem": None, "gmem": None,
             "regs_in": list(rec.regs_in), "regs_out": list(rec.regs_out), "shfl": rec.shfl_src is not None}
    if rec.smem is not None:
        entry["smem"] = {"write": rec.smem.write, "width": rec.smem.width, "tile": rec.smem.tile.name}
        arrays.update({f"{key}.smem.{f}": getattr(rec.smem, f) for f in SMEM_ARRAYS})
    if rec.gmem is not None:
        entry["gmem"] = {"write": rec.gmem.write, "width": rec.gmem.width, "tensor": rec.gmem.tensor.name}
        arrays.update({f"{key}.gmem.{f}": getattr(rec.gmem, f) for f in GMEM_ARRAYS})
    for side, regs in (("in", rec.regs_in), ("out", rec.regs_out)):
        arrays.update({f"{key}.{side}{i}": v for i, v in enumerate(regs.values())})
    if rec.shfl_src is not None:
        arrays[f"{key}.shfl_src"] = rec.shfl_src
    return entry


def save_trace(trace: Trace, path: str | Path) -> Path:
    """Write the archive directory `path` (created if needed); returns it."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    arrays: dict = {"threads": trace.threads}
    records = [_record_manifest(r, arrays) for r in trace.records]
    checkpoints = []
    for i, ck in enumerate(trace.checkpoints):
        checkpoints.append({"checkpoint": ck.checkpoint.name, "round": ck.round})
        arrays[f"c{i}.cta"], arrays[f"c{i}.values"] = ck.cta, ck.values
    manifest = {"format": FORMAT, "version": VERSION, "launch": trace.launch,
                "filter": trace.filter.to_json(), "records": records, "checkpoints": checkpoints}
    (path / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    np.savez_compressed(path / "arrays.npz", **arrays)
    return path


def _load_record(entry: dict, a) -> TraceRecord:
    key = f"r{entry['seq']}"
    smem = gmem = None
    if entry["smem"] is not None:
        s = entry["smem"]
        smem = SmemRecord(s["write"], s["width"], Tile[s["tile"]], *(a[f"{key}.smem.{f}"] for f in SMEM_ARRAYS))
    if entry["gmem"] is not None:
        g = entry["gmem"]
        gmem = GmemRecord(g["write"], Tensor[g["tensor"]], g["width"], *(a[f"{key}.gmem.{f}"] for f in GMEM_ARRAYS))
    regs = {side: {n: a[f"{key}.{side}{i}"] for i, n in enumerate(entry[f"regs_{side}"])} for side in ("in", "out")}
    return TraceRecord(entry["seq"], Op[entry["op"]], Phase[entry["phase"]], entry["round"], entry["pc"],
                       entry["ptx"], entry["label"], entry["repeat"], a[f"{key}.cta"], a[f"{key}.active"],
                       smem=smem, gmem=gmem, regs_in=regs["in"], regs_out=regs["out"],
                       shfl_src=a[f"{key}.shfl_src"] if entry["shfl"] else None, wait_n=entry["wait_n"],
                       site=None if entry["site"] is None else Site[entry["site"]])


def load_trace(path: str | Path) -> Trace:
    """Read an archive written by save_trace; refuses other formats and newer versions."""
    path = Path(path)
    manifest = json.loads((path / "manifest.json").read_text())
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise ValueError(f"{path}: not a {FORMAT} v{VERSION} archive "
                         f"(found {manifest.get('format')!r} v{manifest.get('version')!r})")
    with np.load(path / "arrays.npz") as npz:
        a = {k: npz[k] for k in npz.files}
    records = tuple(_load_record(e, a) for e in manifest["records"])
    checkpoints = tuple(CheckpointRecord(Checkpoint[c["checkpoint"]], c["round"], a[f"c{i}.cta"], a[f"c{i}.values"])
                        for i, c in enumerate(manifest["checkpoints"]))
    return Trace(manifest["launch"], TraceFilter.from_json(manifest["filter"]), a["threads"], records, checkpoints)


# -- values as JSON --------------------------------------------------------------------------------
def reg_values(words: np.ndarray) -> np.ndarray:
    """A register array [..., k] as numbers: uint32 words are f16x2 pairs ([..., 2k] fp16),
    float32 stays fp32, integers and predicates stay as they are."""
    words = np.asarray(words)
    if words.dtype == np.uint32:
        return decode_f16x2(words)
    return words


def json_number(x):
    """A JSON-safe scalar: non-finite floats become the strings 'inf', '-inf', 'nan'."""
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    x = float(x)
    return x if math.isfinite(x) else str(x)


def json_list(a) -> list:
    return [json_number(v) for v in np.asarray(a).reshape(-1).tolist()]


def lane_args(rec: TraceRecord, r: int, c: int, s: int) -> dict:
    """Everything one lane did in instruction r of a record, as JSON values."""
    out: dict = {"active": bool(rec.active[c, s])}
    if rec.smem is not None:
        sm = rec.smem
        out["smem"] = {"tile": sm.tile.value, "addr": int(sm.addr[r, c, s]), "bank": int(sm.bank[r, c, s]),
                       "row": int(sm.row[r, c, s]), "col": int(sm.col[r, c, s]), "on": bool(sm.mask[r, c, s]),
                       "elements": np.stack([sm.elem_row[r, c, s], sm.elem_col[r, c, s]], -1).tolist()}
    if rec.gmem is not None:
        g = rec.gmem
        out["gmem"] = {"tensor": g.tensor.value, "row": int(g.row[r, c, s]), "col": int(g.col[r, c, s]),
                       "on": bool(g.mask[r, c, s])}
    for side, regs in (("in", rec.regs_in), ("out", rec.regs_out)):
        if regs:
            out[side] = {k: json_list(reg_values(v[r, c, s])) for k, v in regs.items()}
    if rec.shfl_src is not None:
        out["shfl_src"] = int(rec.shfl_src[r, c, s])
    return out


def to_perfetto(trace: Trace) -> dict:
    """Chrome trace-event JSON: one process per CTA, one track (tid) per warp, every instruction a
    1-unit slice at its program-order position, args holding each traced lane's values."""
    warps = trace.threads // 32
    ctas = sorted({int(c) for rec in trace.records for c in rec.cta})
    events = [{"ph": "M", "name": "process_name", "pid": c, "args": {"name": f"CTA {c}"}} for c in ctas]
    events += [{"ph": "M", "name": "thread_name", "pid": c, "tid": int(w), "args": {"name": f"warp {w}"}}
               for c in ctas for w in np.unique(warps)]
    step = 0
    for rec in trace.records:
        for r in range(rec.repeat):
            for ci, cta in enumerate(rec.cta.tolist()):
                for w in np.unique(warps[rec.active[ci]]):
                    lanes = np.nonzero(warps == w)[0]
                    args = {"ptx": rec.ptx, "pc": rec.pc, "round": rec.round, "instr": r,
                            "lanes": {f"lane {int(trace.threads[s]) % 32}": lane_args(rec, r, ci, s) for s in lanes}}
                    events.append({"name": rec.label, "cat": rec.phase.value, "ph": "X", "ts": step, "dur": 1,
                                   "pid": int(cta), "tid": int(w), "args": args})
            step += 1
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"format": FORMAT, "version": VERSION, "launch": trace.launch}}


def save_perfetto(trace: Trace, path: str | Path) -> Path:
    path = Path(path)
    path.write_text(json.dumps(to_perfetto(trace)))
    return path
