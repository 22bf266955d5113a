"""ld.shared / st.shared of 1, 2, 4, 8 and 16 bytes on lane arrays.

PTX anchors: `#data-movement-and-conversion-instructions-ld`, `#data-movement-and-conversion-instructions-st`.
Each lane accesses `width` bytes at a byte address aligned to `width`; shared memory is one byte
array per CTA. Accesses move units of 4 bytes (1 or 2 for the narrow widths). When several lanes
store to the same unit the hardware keeps one of them; here the highest lane wins (numpy
assignment order), which no correct kernel depends on.
"""

from __future__ import annotations

import numpy as np

from ..errors import KernelFault

WIDTHS = (1, 2, 4, 8, 16)


def unit_dtype(width: int):
    """The unit a `width`-byte access moves: uint8 / uint16 below 4 bytes, uint32 words above."""
    return {1: np.uint8, 2: np.uint16}.get(width, np.uint32)


def shared_units(addr: np.ndarray, width: int) -> np.ndarray:
    """addr: [...] int64 byte addresses -> [..., k] unit indices (k = width / unit)."""
    if width not in WIDTHS:
        raise ValueError(f"shared-memory access width {width} is not one of {WIDTHS} bytes")
    addr = np.asarray(addr, dtype=np.int64)
    if np.any(addr % width):
        bad = int(addr[addr % width != 0][0])
        raise KernelFault(f"misaligned shared-memory access: {width}-byte access at byte {bad}")
    unit = min(width, 4)
    return addr[..., None] // unit + np.arange(max(width // unit, 1))


def _flat(view: np.ndarray, units: np.ndarray, per_cta: bool) -> np.ndarray:
    """Indices into view.reshape(-1) for every CTA: units [..] shared or [C, ..] per CTA."""
    if not per_cta:
        units = np.broadcast_to(units, (view.shape[0], *units.shape))
    return units + (np.arange(view.shape[0]) * view.shape[1]).reshape(-1, *[1] * (units.ndim - 1))


def ld_shared(smem: np.ndarray, units: np.ndarray, width: int, per_cta: bool = False) -> np.ndarray:
    """smem: [C, nbytes] uint8; units [...] (same for every CTA) or [C, ...] -> [C, ...] values."""
    view = smem.view(unit_dtype(width))  # [C, n_units]
    if not per_cta:
        return np.take(view, units, axis=1)
    return np.take(view.reshape(-1), _flat(view, units, True))


def st_shared(smem: np.ndarray, units: np.ndarray, values: np.ndarray, width: int, on: np.ndarray,
              per_cta: bool = False) -> None:
    """Write values (broadcast to [C, ...units]) where `on` (broadcast to the same, lanes-first
    prefix) into smem [C, nbytes] in place."""
    view = smem.view(unit_dtype(width))
    flat = _flat(view, units, per_cta)
    sel = np.broadcast_to(on.reshape(on.shape + (1,) * (flat.ndim - on.ndim)), flat.shape)
    view.reshape(-1)[flat[sel]] = np.broadcast_to(values, flat.shape)[sel]
