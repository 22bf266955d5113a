"""Each warp's dynamic SASS stream, from the functional run: which path of the SASS control-flow
graph (fa_sim.timing.paths) the prologue, every K/V round and the epilogue take.

Model. The PTX engine runs the kernel's real PTX (fa2_fwd.cu, or a --kernel variant: the same
source the cubin is built from) on a representative CTA of each path class, with a RoundRecorder
(fa_sim.observers.rounds) noting per warp and region (prologue, round t, epilogue) the warp
instructions per class in SASS names, the MUFU.EX2 count, and the source locations it ran (the
CUDA line with its chain of inlining call sites, as PTX `.loc` and nvdisasm -gi both give it).
A region's SASS path must issue exactly the recorded classes and EX2 count (on-counts: guards
resolved as paths.py says); none doing so is a StreamMismatch naming the region and the counts.
Paths that issue the same classes (an interior or a boundary copy arm, a masking branch) are told
apart by the source locations: the path with the fewest wrong locations (those its blocks hold
that the warp did not run in that region, plus those the warp ran that another candidate holds
and it does not: an if-converted arm keeps a location of the other), then the most that it ran;
left even (branches inside one PTX instruction's expansion), the path without a call of
__frcp_rn's slow path (a row that is not empty sums at least 1: its maximum's exponential is
exactly 1), then a round the shortest and the epilogue the longest (its divergent arms are
issued when any lane takes them). Every warp of a CTA must take the same paths (the SM model
runs one stream per CTA): else a StreamMismatch.

Path classes, as the timing model asks for them: a CTA of R rounds, m of them masked. m = 0: a
plain CTA (non-causal N_q = block_m, N_k = R block_n; causal: a Q block past the diagonal); the
masked count of a real CTA (causal: the Q block on the diagonal whose keys end with N_k, a whole
block or, for a CTA whose keys end in a tail, half of one; non-causal, m = 1: a key tail of half a
block); any other m (the model's all-masked steady run) is the plain CTA's
rounds with the locations that masking adds (those the masked probe's last round runs and the
plain one's does not) counted as run in the last m rounds. A Q block whose rows end past N_q (a
query tail) is its own class: it copies Q through the boundary arm (zero fill); its probe has
half a block of rows; its epilogue is the full block's (the SASS issues the stores of rows past
N_q under a guard, on, where the PTX branches around them; a warp whose LSE rows all lie past
N_q leaves at a guarded EXIT before its last store, 2 instructions the model still issues: the
grid's count is then at most 0.02 % above Nsight Compute's). The control flow depends on shapes,
not values. A probe runs at most PROBE_ROUNDS rounds; a longer CTA repeats round 1 of the
PROBE_ROUNDS-round probe's first round from round 1 that the next round repeats (the steady
state; none is a StreamMismatch), so every CTA has the trip
count the schedule gives it; a probe whose CTA runs another number of rounds than the schedule
says is a StreamMismatch. Records are cached on disk by the kernel source, config and shape.
"""

from __future__ import annotations

import enum
import functools
import json
import re
import warnings
from dataclasses import dataclass

import numpy as np

from ..cache import cache_key, cache_root, read_text_entry, store_atomic
from ..config import KernelConfig
from ..contract import kernel_source
from ..events import ROUND_EPILOGUE, ROUND_PROLOGUE
from ..problem import Problem
from .paths import EX2, KernelSass, SassStructureError, on_classes

PROBE_ROUNDS = 8  # the longest probe (plus the masked rounds and prefetch stages, see `probe_rounds`)
_VERSION = 1  # of the cached records' meaning
_LOC = re.compile(r'^\s*//## File "[^"]*", line (\d+)(?: inlined at "[^"]*", line (\d+))?')
_ADDR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/")

Loc = tuple  # (line, call-site line, ..., outermost call site)
Walk = tuple  # block start addresses of one region's path, in order


class StreamMismatch(SassStructureError):
    """The functional run takes a path that no SASS path explains (or warps of a CTA disagree)."""


class Kind(enum.Enum):
    PLAIN = "plain"  # no masked round
    DIAGONAL = "diagonal"  # causal: the Q block on the diagonal whose keys end with N_k
    TAIL = "tail"  # non-causal: a key tail in the last round
    DIAGONAL_TAIL = "diagonal-tail"  # causal: the diagonal Q block whose last key block is a tail


@dataclass(frozen=True)
class Region:
    """One warp's record of a region: class counts (EX2 included) and the locations it ran."""

    counts: frozenset  # (class, n) items
    locs: frozenset


def sass_locations(listing: str) -> dict[int, Loc]:
    """Instruction address -> source location with its inlining chain, from `nvdisasm -gi`
    (a group of `//## File ..., line L inlined at ..., line C` lines, innermost first, then the
    outermost `line C`; it holds until the next group)."""
    out: dict[int, Loc] = {}
    chain: list[int] = []
    fresh = False
    for line in listing.splitlines():
        if m := _LOC.match(line):
            chain = [int(m.group(1))] if not fresh else chain
            fresh = True
            if m.group(2):
                chain.append(int(m.group(2)))
        elif m := _ADDR.match(line):
            out[int(m.group(1), 16)] = tuple(dict.fromkeys(chain))
            fresh = False
    return out


def ptx_location(src) -> Loc | None:
    """An event's source location in the same form (None: no line)."""
    if src is None or src.line <= 0:
        return None
    return (src.line, *dict.fromkeys(site[1] for site in src.inlined_at if site[1] != src.line))


# ---- the functional run ------------------------------------------------------------------------
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


def record(cfg: KernelConfig, causal: bool, kernel, kind: Kind, rounds: int,
           qtail: bool = False) -> list[dict[int, Region]]:
    """Per warp of the probe CTA of this class: region (ROUND_PROLOGUE, t, ROUND_EPILOGUE) -> its
    record. The diagonal Q blocks of up to `probe_rounds` rounds come from one run of the longest
    diagonal probe (its Q blocks run in one wave: the cost of its longest CTA). `qtail`: the Q
    block's rows end half way; its epilogue is the full block's (the SASS issues the stores of
    rows past N_q under a guard, on; the PTX branches around them)."""
    if qtail:
        prob, mb = probe_problem(cfg, causal, kind, rounds, qtail=True)
        full = record(cfg, causal, kernel, kind, rounds)
        tail = _records(cfg, causal, kernel, prob, (mb,))[mb]
        return [{**w, ROUND_EPILOGUE: f[ROUND_EPILOGUE]} for w, f in zip(tail, full)]
    prob, mb = probe_problem(cfg, causal, kind, rounds)
    if kind is Kind.DIAGONAL and rounds <= probe_rounds(cfg):
        batch, _ = probe_problem(cfg, causal, kind, probe_rounds(cfg))
        same = np.flatnonzero(batch.n_block_max(np.arange(batch.n_m_blocks)) == rounds)
        if same.size:
            return _records(cfg, causal, kernel, batch, tuple(range(batch.n_m_blocks)))[int(same[-1])]
    return _records(cfg, causal, kernel, prob, (mb,))[mb]


def _records(cfg: KernelConfig, causal: bool, kernel, prob: Problem, mbs: tuple) -> dict[int, list]:
    """Q block -> per warp records of a run of those Q blocks, cached in memory and on disk (by the
    kernel source, config and shape)."""
    text = kernel_source(kernel).text
    return _cached(text, cfg, causal, kernel, prob.seqlen_q, prob.seqlen_k, mbs)


@functools.lru_cache(maxsize=64)
def _cached(text: str, cfg: KernelConfig, causal: bool, kernel, nq: int, nk: int, mbs: tuple) -> dict[int, list]:
    key = cache_key(v=_VERSION, text=text, config=cfg.tag, causal=causal, nq=nq, nk=nk, mbs=mbs)
    path = cache_root() / "timing-stream" / f"{key}.json"
    stored = read_text_entry(path)
    if stored is not None:
        try:
            return {int(mb): [{int(r): Region(frozenset((c, n) for c, n in reg[0]), frozenset(tuple(x) for x in reg[1]))
                               for r, reg in warp.items()} for warp in warps] for mb, warps in json.loads(stored).items()}
        except (ValueError, TypeError, IndexError, AttributeError):
            pass  # damaged: run again
    prob = Problem(1, 1, nq, nk, causal, 1.0 / np.sqrt(cfg.head_dim), cfg)
    out = _run_probe(prob, kernel, mbs)
    store_atomic(path, json.dumps({mb: [{r: [sorted(reg.counts), sorted(reg.locs)] for r, reg in w.items()}
                                        for w in warps] for mb, warps in out.items()}).encode())
    return out


def _run_probe(prob: Problem, kernel, mbs: tuple) -> dict[int, list[dict[int, Region]]]:
    """Run the Q blocks `mbs` of `prob` (batch 1, one head) on the PTX engine, recorded."""
    from ..hub import Hub
    from ..observers.rounds import RoundRecorder
    from ..ptx.fa2 import run_attention
    from ..run import global_memory

    cfg = prob.config
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, n, cfg.head_dim)).astype(np.float16)
               for n in (prob.seqlen_q, prob.seqlen_k, prob.seqlen_k))
    gmem, _, ptr = global_memory(prob, q, k, v)
    rec = RoundRecorder(prob.n_ctas, cfg.n_warps, ptx_location)
    ctas = sorted(int(c) for c in prob.q_block_index(np.array(mbs)))  # the grid CTAs that compute them
    with warnings.catch_warnings():  # fully masked score rows: -inf - -inf in fp32
        warnings.simplefilter("ignore", RuntimeWarning)
        for lo, hi in _spans(ctas):
            run_attention(prob, gmem, ptr, Hub([rec]), [np.arange(lo, hi)], kernel=kernel)  # one wave per span
    return {mb: _warps(rec, prob, mb) for mb in mbs}


def _spans(ctas: list[int]) -> list[tuple[int, int]]:
    """Consecutive runs of CTA ids as (lo, hi) ranges."""
    out: list[list[int]] = []
    for c in ctas:
        if out and out[-1][1] == c:
            out[-1][1] = c + 1
        else:
            out.append([c, c + 1])
    return [(lo, hi) for lo, hi in out]


def _warps(rec, prob: Problem, mb: int) -> list[dict[int, Region]]:
    """The records of Q block mb's warps, after checking its trip count against the schedule's."""
    cta = int(prob.q_block_index(np.array([mb]))[0])
    rounds = int(prob.n_block_max(np.array([mb]))[0])
    ran = set(rec.rounds[cta].tolist())
    if ran != {rounds}:
        raise StreamMismatch(f"{prob.config.tag}{' causal' if prob.causal else ''}: in the functional run Q block "
                             f"{mb} (N_q {prob.seqlen_q}, N_k {prob.seqlen_k}) runs {sorted(ran)} K/V rounds per warp; "
                             f"the schedule the model dispatches by says {rounds}")
    regions = (ROUND_PROLOGUE, *range(rounds), ROUND_EPILOGUE)
    return [{r: Region(frozenset(c.items()), frozenset(locs)) for r in regions
             for c, locs in [rec.warp_round(cta, w, r)]} for w in range(prob.config.n_warps)]


# ---- the SASS paths they select ----------------------------------------------------------------
class KernelStream:
    """The SASS walks of every path class of one compiled kernel (see the module docstring)."""

    def __init__(self, config: KernelConfig, causal: bool, kernel, ks: KernelSass, locations: dict[int, Loc]):
        self.config, self.causal, self.kernel, self.ks = config, causal, kernel, ks
        self.block_locs = {b: frozenset(locations[i.addr] for i in blk.instrs if locations.get(i.addr))
                           for b, blk in ks.blocks.items()}
        self.paths = {region: [(_features(w), starts) for w, starts in walks] for region, walks in ks.walks.items()}
        self.walks = functools.lru_cache(maxsize=None)(self._cta_walks)

    def parts(self, rounds: int, masked: int = 0, tail: bool = False, qtail: bool = False) -> list[list]:
        """The instructions of a CTA of `rounds` rounds, the last `masked` masked, its keys ending
        in a tail block (`tail`; non-causal: every masked CTA), its queries in a tail block
        (`qtail`: the last Q block of N_q not a multiple of block_m): prologue, each round, epilogue."""
        return [[i for b in walk for i in self.ks.blocks[b].instrs] for walk in self.walks(rounds, masked, tail, qtail)]

    def _cta_walks(self, rounds: int, masked: int, tail: bool = False, qtail: bool = False) -> tuple[Walk, ...]:
        """`walks(rounds, masked, tail, qtail)`: the block starts of each region's path (prologue,
        rounds, epilogue)."""
        real = self._real_masked(rounds)
        if masked == 0 or masked == real:
            kind = Kind.PLAIN if masked == 0 else self._masked_kind()
            return self._extended(Kind.DIAGONAL_TAIL if kind is Kind.DIAGONAL and tail else kind, rounds, qtail)
        if qtail:
            raise ValueError("a query tail is a real CTA's: its masked rounds are the real ones")
        if rounds > probe_rounds(self.config):
            raise ValueError(f"a CTA of {rounds} rounds with {masked} masked is longer than a probe "
                             f"({probe_rounds(self.config)} rounds) and has no real counterpart")
        plain = self._records(Kind.PLAIN, rounds)
        extra = self._mask_locations()
        return self._select_cta([{r: (Region(reg.counts, reg.locs | extra) if rounds - masked <= r < rounds else reg)
                                  for r, reg in w.items()} for w in plain], rounds)

    def _real_masked(self, rounds: int) -> int:
        """Masked rounds of a real CTA with masking (causal: the diagonal's; a key tail: one)."""
        cfg = self.config
        return min(-(-cfg.block_m // cfg.block_n), rounds) if self.causal else min(1, rounds)

    def _masked_kind(self) -> Kind:
        return Kind.DIAGONAL if self.causal else Kind.TAIL

    def _records(self, kind: Kind, rounds: int, qtail: bool = False) -> list[dict[int, Region]]:
        return record(self.config, self.causal, self.kernel, kind, rounds, qtail)

    def _extended(self, kind: Kind, rounds: int, qtail: bool = False) -> tuple[Walk, ...]:
        """A CTA of `rounds` rounds: its own probe, or, longer than a probe, the longest probe
        with its first steady round (from round 1, one whose path the next round repeats) repeated."""
        base = probe_rounds(self.config)
        if kind is Kind.DIAGONAL_TAIL:  # the tail in the same diagonal key block as the CTA's (its masked rounds)
            base += (rounds - base) % max(1, self.config.block_m // self.config.block_n)
        if rounds <= base:
            return self._select_cta(self._records(kind, rounds, qtail), rounds)
        walks = self._select_cta(self._records(kind, base, qtail), base)  # prologue, round 0, ..., epilogue
        steady = next((t for t in range(1, base - 1) if walks[1 + t] == walks[2 + t]), None)
        if steady is None:
            raise StreamMismatch(f"{self.config.tag}: no two consecutive rounds of a {base}-round CTA take the same "
                                 "SASS path, so no steady round repeats for longer CTAs")
        return walks[:1 + steady] + walks[1 + steady:2 + steady] * (rounds - base + 1) + walks[2 + steady:]

    def _mask_locations(self) -> frozenset:
        """Locations the last round of the shortest masked probe with a round before its masked
        ones runs and the last round of the plain probe as long does not."""
        n = 2 * max(1, self.config.block_m // self.config.block_n) if self.causal else 2
        plain, masked = self._records(Kind.PLAIN, n), self._records(self._masked_kind(), n)
        return frozenset().union(*(m[n - 1].locs - p[n - 1].locs for p, m in zip(plain, masked)))

    def _select_cta(self, warps: list[dict[int, Region]], rounds: int) -> tuple[Walk, ...]:
        """Every warp's walks; they must agree."""
        per_warp = [tuple(self.select(_region(r, rounds), w[r]) for r in (ROUND_PROLOGUE, *range(rounds), ROUND_EPILOGUE))
                    for w in warps]
        if any(p != per_warp[0] for p in per_warp):
            bad = next(i for i, p in enumerate(per_warp) if p != per_warp[0])
            raise StreamMismatch(f"{self.config.tag}: warp {bad} of a {rounds}-round CTA takes other SASS paths than "
                                 "warp 0; the SM model runs one stream per CTA")
        return per_warp[0]

    def select(self, region: str, rec: Region) -> Walk:
        """The SASS walk of `region` that issues the record's counts, best explained by its locations."""
        hits = [starts for counts, starts in self.paths[region] if counts == rec.counts]
        if not hits:
            have = sorted({_brief(c) for c, _ in self.paths[region]})
            raise StreamMismatch(f"{self.config.tag}{' causal' if self.causal else ''} {region}: the functional run "
                                 f"issues {_brief(rec.counts)} per warp; no SASS path does (they issue: "
                                 f"{'; '.join(have[:4])}{' ...' if len(have) > 4 else ''})")
        longest = region == "epilogue"
        known = frozenset().union(*(self.block_locs[b] for s in hits for b in s)) & rec.locs

        def score(starts: Walk) -> tuple:
            locs = [self.block_locs[b] for b in starts]
            have = frozenset().union(*locs)
            # locations the walk holds and the warp did not run, plus those the warp ran that
            # another candidate holds and this one does not (an if-converted arm keeps a location
            # of the other arm: the boundary copy of Q holds one of the interior copy's)
            wrong = sum(len(x - rec.locs) for x in locs) + len(known - have)
            size = sum(len(self.ks.blocks[b].instrs) for b in starts)
            return wrong, -len(have & rec.locs), self.ks.slow_calls(starts), -size if longest else size
        return min(hits, key=score)


def _region(rnd: int, rounds: int) -> str:
    if rnd == ROUND_PROLOGUE:
        return "prologue"
    if rnd == ROUND_EPILOGUE:
        return "epilogue"
    return "last_trip" if rnd == rounds - 1 else "trip"


def _features(w) -> frozenset:
    """A path weight's on-counts with its EX2 count: what a warp's record must equal."""
    out = on_classes(w)
    if dict(w).get(EX2):
        out[EX2] = dict(w)[EX2]
    return frozenset(out.items())


def _brief(counts: frozenset) -> str:
    return ", ".join(f"{c} {n}" for c, n in sorted(counts))
