"""Global-memory requests in 32-byte sectors and 128-byte lines: how well each warp's loads,
stores and cp.async copies coalesce.

A warp's global-memory instruction is one request to the L1TEX unit; its active lanes' bytes fall
in some number of 32-byte sectors (the unit the L1 and the L2 move) of some number of 128-byte
cache lines (the unit the L1 looks up and moves as one wavefront). A coalesced request of 32 lanes
x 16 bytes touches 16 sectors of 4 lines; the same lanes walking down a column of 128-byte rows
touch 32 sectors of 32 lines. Nsight Compute's names: `l1tex__t_sectors_pipe_lsu_mem_global_op_ld`
(sectors) over `l1tex__t_requests_pipe_lsu_mem_global_op_ld` (requests).

    counter = SectorCounter()
    fa_sim.ptx.launch(source, grid, block, args=..., observers=[counter])
    counter.report()   # {'LDG': MemoryCounts(requests, sectors, lines, ideal_sectors, ideal_lines), ...}

The timing model (fa_sim.timing.program) charges each global request its average sectors of its
class (the L2's bandwidth) and its lines beyond the ideal (the L1's wavefronts).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import astuple, dataclass

import numpy as np

from ..events import GlobalRequest, LaunchInfo, Op

SECTOR = 32  # bytes
LINE = 128  # bytes
GLOBAL_OPS = (Op.LDGSTS, Op.LDG, Op.STG)


def warp_sectors(addr: np.ndarray, mask: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Distinct 32-byte sectors and 128-byte lines each warp's active lanes touch.

    addr, mask: [..., L] byte addresses and active lanes of one warp instruction (L lanes on the
    last axis); width: bytes per lane (each lane's access may cross a sector or line boundary: its
    first and last byte are counted). -> (sectors, lines), each [...] int64 (0 where no lane is
    active)."""
    addr = np.asarray(addr, np.int64)
    mask = np.broadcast_to(np.asarray(mask, bool), addr.shape)
    if width < 1:
        raise ValueError(f"width must be at least 1 byte, got {width}")
    return _distinct(addr, mask, width, SECTOR), _distinct(addr, mask, width, LINE)


def _distinct(addr: np.ndarray, mask: np.ndarray, width: int, unit: int) -> np.ndarray:
    first, last = addr // unit, (addr + width - 1) // unit
    span = int((last - first).max(initial=0)) + 1  # units one lane's bytes cover (1 for aligned accesses)
    units = np.concatenate([np.where(last >= first + s, first + s, first) for s in range(span)], axis=-1)
    return distinct_keys(units, np.concatenate([mask] * span, axis=-1))


def distinct_keys(keys: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Distinct non-negative int64 `keys` among the `mask`ed entries of the last axis -> [...] int64."""
    keys = np.where(mask, keys, -1)  # keys are non-negative: -1 marks an inactive lane
    keys.sort(axis=-1)
    new = np.ones(keys.shape, bool)
    new[..., 1:] = keys[..., 1:] != keys[..., :-1]
    return (new & (keys >= 0)).sum(-1).astype(np.int64)


@dataclass(frozen=True)
class MemoryCounts:
    """Warp requests of one class and what they touched, summed."""

    requests: int  # warp instructions with at least one active lane
    sectors: int
    lines: int
    ideal_sectors: int  # the active bytes packed into whole sectors, request by request
    ideal_lines: int  # the same into whole lines

    def __add__(self, other: "MemoryCounts") -> "MemoryCounts":
        return MemoryCounts(self.requests + other.requests, self.sectors + other.sectors, self.lines + other.lines,
                            self.ideal_sectors + other.ideal_sectors, self.ideal_lines + other.ideal_lines)

    @property
    def sectors_per_request(self) -> float:
        return self.sectors / self.requests if self.requests else 0.0

    @property
    def lines_per_request(self) -> float:
        return self.lines / self.requests if self.requests else 0.0

    @property
    def ideal_lines_per_request(self) -> float:
        """The lines a request's active bytes would take packed."""
        return self.ideal_lines / self.requests if self.requests else 0.0


class SectorCounter:
    """Observer: the sectors and lines of every global-memory warp request, by SASS class
    (LDGSTS, LDG, STG) and CTA (`report(ctas)` sums the classes over some CTAs)."""

    def __init__(self) -> None:
        self.launch: LaunchInfo | None = None
        self.counts: dict[tuple[int, str], MemoryCounts] = {}  # (linear CTA id, class) -> counts

    def on_launch(self, launch: LaunchInfo) -> None:
        """A new launch starts a new count."""
        self.__init__()
        self.launch = launch

    def on_global(self, req: GlobalRequest) -> None:
        """A global request (fa_sim.events.GlobalRequest): no instruction events are asked for, so
        the PTX engine keeps its fast paths for this observer."""
        if req.op not in GLOBAL_OPS:
            return
        mask = np.asarray(req.mask, bool)  # [R, C, W, L]
        sectors, lines = warp_sectors(req.addr, mask, req.width)
        lanes = mask.sum(-1)
        ideal, ideal_lines = -(-lanes * req.width // SECTOR), -(-lanes * req.width // LINE)
        per_cta = [x.sum(axis=(0, 2)) for x in (lanes > 0, sectors, lines, ideal, ideal_lines)]  # each [C]
        for c, cta in enumerate(np.asarray(req.cta).tolist()):
            add = MemoryCounts(*(int(x[c]) for x in per_cta))
            if not add.requests:
                continue
            key = (int(cta), req.op.value)
            old = self.counts.get(key)
            self.counts[key] = add if old is None else old + add

    # -- shards (fa_sim.parallel.merge): the counts add up -------------------------------------------
    def fresh(self) -> "SectorCounter":
        return SectorCounter()

    def partial(self) -> dict:
        return self.counts

    def merge(self, part: dict) -> None:
        for cls, c in part.items():
            old = self.counts.get(cls)
            self.counts[cls] = c if old is None else old + c

    def report(self, ctas=None) -> dict[str, MemoryCounts]:
        """Class -> the counts summed over `ctas` (linear CTA ids, a CTA listed n times counted n
        times: the timing model's CTAs that stand for others; None: every CTA once)."""
        times = None if ctas is None else Counter(int(c) for c in ctas)
        out: dict[str, MemoryCounts] = {}
        for (cta, cls), c in self.counts.items():
            n = 1 if times is None else times.get(cta, 0)
            if n:
                c = c if n == 1 else MemoryCounts(*(n * x for x in astuple(c)))
                out[cls] = c if cls not in out else out[cls] + c
        return dict(sorted(out.items()))
