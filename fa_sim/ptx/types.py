"""PTX fundamental types (#fundamental-types) and how registers hold them.

Registers are stored as unsigned bit patterns of their declared width (1 for .pred, 16, 32, 64);
an instruction reads them as its type's numpy dtype. `DTYPES` maps a PTX type to that dtype;
f16x2 / bf16x2 / bf16 travel as raw bits (uint32 / uint16) and are unpacked by the handlers.
"""

from __future__ import annotations

import numpy as np

DTYPES: dict[str, np.dtype] = {
    "pred": np.dtype(bool),
    "b8": np.dtype(np.uint8), "u8": np.dtype(np.uint8), "s8": np.dtype(np.int8),
    "b16": np.dtype(np.uint16), "u16": np.dtype(np.uint16), "s16": np.dtype(np.int16),
    "f16": np.dtype(np.float16), "bf16": np.dtype(np.uint16),
    "b32": np.dtype(np.uint32), "u32": np.dtype(np.uint32), "s32": np.dtype(np.int32),
    "f32": np.dtype(np.float32), "f16x2": np.dtype(np.uint32), "bf16x2": np.dtype(np.uint32),
    "b64": np.dtype(np.uint64), "u64": np.dtype(np.uint64), "s64": np.dtype(np.int64),
    "f64": np.dtype(np.float64),
}

#: Storage dtype of a register of each bit width.
STORAGE = {1: np.dtype(bool), 8: np.dtype(np.uint8), 16: np.dtype(np.uint16),
           32: np.dtype(np.uint32), 64: np.dtype(np.uint64)}


def bits(ptype: str) -> int:
    """Bit width of a PTX type ('pred' is 1)."""
    if ptype == "pred":
        return 1
    try:
        return DTYPES[ptype].itemsize * 8
    except KeyError:
        raise ValueError(f"unknown PTX type .{ptype}") from None


def is_type(mod: str) -> bool:
    return mod in DTYPES
