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
apart by the source locations: the path whose blocks hold the fewest locations the warp did not
run in that region, then the most that it did; left even (branches inside one PTX instruction's
expansion, such as __frcp_rn's slow path), a round takes the shortest path and the epilogue the
longest (its divergent arms are issued when any lane takes them). Every warp of a CTA must take
the same paths (the SM model runs one stream per CTA): else a StreamMismatch.

Path classes, as the timing model asks for them: a CTA of R rounds, m of them masked. m = 0: a
plain CTA (non-causal N_q = block_m, N_k = R block_n; causal: a Q block past the diagonal); the
masked count of a real CTA (causal: the diagonal Q block of N_q = N_k; non-causal, m = 1: a key
tail of half a block); any other m (the model's all-masked steady run) is the plain CTA's
rounds with the locations that masking adds (those the masked probe's last round runs and the
plain one's does not) counted as run in the last m rounds. The control flow depends on shapes,
not values. A probe runs at most PROBE_ROUNDS rounds; a longer CTA repeats round 1 of the
PROBE_ROUNDS-round probe (checked to equal round 2: the steady state), so every CTA has the trip
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
    DIAGONAL = "diagonal"  # causal: the Q block on the diagonal of N_q = N_k
    TAIL = "tail"  # non-causal: a key tail in the last round


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
    (prefetch stages, masked rounds), so rounds 1 and 2 show the steady state."""
    return max(PROBE_ROUNDS, -(-cfg.block_m // cfg.block_n) + cfg.kv_stages + 3)


def probe_problem(cfg: KernelConfig, causal: bool, kind: Kind, rounds: int) -> tuple[Problem, int]:
    """The problem and the grid CTA whose Q block has `rounds` rounds of this kind."""
    bm, bn = cfg.block_m, cfg.block_n
    nk = rounds * bn - (bn // 2 if kind is Kind.TAIL else 0)
    if kind is Kind.DIAGONAL:
        nq = nk
    else:
        nq = (-(-nk // bm) + 1) * bm if causal else bm  # causal: one Q block past every key
    prob = Problem(1, 1, nq, nk, causal, 1.0 / np.sqrt(cfg.head_dim), cfg)
    return prob, int(prob.q_block_index(np.array([prob.n_m_blocks - 1]))[0])


def record(cfg: KernelConfig, causal: bool, kernel, kind: Kind, rounds: int) -> list[dict[int, Region]]:
    """Per warp of the probe CTA: region (ROUND_PROLOGUE, t, ROUND_EPILOGUE) -> its record
    (cached on disk by the kernel source, config and probe)."""
    source = kernel_source(kernel)
    key = cache_key(v=_VERSION, text=source.text, config=cfg.tag, causal=causal, kind=kind.value, rounds=rounds)
    path = cache_root() / "timing-stream" / f"{key}.json"
    text = read_text_entry(path)
    if text is not None:
        try:
            return [{int(r): Region(frozenset((c, n) for c, n in reg[0]), frozenset(tuple(x) for x in reg[1]))
                     for r, reg in warp.items()} for warp in json.loads(text)]
        except (ValueError, TypeError, IndexError):
            pass  # damaged: run again
    warps = _run_probe(cfg, causal, kernel, kind, rounds)
    store_atomic(path, json.dumps([{r: [sorted(reg.counts), sorted(reg.locs)] for r, reg in w.items()}
                                   for w in warps]).encode())
    return warps


def _run_probe(cfg: KernelConfig, causal: bool, kernel, kind: Kind, rounds: int) -> list[dict[int, Region]]:
    from ..hub import Hub
    from ..observers.rounds import RoundRecorder
    from ..ptx.fa2 import run_attention
    from ..run import global_memory

    prob, cta = probe_problem(cfg, causal, kind, rounds)
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, n, cfg.head_dim)).astype(np.float16)
               for n in (prob.seqlen_q, prob.seqlen_k, prob.seqlen_k))
    gmem, _, ptr = global_memory(prob, q, k, v)
    rec = RoundRecorder(prob.n_ctas, cfg.n_warps, ptx_location)
    with warnings.catch_warnings():  # fully masked score rows: -inf - -inf in fp32
        warnings.simplefilter("ignore", RuntimeWarning)
        run_attention(prob, gmem, ptr, Hub([rec]), kernel=kernel, cta_range=(cta, cta + 1))
    ran = set(rec.rounds[cta].tolist())
    if ran != {rounds}:
        raise StreamMismatch(f"{cfg.tag}{' causal' if causal else ''}: the functional run's CTA {cta} "
                             f"(N_q {prob.seqlen_q}, N_k {prob.seqlen_k}) ran {sorted(ran)} K/V rounds per warp; "
                             f"the schedule the model dispatches by says {rounds}")
    regions = (ROUND_PROLOGUE, *range(rounds), ROUND_EPILOGUE)
    return [{r: Region(frozenset(c.items()), frozenset(locs)) for r in regions
             for c, locs in [rec.warp_round(cta, w, r)]} for w in range(cfg.n_warps)]


# ---- the SASS paths they select ----------------------------------------------------------------
class KernelStream:
    """The SASS walks of every path class of one compiled kernel (see the module docstring)."""

    def __init__(self, config: KernelConfig, causal: bool, kernel, ks: KernelSass, locations: dict[int, Loc]):
        self.config, self.causal, self.kernel, self.ks = config, causal, kernel, ks
        self.block_locs = {b: frozenset(locations[i.addr] for i in blk.instrs if locations.get(i.addr))
                           for b, blk in ks.blocks.items()}
        self.paths = {region: [(_features(w), starts) for w, starts in walks] for region, walks in ks.walks.items()}
        self._walks = functools.lru_cache(maxsize=None)(self._cta_walks)

    def parts(self, rounds: int, masked: int = 0) -> list[list]:
        """The instructions of a CTA of `rounds` rounds, the last `masked` masked: prologue, each
        round, epilogue."""
        return [[i for b in walk for i in self.ks.blocks[b].instrs] for walk in self._walks(rounds, masked)]

    def _cta_walks(self, rounds: int, masked: int) -> tuple[Walk, ...]:
        real = self._real_masked(rounds)
        if masked == 0 or masked == real:
            return self._extended(Kind.PLAIN if masked == 0 else self._masked_kind(), rounds)
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

    def _records(self, kind: Kind, rounds: int) -> list[dict[int, Region]]:
        return record(self.config, self.causal, self.kernel, kind, rounds)

    def _extended(self, kind: Kind, rounds: int) -> tuple[Walk, ...]:
        """A CTA of `rounds` rounds: its own probe, or, longer than a probe, the longest probe
        with its steady round 1 repeated."""
        base = probe_rounds(self.config)
        if rounds <= base:
            return self._select_cta(self._records(kind, rounds), rounds)
        walks = self._select_cta(self._records(kind, base), base)
        if walks[2] != walks[3]:  # prologue, round 0, round 1, round 2, ...
            raise StreamMismatch(f"{self.config.tag}: rounds 1 and 2 of a {base}-round CTA take different SASS "
                                 "paths, so no steady round repeats for longer CTAs")
        return walks[:2] + walks[2:3] * (rounds - base + 1) + walks[3:]

    def _mask_locations(self) -> frozenset:
        """Locations the masked probe's last round runs and the plain probe's does not."""
        base = probe_rounds(self.config)
        plain, masked = self._records(Kind.PLAIN, base), self._records(self._masked_kind(), base)
        return frozenset().union(*(m[base - 1].locs - p[base - 1].locs for p, m in zip(plain, masked)))

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

        def score(starts: Walk) -> tuple:
            locs = [self.block_locs[b] for b in starts]
            missed = sum(len(x - rec.locs) for x in locs)
            ran = len(frozenset().union(*locs) & rec.locs)
            size = sum(len(self.ks.blocks[b].instrs) for b in starts)
            return missed, -ran, -size if longest else size
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
