"""Static per-warp instruction counts of the compiled kernel's SASS, per class and per K/V round,
beside the simulator's counts (issue 5, section 3: "same program, same instructions").

Model. The nvdisasm -c text of the kernel is parsed into instructions (address, guard, opcode with
modifiers, operands) and cut into basic blocks at branch targets and after every BRA / EXIT;
blocks unreachable from the entry (the `BRA self` sentinel after the last EXIT) are dropped. The
K/V loop is the one natural loop (retreating edge); it must be left only through its latch. Counts
are per warp (SASS is warp code), per path, in the simulator's class names (`sass_class`):

  prologue  paths entry -> loop header
  body      paths header -> latch, once per trip; a trip ends on the back edge, or on the exit
            edge in the last round
  epilogue  the union of the blocks after the loop. Its branches are lane-divergent (lane % 4 != 0
            leaves before the LSE stores; the __frcp_rn slow-path call), and a warp issues the
            union of its lanes' blocks; we check the union equals the heaviest path, so the count
            holds whatever the divergence. The called slow path must hold no counted class.

Guards. `@!PT` instructions never run (ptxas puts three `@!PT LDS RZ, [RZ]` before each LDGSTS
group) and are not counted. Every other guarded instruction is issued by the warp, but the compiler
if-converts short arms, so some guarded instructions are provably off: a pair `@P X` / `@!P X` of
one class with P not rewritten in between has one instruction on and one off; an instruction
guarded like the block's closing `@P BRA` is on along one edge and off along the other. Those
off instructions are counted apart (`off:CLASS`); the simulator models the program, so it is
compared with the instructions that are on. Unresolved guards (`@!P3 STG` for rows < seqlen_q)
count as on, as the simulator counts predicated stores.

What NVRTC 13.0 does (sm_80 / sm_90, the whole config family): no peeling, no unrolling of the K/V
loop. Both arms of the first-round vs later-round softmax (`softmax_rescale_o<true|false>`) are in
the body, each with its own 4 x rows shuffles; the K[t+1] load, the mask and the interior /
boundary copies are branches or if-converted arms (a 1-instruction copy is fully if-converted:
both the plain LDGSTS and the zero-fill one are issued, one off). The boundary arm uses LDGSTS with
an ignore-src predicate operand (zero fill), one instruction per 16-byte chunk as the simulator.
A trip's path is identified by EX2 (MUFU.EX2, one per expf: the P values, plus one alpha per row
slot after round 0), LDGDEPBAR (2 with the K[t+1] load) and whether it is the last trip; any other
branch (mask, copy arms) must leave the on-counts unchanged, else `SassStructureError`.

`python -m fa_hw.sass_counts [--config TAG] [--causal] [--arch sm_90]` prints the per-warp table.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import graphlib
import re
from itertools import takewhile

import numpy as np

from fa_sim.config import KernelConfig
from fa_sim.events import ROUND_EPILOGUE, ROUND_PROLOGUE, Op
from fa_sim.kernels import Problem
from fa_sim.kernels.plan import program_sites

from .compile import KERNEL_NAME, compile_kernel
from .errors import FaHwError

Counts = collections.Counter
EX2 = "#EX2"  # path feature, not a class: MUFU.EX2 instructions that are on
_LINE = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(?:(@!?U?P(?:T|\d))\s+)?([A-Z][A-Z0-9_.]*)\s*(.*?)\s*;")
_TARGET = re.compile(r"`\(([^)]+)\)")
_LABEL = re.compile(r"^\s*([$\w.]+):\s*$")
_FUNC = re.compile(r"\.type\s+([$\w.]+),@function")
_PRED = re.compile(r"U?P[0-6T]")
_WIDTH = {"8", "16", "32", "64", "128"}
_EXACT = {"HMMA.16816.F32": "HMMA", "LDSM.16.M88.4": "LDSM.M88", "LDSM.16.MT88.4": "LDSM.MT88",
          "SHFL.BFLY": "SHFL", "DEPBAR.LE": "DEPBAR", "LDGDEPBAR": "LDGDEPBAR",
          "BAR.SYNC.DEFER_BLOCKING": "BAR", "BAR.SYNC": "BAR", "LDGSTS.E.BYPASS.128": "LDGSTS",
          "LDGSTS.E.BYPASS.LTC128B.128": "LDGSTS"}
_OWN_COLUMN = {"HMMA", "LDSM", "SHFL", "DEPBAR", "BAR", "LDGSTS", "ATOM", "ATOMS", "ATOMG", "RED", "LD",
               "ST", "MEMBAR"}  # unmodelled shapes of these keep their full opcode as a column


class SassStructureError(FaHwError):
    """The SASS does not have the shape this analysis models (one natural loop, ...)."""


@dataclasses.dataclass(frozen=True)
class SassInstr:
    addr: int
    guard: str  # '' when unguarded, else e.g. '@!P0'
    opcode: str  # with modifiers, e.g. 'LDSM.16.MT88.4'
    operands: str

    @property
    def base(self) -> str:
        return self.opcode.split(".")[0]

    @property
    def target(self) -> str | None:
        m = _TARGET.search(self.operands)
        return m.group(1) if m else None

    @property
    def literal(self) -> tuple[str, bool] | None:
        """(predicate, negated) of a real guard; None when unguarded or @PT."""
        return None if self.guard in ("", "@PT") else (self.guard.lstrip("@!"), "!" in self.guard)

    def writes(self, pred: str) -> bool:
        """Conservatively: the predicate is among the leading destinations (first operand and the
        predicates right after it, e.g. ISETP P0, PT, ... or IADD3 R4, P0, P1, ...)."""
        ops = [o.strip() for o in self.operands.split(",")]
        return pred in ops[:1] + list(takewhile(_PRED.fullmatch, ops[1:]))


def parse_functions(sass: str) -> tuple[dict[str, list[SassInstr]], dict[str, int]]:
    """nvdisasm text -> instructions per function, and every label's address."""
    names = set(_FUNC.findall(sass))
    funcs: dict[str, list[SassInstr]] = {}
    labels: dict[str, int] = {}
    current, pending = None, []
    for line in sass.splitlines():
        m = _LINE.match(line)
        if m:
            ins = SassInstr(int(m.group(1), 16), m.group(2) or "", m.group(3), m.group(4))
            labels.update({name: ins.addr for name in pending})
            pending = []
            if current is not None:
                funcs[current].append(ins)
        elif lab := _LABEL.match(line):
            pending.append(lab.group(1))
            if lab.group(1) in names:
                current = lab.group(1)
                funcs[current] = []
    return funcs, labels


def sass_class(ins: SassInstr) -> str | None:
    """The simulator class an instruction counts as (None: not counted). LDS/STS/LDG/STG carry
    their width (STG.128); LDL/STL (spills) and unmodelled shapes keep their opcode."""
    if ins.opcode in _EXACT:
        return _EXACT[ins.opcode]
    if ins.base in ("LDS", "STS", "LDG", "STG"):
        bits = [m.lstrip("US") for m in ins.opcode.split(".")[1:] if m.lstrip("US") in _WIDTH]
        return f"{ins.base}.{bits[-1] if bits else 32}"
    if ins.base in _OWN_COLUMN or ins.base in ("LDL", "STL"):
        return ins.opcode
    return None


def _tags(ins: SassInstr) -> list[str]:
    cls = sass_class(ins)
    return ([cls] if cls else []) + ([EX2] if ins.opcode.startswith("MUFU.EX2") else [])


@dataclasses.dataclass
class _Block:
    instrs: list[SassInstr]
    succ: list[int]  # successor block starts: [taken target, fall-through] for a conditional BRA


def _block_weights(b: _Block) -> dict[int | None, Counts]:
    """Counts of a block per outgoing edge (None: leaving through EXIT), guards resolved."""
    base, pend = Counts(), []
    for i, ins in enumerate(b.instrs):
        if ins.guard != "@!PT" and _tags(ins):
            (pend if ins.literal else [(None, base)])[-1:] if False else None
            if ins.literal:
                pend.append(i)
            else:
                base.update(_tags(ins))
    _pair_off(b.instrs, pend, base)
    last, edges = b.instrs[-1], {s: Counts() for s in b.succ}
    if last.base == "EXIT":
        edges[None] = Counts()
    resolvable = last.base == "BRA" and last.literal and len(set(b.succ)) == 2 and "P" not in last.operands.split("`")[0]
    for i in pend:
        ins = b.instrs[i]
        pred, neg = ins.literal
        tied = resolvable and pred == last.literal[0] and not any(x.writes(pred) for x in b.instrs[i + 1:-1])
        for k, (s, c) in enumerate(edges.items()):
            on = not tied or (neg == last.literal[1]) == (k == 0)
            c.update(_tags(ins) if on else [f"off:{t}" for t in _tags(ins)])
    return {s: base + c for s, c in edges.items()}


def _pair_off(instrs: list[SassInstr], pend: list[int], base: Counts) -> None:
    """Resolve `@P X` / `@!P X` pairs of one class in place: one on, one off."""
    for i in list(pend):
        if i not in pend:
            continue
        pred, neg = instrs[i].literal
        for j in pend:
            if j > i and instrs[j].literal == (pred, not neg) and _tags(instrs[j]) == _tags(instrs[i]):
                if not any(x.writes(pred) for x in instrs[i + 1:j]):
                    base.update(_tags(instrs[i]) + [f"off:{t}" for t in _tags(instrs[i])])
                    pend.remove(i), pend.remove(j)
                    break
