"""Packs: independent instructions of a lane block that call the same value function, executed as
one call on their operands stacked into one [m, N] array.

A lane block (fa_sim/ptx/fused.py) of the attention kernel is mostly the same instruction on
different registers: sixteen `mul; sub; ex2.approx` of the softmax, one per score, sixteen
`cvt.rn.f16x2.f32` that pack P, sixteen `mul` that rescale O. Each is one call of an exact
elementwise function (fa_sim/isa) on one [N] row; as a pack the function runs once on [m, N], so
the per-call cost is paid once and a chain of packs (mul -> sub -> ex2) passes its rows on without
copying. The values are those of the single calls: the functions are elementwise and the same.

The block's instructions are scheduled by level (an instruction's level is one more than that of
every instruction whose value it reads, so same-level instructions are independent); at each level
the packable instructions with the same function, output type and number of operands form one pack.
Reordering keeps the register file's program-order contents: an instruction that stores a register
comes after every instruction that reads that register from the file (the block reads a register
from the file only before its first write of it), and the instructions that can raise (reads of
special registers or of another width, executors run on the block's locals) keep their program
order, so a failing block names the instruction that fails first in program order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

MIN_PACK = 2  # instructions per pack


@dataclass
class Node:
    """One instruction of a block as the generator wrote it: its lines of the function body, the
    instructions whose locals they read (deps), the registers it reads from the register file and
    stores into it, whether it can raise, and for a value-function call that may join a pack its
    PackCall."""

    k: int
    lines: list[str] = field(default_factory=list)
    deps: set[int] = field(default_factory=set)
    reads: set[str] = field(default_factory=set)
    stores: set[str] = field(default_factory=set)
    raises: bool = False
    call: PackCall | None = None


@dataclass(frozen=True)
class PackCall:
    """`var = AS(fn(*args), dtype, n)` followed by `after` (its stores): key = (fn, dtype) names."""

    fn: str
    dtype: str
    args: tuple[str, ...]
    var: str
    after: tuple[str, ...]


@dataclass(frozen=True)
class FileRead:
    """An argument expression that reads a register's row (reg: an ir.Reg) from the register file as ptype."""

    reg: object
    ptype: str


def levels(nodes: list[Node]) -> list[int]:
    """Each node's level (module docstring), in program order."""
    level: list[int] = []
    readers: dict[str, list[int]] = {}
    last_raise = None
    for node in nodes:
        lv = max((level[d] + 1 for d in node.deps), default=0)
        for r in node.stores:
            lv = max([lv] + [level[j] + 1 for j in readers.get(r, ()) if j != node.k])
        if node.raises:
            if last_raise is not None:
                lv = max(lv, level[last_raise] + 1)
            last_raise = node.k
        level.append(lv)
        for r in node.reads:
            readers.setdefault(r, []).append(node.k)
    return level


class Packer:
    """Writes the block's body in level order, packs as single calls (module docstring).
    `file_reads`: argument expressions that read a register row (FileRead); `gather(regs, ptype)`:
    the expression of those rows as one [m, N] array; `scalars`: expressions of one value for all
    lanes (a shift amount's immediate), which a pack takes only when all its members pass the same."""

    def __init__(self, nodes: list[Node], file_reads: dict, gather, scalars: set[str]):
        self.nodes, self.file_reads, self.gather, self.scalars = nodes, file_reads, gather, scalars
        self.rows: dict[str, tuple[str, int, int]] = {}  # member variable -> (pack, row, pack size)
        self.out: list[tuple[int, str]] = []

    def body(self) -> list[tuple[int, str]]:
        """(instruction, line) of the function body, in the order it runs."""
        by_level: dict[int, list[Node]] = {}
        for node, lv in zip(self.nodes, levels(self.nodes)):
            by_level.setdefault(lv, []).append(node)
        for lv in sorted(by_level):
            groups: dict[tuple, list[Node]] = {}
            for node in by_level[lv]:
                key = (node.call.fn, node.call.dtype, len(node.call.args)) if node.call else ("single", node.k)
                groups.setdefault(key, []).append(node)
            for members in sorted(groups.values(), key=lambda g: g[0].k):
                if len(members) >= MIN_PACK:
                    self.pack(members)
                else:
                    self.out += [(members[0].k, line) for line in members[0].lines]
        return self.out

    def pack(self, members: list[Node]) -> None:
        k, m, name = members[0].k, len(members), f"P{len(self.out)}"
        args = [self.combine([node.call.args[j] for node in members]) for j in range(len(members[0].call.args))]
        if None in args:
            for node in members:
                self.out += [(node.k, line) for line in node.lines]
            return
        call = members[0].call
        self.out.append((k, f"{name} = ASM({call.fn}({', '.join(args)}), {call.dtype}, {m}, n)"))
        for i, node in enumerate(members):
            self.rows[node.call.var] = (name, i, m)
            self.out.append((node.k, f"{node.call.var} = {name}[{i}]"))
            self.out += [(node.k, line) for line in node.call.after]

    def combine(self, exprs: list[str]) -> str | None:
        """One argument of a pack: the members' expressions as one array (broadcast when equal;
        None: they cannot be one array)."""
        if all(e == exprs[0] for e in exprs):
            return exprs[0]
        if any(e in self.scalars for e in exprs):
            return None
        rows = [self.rows.get(e) for e in exprs]
        if None not in rows and len({r[0] for r in rows}) == 1 and rows[0][2] == len(exprs) and \
                [r[1] for r in rows] == list(range(len(exprs))):
            return rows[0][0]  # the rows of one earlier pack, in order: that pack's array
        reads = [self.file_reads.get(e) for e in exprs]
        if None not in reads and len({r.ptype for r in reads}) == 1:
            return self.gather(tuple(r.reg for r in reads), reads[0].ptype)
        return f"STACK(({', '.join(exprs)},))"


def as_rows(value, dtype: np.dtype, m: int, n: int) -> np.ndarray:
    """A pack's result as [m, n] of the written type's dtype (fused._as for m rows)."""
    if value.__class__ is np.ndarray and value.dtype == dtype and value.shape == (m, n):
        return value
    v = np.asarray(value).astype(dtype, copy=False)
    return v if v.shape == (m, n) else np.broadcast_to(v, (m, n))


__all__ = ["FileRead", "MIN_PACK", "Node", "PackCall", "Packer", "as_rows", "levels"]
