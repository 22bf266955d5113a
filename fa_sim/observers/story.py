"""One lane's story through one round, told from a Trace (what `fa trace` prints).

Steps come from the trace records (each instruction the lane executed: the tile coordinate,
byte address and banks it touched, the values it received, its shuffle partner); the state
sections come from the checkpoints (S accumulated, after masking, m, l, P~ and O slots), placed at
their global (query, key) or (query, d) coordinates with the closed-form maps of lanemaps.py
(docs/walkthrough.md, section 5 "Any lane's coordinates", tables 4-9).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..checkpoints import Checkpoint
from ..config import KernelConfig
from ..events import ROUND_EPILOGUE, ROUND_PROLOGUE, Op
from ..kernels.labels import Phase, Tile
from ..problem import Problem
from . import lanemaps
from .trace import Trace, TraceRecord
from .trace_io import json_list, json_number, reg_values

BANKS_PER_ROW = {4: 1, 8: 2, 16: 4}
TILE_TENSOR = {Tile.SQ: "Q", Tile.SK: "K", Tile.SV: "V", Tile.SO: "O"}


@dataclass(frozen=True)
class Step:
    """One instruction of the lane. coords: the global (row, col) of `matrix` behind each value
    (Q/K/V elements an ldmatrix delivers, S/O elements an mma produces, O elements staged
    through sO); sent: a shuffle's outgoing value(s)."""

    seq: int
    instr: int
    pc: int
    op: Op
    phase: str
    round: int
    label: str
    ptx: str
    touch: str
    matrix: str
    values: tuple
    coords: tuple
    partner: int | None
    sent: tuple
    detail: str
    src: str = ""  # CUDA source line (PTX engine)
    regs: str = ""  # 'name=value ...' of the registers written (PTX engine: named registers)


@dataclass(frozen=True)
class Slot:
    """A register slot at a global coordinate (col None for per-row state)."""

    name: str
    row: int
    col: int | None
    value: float


@dataclass(frozen=True)
class LaneStory:
    cta: int
    warp: int
    lane: int
    round: int
    m_block: int
    bh: int
    launch: dict
    steps: tuple[Step, ...]
    state: dict  # Checkpoint value -> tuple[Slot, ...]
    coordinates: str | None = None  # a packed or split lane's rows and keys in words (lane_coordinates)
    combine: tuple | None = ()  # split-KV: CombineRow of each of the lane's rows (combine_rows); None: no workspace

    @property
    def partners(self) -> list[int]:
        return [s.partner for s in self.steps if s.partner is not None]

    def slots(self, ck: Checkpoint) -> tuple[Slot, ...]:
        return self.state.get(ck.value, ())

    def kept_keys(self) -> dict[int, list[int]]:
        """query -> keys whose score survived the mask (finite s_masked slots), spec table 4."""
        out: dict[int, list[int]] = {}
        for sl in self.slots(Checkpoint.S_MASKED):
            keys = out.setdefault(sl.row, [])
            if np.isfinite(sl.value):
                keys.append(sl.col)
        return {q: sorted(k) for q, k in sorted(out.items())}


def config_of(launch: dict) -> KernelConfig:
    return KernelConfig.from_json(launch["config"])


def problem_of(launch: dict) -> Problem:
    """The launch's Problem as far as the story needs it: shape, mask (the window: a CTA's first K/V
    block), config and a packed batch's offsets (heads_k and softcap do not change which Q block or
    K/V blocks a CTA computes)."""
    cu = (launch["cu_seqlens_q"], launch["cu_seqlens_k"]) if "cu_seqlens_q" in launch else None
    return Problem(launch["batch"], launch["heads"], launch["seqlen_q"], launch["seqlen_k"], launch["causal"],
                   launch["scale"], config_of(launch), window=tuple(launch.get("window", (-1, -1))), cu_seqlens=cu)


def m_block_of(launch: dict, cta: int) -> int:
    """The Q block a linear CTA id computes (blockIdx.x, reversed under heavy_first with causal)."""
    return int(problem_of(launch).m_block_of(cta))


def packed_header(launch: dict, cta: int) -> str | None:
    """A packed batch's line of the story: which sequence, head and Q block the CTA computes (the
    story's query and key coordinates count from that sequence's start: PACKED_NOTE, and
    lane_coordinates gives the packed rows); None for a dense launch."""
    if "cu_seqlens_q" not in launch:
        return None
    from ..varlen import describe_cta

    return f"packed batch, {describe_cta(problem_of(launch), cta)}"


def split_plan(launch: dict):
    """Split-KV's split launch (the launch names its splits): the fa_sim.splitkv.SplitPlan it ran
    (its problem GQA packed where the launch was), else None."""
    if "splits" not in launch:
        return None
    from dataclasses import replace

    from ..splitkv import SplitPlan

    prob, g = problem_of(launch), launch["gqa_group"]
    unpacked = None if g == 1 else replace(prob, heads=prob.heads * g, seqlen_q=prob.seqlen_q // g, heads_k=prob.heads)
    return SplitPlan(prob, launch["splits"], np.array(launch["cache_seqlens"], np.int32), unpacked=unpacked)


def split_header(launch: dict, cta: int) -> str | None:
    """Split-KV's line of the story: which split, batch-head and Q block the CTA computes and which
    K/V tiles its split covers (SPLIT_NOTE says how the coordinates count); None for other launches."""
    plan = split_plan(launch)
    return None if plan is None else f"split-KV, {plan.describe_cta(cta)}"


SPLIT_NOTE = ("key coordinates are the cache's (block first + round); fa trace runs the split launch's checkpoint "
              "build (FA_SPLITKV with FA_CHECKPOINTS, as fa compare --splits does)")


PACKED_NOTE = ("query and key coordinates count from the sequence's start (the packed rows are in the line below); "
               "fa trace runs the packed batch's checkpoint build (FA_VARLEN with FA_CHECKPOINTS, as fa compare "
               "--seqlens does)")


def _span(lo: int, hi: int) -> str:
    return f"{lo}" if lo == hi else f"{lo}..{hi}"


def lane_coordinates(story: "LaneStory") -> str | None:
    """A packed or split lane's coordinates in words: the queries of its accumulator rows (a packed
    batch: in its sequence and as rows of the packed q; split-KV: the batch, Q head and query of each
    launch row, GQA packed or not) and the keys of the round (a packed batch: the sequence's, and their
    rows of the packed k, v; split-KV: the cache's, within the split's range). None for a dense launch."""
    la, cfg = story.launch, config_of(story.launch)
    plan = split_plan(la)
    if plan is None and "cu_seqlens_q" not in la:
        return None
    thread = 32 * story.warp + story.lane
    tile_rows = sorted(set(lanemaps.row_slot_rows(cfg, thread, np.arange(cfg.rows_per_thread)).tolist()))
    rows = [story.m_block * cfg.block_m + r for r in tile_rows]
    if plan is None:
        prob = problem_of(la)
        b = story.cta // (prob.n_m_blocks * prob.heads)
        (cq, ck), seq = prob.cu_seqlens, prob.sequence(b)
        nq, nk = seq.seqlen_q, seq.seqlen_k
        held = [f"query {r} (packed row {cq[b] + r})" for r in rows if r < nq]
        past = [str(r) for r in rows if r >= nq]
        k0 = (int(seq.n_block_min(story.m_block)) + story.round) * cfg.block_n
        k1 = min(k0 + cfg.block_n, nk) - 1
        keys = (f"round {story.round}'s keys {_span(k0, k1)} of sequence {b} are rows {_span(ck[b] + k0, ck[b] + k1)} "
                f"of the packed k, v")
        where = f"sequence {b}'s {nq} queries"
    else:
        p = plan.problem
        _, bh, split, first, n = plan.cta(story.cta)
        bb, h = divmod(bh, p.heads)
        length = int(plan.cache_seqlens[bb])
        nq = p.seqlen_q

        def name(r):
            if plan.unpacked is None:
                return f"query {r} (batch {bb}, head {h})"
            g, n1 = plan.unpacked.kv_group, plan.unpacked.seqlen_q
            return f"row {r} (batch {bb}, Q head {h * g + r // n1}, query {r % n1})"

        held = [name(r) for r in rows if r < nq]
        past = [str(r) for r in rows if r >= nq]
        k0 = (first + story.round) * cfg.block_n
        keys = (f"round {story.round} runs K/V block {first + story.round}: cache keys {_span(k0, min(k0 + cfg.block_n, length) - 1)}"
                f" (split {split} covers keys {first * cfg.block_n}..{min((first + n) * cfg.block_n, length) - 1})")
        where = f"the launch's {nq} row{'s' * (nq != 1)}"
    text = "lane's rows: " + (", ".join(held) or "none")
    if past:
        text += (f"; row{'s' * (len(past) > 1)} {', '.join(past)} {'are' if len(past) > 1 else 'is'} past {where} "
                 f"(their values are not stored)")
    return f"{text}; {keys}"


@dataclass(frozen=True)
class CombineRow:
    """The combine step (fa2_combine.cu) of one launch row of split-KV decoding, from the real run's
    workspace: the splits' LSEs (lse_accum), m (their max, 0 when all are -inf), the weights w_s =
    ex2.approx.ftz((lse_s - m) * log2 e) and their sum l in fa2_combine.cu's arithmetic (each operation
    rounded to fp32, the splits in ascending order: fa_sim.isa.fp32), the final LSE (the run's), and per
    column c of the lane's O slots the splits' partial O (o_accum) and the final O (the run's, the
    kernel's 16-bit type as a float)."""

    row: int
    name: str
    lse: tuple[float, ...]
    m: float
    weights: tuple[float, ...]
    l: float
    lse_final: float
    cols: tuple[tuple[int, tuple[float, ...], float], ...]


def combine_weights(lse: np.ndarray) -> tuple[np.float32, np.ndarray, np.float32]:
    """(m, w [splits], l) of one row's split LSEs, as fa2_combine.cu computes them."""
    from ..isa.fp32 import LOG2E, ex2_approx_ftz

    lse = np.asarray(lse, np.float32)
    m = np.float32(lse.max())
    m = np.float32(0) if m == -np.inf else m
    w = ex2_approx_ftz(np.float32(lse - m) * LOG2E).astype(np.float32)
    l = np.float32(0)
    for x in w:
        l = np.float32(l + x)
    return m, w, l


def combine_rows(trace: Trace, story: "LaneStory") -> tuple[CombineRow, ...]:
    """The combine step of the lane's rows below the launch's Nq (split-KV with more than one split;
    () otherwise; None when the trace has no workspace, as one read back from an archive): its partial
    LSEs and weights, and the final O at the lane's O columns."""
    plan, ws = split_plan(trace.launch), trace.workspace
    if plan is None or plan.splits == 1:
        return ()
    if ws is None:
        return None
    cfg, p = config_of(trace.launch), plan.problem
    thread = 32 * story.warp + story.lane
    bh = plan.cta(story.cta)[1]
    rows, cols = lanemaps.acc_coords(cfg, thread, np.arange(cfg.o_values_per_thread))
    rows = rows + story.m_block * cfg.block_m
    out = []
    for r in sorted(set(rows.tolist())):
        if r >= p.seqlen_q:
            continue
        lse = ws.lse_accum[:, bh, r]
        m, w, l = combine_weights(lse)
        row_cols = []
        for c in sorted(set(cols[rows == r].tolist())):
            final = float(half_value(ws.o[bh, r, c], cfg.dtype))
            row_cols.append((int(c), tuple(float(x) for x in ws.o_accum[:, bh, r, c]), final))
        out.append(CombineRow(int(r), _row_name(plan, bh, r), tuple(float(x) for x in lse), float(m),
                              tuple(float(x) for x in w), float(l), float(ws.lse[bh, r]), tuple(row_cols)))
    return tuple(out)


def half_value(bits, dtype: str) -> np.float32:
    """A 16-bit pattern (fp16, or bf16 for dtype "bf16") as float32."""
    bits = np.asarray(bits, np.uint16)
    if dtype == "bf16":
        return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return bits.view(np.float16).astype(np.float32)


def _row_name(plan, bh: int, r: int) -> str:
    b, h = divmod(bh, plan.problem.heads)
    if plan.unpacked is None:
        return f"batch {b}, head {h}, query {r}"
    g, n1 = plan.unpacked.kv_group, plan.unpacked.seqlen_q
    return f"batch {b}, Q head {h * g + r // n1}, query {r % n1} (launch row {r})"


def _tile_row0(tile: str, rec: TraceRecord, cfg: KernelConfig, m_block: int, kv0: int = 0) -> int:
    """Global row of tile row 0 of what an ldmatrix or ld/st.shared touched: the Q block, or the
    K/V block of the round (the tile a round reads holds that round's block, kv0 + round: kv0 the
    CTA's first K/V block, a split's)."""
    if tile in (Tile.SQ, Tile.SO):
        return m_block * cfg.block_m
    return cfg.block_n * (kv0 + max(rec.round, 0))


def _touch(rec: TraceRecord, r: int, c: int, s: int) -> str:
    """'sQ(r,c) -> byte -> bank b[-b+3]' of the lane's own shared-memory access."""
    sm = rec.smem
    b, nb = int(sm.bank[r, c, s]), BANKS_PER_ROW.get(sm.width, 1)
    text = (f"{sm.region}({int(sm.row[r, c, s])},{int(sm.col[r, c, s])}) -> {int(sm.addr[r, c, s])}B -> "
            f"bank {b}" + (f"-{b + nb - 1}" if nb > 1 else ""))
    return text if sm.mask[r, c, s] else text + " (off)"


def _mma_coords(rec: TraceRecord, r: int, thread: int, cfg: KernelConfig, m_block: int, kv0: int = 0) -> tuple:
    """Global (row, col) of the 4 accumulators mma r produced. The machine orders the R mmas of a
    k-step mi-major (r = mi * NJ + nj, machine.Machine.mma); C layout per docs/hardware_facts.md."""
    nj_count = cfg.s_n_tiles if rec.phase == Phase.QK else cfg.o_n_tiles
    mi, nj = divmod(r, nj_count)
    e = np.arange(4) + 4 * (mi + cfg.m_repeats * nj)  # CuTe order of the same slots
    rows, cols = lanemaps.acc_coords(cfg, thread, e)
    k0 = cfg.block_n * (kv0 + rec.round) if rec.phase == Phase.QK else 0
    return tuple(zip((rows + m_block * cfg.block_m).tolist(), (cols + k0).tolist()))


def _regs(regs: dict, r: int, c: int, s: int, dtype: str = "fp16") -> tuple:
    if not regs:
        return ()
    return tuple(json_list(np.concatenate([reg_values(v[r, c, s], dtype).reshape(-1) for v in regs.values()])))


def _step(rec: TraceRecord, r: int, c: int, s: int, cfg: KernelConfig, m_block: int, thread: int,
          kv0: int = 0) -> Step:
    touch, matrix, coords, detail = "", "", (), ""
    values = (_regs(rec.regs_out, r, c, s, cfg.dtype)
              or (_regs(rec.regs_in, r, c, s, cfg.dtype) if rec.op is Op.STS else ()))
    if rec.smem is not None:
        touch, matrix = _touch(rec, r, c, s), TILE_TENSOR.get(rec.smem.region, str(rec.smem.region))
        row0 = _tile_row0(rec.smem.region, rec, cfg, m_block, kv0)
        coords = tuple(zip((rec.smem.elem_row[r, c, s] + row0).tolist(), rec.smem.elem_col[r, c, s].tolist()))
    if rec.op is Op.HMMA and rec.src is None:  # the program's mma order (r = mi * NJ + nj) gives coordinates
        matrix, coords = ("S" if rec.phase == Phase.QK else "O"), _mma_coords(rec, r, thread, cfg, m_block, kv0)
    if rec.gmem is not None:
        g = rec.gmem
        detail = f"{str(g.buffer).upper()}[{int(g.row[r, c, s])}, {int(g.col[r, c, s])}:+{g.width // 2}]"
        detail += "" if g.mask[r, c, s] else " (predicated off)"
        if rec.op is Op.LDGSTS and g.mask[r, c, s]:  # a copy: the elements are where they come from
            coords = tuple((int(g.row[r, c, s]), int(g.col[r, c, s]) + i) for i in range(g.width // 2))
    partner = None if rec.shfl_src is None else int(rec.shfl_src[r, c, s])
    sent = _regs(rec.regs_in, r, c, s) if partner is not None else ()
    src, regs = "", ""
    if rec.src is not None:  # the PTX engine: name what each register holds
        outer = rec.src.inlined_at[-1][1] if rec.src.inlined_at else None  # the kernel line that called it
        src = f"{rec.src.file.rsplit('/', 1)[-1]}:{rec.src.line}" + (f"<{outer}" if outer else "")
        named = rec.regs_out or (rec.regs_in if rec.op in (Op.STS, Op.STG) else {})
        regs = " ".join(f"{k}={_ptx_value(v[r, c, s])}" for k, v in named.items())
    return Step(rec.seq, r, rec.pc, rec.op, str(rec.phase), rec.round, rec.label, rec.ptx, touch, matrix, values,
                coords, partner, sent, detail, src, regs)


def _state(trace: Trace, cfg: KernelConfig, cta: int, s: int, thread: int, rnd: int, m_block: int,
           kv0: int = 0) -> dict:
    """Checkpoint slots of one thread at global coordinates."""
    out: dict = {}
    for ck in trace.checkpoints:
        hit = np.nonzero(ck.cta == cta)[0]
        if hit.size == 0 or (ck.round != rnd and ck.checkpoint not in (Checkpoint.O_FINAL,)):
            continue
        words = ck.values[hit[0], s]
        out[ck.checkpoint.value] = _slots(ck.checkpoint, words, cfg, thread, rnd, m_block, kv0)
    return out


def _slots(ck: Checkpoint, words: np.ndarray, cfg: KernelConfig, thread: int, rnd: int, m_block: int,
           kv0: int = 0):
    q0, k0 = m_block * cfg.block_m, (kv0 + rnd) * cfg.block_n
    if ck in (Checkpoint.ROW_MAX, Checkpoint.ROW_SUM):
        vals = words[: cfg.rows_per_thread].view(np.float32)
        rows = lanemaps.row_slot_rows(cfg, thread, np.arange(vals.size)) + q0
        return tuple(Slot(ck.value, int(q), None, float(v)) for q, v in zip(rows, vals))
    if ck is Checkpoint.P_F16:  # f16x2 words (bf16x2 in a bf16 kernel)
        vals = reg_values(words[: cfg.s_values_per_thread // 2].astype(np.uint32), cfg.dtype).astype(np.float32)
    elif ck in (Checkpoint.S_ACC, Checkpoint.S_MASKED, Checkpoint.O_ACC, Checkpoint.O_FINAL):
        n = cfg.o_values_per_thread if ck in (Checkpoint.O_ACC, Checkpoint.O_FINAL) else cfg.s_values_per_thread
        vals = words[:n].view(np.float32)
    else:
        return ()
    rows, cols = lanemaps.acc_coords(cfg, thread, np.arange(vals.size))
    cols = cols + (0 if ck in (Checkpoint.O_ACC, Checkpoint.O_FINAL) else k0)
    return tuple(Slot(ck.value, int(q), int(k), float(v)) for q, k, v in zip(rows + q0, cols, vals))


def lane_story(trace: Trace, cta: int, warp: int, lane: int, round: int) -> LaneStory:
    """The story of (cta, warp, lane) in K/V round `round` (plus the prologue for round 0 and the
    epilogue after the CTA's last round)."""
    cfg = config_of(trace.launch)
    if not (0 <= lane < 32 and 0 <= warp < cfg.n_warps):
        raise ValueError(f"warp {warp} lane {lane} is not a thread of a {cfg.n_warps}-warp CTA "
                         f"(warp 0..{cfg.n_warps - 1}, lane 0..31)")
    thread = 32 * warp + lane
    s = trace.thread_index(thread)
    m_block = m_block_of(trace.launch, cta)
    plan = split_plan(trace.launch)  # split-KV: the split's first K/V block and the batch-head within grid y
    if plan is not None:
        _, bh, _, kv0, _ = plan.cta(cta)
    else:  # round t runs K/V block n_block_min + t: 0, or a window's first block
        bh, kv0 = cta // trace.launch["n_m_blocks"], int(problem_of(trace.launch).n_block_min(m_block))
    last = max((r.round for r in trace.records if r.round >= 0 and cta in r.cta), default=-1)
    keep = {round} | ({ROUND_PROLOGUE} if round == 0 else set()) | ({ROUND_EPILOGUE} if round == last else set())
    steps = []
    for rec in trace.records:
        hit = np.nonzero(rec.cta == cta)[0]
        if rec.round not in keep or hit.size == 0 or not rec.active[hit[0], s]:
            continue
        steps += [_step(rec, r, int(hit[0]), s, cfg, m_block, thread, kv0) for r in range(rec.repeat)]
    if not steps:
        ran = sorted({r.round for r in trace.records if r.round >= 0 and cta in r.cta})
        raise ValueError(f"no traced instruction of CTA {cta} thread {thread} in round {round} "
                         f"(traced rounds of this CTA: {ran or 'none'}; causal CTAs stop early)")
    state = _state(trace, cfg, cta, s, thread, round, m_block, kv0)
    story = LaneStory(cta, warp, lane, round, m_block, bh, trace.launch, tuple(steps), state)
    return replace(story, coordinates=lane_coordinates(story), combine=combine_rows(trace, story))


# -- rendering ---------------------------------------------------------------------------------------
def _ptx_value(v) -> str:
    """A PTX register's value: untyped 32-bit words (.b32: shuffled, moved or packed) as their bits
    and their fp32 reading; typed values as numbers."""
    v = np.asarray(v).reshape(-1)
    if v.dtype == np.uint32:
        return "/".join(f"0x{int(w):08x}({_fmt(float(f))})" for w, f in zip(v, v.view(np.float32)))
    return "/".join(_fmt(x) for x in json_list(v))


def _fmt(v) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def _values(step: Step) -> str:
    if step.coords and step.values and len(step.coords) == len(step.values):
        return " ".join(f"{step.matrix}({r},{c})={_fmt(v)}" for (r, c), v in zip(step.coords, step.values))
    text = " ".join(_fmt(v) for v in step.values[:8]) + (" ..." if len(step.values) > 8 else "")
    if step.partner is not None:
        text = f"partner lane {step.partner}: sent {' '.join(map(_fmt, step.sent))}, got {text}"
    return (step.detail + "  " + text).strip()


def _section(title: str, slots) -> list[str]:
    if not slots:
        return []
    body = "  ".join(f"({sl.row},{sl.col})={_fmt(sl.value)}" if sl.col is not None else f"q{sl.row}={_fmt(sl.value)}"
                     for sl in slots)
    return [f"{title} [{len(slots)}]:", "  " + body]


SECTIONS = ((Checkpoint.S_ACC, "S accumulated, S(query,key) (tCrS after QK)"),
            (Checkpoint.S_MASKED, "S after masking"),
            (Checkpoint.ROW_MAX, "m (rRowMax, unscaled)"), (Checkpoint.ROW_SUM, "l (rRowSum)"),
            (Checkpoint.P_F16, "P~ as fp16 A operand, P(query,key) (tCrP)"),  # fp16: the config's dtype
            (Checkpoint.O_ACC, "O accumulator after PV, O(query,d) (tCrO)"),
            (Checkpoint.O_FINAL, "O after division by l"))


def format_story(story: LaneStory) -> str:
    la = story.launch
    x = story.cta % la["n_m_blocks"]
    block = f"m_block {story.m_block}" if x == story.m_block else f"blockIdx.x {x} -> m_block {story.m_block} (heavy_first)"
    head = (f"CTA {story.cta} ({block}, batch-head {story.bh})  warp {story.warp}  lane {story.lane}"
            f"  (thread {32 * story.warp + story.lane})  round {story.round}\n"
            f"{config_of(la).tag}  seqlen_q {la['seqlen_q']} seqlen_k {la['seqlen_k']}  causal {la['causal']}")
    packed = packed_header(la, story.cta)
    if packed is not None:
        head += f"  (max over the sequences)\n{packed}\n{PACKED_NOTE}"
    split = split_header(la, story.cta)
    if split is not None:
        head += f"\n{split}\n{SPLIT_NOTE}"
    if story.coordinates is not None:
        head += f"\n{story.coordinates}"
    if any(st.src for st in story.steps):  # the PTX engine: every PTX instruction with its source line
        lines = [head, f"{'pc':>5} {'phase':<8} {'source (line<call)':<19} {'PTX instruction':<52} "
                       f"{'smem coord -> byte -> bank':<34} registers written"]
        for st in story.steps:
            text = f"{st.regs} {st.detail}".strip() or _values(st)
            lines.append(f"{st.pc:>5} {st.phase[:8]:<8} {st.src:<19} {st.ptx[:52]:<52} {st.touch:<34} {text}")
    else:
        lines = [head, f"{'pc':>4} {'phase':<8} {'instruction':<44} {'smem coord -> byte -> bank':<34} values"]
        for st in story.steps:
            name = f"{st.label}" + (f" #{st.instr}" if st.instr else "")
            lines.append(f"{st.pc:>4} {st.phase:<8} {name[:44]:<44} {st.touch:<34} {_values(st)}")
    partners = story.partners
    if partners:
        lines.append("shuffle partners: " + ", ".join(f"lane {p}" for p in partners))
    dtype = config_of(la).dtype
    for ck, title in SECTIONS:
        lines += _section(title.replace("fp16", dtype) if ck is Checkpoint.P_F16 else title, story.slots(ck))
    if any(not np.isfinite(sl.value) for sl in story.slots(Checkpoint.S_MASKED)):
        lines.append("kept keys after masking: " + "; ".join(
            f"query {q}: {', '.join(map(str, k)) or 'none'}" for q, k in story.kept_keys().items()))
    lines += _combine_lines(story)
    return "\n".join(lines)


def _combine_lines(story: LaneStory) -> list[str]:
    if "splits" not in story.launch or story.launch["splits"] == 1:
        return []
    if story.combine is None:
        return ["combine (fa2_combine.cu): not in this trace (an archive read back keeps no split-KV workspace)"]
    if not story.combine:
        return ["combine (fa2_combine.cu): none of the lane's rows is below the launch's "
                f"{story.launch['seqlen_q']} rows"]
    lines = ["combine (fa2_combine.cu) of the lane's rows, from the run's workspace: m = max_s lse_s, "
             "w_s = ex2.approx((lse_s - m) log2 e), l = sum_s w_s, O = sum_s w_s O_s / l"]
    for c in story.combine:
        lines.append(f"  {c.name}: split LSEs {', '.join(map(_fmt, c.lse))}; m {_fmt(c.m)}; weights "
                     f"{', '.join(map(_fmt, c.weights))}; l {_fmt(c.l)}; LSE {_fmt(c.lse_final)}")
        lines += [f"    O({c.row},{col}): splits {', '.join(map(_fmt, parts))} -> O {_fmt(o)}" for col, parts, o in c.cols]
    return lines


def story_json(story: LaneStory) -> dict:
    return {"cta": story.cta, "warp": story.warp, "lane": story.lane, "round": story.round,
            "m_block": story.m_block, "bh": story.bh, "launch": story.launch,
            **({} if "cu_seqlens_q" not in story.launch else {"packed": packed_header(story.launch, story.cta)}),
            **({} if "splits" not in story.launch else {"split": split_header(story.launch, story.cta)}),
            "steps": [{"seq": s.seq, "instr": s.instr, "pc": s.pc, "op": s.op.value, "phase": s.phase,
                       "round": s.round, "label": s.label, "ptx": s.ptx, "src": s.src, "regs": s.regs,
                       "touch": s.touch, "detail": s.detail,
                       "matrix": s.matrix, "values": list(s.values), "coords": [list(c) for c in s.coords],
                       "partner": s.partner, "sent": list(s.sent)}
                      for s in story.steps],
            "partners": story.partners,
            "kept_keys": {str(q): k for q, k in story.kept_keys().items()},
            "state": {k: [{"row": sl.row, "col": sl.col, "value": json_number(sl.value)} for sl in v]
                      for k, v in story.state.items()},
            **({} if story.coordinates is None else {"coordinates": story.coordinates}),
            **({} if "splits" not in story.launch else {"combine": None if story.combine is None else [
                {"row": c.row, "name": c.name, "lse": [json_number(x) for x in c.lse], "m": json_number(c.m),
                 "weights": [json_number(x) for x in c.weights], "l": json_number(c.l),
                 "lse_final": json_number(c.lse_final),
                 "cols": [{"col": col, "splits": [json_number(x) for x in parts], "o": json_number(o)}
                          for col, parts, o in c.cols]} for c in story.combine]})}
