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
from itertools import pairwise

import numpy as np

MIN_PACK = 2  # instructions per pack
MIN_CHAIN = 4  # instructions per chain run as one call (shorter ones cost no more one by one)


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
    chain: ChainCall | None = None


@dataclass(frozen=True)
class PackCall:
    """`var = AS(fn(*args), dtype, n)` followed by `after` (its stores): key = (fn, dtype) names."""

    fn: str
    dtype: str
    args: tuple[str, ...]
    var: str
    after: tuple[str, ...]
    fold: str | None = None  # the name of fn's fold (ops.common.Folding): a chain of it is one call
    store: tuple | None = None  # (register, type) when `after` is only its store into the register file


@dataclass(frozen=True)
class ChainCall:
    """A chain of calls (module docstring) as one: fold(the operands x_0 .. x_m as [m + 1, N]) gives
    the members' values in order; each member (its instruction and PackCall) then runs its `after`."""

    fold: str
    dtype: str
    operands: tuple[str, ...]
    members: tuple[tuple[int, PackCall], ...]


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


def fold_chains(nodes: list[Node]) -> None:
    """Make each chain of at least MIN_CHAIN calls of one Folding function (module docstring) one
    node, at its last member's place (the other members' nodes are left empty): it computes every
    member's value, so what reads one of them depends on it."""
    ancestors: list[set[int]] = []
    for node in nodes:
        ancestors.append(set().union(*(ancestors[d] | {d} for d in node.deps)))
    users: dict[int, list[int]] = {}
    for node in nodes:
        for d in node.deps:
            users.setdefault(d, []).append(node.k)
    for members in _chains(nodes, ancestors):
        members = _cut(nodes, users, members)
        if len(members) >= MIN_CHAIN:
            _merge(nodes, members)


def _chains(nodes: list[Node], ancestors: list[set[int]]) -> list[list[int]]:
    """Maximal chains: each member a Folding call that reads the previous member's value and, as its
    other operand, a value computed from no member of the chain."""
    producer = {node.call.var: node.k for node in nodes if node.call is not None}
    chain_of: dict[int, list[int]] = {}
    out = []
    for node in nodes:
        c = node.call
        if c is None or c.fold is None or node.raises or len(c.args) != 2 or c.args[0] == c.args[1]:
            continue
        for a in c.args:
            p = producer.get(a)
            prev = None if p is None else nodes[p].call
            if prev is None or (prev.fold, prev.fn, prev.dtype) != (c.fold, c.fn, c.dtype) or nodes[p].raises:
                continue
            chain = chain_of.get(p) or [p]
            if chain[-1] != p or any((ancestors[d] | {d}) & set(chain) for d in node.deps - {p}):
                continue
            if len(chain) == 1:
                chain_of[p] = chain
                out.append(chain)
            chain.append(node.k)
            chain_of[node.k] = chain
            break
    return out


def _cut(nodes: list[Node], users: dict, members: list[int]) -> list[int]:
    """The chain's longest head that can run as one call at its last member's place: no instruction
    between its members but the next member reads a member's value, or stores a register that a
    member before it reads from the register file. The head ends before the first such instruction."""
    while len(members) >= MIN_CHAIN:
        last, inside = members[-1], set(members)
        stop = [u for i, k in enumerate(members[:-1]) for u in users.get(k, ()) if u < last and u != members[i + 1]]
        stop += [k for k in range(members[0] + 1, last) if k not in inside and
                 nodes[k].stores & set().union(*(nodes[j].reads for j in members if j < k))]
        if not stop:
            return members
        members = [k for k in members if k < min(stop)]
    return []


def _merge(nodes: list[Node], members: list[int]) -> None:
    """The chain's node (at its last member) in place of its members' nodes."""
    first, last = nodes[members[0]], nodes[members[-1]]
    calls = [nodes[k].call for k in members]
    others = [next(a for a in call.args if a != prev.var) for prev, call in pairwise(calls)]
    merged = Node(last.k, deps=set().union(*(nodes[k].deps for k in members)) - set(members),
                  reads=set().union(*(nodes[k].reads for k in members)),
                  stores=set().union(*(nodes[k].stores for k in members)),
                  chain=ChainCall(first.call.fold, first.call.dtype, (*first.call.args, *others),
                                  tuple(zip(members, calls))))
    for k in members:
        nodes[k] = Node(k)
    nodes[last.k] = merged
    inside = set(members)
    for node in nodes:
        if node.deps & inside and node.k != last.k:
            node.deps = (node.deps - inside) | {last.k}


class Packer:
    """Writes the block's body in level order, packs as single calls (module docstring).
    `file_reads`: argument expressions that read a register row (FileRead); `gather(regs, ptype)`:
    the expression of those rows as one [m, N] array; `scalars`: expressions of one value for all
    lanes (a shift amount's immediate), which a pack takes only when all its members pass the same."""

    def __init__(self, nodes: list[Node], file_reads: dict, gather, scalars: set[str], scatter=None):
        self.nodes, self.file_reads, self.gather, self.scalars = nodes, file_reads, gather, scalars
        self.scatter = scatter  # scatter(regs, ptype): the expression of a function storing [m, N] into them
        self.rows: dict[str, tuple[str, int, int]] = {}  # member variable -> (pack, row, pack size)
        self.out: list[tuple[int, str]] = []

    def body(self) -> list[tuple[int, str]]:
        """(instruction, line) of the function body, in the order it runs."""
        by_level: dict[int, list[Node]] = {}
        fold_chains(self.nodes)
        for node, lv in zip(self.nodes, levels(self.nodes)):
            by_level.setdefault(lv, []).append(node)
        for lv in sorted(by_level):
            groups: dict[tuple, list[Node]] = {}
            for node in by_level[lv]:
                key = (node.call.fn, node.call.dtype, len(node.call.args)) if node.call else ("single", node.k)
                groups.setdefault(key, []).append(node)
            for members in sorted(groups.values(), key=lambda g: g[0].k):
                if members[0].chain is not None:
                    self.fold(members[0])
                elif len(members) >= MIN_PACK:
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
        stores = [node.call.store for node in members]
        together = self.scatter is not None and None not in stores and len({t for _, t in stores}) == 1
        for i, node in enumerate(members):
            self.rows[node.call.var] = (name, i, m)
            self.out.append((node.k, f"{node.call.var} = {name}[{i}]"))
            self.out += [] if together else [(node.k, line) for line in node.call.after]
        if together:  # every member only stores its value: one store of the pack's rows
            self.out.append((members[-1].k, f"{self.scatter(tuple(r for r, _ in stores), stores[0][1])}({name})"))

    def fold(self, node: Node) -> None:
        """A chain as one call of its fold; its results are the rows of one array, as a pack's."""
        chain, m = node.chain, len(node.chain.members)
        ops = list(chain.operands)
        x = (self.combine(ops) if len(set(ops)) > 1 else None) or f"STACK(({', '.join(ops)},))"
        name = f"R{len(self.out)}"
        self.out.append((node.k, f"{name} = ASM({chain.fold}({x}), {chain.dtype}, {m}, n)"))
        for i, (k, call) in enumerate(chain.members):
            self.rows[call.var] = (name, i, m)
            self.out.append((k, f"{call.var} = {name}[{i}]"))
            self.out += [(k, line) for line in call.after]

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


__all__ = ["ChainCall", "FileRead", "MIN_CHAIN", "MIN_PACK", "Node", "PackCall", "Packer", "as_rows", "fold_chains", "levels"]
