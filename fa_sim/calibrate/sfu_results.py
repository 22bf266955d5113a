"""What fa_sim.calibrate.sfu_probe brings back, and how it reads it again.

Dumps. A dumped band holds hw(x) for x = band start + j * 2^s, where s is the lowest mantissa bit
whose flip ever changed the output inside that band on the device (the sweep's change histogram):
below it the output is constant on aligned blocks of 2^s inputs, so the stride loses nothing. The
output bit patterns are stored as int8 differences of consecutive values (exact, self-contained,
no reference function needed to decode); a difference outside +-127 is an escape (-128) whose
full value is listed separately. Each stream is zlib-compressed; a CRC-32 of the decoded outputs
checks the round trip.

Family files. sfu_<family>.npz (uncompressed container of already-compressed blobs) holds every
array of the family's ops under "<op>__<key>"; it is rewritten after each op, so an op that fails
later loses nothing before it. The budget keeps each file under the 16 MB a device run returns.
"""

from __future__ import annotations

import json
import os
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .sfu_ops import DCLIP, N_CHANGE, band_label

ESCAPE = -128


@dataclass(frozen=True)
class EncodedBand:
    band: int
    stride_log2: int
    count: int
    crc: int
    n_escapes: int
    blobs: tuple[bytes, bytes, bytes]  # zlib(int8 deltas), zlib(uint32 escape index), zlib(uint32 value)

    @property
    def nbytes(self) -> int:
        return sum(len(b) for b in self.blobs)


def dump_stride_log2(changes_row: np.ndarray) -> int:
    """Lowest mantissa bit whose flip changed the output in this band (23: the band is constant)."""
    hits = np.flatnonzero(np.asarray(changes_row))
    return int(hits[0]) if hits.size else N_CHANGE


def band_inputs(b: int, stride_log2: int) -> np.ndarray:
    count = 1 << (N_CHANGE - stride_log2)
    return ((b << 23) + (np.arange(count, dtype=np.uint64) << stride_log2)).astype(np.uint32)


def encode_band(b: int, stride_log2: int, bits: np.ndarray) -> EncodedBand:
    bits = np.ascontiguousarray(bits, dtype=np.uint32)
    diff = np.diff(bits.astype(np.int64), prepend=np.int64(1) << 40)  # the first value always escapes
    esc = np.flatnonzero((diff < -127) | (diff > 127))
    delta = np.where((diff < -127) | (diff > 127), ESCAPE, diff).astype(np.int8)
    blobs = (zlib.compress(delta.tobytes(), 6), zlib.compress(esc.astype(np.uint32).tobytes(), 6),
             zlib.compress(bits[esc].tobytes(), 6))
    return EncodedBand(b, stride_log2, bits.size, zlib.crc32(bits.tobytes()), esc.size, blobs)


def decode_blobs(delta_z: bytes, idx_z: bytes, val_z: bytes) -> np.ndarray:
    delta = np.frombuffer(zlib.decompress(delta_z), dtype=np.int8).astype(np.int64)
    idx = np.frombuffer(zlib.decompress(idx_z), dtype=np.uint32).astype(np.int64)
    val = np.frombuffer(zlib.decompress(val_z), dtype=np.uint32).astype(np.int64)
    if delta.size == 0:
        return np.zeros(0, dtype=np.uint32)
    if idx.size == 0 or idx[0] != 0 or idx.size != val.size:
        raise ValueError("dump stream without its leading escape: not written by encode_band")
    delta[idx] = 0
    run = np.cumsum(delta)
    full = np.zeros(delta.size, dtype=np.int64)
    full[idx] = val
    is_escape = np.zeros(delta.size, dtype=bool)
    is_escape[idx] = True
    anchor = np.maximum.accumulate(np.where(is_escape, np.arange(delta.size), 0))  # last escape at or before
    return (full[anchor] + run - run[anchor]).astype(np.uint32)


def fit_budget(bands, budget: int) -> list[EncodedBand]:
    """The longest prefix of `bands` (an iterable in priority order) within `budget` bytes; stops
    consuming the iterable at the first band that does not fit."""
    kept, used = [], 0
    for enc in bands:
        if used + enc.nbytes > budget:
            break
        kept.append(enc)
        used += enc.nbytes
    return kept


def dump_arrays(bands: list[EncodedBand]) -> dict[str, np.ndarray]:
    out = {"dump_meta": np.array([[e.band, e.stride_log2, e.count, e.crc, e.n_escapes] for e in bands],
                                 dtype=np.int64).reshape(-1, 5)}
    for k, e in enumerate(bands):
        for name, blob in zip(("delta", "escidx", "escval"), e.blobs):
            out[f"dump{k}_{name}"] = np.frombuffer(blob, dtype=np.uint8)
    return out


def read_dumps(arrays: dict[str, np.ndarray]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """band -> (inputs, outputs) as uint32, each checked against its CRC-32."""
    out = {}
    for k, (b, s, count, crc, _) in enumerate(arrays["dump_meta"].tolist()):
        bits = decode_blobs(*(arrays[f"dump{k}_{n}"].tobytes() for n in ("delta", "escidx", "escval")))
        if bits.size != count or zlib.crc32(bits.tobytes()) != crc:
            raise ValueError(f"dump of band {band_label(b)} does not decode to its recorded CRC")
        out[b] = (band_inputs(b, s), bits)
    return out


class FamilyFile:
    """One results file: arrays of several ops, rewritten whole after each op (atomic replace)."""

    def __init__(self, path: Path):
        self.path, self.arrays = path, {}

    def put(self, op_name: str, arrays: dict[str, np.ndarray]) -> None:
        self.arrays.update({f"{op_name}__{k}": np.asarray(v) for k, v in arrays.items()})
        tmp = self.path.with_name(self.path.name + ".partial")
        with open(tmp, "wb") as f:
            np.savez(f, **self.arrays)
        os.replace(tmp, self.path)

    def used(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())


def load_family(path: Path) -> dict[str, dict[str, np.ndarray]]:
    """op name -> {key: array} of one results file."""
    out: dict[str, dict[str, np.ndarray]] = {}
    with np.load(path) as z:
        for key in z.files:
            op, _, name = key.partition("__")
            out.setdefault(op, {})[name] = z[key]
    return out


def write_json(path: Path, obj) -> None:
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=False))
    os.replace(tmp, path)


# ---- summaries of the sweep counters ----

def ordered(bits: np.ndarray) -> np.ndarray:
    """fp32 bit patterns -> integers in value order (+0 and -0 both 0; one step per ulp)."""
    b = np.asarray(bits, dtype=np.uint32).astype(np.int64)
    return np.where(b >> 31, -(b & 0x7FFFFFFF), b)


def ulp_bins(y: np.ndarray, r: np.ndarray) -> np.ndarray:
    """The CPU twin of sfu_probe.cu bin_of: bin of each (hw, expected) pair of fp32 bit patterns."""
    y, r = np.asarray(y, dtype=np.uint32), np.asarray(r, dtype=np.uint32)
    yn, rn = (y & 0x7FFFFFFF) > 0x7F800000, (r & 0x7FFFFFFF) > 0x7F800000
    d = ordered(y) - ordered(r)
    b = np.clip(d, -DCLIP - 1, DCLIP + 1) + DCLIP
    b = np.where(b < 0, 33, np.where(b > 2 * DCLIP, 34, b))
    b = np.where((d == 0) & (y != r), 39, b)
    return np.select([yn & rn & (y == r), yn & rn, yn, rn], [35, 36, 37, 38], b)

def bins_total(hist: np.ndarray, bands=slice(None)) -> np.ndarray:
    return np.asarray(hist, dtype=np.uint64)[bands].sum(axis=0)


def sweep_summary(hist: np.ndarray, dmin: np.ndarray, dmax: np.ndarray) -> dict:
    """Counts of one sweep: bit-exact, ulp classes, NaN outcomes, extremes over bands with data."""
    t = bins_total(hist).astype(np.int64)
    d = np.arange(-DCLIP, DCLIP + 1)
    ulp = t[:2 * DCLIP + 1]
    used = dmin <= dmax
    return {
        "total": int(t.sum()), "exact": int(t[DCLIP] + t[35]),
        "d<=-2": int(ulp[d <= -2].sum() + t[33]), "d=-1": int(ulp[d == -1].sum()),
        "d=+1": int(ulp[d == 1].sum()), "d>=+2": int(ulp[d >= 2].sum() + t[34]),
        "nan_both_same": int(t[35]), "nan_both_other_bits": int(t[36]), "nan_only_hw": int(t[37]),
        "nan_only_expected": int(t[38]), "zero_sign": int(t[39]),
        "dmin": int(dmin[used].min()) if used.any() else 0, "dmax": int(dmax[used].max()) if used.any() else 0,
    }


def class_summary(hist: np.ndarray) -> dict:
    """Bit-exact counts per input class: +-normal, +-zero/subnormal, +-inf/NaN."""
    h = np.asarray(hist, dtype=np.uint64).reshape(2, 256, -1)
    classes = {"normal": slice(1, 255), "zero/subnormal": slice(0, 1), "inf/nan": slice(255, 256)}
    out = {}
    for sign, s in ((0, "+"), (1, "-")):
        for name, sl in classes.items():
            t = h[sign, sl].sum(axis=0).astype(np.int64)
            out[f"{s}{name}"] = {"total": int(t.sum()), "exact": int(t[DCLIP] + t[35])}
    return out


def ignored_bits(changes: np.ndarray, bands) -> dict[str, int]:
    """Per band: how many low mantissa bits never changed the output (23: constant band)."""
    return {band_label(b): dump_stride_log2(changes[b]) for b in bands}


def check_summary(names, mism: np.ndarray, appl: np.ndarray, first: np.ndarray) -> list[dict]:
    out = []
    for h, name in enumerate(names):
        bad = first[:, h][first[:, h] != 0xFFFFFFFF]
        out.append({"hypothesis": name, "mismatches": int(mism[:, h].sum()), "applicable": int(appl[:, h].sum()),
                    "first_mismatch": f"0x{int(bad.min()):08x}" if bad.size else None})
    return out


def format_table(rows: list[dict]) -> str:
    """The summary table run and verify print (one row per op)."""
    head = (f"{'op':11s} {'inputs':>10s} {'bit-exact':>10s} {'%':>9s} {'d<=-2':>9s} {'d=-1':>10s} "
            f"{'d=+1':>10s} {'d>=+2':>9s} {'NaN?':>6s} {'dmin':>6s} {'dmax':>6s} {'ign[1,2)':>8s} {'sec':>5s}")
    lines = [head, "-" * len(head)]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['op']:11s} FAILED: {r['error']}")
            continue
        s = r["sweep"]
        nan_bad = s["nan_both_other_bits"] + s["nan_only_hw"] + s["nan_only_expected"]
        lines.append(f"{r['op']:11s} {s['total']:10d} {s['exact']:10d} {100 * s['exact'] / max(s['total'], 1):9.5f} "
                     f"{s['d<=-2']:9d} {s['d=-1']:10d} {s['d=+1']:10d} {s['d>=+2']:9d} {nan_bad:6d} "
                     f"{max(s['dmin'], -99999):6d} {min(s['dmax'], 99999):6d} {r.get('ignored_1_2', '-'):>8} "
                     f"{r['seconds']:5.1f}")
    return "\n".join(lines)


# ---- 16-bit forms ----

def round_bf16(v: np.ndarray) -> np.ndarray:
    """float64 -> bf16 bits, to nearest even (8 significand bits, subnormals below 2^-126)."""
    a = np.abs(v)
    _, e = np.frexp(a)  # a = m 2^e, m in [0.5, 1)
    lsb = np.maximum(e.astype(np.int64) - 1, -126) - 7
    with np.errstate(invalid="ignore", over="ignore"):
        q = np.ldexp(np.rint(np.ldexp(a, -lsb)), lsb)
        bits = (np.copysign(q, v).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return np.where(np.isnan(v), np.uint16(0x7FC0), bits)


def half_to_f32_bits(h, u16: np.ndarray) -> np.ndarray:
    """16-bit inputs of h's format as the fp32 bit patterns of the same values."""
    u16 = np.asarray(u16, dtype=np.uint16)
    if h.fmt == "bf16":
        return u16.astype(np.uint32) << 16
    with np.errstate(invalid="ignore"):
        return u16.view(np.float16).astype(np.float32).view(np.uint32)


def round_to_half(h, f32_bits: np.ndarray) -> np.ndarray:
    """fp32 values rounded to nearest even in h's format (uint16 bit patterns)."""
    with np.errstate(over="ignore", invalid="ignore"):
        v = np.asarray(f32_bits, dtype=np.uint32).view(np.float32).astype(np.float64)
        return v.astype(np.float16).view(np.uint16) if h.fmt == "f16" else round_bf16(v)


def half_reference(h, inputs: np.ndarray) -> np.ndarray:
    """Correctly rounded 2^x or tanh(x) of 16-bit inputs (uint16 bit patterns) in h's format."""
    with np.errstate(over="ignore", invalid="ignore"):
        x = np.asarray(half_to_f32_bits(h, inputs), dtype=np.uint32).view(np.float32).astype(np.float64)
        v = np.exp2(x) if h.name.startswith("ex2") else np.tanh(x)
        return v.astype(np.float16).view(np.uint16) if h.fmt == "f16" else round_bf16(v)


def half_compare(h, table: np.ndarray, ref: np.ndarray) -> dict:
    """Counts of 16-bit outputs against a reference: bit-exact, within one ulp, the largest step."""
    table, ref = np.asarray(table, dtype=np.uint16), np.asarray(ref, dtype=np.uint16)
    nan_above = 0x7C00 if h.fmt == "f16" else 0x7F80

    def order(b):
        b = b.astype(np.int64)
        return np.where(b >> 15, -(b & 0x7FFF), b)

    tn, rn = (table & 0x7FFF) > nan_above, (ref & 0x7FFF) > nan_above
    both = ~tn & ~rn
    d = np.abs(order(table) - order(ref))[both]
    return {"exact": int(np.count_nonzero(table == ref)), "abs_d_le_1": int(np.count_nonzero(d <= 1)),
            "max_abs_d": int(d.max()) if d.size else 0, "nan_mismatch": int(np.count_nonzero(tn != rn))}
