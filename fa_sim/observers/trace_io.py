"""Trace archives (manifest JSON + npz arrays) and Chrome/Perfetto trace-event export.

Archive format `flashsim-trace` version 2 (traces/README.md): a directory holding
`manifest.json` (launch, filter, one entry per record and checkpoint: the typed scalar fields)
and `arrays.npz` (every array of every record, keyed `r{seq}.{field}` / `c{index}.{field}`).
Register arrays are keyed by position (`r{seq}.in{i}`, `r{seq}.out{i}`); their names and dtypes
live in the manifest, so no register name has to be a valid file name. Version 1 archives (phase,
tile and tensor as enum names, no addresses on the global side, no source lines) still load.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from ..checkpoints import Checkpoint
from ..events import GmemAccess, Op, SourceLoc, decode_f16x2
from .trace import CheckpointRecord, SmemRecord, Trace, TraceFilter, TraceRecord

FORMAT = "flashsim-trace"
VERSION = 2
READABLE = (1, 2)
SMEM_ARRAYS = ("addr", "mask", "row", "col", "elem_row", "elem_col")
GMEM_ARRAYS = ("addr", "row", "col", "mask")
# Version 1 wrote enum names; their values are what events carry now.
V1_PHASES = {"Q_LOAD": "Q load", "K_LOAD": "K load", "V_LOAD": "V load", "QK": "QK", "MASK": "mask",
             "SOFTMAX": "softmax", "PV": "PV", "EPILOGUE": "epilogue"}
V1_NAMES = {"SQ": "sQ", "SK": "sK", "SV": "sV", "SO": "sO"}


def _src_json(src: SourceLoc | None):
    if src is None:
        return None
    return {"file": src.file, "line": src.line, "col": src.col, "function": src.function,
            "inlined_at": [list(x) for x in src.inlined_at]}


def _src_load(d) -> SourceLoc | None:
    if d is None:
        return None
    return SourceLoc(d["file"], d["line"], d["col"], d["function"], tuple(tuple(x) for x in d["inlined_at"]))


def _record_manifest(rec: TraceRecord, arrays: dict) -> dict:
    key = f"r{rec.seq}"
    arrays[f"{key}.cta"], arrays[f"{key}.active"] = rec.cta, rec.active
    entry = {"seq": rec.seq, "op": rec.op.name, "phase": str(rec.phase), "round": rec.round, "pc": rec.pc,
             "ptx": rec.ptx, "label": rec.label, "repeat": rec.repeat, "wait_n": rec.wait_n,
             "src": _src_json(rec.src), "ptx_line": rec.ptx_line, "smem": None, "gmem": None,
             "regs_in": list(rec.regs_in), "regs_out": list(rec.regs_out), "shfl": rec.shfl_src is not None}
    if rec.smem is not None:
        sm = rec.smem
        entry["smem"] = {"write": sm.write, "width": sm.width, "region": None if sm.region is None else str(sm.region),
                         "ldsm": None if sm.ldsm is None else list(sm.ldsm)}
        arrays.update({f"{key}.smem.{f}": getattr(rec.smem, f) for f in SMEM_ARRAYS})
    if rec.gmem is not None:
        entry["gmem"] = {"write": rec.gmem.write, "width": rec.gmem.width,
                         "buffer": None if rec.gmem.buffer is None else str(rec.gmem.buffer)}
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


def _load_record(entry: dict, a, version: int) -> TraceRecord:
    key = f"r{entry['seq']}"
    smem = gmem = None
    if entry["smem"] is not None:
        s = entry["smem"]
        region = V1_NAMES[s["tile"]] if version == 1 else s["region"]
        ldsm = _v1_ldsm(entry["ptx"]) if version == 1 else (None if s["ldsm"] is None else tuple(s["ldsm"]))
        arr = {f: a[f"{key}.smem.{f}"] for f in SMEM_ARRAYS}
        smem = SmemRecord(s["write"], s["width"], arr["addr"], arr["mask"], region, arr["row"], arr["col"], ldsm,
                          elem_row=arr["elem_row"], elem_col=arr["elem_col"])
    if entry["gmem"] is not None:
        g = entry["gmem"]
        arr = {f: a[f"{key}.gmem.{f}"] for f in GMEM_ARRAYS if f"{key}.gmem.{f}" in a}
        if version == 1:  # no addresses were kept
            arr["addr"] = np.full(arr["row"].shape, -1, np.int64)
        buffer = g["tensor"].lower() if version == 1 else g["buffer"]
        gmem = GmemAccess(g["write"], g["width"], arr["addr"], arr["mask"], buffer, arr["row"], arr["col"])
    regs = {side: {n: a[f"{key}.{side}{i}"] for i, n in enumerate(entry[f"regs_{side}"])} for side in ("in", "out")}
    phase = V1_PHASES[entry["phase"]] if version == 1 else entry["phase"]
    return TraceRecord(Op[entry["op"]], phase, entry["round"], entry["pc"], entry["ptx"], entry["label"],
                       a[f"{key}.cta"], a[f"{key}.active"], repeat=entry["repeat"], smem=smem, gmem=gmem,
                       regs_in=regs["in"], regs_out=regs["out"],
                       shfl_src=a[f"{key}.shfl_src"] if entry["shfl"] else None, wait_n=entry["wait_n"],
                       src=_src_load(entry.get("src")), ptx_line=entry.get("ptx_line"), seq=entry["seq"])


def _v1_ldsm(ptx: str) -> tuple[int, bool] | None:
    """Version 1 kept the ldmatrix form only in its PTX mnemonic."""
    if not ptx.startswith("ldmatrix"):
        return None
    num = next(int(p[1:]) for p in ptx.split(".") if p in ("x1", "x2", "x4"))
    return num, ".trans" in ptx


def load_trace(path: str | Path) -> Trace:
    """Read an archive written by save_trace; refuses other formats and newer versions."""
    path = Path(path)
    manifest = json.loads((path / "manifest.json").read_text())
    version = manifest.get("version")
    if manifest.get("format") != FORMAT or version not in READABLE:
        raise ValueError(f"{path}: not a {FORMAT} archive of a version this flashsim reads {READABLE} "
                         f"(found {manifest.get('format')!r} v{version!r})")
    with np.load(path / "arrays.npz") as npz:
        a = {k: npz[k] for k in npz.files}
    records = tuple(_load_record(e, a, version) for e in manifest["records"])
    checkpoints = tuple(CheckpointRecord(Checkpoint[c["checkpoint"]], c["round"], a[f"c{i}.cta"], a[f"c{i}.values"])
                        for i, c in enumerate(manifest["checkpoints"]))
    return Trace(_launch(manifest["launch"]), TraceFilter.from_json(manifest["filter"]), a["threads"], records,
                 checkpoints)


def _launch(launch: dict) -> dict:
    """The launch of an archive with its config's fields complete: a field added since it was written
    takes its default (KernelConfig.from_json), as the run that wrote it had."""
    if isinstance(launch.get("config"), dict):
        from ..config import KernelConfig

        launch = {**launch, "config": KernelConfig.from_json(launch["config"]).to_json()}
    return launch


# -- values as JSON --------------------------------------------------------------------------------
def reg_values(words: np.ndarray, dtype: str = "fp16") -> np.ndarray:
    """A register array [..., k] as numbers: uint32 words are f16x2 pairs ([..., 2k] fp16; bf16x2
    pairs as float32 values for a kernel of dtype "bf16"), float32 stays fp32, integers and
    predicates stay as they are."""
    words = np.asarray(words)
    if words.dtype == np.uint32:
        if dtype == "bf16":
            h = np.ascontiguousarray(words).view(np.uint16).reshape(*words.shape[:-1], 2 * words.shape[-1])
            return (h.astype(np.uint32) << np.uint32(16)).view(np.float32)
        return decode_f16x2(words)
    return words


def launch_dtype(launch: dict) -> str:
    """The 16-bit type of a traced launch ("fp16" for other kernels and traces of older versions)."""
    return (launch.get("config") or {}).get("dtype", "fp16") if isinstance(launch, dict) else "fp16"


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


def lane_args(rec: TraceRecord, r: int, c: int, s: int, dtype: str = "fp16") -> dict:
    """Everything one lane did in instruction r of a record, as JSON values (16-bit pairs decoded as
    `dtype`, the launch's: `launch_dtype`)."""
    out: dict = {"active": bool(rec.active[c, s])}
    if rec.smem is not None:
        sm = rec.smem
        out["smem"] = {"region": sm.region, "addr": int(sm.addr[r, c, s]), "bank": int(sm.bank[r, c, s]),
                       "row": int(sm.row[r, c, s]), "col": int(sm.col[r, c, s]), "on": bool(sm.mask[r, c, s]),
                       "elements": np.stack([sm.elem_row[r, c, s], sm.elem_col[r, c, s]], -1).tolist()}
    if rec.gmem is not None:
        g = rec.gmem
        out["gmem"] = {"buffer": g.buffer, "addr": int(g.addr[r, c, s]), "row": int(g.row[r, c, s]),
                       "col": int(g.col[r, c, s]), "on": bool(g.mask[r, c, s])}
    for side, regs in (("in", rec.regs_in), ("out", rec.regs_out)):
        if regs:
            out[side] = {k: json_list(reg_values(v[r, c, s], dtype)) for k, v in regs.items()}
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
    step, dtype = 0, launch_dtype(trace.launch)
    for rec in trace.records:
        for r in range(rec.repeat):
            for ci, cta in enumerate(rec.cta.tolist()):
                for w in np.unique(warps[rec.active[ci]]):
                    lanes = np.nonzero(warps == w)[0]
                    args = {"ptx": rec.ptx, "pc": rec.pc, "round": rec.round, "instr": r,
                            "src": None if rec.src is None else str(rec.src),
                            "lanes": {f"lane {int(trace.threads[s]) % 32}": lane_args(rec, r, ci, s, dtype)
                                      for s in lanes}}
                    events.append({"name": rec.label, "cat": str(rec.phase), "ph": "X", "ts": step, "dur": 1,
                                   "pid": int(cta), "tid": int(w), "args": args})
            step += 1
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"format": FORMAT, "version": VERSION, "launch": trace.launch}}


def save_perfetto(trace: Trace, path: str | Path) -> Path:
    path = Path(path)
    path.write_text(json.dumps(to_perfetto(trace)))
    return path
