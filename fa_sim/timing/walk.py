"""Each warp's dynamic SASS stream, from its path in the functional run: the SASS control-flow
graph walked with every conditional branch decided by the PTX branch it compiles from.

Why this works for any kernel. ptxas keeps the control flow NVVM wrote into the PTX: the SASS
branches of a kernel are its PTX branches (some if-converted away into predicated instructions,
which then need no decision) plus branches ptxas adds inside the expansion of one PTX instruction
(the slow path of `rcp.rn.f32` and `div.rn.f32`: a CALL of an `$__internal_..._slowpath`
subroutine). So the walk needs, at each SASS conditional branch, one fact the functional run
knows: did the warp's lanes branch there? Accel-Sim drives its core model with each warp's
executed SASS trace, taken from the GPU; here the PTX engine's run gives the path
(fa_sim.observers.branches: per warp, each control instruction's pc and whether ALL, NONE or
SOME of its lanes branched), and the SASS supplies the instructions, their order and their
control bits.

The tie (static, once per kernel). Each SASS conditional branch (a guarded BRA, a guarded CALL to
a label of its own function - how sm_80 leaves a loop -, a guarded EXIT) is:
- *internal* when exactly one of its arms reaches a CALL of a ptxas-internal subroutine before the
  arms meet again: the expansion of one PTX instruction. The walk takes the other arm, the fast
  path: a slow path runs for operands outside the normal range (a reciprocal of a denormal, an
  infinity, a NaN), which the kernels timed here do not reach (Nsight Compute's per-instruction
  counts of the attention kernel: the slow path never executes).
- else *tied* to a PTX control instruction at the same source location (the CUDA line with its
  chain of inlining call sites; nvdisasm -gi and PTX .loc give both): with as many SASS as PTX
  candidates at a location they are tied in program order, else each to the candidate whose arms
  run the most alike locations; with more SASS than PTX branches, first a PTX branch of the same
  source line at another call site that no SASS branch shares a location with is taken in (ptxas
  labelled its branch with a sibling call's site: `_excess`). The polarity (does the SASS branch jump where the PTX one does,
  or to its fall-through) is read from the arms: the locations of the first instructions along
  each arm, those the two arms do not share, compared both ways round; an EXIT counts as a
  location of its own, so `@P0 EXIT` ties to `@%p bra` to the block that returns.
A SASS conditional branch that is neither has no PTX counterpart: a `TieError` names its
address and source line. A location whose SASS and PTX branches cannot be told apart is one too.
*Called functions.* A `__noinline__` function ptxas keeps as a subroutine is one SASS body CALLed
from each call site; the PTX engine runs a copy of it per call (fa_sim.ptx.inline, Kernel.calls).
Each SASS call chain (the CALLs' return addresses from the kernel inwards) is matched to its copy
by the call's source location, in program order among the calls of one location (`call_sites`),
and each conditional branch of the body is tied once per chain among the branches of that copy,
the copy's returns leaving it as a RET leaves the SASS function (`CopyGraph`): ptxas's early
`@!P RET` over the body's last if-converted test is tied to that test, the one whose arm stores
what the SASS arm stores. There a tie must be the only one the arms allow: where two choices are
equally alike, or a call matches no copy, a `TieError` names the line (and says to make the
function `__forceinline__`).
*Chained* PTX branches: a short-circuit condition (`if (a || b)`) is a chain of PTX branches at
one location, each but the last jumping to where the last one jumps or falls through, with only
straight-line code between them; ptxas may fold the chain into one SASS branch (a window build's
mask test: `@!P1 BRA P0`), tied to the chain's last PTX branch. A chained branch that no SASS
branch decides feeds its outcome to the tied one: all lanes jumping is the tied branch's outcome
towards the same place, none jumping leaves the decision to the next branch of the chain.

The walk (per warp). From the kernel's entry, block by block: an unconditional branch is
followed; a tied branch takes the next outcome of its PTX branch from the warp's path (each PTX
branch's outcomes are a queue: a SASS branch unrolled or duplicated by ptxas takes them in turn);
ALL and NONE pick one arm; SOME (the warp diverged) issues both arms one after the other up to the
point where they meet again (the BSSY target ptxas sets, else the immediate post-dominator), the
arm the PTX engine runs first (the lower pc) first, as SIMT hardware serialises divergent paths;
where they meet at a BSYNC (the convergence barrier of ptxas's BSSY), each of the two groups issues
it on arrival, so the walk issues it twice (Nsight Compute on the H100: split-KV's store_partial,
whose lanes of rows past N_q branch straight to the BSYNC, 1 warp instruction more per such warp);
an EXIT with SOME of its lanes leaving goes on with the others. A CALL to a function of the
kernel is walked into and RET comes back; a branch inside it takes the outcomes of the PTX copy of
the call chain the walk is in (its call stack), a guarded RET returns when it branches, and where
the lanes split and meet only on returning (an early `@P RET` that SOME take), each group runs to
the return and issues the BSYNC after the CALL (of the BSSY ptxas puts around it) on arrival.
At the end, every tied PTX branch's outcomes must have been taken, else the path and the SASS
disagree: a `TieError` naming the line.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import re
from os.path import basename

from ..observers.branches import ALL, NONE, SOME

_INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(?:(@!?U?P(?:T|\d))\s+)?([A-Z][A-Z0-9_.]*)\s*(.*?)\s*;")
_TARGET = re.compile(r"`\(([^)]+)\)")
_LABEL = re.compile(r"^\s*([$\w.]+):\s*$")
_FUNC = re.compile(r"\.type\s+([$\w.]+),@function")
_LOC = re.compile(r'^\s*//## File "([^"]*)", line (\d+)(?: inlined at "[^"]*", line (\d+))?')

EXIT = ("<exit>",)  # an arm that leaves the kernel, as a location
Loc = tuple  # (file basename, line, call-site line, ..., outermost call site)


class TieError(ValueError):
    """The SASS and the functional run's path cannot be tied (see the module docstring)."""


@dataclasses.dataclass(frozen=True)
class Instr:
    addr: int
    guard: str  # '' unguarded, '@PT', '@!P0', ...
    opcode: str
    operands: str
    loc: Loc | None

    @property
    def base(self) -> str:
        return self.opcode.split(".")[0]

    @property
    def target(self) -> str | None:
        m = _TARGET.search(self.operands)
        return m.group(1) if m else None

    @property
    def conditional(self) -> bool:
        return self.guard not in ("", "@PT") and self.guard != "@!PT"

    def where(self) -> str:
        file = "the kernel source" if self.loc and self.loc[0] == MAIN else self.loc[0] if self.loc else ""
        line = f", {file} line {' inlined at '.join(map(str, self.loc[1:]))}" if self.loc else ""
        return f"SASS {self.addr:#06x} `{self.guard + ' ' if self.guard else ''}{self.opcode} {self.operands}`{line}"


@dataclasses.dataclass
class Block:
    start: int
    instrs: list[Instr]
    succ: list  # [taken, fall] for a conditional branch; addresses; None: leaves (EXIT/RET)
    func: str

    @property
    def last(self) -> Instr:
        return self.instrs[-1]


def parse_sass(listing: str) -> tuple[dict[str, list[Instr]], dict[str, int]]:
    """`nvdisasm -gi -c` text -> instructions per function (with their source locations) and the
    address of every label."""
    names = set(_FUNC.findall(listing))
    funcs: dict[str, list[Instr]] = {}
    labels: dict[str, int] = {}
    current, pending = None, []
    chain: list = []
    fresh = False
    for line in listing.splitlines():
        if m := _LOC.match(line):
            if not fresh:
                chain = [basename(m.group(1)), int(m.group(2))]
            fresh = True
            if m.group(3):
                chain.append(int(m.group(3)))
        elif m := _INSTR.match(line):
            loc = tuple(dict.fromkeys(chain[1:])) if chain else ()
            ins = Instr(int(m.group(1), 16), m.group(2) or "", m.group(3), m.group(4),
                        (chain[0], *loc) if loc else None)
            fresh = False
            labels.update({n: ins.addr for n in pending})
            pending = []
            if current is not None:
                funcs[current].append(ins)
        elif lab := _LABEL.match(line):
            pending.append(lab.group(1))
            if lab.group(1) in names:
                current = lab.group(1)
                funcs[current] = []
    return funcs, labels


def kernel_listing(listing: str, kernel: str) -> str:
    """The part of an nvdisasm listing that holds `kernel`'s code section (its own functions too:
    the subroutines ptxas calls from it); each kernel's addresses start at 0 in its section."""
    head = re.compile(r"^\s*\.section\s+([^,\s]+)")
    keep, out, found = True, [], False
    for line in listing.splitlines():
        if m := head.match(line):
            keep = m.group(1) == f".text.{kernel}"
            found |= keep
        if keep:
            out.append(line)
    if not found:
        raise TieError(f"the SASS has no code section for kernel {kernel!r}")
    return "\n".join(out)


def ptx_loc(loc) -> Loc | None:
    """A PTX instruction's SourceLoc in the same form as the SASS's."""
    if loc is None or loc.line <= 0:
        return None
    return (basename(loc.file), *dict.fromkeys([loc.line, *(site[1] for site in loc.inlined_at)]))


def post_dominators(succ: dict) -> dict:
    """Immediate post-dominator of every node of a graph (node -> successors, None: the exit);
    None when only the exit post-dominates it."""
    nodes = list(succ)
    full = set(nodes) | {None}
    pdom = {a: set(full) for a in nodes}
    pdom[None] = {None}
    changed = True
    while changed:
        changed = False
        for a in reversed(nodes):
            nxt = [s if s in pdom else None for s in succ[a]] or [None]
            new = {a} | set.intersection(*(pdom[s] for s in nxt))
            if new != pdom[a]:
                pdom[a], changed = new, True
    out = {}
    for a in nodes:
        strict = pdom[a] - {a}
        out[a] = next((d for d in strict if d is not None and pdom[d] == strict), None)
    return out


@dataclasses.dataclass(frozen=True)
class Arm:
    """What one arm of a branch runs before the arms meet again: its locations (EXIT when it
    leaves the kernel) and how many instructions."""

    locs: frozenset
    size: int

    @property
    def tokens(self) -> frozenset:
        """Its locations, with a token for an arm that runs nothing or only leaves."""
        if not self.locs:
            return frozenset({("<empty>",)})
        return self.locs | ({("<leaves>",)} if self.locs == {EXIT} else set())


def region_locs(succ: dict, locs: dict, start, meet, limit: int = 256) -> Arm:
    """The Arm of the blocks from `start` up to (not into) `meet`."""
    out, seen, todo, n = set(), set(), [start], 0
    while todo and n < limit:
        at = todo.pop()
        if at == meet and meet is not None:
            continue
        if at is None:
            out.add(EXIT)
            continue
        if at in seen or at not in succ:
            continue
        seen.add(at)
        out.update(x for x in locs[at] if x)
        n += len(locs[at])
        todo += list(succ[at]) or [None]
    return Arm(frozenset(out), n)


MAIN = "<kernel source>"  # the file most instructions come from, as a location names it


def _main_file(instrs: list) -> list:
    """The instructions with their locations' dominant file named MAIN: the kernel's own source,
    whatever name the compile gave it (a --kernel variant's PTX and cubin may name it apart)."""
    files = collections.Counter(i.loc[0] for i in instrs if i.loc)
    if not files:
        return instrs
    main = files.most_common(1)[0][0]
    return [dataclasses.replace(i, loc=(MAIN, *i.loc[1:])) if i.loc and i.loc[0] == main else i for i in instrs]


class SassGraph:
    """The basic blocks of every function of a cubin's SASS."""

    def __init__(self, listing: str, kernel: str):
        self.funcs, self.labels = parse_sass(kernel_listing(listing, kernel))
        if kernel not in self.funcs:
            raise TieError(f"the SASS has no function {kernel!r} (it has {', '.join(sorted(self.funcs))})")
        self.kernel = kernel
        self.funcs = {name: _main_file(instrs) for name, instrs in self.funcs.items()}
        self.blocks: dict[int, Block] = {}
        for name, instrs in self.funcs.items():
            self._cut(name, instrs)
        self.entry = self.funcs[kernel][0].addr

    def is_jump(self, ins: Instr) -> bool:
        """A BRA, or a CALL to a label that is no function (sm_80 leaves a loop with one); one
        guarded by `@!PT` never jumps."""
        if ins.guard == "@!PT":
            return False
        return ins.base in ("BRA", "JMP") or (ins.base == "CALL" and ins.target is not None
                                              and ins.target not in self.funcs and ins.target in self.labels)

    def _cut(self, func: str, instrs: list[Instr]) -> None:
        leaders = {instrs[0].addr}
        for k, ins in enumerate(instrs):  # the last instruction too: out-of-line code ends with a jump back
            if ins.base in ("BRX", "JMX", "BREAK", "KILL"):
                raise TieError(f"unsupported control flow: {ins.where()} (indirect branches are not modelled)")
            if self.is_jump(ins) or (ins.base in ("EXIT", "RET", "CALL", "BSYNC") and ins.guard != "@!PT"):
                if k + 1 < len(instrs):
                    leaders.add(instrs[k + 1].addr)
                if self.is_jump(ins):
                    leaders.add(self.labels[ins.target])
        cur: list[Instr] = []
        for i, ins in enumerate(instrs):
            cur.append(ins)
            nxt = instrs[i + 1].addr if i + 1 < len(instrs) else None
            if nxt is None or nxt in leaders:
                fall = [nxt] if nxt is not None else [None]
                if self.is_jump(ins):
                    succ = [self.labels[ins.target]] + (fall if ins.conditional else [])
                elif ins.base in ("EXIT", "RET") and ins.guard != "@!PT":
                    succ = [None] + (fall if ins.conditional else [])
                else:
                    succ = fall
                self.blocks[cur[0].addr] = Block(cur[0].addr, cur, succ, func)
                cur = []

    def calls_internal(self, start: int | None, stop: int | None, limit: int = 64) -> bool:
        """Whether the blocks from `start` up to `stop` call a ptxas-internal subroutine before
        another conditional branch."""
        todo, seen = [start], set()
        while todo and len(seen) < limit:
            at = todo.pop()
            if at is None or at == stop or at in seen or at not in self.blocks:
                continue
            seen.add(at)
            b = self.blocks[at]
            if any(i.base == "CALL" and (i.target or "").startswith("$__internal") for i in b.instrs):
                return True
            if not b.last.conditional:  # behind another branch it is that branch's arm
                todo += [s for s in b.succ if s is not None]
        return False

    @functools.cached_property
    def succ(self) -> dict:
        """Successors per block inside its function (None: the function's exit)."""
        return {a: [x if x in self.blocks and self.blocks[x].func == b.func else None for x in b.succ]
                for a, b in self.blocks.items()}

    @functools.cached_property
    def ipdom(self) -> dict:
        """Immediate post-dominator of every block (None: the exit)."""
        return post_dominators(self.succ)

    def arms(self, start: int) -> tuple[frozenset, frozenset]:
        """Locations each arm of the branch ending block `start` runs before the arms meet."""
        locs = self._locs
        meet = self.ipdom.get(start)
        return tuple(region_locs(self.succ, locs, s, meet) for s in self.blocks[start].succ[:2])

    @functools.cached_property
    def _locs(self) -> dict:
        return {a: [i.loc for i in b.instrs] + ([EXIT] if b.last.base == "EXIT" and not b.last.conditional else [])
                for a, b in self.blocks.items()}


@dataclasses.dataclass(frozen=True)
class Tie:
    """What decides one SASS conditional branch: the PTX control instruction `pc` (`same`: the
    SASS branch jumps when the PTX one does), or, internal, always the arm `arm` (0 taken, 1 fall);
    inside a called function, per call site: `sites` ((call chain, pc, same), ...), the chain being
    the return addresses of the CALLs that entered it (the walk's call stack)."""

    pc: int | None
    same: bool = True
    arm: int | None = None
    sites: tuple = ()

    def decide(self, calls: list) -> tuple[int | None, bool]:
        """(pc, same) for the walk's call stack `calls`."""
        if not self.sites:
            return self.pc, self.same
        chain = tuple(calls)
        for at, pc, same in self.sites:
            if at == chain:
                return pc, same
        raise TieError(f"the SASS walk reached a branch of a called function from the call chain "
                       f"{', '.join(hex(a) for a in chain)}, which no PTX copy of the call was matched to")

    @property
    def pcs(self) -> set:
        """The PTX control instructions that decide it."""
        return {pc for _, pc, _ in self.sites} if self.sites else {self.pc} - {None}


class PtxGraph:
    """The PTX kernel's basic blocks and the arms of its control instructions, in the same terms."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.code = kernel.instructions
        n = len(self.code)
        files = collections.Counter(basename(i.loc.file) for i in self.code if i.loc is not None and i.loc.line > 0)
        self._main = files.most_common(1)[0][0] if files else None
        self.calls = getattr(kernel, "calls", ())  # the inlined copies of called functions (fa_sim.ptx.inline)
        leaders = {0} | set(kernel.labels.values()) | {c.start for c in self.calls} | {c.end for c in self.calls}
        for ins in self.code:
            if ins.opcode in ("bra", "ret", "exit") and ins.pc + 1 < n:
                leaders.add(ins.pc + 1)
        starts = sorted(x for x in leaders if x < n)
        self.block_of = {}
        self.succ, self.locs = {}, {}
        for a, b in zip(starts, starts[1:] + [n]):
            last = self.code[b - 1]
            fall = b if b < n else None
            if last.opcode == "bra":
                target = kernel.labels[last.operands[0].name]
                succ = [target] + ([fall] if last.guard is not None else [])
            elif last.opcode in ("ret", "exit"):
                succ = [None] + ([fall] if last.guard is not None else [])
            else:
                succ = [fall]
            self.succ[a] = succ
            self.locs[a] = [self.loc(i) for i in self.code[a:b]] + (
                [EXIT] if last.opcode in ("ret", "exit") and last.guard is None else [])
            for pc in range(a, b):
                self.block_of[pc] = a
        leaves = {a for a in self.succ if self.code[a].opcode in ("ret", "exit") and self.code[a].guard is None}
        self.succ = {a: [None if x in leaves else x for x in succ] for a, succ in self.succ.items()}
        self.ipdom = post_dominators(self.succ)

    def loc(self, ins) -> Loc | None:
        """An instruction's location, its kernel source's file named MAIN."""
        return self.source_loc(ins.loc)

    def source_loc(self, loc) -> Loc | None:
        """A SourceLoc as a location, its kernel source's file named MAIN."""
        loc = ptx_loc(loc)
        return (MAIN, *loc[1:]) if loc and loc[0] == self._main else loc

    def control(self, copies=()) -> list:
        """Conditional control instructions: guarded bra / ret / exit; those of the inlined copies
        `copies` (indices of `calls`) left out."""
        out = [i for i in self.code if i.opcode in ("bra", "ret", "exit") and i.guard is not None]
        spans = [(self.calls[k].start, self.calls[k].end) for k in copies]
        return [i for i in out if not any(a <= i.pc < b for a, b in spans)]

    def arms(self, ins) -> tuple[frozenset, frozenset]:
        """(locations where it branches to, locations of its fall-through), up to where they meet."""
        a = self.block_of[ins.pc]
        meet = self.ipdom.get(a)
        return tuple(region_locs(self.succ, self.locs, s, meet) for s in self.succ[a][:2])

    def copy(self, k: int) -> "CopyGraph":
        """The inlined copy `k` (an index of `calls`) as a function of its own."""
        return CopyGraph(self, k)


class CopyGraph:
    """One inlined copy of a called function (PtxGraph.calls[k]) as the SASS has the function: a
    graph of its own, which its returns (the inliner's branches to the instruction after the call)
    leave as a RET leaves the SASS function; the copies it calls in turn run no locations of its own
    (the SASS function CALLs their body)."""

    def __init__(self, ptx: PtxGraph, k: int):
        c = ptx.calls[k]
        self.code, self.loc, self.block_of = ptx.code, ptx.loc, ptx.block_of
        inner = [(d.start, d.end) for d in ptx.calls if d.parent == k]
        blocks = [a for a in ptx.succ if c.start <= a < c.end]

        def returns(a):  # a block that is a `ret` of the callee: an unguarded branch to the copy's end
            ins = ptx.code[a]
            return ins.opcode == "bra" and ins.guard is None and ptx.kernel.labels[ins.operands[0].name] == c.end
        leaves = {a for a in blocks if returns(a)}
        self.succ = {a: [x if x is not None and c.start <= x < c.end and x not in leaves else None
                         for x in ptx.succ[a]] for a in blocks}
        self.locs = {a: [] if any(lo <= a < hi for lo, hi in inner) else ptx.locs[a] for a in blocks}
        self.ipdom = post_dominators(self.succ)
        self.own = [i for i in ptx.control()
                    if c.start <= i.pc < c.end and not any(lo <= i.pc < hi for lo, hi in inner)]

    def control(self) -> list:
        """The copy's own conditional control instructions (not those of the copies it calls)."""
        return self.own

    arms = PtxGraph.arms


def _agreement(s: tuple, p: tuple) -> tuple[float, float]:
    """(same, swapped): how well the SASS arms match the PTX arms taken-to-taken, and
    taken-to-fall: the locations (and the tokens of an arm that runs nothing or only leaves) one
    arm has and the other does not, shared; then, below one, how alike the arms' sizes are."""
    st, sf = s[0].tokens - s[1].tokens, s[1].tokens - s[0].tokens
    pt, pf = p[0].tokens - p[1].tokens, p[1].tokens - p[0].tokens

    def sizes(a, b):
        return 0.5 / (1 + abs(math.log1p(a[0].size) - math.log1p(b[0].size))
                      + abs(math.log1p(a[1].size) - math.log1p(b[1].size)))
    return (len(st & pt) + len(sf & pf) + sizes(s, p),
            len(st & pf) + len(sf & pt) + sizes(s, p[::-1]))


def tie(sass: SassGraph, ptx: PtxGraph) -> dict[int, Tie]:
    """The Tie of every SASS conditional branch (by the address of its block's start). A branch of a
    called function of the source (a `__noinline__` function ptxas keeps as a subroutine) is tied
    once per call site, to the PTX copy the engine runs for that call (`call_sites`): its Tie's
    `sites`, which the walk picks by its call stack."""
    kernel, called = [], collections.defaultdict(list)
    for start, b in sorted(sass.blocks.items()):
        if not b.last.conditional or len(b.succ) != 2:
            continue
        if b.func == sass.kernel:
            kernel.append(start)
        elif not b.func.startswith("$__internal"):
            called[b.func].append(start)
        # else a ptxas-internal subroutine's (a slow path): never taken, as the walk takes the fast path
    sites, failed = call_sites(sass, ptx)
    out = _tie(sass, ptx, kernel, ptx.control(copies=set(sites.values())), exact=False)
    for func, starts in called.items():
        per: dict = collections.defaultdict(list)  # SASS block -> [(chain, Tie)] per call site
        chains = [c for c, f in failed.items() if f[0] == func]
        if chains:
            raise TieError(f"{sass.blocks[starts[0]].last.where()}: a conditional branch inside the called "
                           f"function {func}, whose call {failed[chains[0]][1]}")
        for chain, k in sorted(sites.items()):
            if chain_func(sass, chain) != func:
                continue
            view = ptx.copy(k)
            for s, t in _tie(sass, view, starts, view.control(), exact=True).items():
                per[s].append((chain, t))
        for s, ts in per.items():
            if all(t.pc is None for _, t in ts) and len({t.arm for _, t in ts}) == 1:
                out[s] = ts[0][1]  # a ptxas-internal slow path's test: the same at every call site
            else:
                out[s] = Tie(None, sites=tuple((chain, t.pc, t.same) for chain, t in ts))
    return out


def chain_func(sass: SassGraph, chain: tuple) -> str:
    """The SASS function a call chain (the return addresses of its CALLs, outermost first) runs."""
    return sass.blocks[_call_block(sass, chain[-1])].last.target


def _call_block(sass: SassGraph, ret: int) -> int:
    """The block ending in the CALL whose return address is `ret`."""
    return max(a for a in sass.blocks if a < ret)


def call_sites(sass: SassGraph, ptx: PtxGraph) -> tuple[dict, dict]:
    """({chain: PTX copy}, {chain: (function, why not)}): each SASS call chain of a called function of
    the source (the return addresses of the CALLs from the kernel inwards) and the copy of that call
    that the PTX engine runs (PtxGraph.calls), matched by the call's source location (its line and
    inlining chain) and, among the calls of one location, in program order; the calls inside a
    called function to those inside the copy matched to it. A location with other counts of SASS
    and PTX calls is not matched: why not, for its chains."""
    kernel_name = f"${sass.kernel}$"
    sites, failed = {}, {}

    def calls_in(func, prefix):
        out = []
        for a, b in sorted(sass.blocks.items()):
            last = b.last
            if (b.func == func and last.base == "CALL" and not sass.is_jump(last) and last.target in sass.funcs
                    and not last.target.startswith("$__internal")):
                out.append((prefix + (b.succ[0],), last))
        return out

    def match(func, prefix, parent, depth):
        if depth > 16:
            return
        groups = collections.defaultdict(lambda: ([], []))
        for chain, ins in calls_in(func, prefix):
            callee = ins.target[len(kernel_name):] if ins.target.startswith(kernel_name) else ins.target
            groups[callee, ins.loc][0].append((chain, ins))
        for k, c in enumerate(ptx.calls):
            if c.parent == parent:
                groups[c.callee, ptx.source_loc(c.loc)][1].append(k)
        for (callee, loc), (sass_calls, copies) in groups.items():
            if len(sass_calls) != len(copies):
                for chain, ins in sass_calls:
                    unmatched(ins.target, chain, f"{ins.where()} is one of {len(sass_calls)} SASS calls of it at "
                              f"that source location and the PTX has {len(copies)}: not modelled (make the "
                              "function __forceinline__ to time this variant)", depth + 1)
                continue
            for (chain, ins), k in zip(sass_calls, copies):
                sites[chain] = k
                match(ins.target, chain, k, depth + 1)

    def unmatched(func, chain, why, depth):  # the chain and those inside it: no copy
        failed[chain] = (func, why)
        if depth <= 16:
            for inner, ins in calls_in(func, chain):
                unmatched(ins.target, inner, why, depth + 1)

    match(sass.kernel, (), None, 0)
    return sites, failed


def _tie(sass: SassGraph, ptx, blocks: list, control: list, exact: bool) -> dict[int, Tie]:
    """The Tie of each SASS conditional branch of `blocks` (block starts), among the PTX control
    instructions `control` of `ptx` (a PtxGraph, or a CopyGraph for a called function's body).
    `exact` (a called function's body): where the arms leave it open which PTX branch one compiles
    from (two choices equally alike), a TieError, not the first of them."""
    out: dict[int, Tie] = {}
    by_loc = collections.defaultdict(list)
    for ins in control:
        by_loc[ptx.loc(ins)].append(ins)
    pending = collections.defaultdict(list)  # location -> SASS blocks ending in a tied branch
    for start in blocks:
        b = sass.blocks[start]
        last = b.last
        meet = sass.ipdom.get(start)
        slow = [sass.calls_internal(s, meet) for s in b.succ]
        if slow[0] != slow[1]:
            out[start] = Tie(None, arm=slow.index(False))
            continue
        pending[last.loc].append(start)
    placed = {loc for loc in pending if by_loc.get(loc)}
    spare = [i for loc, ins in by_loc.items() if loc not in placed for i in ins]  # PTX branches no SASS one shares a location with
    for loc, starts in sorted(pending.items(), key=lambda kv: kv[0] not in placed):
        cands = by_loc.get(loc) or []
        if not cands:  # ptxas if-converted an arm and branches past the other: the branch takes the
            # location of a neighbouring instruction; tie it to the PTX branch of the same outermost
            # call site whose arms are most alike
            near = [i for i in spare if loc and ptx.loc(i) and ptx.loc(i)[0] == loc[0] and ptx.loc(i)[-1] == loc[-1]]
            cands = near or [i for i in spare if ptx.loc(i)]  # else any PTX branch no SASS one shares a line with
            scored = sorted(((max(_agreement(sass.arms(s), ptx.arms(i))), i.pc) for s in starts for i in cands),
                            reverse=True)
            if not scored or scored[0][0] < 1 or (len(scored) > 1 and scored[1][0] == scored[0][0]
                                                  and scored[1][1] != scored[0][1]):
                ins = sass.blocks[starts[0]].last
                raise TieError(f"{ins.where()}: no PTX branch at that source location decides it, and none near "
                               "it has alike arms; the timing model ties every SASS branch to the PTX branch it "
                               "compiles from (a branch ptxas made up is not modelled)")
            cands = [ptx.code[scored[0][1]]]
            spare.remove(cands[0])
        arms = {s: sass.arms(s) for s in starts}
        parms = {i.pc: ptx.arms(i) for i in cands}
        if len(starts) == len(cands):
            pairs = list(zip(starts, cands))
        elif len(starts) < len(cands):  # some if-converted: the order-keeping choice most alike
            pairs = _align(starts, cands, lambda s, i: max(_agreement(arms[s], parms[i.pc])))
            if exact and pairs != _align(starts, cands, lambda s, i: max(_agreement(arms[s], parms[i.pc])),
                                         last=True):
                ins = sass.blocks[starts[0]].last
                raise TieError(f"{ins.where()}: {len(cands)} PTX branches at that source location, {len(starts)} "
                               "SASS ones, and the arms of more than one choice are equally alike: which PTX branch "
                               "it compiles from is open (not modelled; make the function __forceinline__ to time "
                               "this variant)")
            # the others are spare too: ptxas may have labelled one's SASS branch with the location of
            # an instruction of its arm (a loop NVVM unrolled by 2: copy_tile's test in the second copy
            # carries its cp.async's location), tied below among the branches of no shared location
            paired = {i.pc for _, i in pairs}
            spare += [i for i in cands if i.pc not in paired]
        else:
            pairs = _excess(starts, cands, loc, spare, arms, parms, ptx, sass if exact else None)
        for s, ins in pairs:
            same, swapped = _agreement(arms[s], parms[ins.pc])
            if same == swapped:
                raise TieError(f"{sass.blocks[s].last.where()}: its arms look alike both ways round against "
                               f"the PTX branch `{ins.text}` (PTX line {ins.ptx_line}); cannot tell which arm "
                               "is taken")
            out[s] = Tie(ins.pc, same > swapped)
    return out


def _excess(starts: list, cands: list, loc, spare: list, arms: dict, parms: dict, ptx, exact=None) -> list:
    """More SASS than PTX branches at one location `loc`: the (SASS block, PTX branch) pairs.

    First the -lineinfo case: ptxas computed one condition for two PTX branches of the same source
    line (two inlined calls of one helper testing the same bound: no_prefetch's K and V copies),
    and the SASS branch of the first call carries the second call's location. The PTX branch it
    compiles from is then one no SASS branch shares a location with (`spare`), of the same source
    line at another call site; it is taken in, and the SASS branches tied in program order to the
    most alike of the candidates and those (each PTX branch one SASS branch), where that explains
    every SASS branch and each one taken in runs the more alike arms. Else ptxas duplicated the code
    (paths split, a tail copied): each copy to its most alike candidate, taking that branch's
    outcomes in turn; were its iterations not the PTX's (a loop ptxas unrolled), the walk runs out
    of or leaves outcomes: a TieError there names the branch. `exact` (the SassGraph, for a called
    function): a copy with two candidates equally alike is a TieError."""
    def score(s, i):
        return max(_agreement(arms[s], parms[i.pc]))

    def best_own(s):
        return max(score(s, i) for i in cands)

    same_line = [i for i in spare if loc and (ptx.loc(i) or ())[:2] == loc[:2]]
    if same_line and len(cands) + len(same_line) >= len(starts):
        parms.update({i.pc: ptx.arms(i) for i in same_line})
        pairs = _align(starts, sorted(cands + same_line, key=lambda i: i.pc), score)
        taken = [(s, i) for s, i in pairs if i in same_line]
        if taken and all(score(s, i) > best_own(s) for s, i in taken):
            for _, i in taken:
                spare.remove(i)
            return pairs
    if exact:
        for s in starts:
            top = sorted((score(s, i) for i in cands), reverse=True)
            if len(top) > 1 and top[0] == top[1]:
                raise TieError(f"{exact.blocks[s].last.where()}: more SASS than PTX branches at that source "
                               "location, and two PTX branches equally alike: which one it compiles from is open "
                               "(not modelled; make the function __forceinline__ to time this variant)")
    return [(s, max(cands, key=lambda i: (score(s, i), -i.pc))) for s in starts]


def _align(starts: list, cands: list, score, last: bool = False) -> list:
    """Each of `starts` to a distinct candidate, in order, with the largest total score (the
    alignment of two sequences, len(starts) <= len(cands)); among equal ones the earliest
    candidates, `last`: the latest (the two agree where the best is unique)."""
    if last:
        return [(s, i) for s, i in _align(starts[::-1], cands[::-1], score)][::-1]
    m, n = len(starts), len(cands)
    best = [[0.0] * (n + 1) for _ in range(m + 1)]
    for i in range(1, m + 1):
        best[i][i - 1] = float("-inf")
        for j in range(i, n + 1):
            best[i][j] = max(best[i][j - 1] if j > i else float("-inf"),
                             best[i - 1][j - 1] + score(starts[i - 1], cands[j - 1]))
    pairs, j = [], n
    for i in range(m, 0, -1):
        while j > i and best[i][j] == best[i][j - 1]:
            j -= 1
        pairs.append((starts[i - 1], cands[j - 1]))
        j -= 1
    return pairs[::-1]


def _chains(ptx: PtxGraph, tied: frozenset) -> dict[int, tuple[int, str]]:
    """PTX branch pc -> (the tied branch it chains to, that branch's outcome when this one jumps
    with all lanes), for the untied branches of short-circuit chains (module docstring)."""
    control = {i.pc for i in ptx.code if i.opcode in ("bra", "ret", "exit")}
    out = {}
    for t in sorted(tied):
        last = ptx.code[t]
        if last.opcode != "bra":
            continue
        ends = {ptx.kernel.labels[last.operands[0].name]: ALL, t + 1: NONE}  # its jump target, its fall-through
        at = t
        while True:
            u = max((pc for pc in control if pc < at), default=None)  # the control instruction before
            if u is None or u in tied or ptx.code[u].opcode != "bra" or ptx.code[u].guard is None:
                break
            ins = ptx.code[u]
            when = ends.get(ptx.kernel.labels[ins.operands[0].name])
            if when is None or ptx.loc(ins) != ptx.loc(last):
                break
            out[u] = (t, when)
            at = u
    return out


_UNROLLED = ("; a loop ptxas unrolled runs several PTX iterations per SASS iteration, which the walk does not "
             "model: keep it rolled with `#pragma unroll 1` (PTX .pragma \"nounroll\") or unroll it in the source")


class Walker:
    """Each warp's SASS stream from its path (see the module docstring)."""

    def __init__(self, sass: SassGraph, ptx: PtxGraph):
        self.sass, self.ptx = sass, ptx
        self.ties = tie(sass, ptx)
        self.tied_pcs = frozenset(pc for t in self.ties.values() for pc in t.pcs)
        self._first = {}  # PTX pc -> which of its arms the engine runs first on divergence (0 taken)
        for pc in sorted(self.tied_pcs):
            ins = ptx.code[pc]
            target = ptx.kernel.labels[ins.operands[0].name] if ins.opcode == "bra" else len(ptx.code)
            self._first[pc] = 0 if target < ins.pc + 1 else 1
        self.chained = _chains(ptx, self.tied_pcs)
        self.walk = functools.lru_cache(maxsize=4096)(self._walk)

    def _walk(self, path: tuple) -> tuple[int, ...]:
        """The block starts a warp with this path ((pc, outcome), ...) issues, in order."""
        queues = collections.defaultdict(collections.deque)
        for pc, outcome in path:
            if pc in self.tied_pcs:
                queues[pc].append(outcome)
            elif pc in self.chained and outcome != NONE:
                tied, when = self.chained[pc]
                if outcome == SOME:
                    ins = self.ptx.code[pc]
                    raise TieError(f"the PTX branch `{ins.text}` (PTX line {ins.ptx_line}) diverged; it is part of a "
                                   "condition ptxas folded into one SASS branch, whose lanes then split otherwise")
                queues[tied].append(when)
        out: list[int] = []
        self._run(self.sass.entry, None, queues, out, [])
        left = [pc for pc, q in queues.items() if q]
        if left:
            ins = self.ptx.code[min(left)]
            raise TieError(f"the functional run took the PTX branch `{ins.text}` (PTX line {ins.ptx_line}, "
                           f"{ins.loc}) {len(queues[min(left)])} more times than the SASS walk reached it: the "
                           f"SASS's control flow does not follow the PTX's there{_UNROLLED}")
        return tuple(out)

    def _run(self, at, stop, queues, out, calls) -> int | None:
        """Issue blocks from `at` until reaching `stop` (or the end); return where it stopped.
        `calls`: the return addresses of the CALLs the walk is inside, outermost first."""
        blocks, steps = self.sass.blocks, 0
        while at is not None and at != stop:
            steps += 1
            if steps > 50_000_000:
                raise TieError("the SASS walk does not end")
            b = blocks[at]
            out.append(at)
            last = b.last
            if last.base == "CALL" and not self.sass.is_jump(last) and last.target in self.sass.funcs:
                if last.conditional:
                    raise TieError(f"{last.where()}: a conditional call is not modelled")
                calls.append(b.succ[0])
                at = self.sass.funcs[last.target][0].addr
                continue
            if last.base == "RET" and not last.conditional and last.guard != "@!PT":
                at = calls.pop() if calls else None
                continue
            if len(b.succ) == 1:
                at = b.succ[0]
                continue
            t = self.ties.get(at)
            if t is None:  # @!PT-like guards never branch; `BRA` with a constant predicate
                at = b.succ[1]
                continue
            pc, same = t.decide(calls)
            if pc is None:
                at = self._next(b, t.arm, calls)
                continue
            q = queues.get(pc)
            if not q:
                raise TieError(f"{last.where()}: the SASS walk reaches this branch more often than the functional "
                               f"run took its PTX branch `{self.ptx.code[pc].text}` (PTX line "
                               f"{self.ptx.code[pc].ptx_line}){_UNROLLED}")
            outcome = q.popleft()
            if outcome == SOME and last.base == "EXIT":
                at = b.succ[1]  # some lanes leave, the warp goes on with the others
                continue
            if outcome != SOME:
                jumps = (outcome == ALL) == same
                at = self._next(b, 0 if jumps else 1, calls)
                continue
            first = self._first[pc] if same else 1 - self._first[pc]
            meet = self.sass.ipdom.get(at)
            if meet is None and calls and b.func != self.sass.kernel:
                at = self._diverged_return(b, first, queues, out, calls)
                continue
            arrived = self._run(b.succ[first], meet, queues, out, calls) == meet
            mid = len(out)
            arrived &= self._run(b.succ[1 - first], meet, queues, out, calls) == meet
            if arrived and meet is not None and blocks[meet].instrs[0].base == "BSYNC":
                out.insert(mid, meet)  # the first group's BSYNC (a block of its own: `_cut`); the second's below
            at = meet
        return at

    def _next(self, b: Block, arm: int, calls: list) -> int | None:
        """The block after `b` along its arm `arm`; a RET's taken arm returns to the caller."""
        at = b.succ[arm]
        if at is None and b.last.base == "RET":
            return calls.pop() if calls else None
        return at

    def _diverged_return(self, b: Block, first: int, queues, out, calls) -> int:
        """A divergent branch inside a called function whose arms meet only where it returns (ptxas's
        early `@P RET`): each lane group runs its arm up to the return, first `first`; both arrive at
        the return address, the BSYNC of the BSSY around the CALL, which each group issues on arrival.
        Return the return address (the call popped)."""
        ret = calls[-1]
        if self.sass.blocks[ret].instrs[0].base != "BSYNC":
            raise TieError(f"{b.last.where()}: its lanes diverge and return from {b.func} apart, to "
                           f"{self.sass.blocks[ret].instrs[0].where()}, no convergence barrier (BSYNC): where they "
                           "meet again is not modelled")
        mid = None
        for k, arm in enumerate((b.succ[first], b.succ[1 - first])):
            if arm is not None:  # None: the taken arm of a RET, the group returns at once
                saved = list(calls)
                if self._run(arm, ret, queues, out, calls) != ret:
                    raise TieError(f"{b.last.where()}: one arm of this divergent branch of {b.func} does not "
                                   "return to its call (an EXIT inside the called function is not modelled)")
                calls[:] = saved
            if k == 0:
                mid = len(out)
        out.insert(mid, ret)  # the first group's BSYNC; the second's as the walk goes on
        calls.pop()
        return ret


_CLASS_OF = {"HMMA": "HMMA", "LDSM": "LDSM", "SHFL": "SHFL", "BAR": "BAR", "LDGSTS": "LDGSTS", "LDS": "LDS",
             "STS": "STS"}  # SASS opcode -> the engine's instruction class (fa_sim.events.Op) it counts as


def class_counts(graph: SassGraph, walks) -> tuple[dict, dict]:
    """(issued, unguarded): per engine class, the warp instructions the walks issue, and those of
    them without a guard (a guarded one may be an if-converted arm the warp's lanes did not run)."""
    issued, sure = collections.Counter(), collections.Counter()
    for walk in walks:
        for b in walk:
            for i in graph.blocks[b].instrs:
                cls = _CLASS_OF.get(i.base)
                if cls is None or i.guard == "@!PT" or (cls == "BAR" and not i.opcode.startswith("BAR.SYNC")):
                    continue
                issued[cls] += 1
                if i.guard in ("", "@PT"):
                    sure[cls] += 1
    return dict(issued), dict(sure)


_KEPT = ("BAR", "HMMA")  # ptxas never removes these; a load or a shuffle it may reuse (CSE)


def check_counts(graph: SassGraph, walks, engine: dict, what: str) -> None:
    """The walks must explain the engine's count of every class: at least the unguarded SASS
    instructions, and for barriers and mmas, which ptxas never removes, at most all issued ones (a
    repeated load or shuffle ptxas may reuse). A barrier or an mma the functional run made that no
    walk issues (or one the walks issue that it did not) means the SASS is not the PTX's: a TieError."""
    issued, sure = class_counts(graph, walks)
    for cls in _CLASS_OF.values():
        n = int(engine.get(cls, 0))
        most = issued.get(cls, 0) if cls in _KEPT else float("inf")
        if not sure.get(cls, 0) <= n <= most:
            raise TieError(f"{what}: the functional run issues {n} {cls} warp instructions, the SASS walk "
                           f"{sure.get(cls, 0)} unguarded and {issued.get(cls, 0)} in all: the SASS does not "
                           "compile this PTX (a kernel source other than the cubin's?)")
