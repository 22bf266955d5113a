"""Each warp's dynamic SASS stream through the attention kernel, cut into its regions
(prologue, each K/V round, epilogue): the representative CTAs the timing model runs.

Model. The PTX engine runs the kernel's real PTX (fa2_fwd.cu, or a --kernel variant: the same
source the cubin is built from) on a representative CTA of each path class, with a BranchRecorder
(fa_sim.observers.branches): every warp's control flow. fa_sim.timing.walk ties it to the SASS and
walks each warp through it - any control flow: loops rolled or not, warps of one CTA on different
paths (pingpong's two groups), early exits. The walk is cut into regions at the K/V loop's latch:
the SASS block whose branch is tied to the back edge of the PTX engine's main loop (the outermost
loop holding a barrier or an mma, fa_sim.ptx.blocks.main_loop); round t ends at the latch's
(t + 1)-th visit, round 0 starts at the loop's header (the latch's back target), the prologue is
before it and the epilogue after the last round. Nothing here knows what the rounds compute.

Path classes, as the timing model asks for them: a CTA of R rounds, m of them masked. m = 0: a
plain CTA (non-causal N_q = block_m, N_k = R block_n; causal: a Q block past the diagonal); the
masked count of a real CTA (causal: the Q block on the diagonal whose keys end with N_k, a whole
block or, for a CTA whose keys end in a tail, half of one; non-causal, m = 1: a key tail of half a
block); any other m (the model's all-masked steady run) is the plain CTA's path with, in its last
m rounds, what the last round of the shortest masked probe runs otherwise than the plain probe's
last round (the two aligned by pc: outcomes flipped, events added or left out) applied.
A Q block whose rows end past N_q (a query tail) is its own class: its probe has half a block of
rows (it copies Q through the boundary arm; warps whose rows all lie past N_q leave early). The
control flow depends on shapes, not values. A probe runs at most PROBE_ROUNDS rounds; a longer CTA
repeats the first steady round (from round 1, one whose walk the next round repeats in every
warp; none is a StreamMismatch), so every CTA has the trip count the schedule gives it; a probe
whose warps run another number of rounds than the schedule says is a StreamMismatch. Probes are
cached on disk by the kernel source, config and shape.

Issue 38's features (`Features`: the build's FA_KV_GROUP, FA_WINDOW_*, FA_SOFTCAP; bf16 is the
config's dtype) are compiled into the probe build as into the timed one, and the probes run with
the feature's inputs: bf16-rounded values for a bf16 config, kv_group Q heads over one K/V head
(the CTAs of head 0 run), the softcap. A window is probed through its *wide twin*: the same build
with each bounded side widened by WIDE keys, so that no side binds at a probe's sizes and the
probes run the plain, tail and diagonal CTAs the classes above need. The twin's PTX must be the
window build's instruction for instruction (immediates aside: `same_structure`), so its recorded
(pc, outcome) paths are paths of the window build and are walked through the window build's own
SASS; a window whose twin compiles otherwise is a StreamMismatch naming it.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import functools
import json
import warnings

import numpy as np

from ..cache import cache_key, cache_root, read_text_entry, store_atomic
from ..config import KernelConfig
from ..contract import kernel_source
from ..problem import Problem
from .walk import SassGraph, TieError, Walker, check_counts

PROBE_ROUNDS = 8  # the longest probe (plus the masked rounds and prefetch stages, see `probe_rounds`)
_VERSION = 2  # of the cached probes' meaning: per warp, the (pc, outcome) of each control instruction

WIDE = 1 << 20  # keys added to each bounded window side in the probes' wide twin (never binds in a probe)

Path = tuple  # ((pc, outcome), ...) of one warp
Walk = tuple  # block start addresses of one region's path, in order


class StreamMismatch(TieError):
    """The functional run takes a path the SASS walk or the schedule cannot follow."""


@dataclasses.dataclass(frozen=True)
class Features:
    """Issue 38's features of the timed build (fa_sim.contract.KernelBuild's kv_group, effective
    window and softcap); the default is the kernel without them."""

    kv_group: int = 1
    window: tuple[int, int] = (-1, -1)
    softcap: float = 0.0

    @classmethod
    def of(cls, prob: Problem) -> "Features":
        return cls(prob.kv_group, (prob.window_left, prob.window_right), prob.softcap)

    @property
    def probe_window(self) -> tuple[int, int]:
        """The wide twin's window: each bounded side WIDE keys wider (see the module docstring)."""
        return tuple(-1 if s < 0 else s + WIDE for s in self.window)

    def key(self) -> dict:
        """The probe cache's key fields (none for the plain kernel: its entries stay valid)."""
        return {} if self == Features() else {"kv_group": self.kv_group, "window": list(self.probe_window),
                                              "softcap": float(np.float32(self.softcap))}


PLAIN = Features()


def same_structure(a, b) -> bool:
    """Two PTX programs alike instruction for instruction but for immediate operands."""
    from ..ptx.ir import Imm

    def shape(i):
        return (i.opcode, i.mods, str(i.guard), tuple("imm" if isinstance(o, Imm) else str(o) for o in i.operands))
    ia, ib = a.kernel.instructions, b.kernel.instructions
    return len(ia) == len(ib) and all(shape(x) == shape(y) for x, y in zip(ia, ib))


class Kind(enum.Enum):
    PLAIN = "plain"  # no masked round
    DIAGONAL = "diagonal"  # causal: the Q block on the diagonal whose keys end with N_k
    TAIL = "tail"  # non-causal: a key tail in the last round
    DIAGONAL_TAIL = "diagonal-tail"  # causal: the diagonal Q block whose last key block is a tail


def probe_rounds(cfg: KernelConfig) -> int:
    """Rounds of the longest probe: enough that round 2 is neither first nor near the end
    (prefetch stages, masked rounds), so rounds 1 and 2 show the steady state; a whole number of
    diagonal blocks (block_m / block_n rounds), so the diagonal probe's last Q block is full."""
    per = max(1, cfg.block_m // cfg.block_n)
    least = max(PROBE_ROUNDS, -(-cfg.block_m // cfg.block_n) + cfg.kv_stages + 3)
    return -(-least // per) * per


def probe_problem(cfg: KernelConfig, causal: bool, kind: Kind, rounds: int, qtail: bool = False) -> tuple[Problem, int]:
    """The problem and the Q block (its last) that has `rounds` rounds of this kind; `qtail`: its
    rows end half way (a query tail: the CTA copies Q through the boundary arm)."""
    bm, bn = cfg.block_m, cfg.block_n
    nk = rounds * bn - (bn // 2 if kind in (Kind.TAIL, Kind.DIAGONAL_TAIL) else 0)
    if kind in (Kind.DIAGONAL, Kind.DIAGONAL_TAIL):
        nq = -(-nk // bm) * bm  # its last Q block reaches the last key
    else:
        nq = (-(-nk // bm) + 1) * bm if causal else bm  # causal: one Q block past every key
    nq -= bm // 2 if qtail else 0  # the rounds do not change: they follow the block's first row
    prob = Problem(1, 1, nq, nk, causal, 1.0 / np.sqrt(cfg.head_dim), cfg)
    return prob, prob.n_m_blocks - 1


def paths_of(cfg: KernelConfig, causal: bool, kernel, kind: Kind, rounds: int, qtail: bool = False,
             feat: Features = PLAIN) -> list[Path]:
    """Per warp, the control flow of the probe CTA of this class. The diagonal Q blocks of up to
    `probe_rounds` rounds come from one run of the longest diagonal probe (its Q blocks run in one
    wave: the cost of its longest CTA)."""
    prob, mb = probe_problem(cfg, causal, kind, rounds, qtail)
    if kind is Kind.DIAGONAL and not qtail and rounds <= probe_rounds(cfg):
        batch, _ = probe_problem(cfg, causal, kind, probe_rounds(cfg))
        same = np.flatnonzero(batch.n_block_max(np.arange(batch.n_m_blocks)) == rounds)
        if same.size:
            return _probe(cfg, causal, kernel, batch, tuple(range(batch.n_m_blocks)), feat)[int(same[-1])]
    return _probe(cfg, causal, kernel, prob, (mb,), feat)[mb]


def _probe(cfg: KernelConfig, causal: bool, kernel, prob: Problem, mbs: tuple,
           feat: Features = PLAIN) -> dict[int, list[Path]]:
    return _cached(kernel_source(kernel).text, cfg, causal, kernel, prob.seqlen_q, prob.seqlen_k, mbs, feat)[0]


def probe_counts(cfg: KernelConfig, causal: bool, kernel, kind: Kind, rounds: int, qtail: bool = False,
                 feat: Features = PLAIN) -> tuple:
    """(the Q blocks the probe of this class ran, {class: warp instructions the engine counted})."""
    prob, mb = probe_problem(cfg, causal, kind, rounds, qtail)
    if kind is Kind.DIAGONAL and not qtail and rounds <= probe_rounds(cfg):
        batch, _ = probe_problem(cfg, causal, kind, probe_rounds(cfg))
        if (batch.n_block_max(np.arange(batch.n_m_blocks)) == rounds).any():
            mbs = tuple(range(batch.n_m_blocks))
            return batch, mbs, _cached(kernel_source(kernel).text, cfg, causal, kernel, batch.seqlen_q,
                                       batch.seqlen_k, mbs, feat)[1]
    return prob, (mb,), _cached(kernel_source(kernel).text, cfg, causal, kernel, prob.seqlen_q, prob.seqlen_k, (mb,),
                                feat)[1]


@functools.lru_cache(maxsize=64)
def _cached(text: str, cfg: KernelConfig, causal: bool, kernel, nq: int, nk: int, mbs: tuple,
            feat: Features = PLAIN) -> tuple[dict, dict]:
    """(Q block -> per warp paths, {class: warp instructions}) of a run of those Q blocks, cached in
    memory and on disk."""
    key = cache_key(v=_VERSION, text=text, config=cfg.tag, causal=causal, nq=nq, nk=nk, mbs=mbs, **feat.key())
    path = cache_root() / "timing-paths" / f"{key}.json"
    stored = read_text_entry(path)
    if stored is not None:
        try:
            raw = json.loads(stored)
            return ({int(mb): [tuple((int(pc), int(o)) for pc, o in warp) for warp in warps]
                     for mb, warps in raw["paths"].items()}, {str(c): int(n) for c, n in raw["counts"].items()})
        except (ValueError, TypeError, KeyError, AttributeError):
            pass  # damaged: run again
    prob = Problem(1, 1, nq, nk, causal, 1.0 / np.sqrt(cfg.head_dim), cfg)
    out, counts = _run_probe(prob, kernel, mbs, feat)
    store_atomic(path, json.dumps({"paths": {mb: [list(map(list, w)) for w in warps] for mb, warps in out.items()},
                                   "counts": counts}).encode())
    return out, counts


def round_latch(kernel) -> int:
    """The PTX pc of the K/V loop's back edge, whose visits count the rounds: the engine's main loop
    (fa_sim.ptx.blocks.main_loop: the outermost loop holding a barrier or an mma), or, where that
    loop only wraps an inner loop holding every barrier of it (an edit that walks the K/V blocks in
    chunks: `for (t0 ...) for (t = t0; t < t0 + 3 ...)`), that inner loop, and so on inwards. A
    rolled loop inside a round (a GEMM kept rolled, a copy loop with one extra barrier) leaves some
    barrier of the round outside it, so the round stays the outer loop's."""
    from ..ptx.blocks import main_loop

    loop = main_loop(kernel)
    code = kernel.instructions
    bars = lambda lo, hi: {i.pc for i in code[lo: hi + 1] if i.opcode in ("bar", "barrier") and "warp" not in i.mods}
    inner = [(kernel.labels[i.operands[0].name], i.pc) for i in code
             if i.opcode == "bra" and kernel.labels[i.operands[0].name] <= i.pc]
    head, tail = loop.head, loop.tail
    while True:
        mine = bars(head, tail)
        deeper = [(h, t) for h, t in inner if head <= h and t <= tail and (h, t) != (head, tail) and mine
                  and bars(h, t) == mine]
        if not deeper:
            return tail
        head, tail = max(deeper, key=lambda lp: lp[1] - lp[0])


def probe_program(cfg: KernelConfig, causal: bool, kernel, feat: Features = PLAIN):
    """The PTX program the probes run: the timed build with its features, a window's wide twin."""
    from ..ptx.fa2 import _program

    return _program(kernel_source(kernel), cfg, bool(causal), False, feat.kv_group, feat.probe_window, feat.softcap)


def probe_inputs(prob: Problem, seed: int = 0, bits: bool = True) -> tuple:
    """Random q, k, v of `prob` as the kernel reads them: fp16, or for a bf16 config bf16-rounded
    values, as uint16 bit patterns (`bits`: what fa_sim.run.global_memory takes) or as float32 (what
    fa_sim.simulate takes with dtype="bf16"); k, v with heads_k heads."""
    from ..validate import round_to_bf16

    rng = np.random.default_rng(seed)
    rows = ((prob.heads, prob.seqlen_q), (prob.heads_k, prob.seqlen_k), (prob.heads_k, prob.seqlen_k))
    shapes = [(prob.batch, h, n, prob.head_dim) for h, n in rows]
    raw = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    if prob.config.dtype == "bf16":
        values = [np.asarray(round_to_bf16(x), np.float32) for x in raw]
        return tuple((x.view(np.uint32) >> 16).astype(np.uint16) for x in values) if bits else tuple(values)
    return tuple(x.astype(np.float16) for x in raw)


def _run_probe(prob: Problem, kernel, mbs: tuple, feat: Features = PLAIN) -> tuple[dict, dict]:
    """Run the Q blocks `mbs` of `prob` (batch 1, one head; with `feat`: its kv_group Q heads over one
    K/V head, head 0's CTAs run) on the PTX engine, their branches recorded: (Q block -> per warp
    paths, {class: warp instructions the engine counted})."""
    from ..hub import Hub
    from ..observers.branches import BranchRecorder
    from ..ptx.fa2 import run_attention
    from ..run import global_memory

    cfg = prob.config
    # the launch the probe build runs: its kv_group heads share K/V head 0, the softcap; the wide
    # twin's window binds nowhere here, so the grid's rounds are the windowless problem's
    prob = Problem(1, feat.kv_group, prob.seqlen_q, prob.seqlen_k, prob.causal, prob.scale, cfg, heads_k=1,
                   softcap=feat.softcap)
    program = probe_program(cfg, prob.causal, kernel, feat)
    gmem, _, ptr = global_memory(prob, *probe_inputs(prob))
    rec = BranchRecorder()
    hub = Hub([rec])
    ctas = sorted(int(c) for c in prob.q_block_index(np.array(mbs)))  # the grid CTAs that compute them
    with warnings.catch_warnings():  # fully masked score rows: -inf - -inf in fp32
        warnings.simplefilter("ignore", RuntimeWarning)
        for lo, hi in _spans(ctas):
            # one wave per span
            run_attention(prob, gmem, ptr, hub, [np.arange(lo, hi)], kernel=kernel, program=program)
    counts: dict = {}
    for (op, _, _), n in hub.counts.items():
        counts[op.value] = counts.get(op.value, 0) + int(n)
    latch = round_latch(program.kernel)
    out = {}
    for mb in mbs:
        cta = int(prob.q_block_index(np.array([mb]))[0])
        rounds = int(prob.n_rounds_of(np.array([mb]))[0])
        warps = [rec.path(cta, w) for w in range(cfg.n_warps)]
        ran = sorted({sum(pc == latch for pc, _ in p) for p in warps})
        if ran != [rounds]:
            raise StreamMismatch(f"{cfg.tag}{' causal' if prob.causal else ''}: in the functional run Q block {mb} "
                                 f"(N_q {prob.seqlen_q}, N_k {prob.seqlen_k}) runs {ran} K/V rounds per warp; the "
                                 f"schedule the model dispatches by says {rounds}")
        out[mb] = warps
    return out, counts


def _spans(ctas: list[int]) -> list[tuple[int, int]]:
    """Consecutive runs of CTA ids as (lo, hi) ranges."""
    out: list[list[int]] = []
    for c in ctas:
        if out and out[-1][1] == c:
            out[-1][1] = c + 1
        else:
            out.append([c, c + 1])
    return [(lo, hi) for lo, hi in out]


# ---- the walks -----------------------------------------------------------------------------------
def _through_jumps(graph: SassGraph, at: int) -> int:
    """The first block from `at` that does more than jump on (sm_80 leaves the K/V loop with a
    conditional CALL to its exit and goes round again through a block that only branches back)."""
    seen = set()
    while at is not None and at not in seen:
        seen.add(at)
        b = graph.blocks[at]
        if len(b.instrs) != 1 or not graph.is_jump(b.last) or b.last.conditional:
            return at
        at = b.succ[0]
    return at


class KernelStream:
    """Per warp, the SASS walk of every path class of one compiled kernel, in regions."""

    def __init__(self, config: KernelConfig, causal: bool, kernel, graph: SassGraph, walker: Walker, latch_pc: int,
                 features: Features = PLAIN):
        self.config, self.causal, self.kernel, self.features = config, causal, kernel, features
        self.graph, self.walker, self.latch_pc = graph, walker, latch_pc
        latches = [(a, t) for a, t in walker.ties.items() if t.pc == latch_pc]
        if len(latches) != 1:
            raise StreamMismatch(f"{config.tag}: the K/V loop's back edge (PTX pc {latch_pc}) is tied to "
                                 f"{len(latches)} SASS branches; the regions need exactly one")
        self.latch, tie = latches[0]
        self.header = _through_jumps(graph, graph.blocks[self.latch].succ[0 if tie.same else 1])
        self.warp_walks = functools.lru_cache(maxsize=None)(self._cta_walks)
        self._checked: set = set()

    def walks(self, rounds: int, masked: int = 0, tail: bool = False, qtail: bool = False) -> tuple[Walk, ...]:
        """Warp 0's regions: prologue, each round, epilogue (block starts)."""
        return self.warp_walks(rounds, masked, tail, qtail)[0]

    def parts(self, rounds: int, masked: int = 0, tail: bool = False, qtail: bool = False) -> list[list[list]]:
        """Per warp, the instructions of each region of a CTA of `rounds` rounds, the last `masked`
        masked, its keys ending in a tail block (`tail`; non-causal: every masked CTA), its queries
        in a tail block (`qtail`)."""
        blocks = self.graph.blocks
        return [[[i for b in region for i in blocks[b].instrs] for region in warp]
                for warp in self.warp_walks(rounds, masked, tail, qtail)]

    def _cta_walks(self, rounds: int, masked: int, tail: bool = False, qtail: bool = False) -> tuple:
        real = self._real_masked(rounds)
        if masked == 0 or masked == real:
            kind = Kind.PLAIN if masked == 0 else self._masked_kind()
            return self._extended(Kind.DIAGONAL_TAIL if kind is Kind.DIAGONAL and tail else kind, rounds, qtail)
        if qtail:
            raise ValueError("a query tail is a real CTA's: its masked rounds are the real ones")
        if rounds > probe_rounds(self.config):
            raise ValueError(f"a CTA of {rounds} rounds with {masked} masked is longer than a probe "
                             f"({probe_rounds(self.config)} rounds) and has no real counterpart")
        plain = paths_of(self.config, self.causal, self.kernel, Kind.PLAIN, rounds, feat=self.features)
        segs = self._mask_outcomes()
        return tuple(self._regions(self._masked(p, g, rounds - masked, rounds), rounds) for p, g in zip(plain, segs))

    def check_fixed(self, *rounds: int) -> None:
        """The model charges a CTA its fixed cost (prologue, epilogue) plus its rounds: every warp's
        prologue and epilogue must walk the same SASS blocks in plain CTAs of each of `rounds` rounds.
        A StreamMismatch where they do not: work outside the K/V loop that grows with the rounds (a
        second loop over the K/V blocks, say a pass that takes each row's maximum first), which the
        fixed cost of one round count would charge every CTA alike (timed as any launch instead)."""
        walks = [self.warp_walks(r, 0) for r in rounds]
        for w in range(self.config.n_warps):
            for region, at in (("prologue", 0), ("epilogue", -1)):
                lengths = [sum(len(self.graph.blocks[b].instrs) for b in walk[w][at]) for walk in walks]
                if any(walk[w][at] != walks[0][w][at] for walk in walks):
                    raise StreamMismatch(
                        f"{self.config.tag}: warp {w}'s {region} (outside the K/V loop, PTX pc {self.latch_pc}'s "
                        f"back edge) runs {' / '.join(map(str, lengths))} SASS instructions in CTAs of "
                        f"{' / '.join(map(str, rounds))} rounds: work outside the loop grows with the rounds (a "
                        "second loop over the K/V blocks?), which a fixed cost per CTA cannot charge")

    def _real_masked(self, rounds: int) -> int:
        """Masked rounds of a real CTA with masking (causal: the diagonal's; a key tail: one)."""
        cfg = self.config
        return min(-(-cfg.block_m // cfg.block_n), rounds) if self.causal else min(1, rounds)

    def _masked_kind(self) -> Kind:
        return Kind.DIAGONAL if self.causal else Kind.TAIL

    def _extended(self, kind: Kind, rounds: int, qtail: bool = False) -> tuple:
        """A CTA of `rounds` rounds: its own probe, or, longer than a probe, the longest probe
        with its first steady round (from round 1, one whose walk the next round repeats in every
        warp) repeated."""
        base = probe_rounds(self.config)
        if kind is Kind.DIAGONAL_TAIL:  # the tail in the same diagonal key block as the CTA's (its masked rounds)
            base += (rounds - base) % max(1, self.config.block_m // self.config.block_n)
        if rounds <= base:
            self._check(kind, rounds, qtail)
            return tuple(self._regions(p, rounds) for p in paths_of(self.config, self.causal, self.kernel, kind,
                                                                    rounds, qtail, self.features))
        self._check(kind, base, qtail)
        warps = [self._regions(p, base) for p in paths_of(self.config, self.causal, self.kernel, kind, base, qtail,
                                                          self.features)]
        steady = next((t for t in range(1, base - 1) if all(w[1 + t] == w[2 + t] for w in warps)), None)
        if steady is None:
            raise StreamMismatch(f"{self.config.tag}: no two consecutive rounds of a {base}-round CTA take the same "
                                 "SASS path, so no steady round repeats for longer CTAs")
        return tuple(w[:1 + steady] + w[1 + steady:2 + steady] * (rounds - base + 1) + w[2 + steady:] for w in warps)

    def _check(self, kind: Kind, rounds: int, qtail: bool) -> None:
        """The walks of the probe's CTAs must explain the engine's instruction counts
        (fa_sim.timing.walk.check_counts), once per probe."""
        prob, mbs, counts = probe_counts(self.config, self.causal, self.kernel, kind, rounds, qtail, self.features)
        key = (prob.seqlen_q, prob.seqlen_k, mbs)
        if key in self._checked:
            return
        paths = _probe(self.config, self.causal, self.kernel, prob, mbs, self.features)
        walks = [self.walker.walk(p) for mb in mbs for p in paths[mb]]
        check_counts(self.graph, walks, counts, f"{self.config.tag}{' causal' if self.causal else ''} (N_q "
                                                f"{prob.seqlen_q}, N_k {prob.seqlen_k})")
        self._checked.add(key)

    def _regions(self, path: Path, rounds: int) -> tuple[Walk, ...]:
        """One warp's walk cut at the K/V loop: prologue, each round, epilogue."""
        walk = self.walker.walk(path)
        ends = [i for i, b in enumerate(walk) if b == self.latch]
        if len(ends) != rounds or self.header not in walk[: (ends[0] if ends else len(walk)) + 1]:
            raise StreamMismatch(f"{self.config.tag}: the SASS walk passes the K/V loop's latch {len(ends)} times "
                                 f"where the functional run made {rounds} rounds")
        first = walk.index(self.header)
        cuts = [first] + [e + 1 for e in ends]
        return (walk[:first], *(walk[a:b] for a, b in zip(cuts, cuts[1:])), walk[cuts[-1]:])

    def _masked(self, path: Path, edit: tuple, lo: int, hi: int) -> Path:
        """The path with rounds lo..hi-1 masked: `edit` (from `_mask_outcomes`) applied to each.
        The events a masked round runs after a pc are put in only where the round goes on from that
        pc as the plain round the edit comes from did (its next event's pc): a round with control flow
        of its own there (a first round that a switch on the round's kind sends to another case) is a
        round the edit does not describe, and runs its own events on."""
        flips, after, drop = edit
        out, rnd = [], 0
        for i, (pc, o) in enumerate(path):
            masked = lo <= rnd < hi
            if not (masked and pc in drop):
                out.append((pc, flips.get(pc, o) if masked else o))
            if masked and pc in after:
                events, then = after[pc]
                if then is None or (i + 1 < len(path) and path[i + 1][0] == then):
                    out.extend(events)
            rnd += pc == self.latch_pc
        return tuple(out)

    def _mask_outcomes(self) -> list[tuple]:
        """Per warp, how a masked round's control flow differs from a plain one's, from the last
        rounds of the shortest masked probe with a round before its masked ones and of the plain
        probe as long, aligned by pc (difflib): ({pc: the masked outcome} where only the outcome
        differs, {pc: (events the masked round runs after it, the pc the plain round runs next)},
        {pcs it does not run})."""
        n = 2 * max(1, self.config.block_m // self.config.block_n) if self.causal else 2
        plain = paths_of(self.config, self.causal, self.kernel, Kind.PLAIN, n, feat=self.features)
        masked = paths_of(self.config, self.causal, self.kernel, self._masked_kind(), n, feat=self.features)
        out = []
        for p, m in zip(plain, masked):
            lp, lm = self._last_round(p), self._last_round(m)
            flips, after, drop = {}, {}, set()
            match = difflib.SequenceMatcher(None, [pc for pc, _ in lp], [pc for pc, _ in lm], autojunk=False)
            for tag, i1, i2, j1, j2 in match.get_opcodes():
                if tag == "equal":
                    flips.update({lp[i][0]: lm[j][1] for i, j in zip(range(i1, i2), range(j1, j2)) if lp[i] != lm[j]})
                    continue
                if i1 == 0:
                    raise StreamMismatch(f"{self.config.tag}: a masked round begins with other branches than a "
                                         "plain one; the all-masked steady run cannot be made from the plain one")
                drop.update(pc for pc, _ in lp[i1:i2])
                after[lp[i1 - 1][0]] = (tuple(lm[j1:j2]), lp[i1][0] if i1 < len(lp) else None)
            out.append((flips, after, drop))
        return out

    def _last_round(self, path: Path) -> list:
        ends = [i for i, (pc, _) in enumerate(path) if pc == self.latch_pc]
        return list(path[ends[-2] + 1: ends[-1] + 1]) if len(ends) > 1 else list(path[: ends[-1] + 1])
