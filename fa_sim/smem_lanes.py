"""Shared-memory addresses of a run of instructions (`SmemLanes`), as the machine takes them, with
the gather and scatter indices derived from static addresses computed once and cached on the
object (the hand-written program's plans are static; the PTX engine's addresses are per CTA).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from . import isa


@dataclass(frozen=True, eq=False)
class SmemLanes:
    """Shared-memory addresses of R instructions issued back to back.

    addr: [W, L, R] int64 byte addresses shared by every CTA, or [C, W, L, R] per CTA;
    lanes: [L] bool lanes that supply an address (None: all). Gather indices derived from static
    addresses are computed once and cached on the object.
    """

    width: int
    addr: np.ndarray
    lanes: np.ndarray | None = None

    @property
    def per_cta(self) -> bool:
        return self.addr.ndim == 4

    @property
    def repeat(self) -> int:
        return self.addr.shape[-1]

    @cached_property
    def units(self) -> np.ndarray:
        """[..., W, L, R, k] index of each accessed unit (isa.shared_units)."""
        return isa.shared_units(self.addr, self.width)

    def landing(self, unit_bytes: int) -> tuple[int | None, np.ndarray]:
        """Where the units (`unit_bytes` each) of a write by every lane land in a CTA's shared
        memory, in [W, L, R, units] order, cached: (lo, inv) when they cover [lo, lo + n) once
        each (unit lo + j comes from written unit inv[j]: one gather into a slice), else (None,
        the unit index of each written unit). Shared addresses only."""
        cache = self.__dict__.setdefault("_landing", {})
        if unit_bytes not in cache:
            idx = (self.addr // unit_bytes)[..., None] + np.arange(self.width // unit_bytes)  # [W, L, R, units]
            idx = idx.reshape(-1)
            lo = int(idx.min()) if idx.size else 0
            inv = np.full(idx.size, -1, np.int64)
            if idx.size and int(idx.max()) - lo < idx.size:
                inv[idx - lo] = np.arange(idx.size)
            cache[unit_bytes] = (lo, inv) if idx.size and (inv >= 0).all() else (None, idx)
        return cache[unit_bytes]

    def ldsm_index(self, num: int, trans: bool) -> isa.LdmatrixIndex:
        """Where every received half comes from ([..., W, L, R, num(, 2)]), cached."""
        cache = self.__dict__.setdefault("_ldsm", {})
        key = (num, trans)
        if key not in cache:
            addr = np.moveaxis(self.addr, -1, -2)  # [..., W, R, L]
            lead = addr.ndim - 3
            cache[key] = isa.ldmatrix_index(addr, num, trans).moved(lead + 1, lead + 2)
        return cache[key]
