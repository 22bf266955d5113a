"""The kernel's SASS as a control-flow graph: basic blocks, the K/V loop, and every path through
the three regions a warp runs (prologue, one K/V trip, epilogue), with what each path issues.

Model. nvdisasm -c text -> instructions (address, guard, opcode, operands) -> basic blocks (cut at
branch targets and after BRA / EXIT / a CALL to a label of the kernel, which is how sm_80 leaves
the loop, and after a BSYNC, so that the blocks are fa_sim.timing.walk's), reachable from the entry only (the `BRA self` sentinel after EXIT is dropped). The K/V
loop is the one backward branch; it must be left at its bottom. Per warp, in the simulator's class
names (`sass_class`), per path: prologue = paths entry -> header; a trip = paths header -> back
edge, or -> exit edge for the last round (loop body counted once per trip); epilogue = union of
the blocks after the loop, which a warp issues whatever its lanes' divergence (lane % 4 != 0 exits
before the LSE stores; the __frcp_rn slow-path call, whose callee must hold no counted class) -
checked to equal the heaviest single path.

Guards. `@!PT` never runs (ptxas puts three `@!PT LDS RZ, [RZ]` before each LDGSTS group): not
counted. Any other guarded instruction is issued, but ptxas if-converts short arms, so some are
provably off: of a pair `@P X` / `@!P X` (one class, P not rewritten between) one is on and one
off; one guarded like the block's closing `@P BRA` is on along one edge, off along the other.
Off instructions are counted apart (`off:CLASS`). Unresolved guards (`@!P3 STG`, rows < seqlen_q)
count as on. LDL/STL (spills) are counted apart too.

What NVRTC 13.0 does (sm_80 and sm_90, whole config family): no peeling, no unrolling of the K/V
loop; both softmax arms (`softmax_rescale_o<true|false>`, each with its own shuffles) are in the
body; the K[t+1] load, the mask and the interior / boundary copies are branches or if-converted
arms (a 1-instruction copy: both the plain and the zero-fill LDGSTS issued, one off; a longer one:
the interior arm predicated into the boundary arm). Zero fill is LDGSTS with an ignore-src
predicate, one per 16-byte chunk. A trip's path is told by EX2 (MUFU.EX2, one per exponential: the
P values, plus one alpha per row slot after round 0), LDGDEPBAR (2 with the K[t+1] load) and
being the last; other branches (mask, copy arms) must not change the on-counts, else
`SassStructureError`. Which path a warp takes through each region comes from the functional run
(fa_sim.timing.stream); fa_sim.timing.oracle keeps the choice derived from the config, the
oracle the tests hold the functional run's against and fa_hw/sass_counts.py's static table.
"""

from __future__ import annotations

import collections
import dataclasses
import graphlib
import re
from itertools import takewhile

from ..contract import KERNEL_NAME


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


class SassStructureError(ValueError):
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
        predicates right after it: ISETP P0, PT, ...; IADD3 R4, P0, P1, ...), or R2P PR, ..."""
        ops = [o.strip() for o in self.operands.split(",")]
        return ops[0] == "PR" or pred in ops[:1] + list(takewhile(_PRED.fullmatch, ops[1:]))


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
            if ins.literal:
                pend.append(i)
            else:
                base.update(_tags(ins))
    _pair_off(b.instrs, pend, base)
    last, edges = b.instrs[-1], {s: Counts() for s in b.succ}
    if last.base == "EXIT":
        edges[None] = Counts()
    resolvable = (last.base in ("BRA", "CALL") and last.literal and len(set(b.succ)) == 2
                  and not last.operands.startswith(("P", "!P", "UP", "!UP")))  # not `BRA P1, target`
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


def _cfg(instrs: list[SassInstr], labels: dict[str, int], functions) -> dict[int, _Block]:
    """Basic blocks by start address, only those reachable from the entry. A CALL to a label of
    the same function is a jump (sm_80 leaves the K/V loop with `@P0 CALL.REL.NOINC` to the exit)."""
    def jump(ins):
        return ins.base == "BRA" or (ins.base == "CALL" and ins.target not in functions)
    leaders = {instrs[0].addr}
    for ins, nxt in zip(instrs, instrs[1:]):
        if ins.base in ("BRX", "JMX", "JMP", "BREAK", "KILL"):
            raise SassStructureError(f"unsupported control flow at {ins.addr:#06x}: {ins.opcode}")
        if jump(ins) or ins.base in ("EXIT", "RET", "BSYNC"):  # a BSYNC alone, as fa_sim.timing.walk cuts it
            leaders |= {nxt.addr} | ({labels[ins.target]} if jump(ins) else set())
    blocks, cur = {}, []
    for i, ins in enumerate(instrs):
        cur.append(ins)
        nxt = instrs[i + 1].addr if i + 1 < len(instrs) else None
        if nxt is None or nxt in leaders:
            fall = [nxt] if nxt is not None else []
            if jump(ins):
                succ = [labels[ins.target]] + (fall if ins.literal else [])
            else:
                succ = fall if ins.base not in ("EXIT", "RET") or ins.literal else []
            blocks[cur[0].addr], cur = _Block(cur, succ), []
    reach = _reach({a: b.succ for a, b in blocks.items()}, [instrs[0].addr])
    return {a: b for a, b in blocks.items() if a in reach}


def _reach(succ: dict, starts, allowed=None) -> set:
    """Nodes reachable from `starts` along `succ` (node -> successors), staying inside `allowed`."""
    seen, todo = set(), list(starts)
    while todo:
        n = todo.pop()
        if n not in seen and (allowed is None or n in allowed):
            seen.add(n)
            todo += succ[n]
    return seen


def _path_weights(blocks: dict[int, _Block], nodes: set[int], start: int, ends: set, skip: set) -> set:
    """Counts of every path from `start` through the DAG `nodes` (edges in `skip` removed) that
    leaves by one of the edges `ends` (block, successor or None), as frozensets of items."""
    weights = {n: _block_weights(blocks[n]) for n in nodes}
    preds = {n: [p for p in nodes if n in blocks[p].succ and (p, n) not in skip] for n in nodes}
    at: dict[int, set] = {start: {frozenset()}}
    for n in graphlib.TopologicalSorter(preds).static_order():
        if n != start:
            at[n] = {_plus(w, weights[p][n]) for p in preds[n] for w in at.get(p, ())}
    return {_plus(w, weights[u][s]) for u, s in ends for w in at.get(u, ())}


def _plus(w: frozenset, c: Counts) -> frozenset:
    return frozenset((Counts(dict(w)) + c).items())


def on_classes(w) -> Counts:
    """The simulator-comparable part of a path weight: classes that are on, without local memory
    (spills, which the simulator has no notion of: see `local_memory_bytes`)."""
    return Counts({k: v for k, v in dict(w).items() if k != EX2 and not k.startswith(("off:", "LDL", "STL"))})


def off_classes(w) -> Counts:
    """Instructions issued with their guard provably false (if-converted arms), per class."""
    return Counts({k[4:]: v for k, v in dict(w).items() if k.startswith("off:")})


@dataclasses.dataclass(frozen=True)
class KernelSass:
    """Per-warp path weights of one kernel's three regions (see the module docstring)."""

    prologue: frozenset  # paths entry -> loop header
    trip: frozenset  # paths header -> latch -> back edge (rounds before the last)
    last_trip: frozenset  # paths header -> latch -> loop exit (the last round)
    epilogue: Counts  # union of the blocks after the loop (= the heaviest path)
    notes: str
    blocks: dict = dataclasses.field(default_factory=dict, compare=False)  # start address -> _Block
    walks: dict = dataclasses.field(default_factory=dict, compare=False)  # region -> ((weight, block starts), ...)
    callees: frozenset = dataclasses.field(default=frozenset(), compare=False)  # functions the kernel CALLs

    def paths(self, region: str, ex2: int | None = None, ldgdepbar: int | None = None, **classes: int) -> list:
        """Paths of `region` with these path features: EX2 and LDGDEPBAR on-counts, and any
        counted class given by name in `classes` ({"LDGSTS": 8, "HMMA": 64}, see `_trip_key`)."""
        want = {EX2: ex2, "LDGDEPBAR": ldgdepbar, **classes}
        ws = {"prologue": self.prologue, "trip": self.trip, "last_trip": self.last_trip}[region]
        return [w for w in ws if all(n is None or dict(w).get(c, 0) == n for c, n in want.items())]

    def walk(self, region: str, longest: bool = False, **key) -> list:
        """The instructions, in issue order, of one path of `region` ('prologue', 'trip', 'last_trip',
        'epilogue') with these features (`paths`); among paths that issue the same counted classes
        (a masking branch, an if-converted copy arm) the shortest, or with `longest` the longest
        (a round that masks: the causal diagonal, a tail)."""
        return [ins for b in self.walk_starts(region, longest, **key) for ins in self.blocks[b].instrs]

    def walk_starts(self, region: str, longest: bool = False, **key) -> tuple:
        """The block starts of the path `walk` takes."""
        want = {EX2: key.pop("ex2", None), "LDGDEPBAR": key.pop("ldgdepbar", None), **key}
        hits = [starts for w, starts in self.walks[region]
                if all(n is None or dict(w).get(c, 0) == n for c, n in want.items())]
        if not hits:
            raise SassStructureError(f"{region}: no path with {key}")
        size = [sum(len(self.blocks[b].instrs) for b in starts) for starts in hits]
        return hits[size.index(max(size) if longest else min(size))]

    def slow_calls(self, starts: tuple) -> int:
        """Blocks of a walk that call another function: the __frcp_rn slow path of normalize, for
        a row sum outside the normal range. A row that is not empty sums at least 1 (its maximum's
        exponential is exactly 1), so the warp takes the MUFU.RCP arm (Nsight Compute's per-SASS
        counts: the call arm is never executed)."""
        return sum(any(i.base == "CALL" and i.target in self.callees for i in self.blocks[b].instrs) for b in starts)

    def epilogue_starts(self) -> tuple:
        """The epilogue's walk: every counted instruction, the fast arm of __frcp_rn, the longest."""
        walks = [starts for _, starts in self.walks["epilogue"]]
        return min(walks, key=lambda s: (self.slow_calls(s), -sum(len(self.blocks[b].instrs) for b in s)))

    def pick(self, region: str, **key) -> Counts:
        """On-counts of the paths of `region` with this key (`paths`' features); they must agree."""
        hits = {frozenset(on_classes(w).items()) for w in self.paths(region, **key)}
        if len(hits) != 1:
            have = sorted((dict(w).get(EX2, 0), dict(w).get("LDGDEPBAR", 0)) for w in self.paths(region))
            raise SassStructureError(f"{region}: {len(hits)} distinct on-counts for {key} (paths' EX2, LDGDEPBAR: {have})")
        return Counts(dict(next(iter(hits))))


def analyze(sass: str, function: str = KERNEL_NAME) -> KernelSass:
    """Cut the kernel's SASS into prologue / K-V loop trip / epilogue and weigh every path."""
    funcs, labels = parse_functions(sass)
    blocks = _cfg(funcs[function], labels, funcs)
    entry = funcs[function][0].addr
    back = [(u, s) for u, b in blocks.items() for s in b.succ if s <= u]  # backward branches
    if len({h for _, h in back}) != 1:
        raise SassStructureError(f"expected one loop (the K/V loop), found back edges {back}")
    header, latches = back[0][1], {u for u, _ in back}
    loop, exits = _loop(blocks, header, latches)
    outside = set(blocks) - loop
    pro = _path_weights(blocks, outside, entry, {(n, header) for n in outside if header in blocks[n].succ}, set())
    trip = _path_weights(blocks, loop, header, set(back), set(back))
    last = _path_weights(blocks, loop, header, exits, set(back))
    callees = frozenset({i.target for b in blocks.values() for i in b.instrs if i.base == "CALL"} & set(funcs))
    for name in callees:
        if any(sass_class(i) for i in funcs[name]):  # the __frcp_rn slow path must issue no class
            raise SassStructureError(f"{function} calls {name}, which issues counted instructions")
    end = max(blocks[u].instrs[-1].addr for u in latches)
    notes = (f"K/V loop {header:#06x}..{end:#06x}: {len(loop)} blocks, "
             f"{sum(len(blocks[n].succ) == 2 for n in loop)} two-way branches, {len(trip | last)} trip paths")
    after = next(iter(exits))[1]
    epilogue = _epilogue(blocks, after)
    reach = _reach({a: b.succ for a, b in blocks.items()}, [after])
    walks = {"prologue": _walks(blocks, outside, entry, {(n, header) for n in outside if header in blocks[n].succ}),
             "trip": _walks(blocks, loop, header, set(back), set(back)),
             "last_trip": _walks(blocks, loop, header, exits, set(back)),
             "epilogue": tuple(w for w in _walks(blocks, reach, after, {(n, None) for n in reach
                                                                          if blocks[n].instrs[-1].base in ("EXIT", "RET")})
                               if on_classes(w[0]) == epilogue)}
    return KernelSass(frozenset(pro), frozenset(trip), frozenset(last), epilogue, notes, blocks, walks, callees)


def _walks(blocks: dict[int, _Block], nodes: set[int], start: int, ends: set, skip: set = frozenset()) -> tuple:
    """Every path from `start` through the DAG `nodes` that leaves by an edge of `ends`, as
    (weight, block starts in order), weights as in `_path_weights`."""
    weights = {n: _block_weights(blocks[n]) for n in nodes}
    out, todo = [], [(start, (start,), frozenset())]
    while todo:
        n, starts, w = todo.pop()
        for s in dict.fromkeys(blocks[n].succ + ([None] if None in weights[n] else [])):
            if (n, s) in ends:
                out.append((_plus(w, weights[n][s]), starts))
            elif s in nodes and (n, s) not in skip:
                todo.append((s, starts + (s,), _plus(w, weights[n][s])))
    return tuple(sorted(out, key=lambda x: x[1]))


def _loop(blocks: dict[int, _Block], header: int, latches: set[int]) -> tuple[set[int], set]:
    """The natural loop of `header` and its exit edges, checked to be bottom-tested: every
    header -> latch path passes an exiting block that is not the header (one-block loops aside),
    so a trip ends at the back edge or, the last one, at the exit edge."""
    succ = {a: b.succ for a, b in blocks.items()}
    preds = {a: [p for p in blocks if a in blocks[p].succ] for a in blocks}
    loop = {header} | _reach(preds, latches, set(blocks) - {header})
    exits = {(u, s) for u in loop for s in succ[u] if s not in loop}
    exiting = {u for u, _ in exits}
    inner = _reach(succ, [header], loop - exiting)
    if len({s for _, s in exits}) != 1 or inner & latches or (header in exiting and loop != {header}):
        raise SassStructureError(f"the K/V loop must be left at its bottom only, exits: {sorted(exits)}")
    return loop, exits


def _epilogue(blocks: dict[int, _Block], start: int) -> Counts:
    reach = _reach({a: b.succ for a, b in blocks.items()}, [start])
    union = Counts()
    for n in reach:  # a block is issued once if any lane gets there; take its heaviest edge
        ws = [on_classes(w) for w in _block_weights(blocks[n]).values()]
        union += Counts({k: max(w[k] for w in ws) for k in set().union(*ws)})
    ends = {(n, None) for n in reach if blocks[n].instrs[-1].base in ("EXIT", "RET")}
    if not any(on_classes(w) == union for w in _path_weights(blocks, reach, start, ends, set())):
        raise SassStructureError(f"epilogue: no single path issues every counted instruction {dict(union)}")
    return union


def local_memory_bytes(sass: str, function: str = KERNEL_NAME) -> tuple[int, int]:
    """Static (STL, LDL) bytes of the function: what ptxas -v reports as spill stores / loads."""
    out = {"STL": 0, "LDL": 0}
    for ins in parse_functions(sass)[0][function]:
        if ins.base in out:
            bits = [m for m in ins.opcode.split(".")[1:] if m in _WIDTH]
            out[ins.base] += int(bits[-1] if bits else 32) // 8
    return out["STL"], out["LDL"]

