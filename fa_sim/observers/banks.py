"""Shared-memory bank conflicts, counted the way Nsight Compute counts them.

Rules (docs/hardware_facts.md, "Shared-memory bank conflicts as Nsight Compute counts them"):
32 banks x 4 bytes, bank = (byte address / 4) mod 32. A warp instruction splits into phases:
4-byte accesses 1 phase of 32 lanes, 8-byte 2 phases of 16 lanes, 16-byte 4 phases of 8 lanes,
ldmatrix.xN one phase per matrix (lanes 8m..8m+7, 16 bytes each). The wavefronts of a phase are the
largest number of distinct 4-byte words that fall into one bank (lanes on the same word share it);
ideal wavefronts = phases that access anything; conflicts = wavefronts - ideal.

ncu metrics this mirrors, per SASS class:
  LDSM  smsp__inst_executed_op_ldsm.sum, smsp__sass_l1tex_data_pipe_lsu_wavefronts_mem_shared_op_ldsm.sum,
        smsp__sass_l1tex_data_bank_conflicts_pipe_lsu_mem_shared_op_ldsm.sum
  LDS   smsp__sass_inst_executed_op_shared_ld.sum, ..._wavefronts_mem_shared_op_ld.sum
  STS   smsp__sass_inst_executed_op_shared_st.sum, ..._wavefronts_mem_shared_op_st.sum
  LDGSTS smsp__inst_executed_op_ldgsts.sum; ncu never calls its cost a bank conflict (its shared
        side shows in ..._op_ldgsts_cache_bypass wavefronts), so its wavefronts - ideal are
        reported apart, as "excess_wavefronts" (JSON) and outside the conflict column (tables).
"""

from __future__ import annotations

import dataclasses
import enum
from collections import Counter
from dataclasses import dataclass

import numpy as np

from ..events import ROUND_EPILOGUE, ROUND_PROLOGUE, InstrEvent, LaunchInfo, Op, SmemAccess
from ..isa.sm80 import BANK_BYTES, N_BANKS
from ..isa.sm80 import WARP_SIZE as WARP


class SmemClass(enum.Enum):
    """SASS instruction classes ncu reports shared-memory wavefronts for."""

    LDSM = "LDSM"
    LDS = "LDS"
    STS = "STS"
    LDGSTS = "LDGSTS"


#: Classes whose excess wavefronts ncu calls bank conflicts.
CONFLICT_CLASSES = (SmemClass.LDSM, SmemClass.LDS, SmemClass.STS)
EXCESS_WAVEFRONTS = "excess_wavefronts"  # LDGSTS: wavefronts - ideal, which ncu does not call conflicts
SMEM_OPS = frozenset({Op.LDSM, Op.LDS, Op.STS, Op.LDGSTS})
ROUND_NAMES = {ROUND_PROLOGUE: "prologue", ROUND_EPILOGUE: "epilogue"}


def excess_name(cls: "SmemClass | None") -> str:
    """JSON name of wavefronts - ideal for class `cls` (None: a sum over the conflict classes)."""
    return EXCESS_WAVEFRONTS if cls is SmemClass.LDGSTS else "conflicts"


def bank_of(addr) -> np.ndarray:
    """Bank of a byte address: (addr / 4) mod 32."""
    return (np.asarray(addr, dtype=np.int64) // BANK_BYTES) % N_BANKS


def lanes_per_phase(op: Op, width: int) -> int:
    """Lanes served together in one phase (ldmatrix: the 8 row addresses of one matrix)."""
    if op is Op.LDSM:
        return 8
    try:
        return {1: 32, 2: 32, 4: 32, 8: 16, 16: 8}[width]
    except KeyError:
        raise ValueError(f"shared-memory access width {width} is not 4, 8 or 16 bytes") from None


def phase_words(addr: np.ndarray, mask: np.ndarray, op: Op, width: int) -> np.ndarray:
    """[..., 32] lane addresses -> [..., phases, words] 4-byte word indices (-1 where unused)."""
    lpp = lanes_per_phase(op, width)
    k = max(width // BANK_BYTES, 1)
    words = addr[..., None] // BANK_BYTES + np.arange(k)  # [..., 32, k]
    words = np.where(mask[..., None], words, -1)
    return words.reshape(*addr.shape[:-1], WARP // lpp, lpp * k)


def phase_wavefronts(words: np.ndarray) -> np.ndarray:
    """[..., phases, words] -> [..., phases] wavefronts: max over banks of distinct words."""
    lead = words.shape[:-1]
    flat = np.sort(words.reshape(-1, words.shape[-1]), axis=-1)  # [P, n]
    new = np.ones(flat.shape, dtype=bool)
    new[:, 1:] = flat[:, 1:] != flat[:, :-1]
    keep = new & (flat >= 0)
    idx = np.arange(flat.shape[0])[:, None] * N_BANKS + flat % N_BANKS
    counts = np.bincount(idx[keep], minlength=flat.shape[0] * N_BANKS)
    return counts.reshape(flat.shape[0], N_BANKS).max(axis=1).reshape(lead)


def word_wavefront(words: np.ndarray) -> np.ndarray:
    """Same shape as words: which wavefront (0-based) serves each word of its phase.

    Distinct words of one bank are served one per wavefront in address order; -1 where unused.
    """
    flat = words.reshape(-1, words.shape[-1])
    order = np.argsort(flat, axis=-1, kind="stable")
    s = np.take_along_axis(flat, order, axis=-1)
    new = np.ones(s.shape, dtype=bool)
    new[:, 1:] = s[:, 1:] != s[:, :-1]
    bank = s % N_BANKS
    # rank of each distinct word inside its bank: cumulative count of new words per (row, bank)
    onehot = (bank[..., None] == np.arange(N_BANKS)) & (new & (s >= 0))[..., None]
    rank = np.take_along_axis(np.cumsum(onehot, axis=1), bank[..., None], axis=2)[..., 0] - 1
    out = np.empty_like(rank)
    np.put_along_axis(out, order, np.where(s >= 0, rank, -1), axis=-1)
    return out.reshape(words.shape)


@dataclass(frozen=True)
class Counts:
    """instructions, wavefronts, ideal wavefronts; conflicts = wavefronts - ideal."""

    instructions: int = 0
    wavefronts: int = 0
    ideal: int = 0

    @property
    def conflicts(self) -> int:
        return self.wavefronts - self.ideal

    def __add__(self, other: "Counts") -> "Counts":
        return Counts(self.instructions + other.instructions, self.wavefronts + other.wavefronts,
                      self.ideal + other.ideal)

    def to_json(self, cls: "SmemClass | None" = None) -> dict:
        """The counts of class `cls`; the excess over ideal is named "conflicts" where Nsight
        Compute calls it bank conflicts, "excess_wavefronts" for LDGSTS, where it does not."""
        return {"instructions": self.instructions, "wavefronts": self.wavefronts,
                "ideal": self.ideal, excess_name(cls): self.conflicts}


@dataclass(frozen=True)
class InstrCost:
    """Per executed warp instruction of one event: [R, C, W] wavefronts, ideal and executed."""

    wavefronts: np.ndarray
    ideal: np.ndarray
    executed: np.ndarray


def instruction_cost(op: Op, smem: SmemAccess, active: np.ndarray) -> InstrCost:
    """Wavefronts and ideal wavefronts of every warp instruction of an event (vectorised)."""
    mask = smem.mask & active[None]
    words = phase_words(np.asarray(smem.addr, dtype=np.int64), mask, op, smem.width)
    wf = phase_wavefronts(words)  # [R, C, W, phases]
    ideal = (words >= 0).any(axis=-1)
    executed = np.broadcast_to(active.any(axis=-1)[None], wf.shape[:-1])
    return InstrCost(wf.sum(-1) * executed, ideal.sum(-1) * executed, executed)


def ldgsts_wavefronts(dst: np.ndarray, src: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Shared-side wavefronts of cp.async.cg as Nsight Compute counts them: [..., 32] destination
    and source byte addresses, mask -> [..., 4] per quarter-warp phase.

    Fitted to the H200 (fa_sim/calibrate/ldgsts_probe.py, tests/data/h200/ldgsts_probe.json): data
    moves in 32-byte source sectors into 128-byte destination lines. Per phase, the 16-byte chunks
    bound for one destination line split into two classes by their shift (dst - src) mod 32: 0
    (sectors stay whole) or 16 (sectors straddle). Each class present costs the largest number of
    source sectors feeding one destination sector, or of destination sectors fed by one source
    sector (1 for whole sectors in any order, as in the swizzled and plain rows; 2 for rows shifted
    by 16 bytes, as the padded layout's pitch makes them). Reproduces 34 of the 35 probed patterns,
    every row copy the kernel issues among them; a 32-byte stride (never issued) costs one
    wavefront per lane on the hardware, twice this rule.
    """
    shape = dst.shape[:-1] + (4, 8)
    d, s_, m = dst.reshape(shape), src.reshape(shape), mask.reshape(shape)

    def same(key):  # [..., 4, 8, 8] lanes i, j of a phase agree on key, both active
        return m[..., :, None] & m[..., None, :] & (key[..., :, None] == key[..., None, :])

    group = same(d // 128) & same(((d - s_) // 16) % 2)  # same destination line and shift class
    same_dsec, same_ssec = group & same(d // 32), group & same(s_ // 32)
    earlier = np.tril(np.ones((8, 8), bool), -1)  # [i, j]: j < i
    first_pair = m & ~(same_dsec & same_ssec & earlier).any(-1)  # first lane of its sector pair
    deg = np.maximum((same_dsec & first_pair[..., None, :]).sum(-1),  # source sectors per dst sector
                     (same_ssec & first_pair[..., None, :]).sum(-1))  # dst sectors per source sector
    group_cost = np.where(group, deg[..., None, :], 0).max(-1)  # [..., 4, 8]
    leader = m & ~(group & earlier).any(-1)  # first lane of each (line, class) group
    return np.where(leader, group_cost, 0).sum(-1)


def mixed_zero_fill_wavefronts(dst: np.ndarray, src: np.ndarray, mask: np.ndarray, fetched: np.ndarray) -> np.ndarray:
    """Extra shared-side wavefronts of cp.async warp instructions whose active lanes MIX copies
    (src-size > 0, `fetched`) and zero fills (src-size 0): [..., 32] -> [...].

    Measured with Nsight Compute on the H100 (fa2_fwd, m64n64d64w4-swizzled, Nk = 150: a K/V tail
    tile of 22 rows; docs/hardware_facts.md): an instruction whose lanes 0-15 copy two whole rows and
    lanes 16-31 zero-fill two more costs 6 wavefronts, not the 4 of `ldgsts_wavefronts`; one that
    only copies or only zero-fills costs 4 (every other LDGSTS of those launches). Rule: the
    COPIED lanes of a mixed instruction are written in wavefronts of their own, once more by
    `ldgsts_wavefronts` over those lanes alone. The 2 + 2 rows above cannot tell this from "the
    zero-filled lanes once more"; three launches whose tails also split 1 + 3 and 3 + 1 rows do (a
    packed batch, --seqlens 70,130,5 --heads 2, and split-KV decoding, --cache-seqlens 300,170
    --splits 3 and --cache-seqlens 199 --splits 1, d = 64, H100): ncu counts 4406, 5412 and 1166
    LDGSTS wavefronts; this rule gives all three, the zero-filled reading 4418, 5452 and 1162.
    """
    zero = mask & ~fetched
    mixed = fetched.any(-1) & zero.any(-1)
    return np.where(mixed, ldgsts_wavefronts(dst, src, mask & fetched).sum(-1), 0)


@dataclass(frozen=True)
class BankRow:
    """Totals of one static instruction (pc) in one round."""

    cls: SmemClass
    phase: str
    round: int
    pc: int
    ptx: str
    label: str
    region: str | None
    counts: Counts


class BankCounter:
    """Observer: counts every shared-memory instruction by class, phase, round and pc.

    `per_instruction[cls]` is a Counter of wavefronts-per-warp-instruction, so statements such as
    "every ldmatrix.x4 costs 32 wavefronts" can be checked instruction by instruction.
    """

    def __init__(self) -> None:
        self.launch: LaunchInfo | None = None
        self._rows: dict[tuple, BankRow] = {}
        self.per_instruction: dict[SmemClass, Counter] = {c: Counter() for c in SmemClass}

    def wants(self, op: Op, phase: str, round: int) -> bool:
        return op in SMEM_OPS

    def on_launch(self, launch: LaunchInfo) -> None:
        """A new launch starts a new count."""
        self.__init__()
        self.launch = launch

    def on_instr(self, event: InstrEvent) -> None:
        if event.op not in SMEM_OPS or event.smem is None:
            return
        cls = SmemClass(event.op.value)
        cost = instruction_cost(event.op, event.smem, np.asarray(event.active, dtype=bool))
        if cls is SmemClass.LDGSTS and event.gmem is not None:
            cost = self._ldgsts_cost(event, cost)
        wf = cost.wavefronts[cost.executed]
        self.per_instruction[cls].update(Counter(dict(zip(*np.unique(wf, return_counts=True)))))
        add = Counts(int(cost.executed.sum()), int(wf.sum()), int(cost.ideal.sum()))
        key = (cls, event.phase, event.round, event.pc)
        old = self._rows.get(key)
        counts = add if old is None else old.counts + add
        self._rows[key] = BankRow(cls, event.phase, event.round, event.pc, event.ptx, event.label,
                                  event.smem.region, counts)

    def _ldgsts_cost(self, event: InstrEvent, cost: "InstrCost") -> "InstrCost":
        """cp.async wavefronts by ncu's rule (ldgsts_wavefronts, mixed_zero_fill_wavefronts); the
        ideal stays one per phase."""
        src = np.asarray(event.gmem.addr, np.int64)  # [R, C, W, L] source byte addresses
        dst = np.asarray(event.smem.addr, np.int64)
        mask = np.asarray(event.smem.mask, bool) & np.asarray(event.active, bool)[None]
        fetched = mask & np.asarray(event.gmem.mask, bool)  # src-size > 0; the other lanes zero-fill
        wf = ldgsts_wavefronts(dst, src, mask).sum(-1) + mixed_zero_fill_wavefronts(dst, src, mask, fetched)
        return InstrCost(wf * cost.executed, cost.ideal, cost.executed)

    # -- shards (fa_sim.parallel.merge): rows add up; a row's labels are its latest event's --------
    def fresh(self) -> "BankCounter":
        return BankCounter()

    def partial(self) -> tuple[dict, dict]:
        return self._rows, self.per_instruction

    def merge(self, part: tuple[dict, dict]) -> None:
        rows, per = part
        for key, row in rows.items():
            old = self._rows.get(key)
            self._rows[key] = row if old is None else dataclasses.replace(row, counts=old.counts + row.counts)
        for cls, counter in per.items():
            self.per_instruction[cls].update(counter)

    def report(self) -> "BankReport":
        problem = getattr(self.launch, "problem", None)
        smem = None if problem is None else problem.config.smem
        rows = tuple(sorted(self._rows.values(), key=lambda r: (r.round == ROUND_EPILOGUE, r.round, r.pc)))
        per = {c: dict(sorted((int(k), int(v)) for k, v in cnt.items()))
               for c, cnt in self.per_instruction.items()}
        return BankReport(smem.value if smem is not None else "?", rows, per)


@dataclass(frozen=True)
class BankReport:
    """Everything BankCounter measured; group-bys over its rows."""

    smem: str
    rows: tuple[BankRow, ...]
    per_instruction: dict  # SmemClass -> {wavefronts per instruction: number of instructions}

    def group(self, *fields: str) -> dict:
        """Sum counts over rows grouped by BankRow fields, e.g. group('cls') or group('phase', 'cls')."""
        out: dict = {}
        for row in self.rows:
            key = tuple(getattr(row, f) for f in fields)
            key = key[0] if len(key) == 1 else key
            out[key] = out.get(key, Counts()) + row.counts
        return out

    def phases(self) -> list[str]:
        """The phase labels in program order (by the first pc each appears at)."""
        first: dict = {}
        for row in self.rows:
            first[row.phase] = min(first.get(row.phase, row.pc), row.pc)
        return sorted(first, key=first.get)

    def by_class(self) -> dict[SmemClass, Counts]:
        got = self.group("cls")
        return {c: got.get(c, Counts()) for c in SmemClass}

    def total(self) -> Counts:
        """Totals over the classes ncu counts conflicts for (LDSM, LDS, STS)."""
        by = self.by_class()
        return sum((by[c] for c in CONFLICT_CLASSES), Counts())

    def to_json(self) -> dict:
        phases: dict = {}
        for (phase, cls), counts in self.group("phase", "cls").items():
            phases.setdefault(str(phase), {})[cls.value] = counts.to_json(cls)
        rounds: dict = {}
        for (rnd, cls), counts in self.group("round", "cls").items():
            rounds.setdefault(ROUND_NAMES.get(rnd, str(rnd)), {})[cls.value] = counts.to_json(cls)
        return {
            "smem": self.smem,
            "classes": {c.value: v.to_json(c) for c, v in self.by_class().items()},
            "phases": phases,
            "rounds": rounds,
            "total": self.total().to_json(),
            "per_instruction": {c.value: {str(k): v for k, v in d.items()}
                                for c, d in self.per_instruction.items() if d},
        }
