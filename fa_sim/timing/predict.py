"""Predicted kernel time of one launch on a GPU model, from the cubin, without a GPU.

How (what `fa time --help` says too):
1. The cubin NVRTC builds for the GPU's arch, disassembled with its control bits
   (fa_sim.timing.sass) and cut into the paths a warp can take (fa_sim.timing.paths): prologue,
   one K/V round and epilogue; which path each region of a CTA takes (first, steady, masked, last
   round) comes from the functional run of a representative CTA on the PTX engine
   (fa_sim.timing.stream); every warp of a CTA takes its CTA's path.
2. Shared-memory cost per instruction class from the bank model on a one-CTA simulation
   (LDSM, LDS, STS: the exact wavefronts; LDGSTS: one per 128 bytes written, and the source
   sectors fetched once per destination sector they feed: CopyPieces).
3. Occupancy: resident CTAs per SM from the cubin's registers, shared memory and threads.
4. One SM, cycle by cycle (fa_sim.timing.sm), with j identical CTAs resident (j = 1, the
   occupancy, and half of it from 4 on; linear in between), started about a j-th of a round apart
   (a running grid's CTAs are at spread-out points of their rounds; averaged over PHASES offsets,
   as the CTAs' relative phases in a running grid are spread too): the cycles of a steady round
   c_j and the fixed cost o_j of a CTA when j share the SM, each j under the copy latency of
   its load (it rises with the share of the SM's CTA slots filled); the first wave's fixed cost from j
   CTAs started together; a masked round's time over a plain one's. This is the
   representative-CTA approximation: CTAs are not all timed.
5. The GPU: the grid's CTAs in launch order (heavy_first: longest first) dispatched to the SMs'
   free slots (SMs freeing slots together are refilled one CTA each in turn); each SM runs its
   resident CTAs at the rate of its occupancy; the last CTA's end, at the GPU's effective clock,
   plus the launch overhead (a fixed latency and the first wave's share of the grid's start-up
   and drain: GpuModel.overhead_us), is the kernel time.
"""

from __future__ import annotations

import functools
import hashlib
import heapq
import json
import sys
from dataclasses import dataclass, field

import numpy as np

from ..config import KernelConfig
from ..contract import KERNEL_NAME, KernelBuild, kernel_source
from ..contract.cubins import compile_build
from ..contract.sass import disassemble
from ..problem import Problem
from .cost import Progress, timing_cost
from .gpus import GPUS, GpuModel, gpu_model
from .program import Step, step
from .sass import parse
from .sm import REASONS, SmRun, run_sm
from .stream import PLAIN, Features, KernelStream, StreamMismatch, probe_program, round_latch, same_structure
from .walk import PtxGraph, SassGraph, Walker, kernel_listing

STEADY_RUN = 8  # K/V rounds of the staggered CTAs timed per occupancy level
TOGETHER_RUN = 2  # K/V rounds of the CTAs started together (the first wave's fixed cost)
TIMELINE_ROUNDS = 4
PHASES = 3  # relative phases of the co-resident CTAs over which a steady round is averaged  # K/V rounds of the CTAs of `issue_timeline`


@dataclass(frozen=True)
class Prediction:
    kernel_ms: float
    tflops: float
    occupancy: int  # resident CTAs per SM
    limiter: str
    pipes: dict  # pipe -> utilisation of its peak (0..1) in the full-occupancy run
    issue_slots: float  # issued / (cycles x 4 sub-partitions)
    achieved_occupancy: float  # resident warps / the SM's 64
    stalls: dict  # Nsight Compute reason -> warp-cycles per issued instruction
    cycles_per_round: tuple  # c_j, j = 1..occupancy
    instructions: int  # warp instructions the grid issues (Nsight Compute: smsp__inst_executed.sum)
    notes: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"kernel_ms": self.kernel_ms, "tflops": self.tflops, "occupancy": self.occupancy,
                "limiter": self.limiter, "pipes": self.pipes, "issue_slots": self.issue_slots,
                "achieved_occupancy": self.achieved_occupancy, "stalls": self.stalls,
                "cycles_per_round": list(self.cycles_per_round), "instructions": self.instructions, **self.notes}


@dataclass(frozen=True)
class KernelModel:
    """The static part of a prediction: one compiled kernel, its paths and costs."""

    config: KernelConfig
    causal: bool
    sass: SassGraph  # the kernel's SASS blocks
    controls: dict  # address -> Control
    registers: int
    wavefronts: dict  # shared-memory class -> average wavefronts per warp instruction
    stream: KernelStream  # per warp, the SASS walk of each region, from the functional run
    fingerprint: str = ""  # sha256 of the SASS listing the model was built from (the rates' disk cache key)
    memory: dict = field(default_factory=dict)  # global class -> MemoryCounts of the one-CTA run (sectors, lines)
    stack_bytes: int = 0  # local memory per thread (spills, local arrays), from the cubin
    static_smem: int = 0  # shared bytes of the kernel's own __shared__ variables, before the dynamic ones

    @property
    def cta_smem(self) -> int:
        """Shared memory per CTA: the static variables (an edit's `__shared__ int flag`) and the config's."""
        return self.static_smem + self.config.smem_bytes
    _steps: dict = field(default_factory=dict, compare=False, repr=False)  # gpu -> address -> Step

    def steps(self, instrs, gpu: GpuModel) -> list[Step]:
        """Each instruction as the SM model's Step; one Step per address and GPU, built once (a walk
        of 8 rounds repeats every loop instruction 8 times per warp)."""
        memo = self._steps.setdefault(gpu, {})
        out = []
        for i in instrs:
            hit = memo.get(i.addr)
            if hit is None:
                hit = memo[i.addr] = step(i.opcode, i.operands, i.guard, self.controls[i.addr], gpu,
                                          self.wavefronts, self.memory)
            out.append(hit)
        return out

    def warp_walks(self, rounds: int, masked: int = 0, tail: bool = False, qtail: bool = False) -> list[list]:
        """Per warp of one CTA, its instructions for `rounds` K/V rounds, the last `masked` of them
        masked (`tail`: its keys end in a partial block; `qtail`: its queries do)."""
        return [[i for part in warp for i in part] for warp in self.stream.parts(rounds, masked, tail, qtail)]

    def cta_walk(self, rounds: int, masked: int = 0, tail: bool = False, qtail: bool = False, warp: int = 0) -> list:
        """One warp's instructions (warp 0: the one whose round starts `round_starts` gives)."""
        return self.warp_walks(rounds, masked, tail, qtail)[warp]

    def walk_length(self, rounds: int, masked: int = 0, tail: bool = False, qtail: bool = False) -> int:
        """The warp instructions of one CTA of this class, all its warps, without building the lists
        (a walk of 2^25 rounds is 10^10 entries)."""
        blocks = self.sass.blocks
        return sum(len(blocks[b].instrs) for warp in self.stream.warp_walks(rounds, masked, tail, qtail)
                   for region in warp for b in region)

    def round_starts(self, rounds: int, masked: int = 0) -> list[int]:
        """Index in warp 0's walk of each round's first instruction."""
        sizes = [len(p) for p in self.stream.parts(rounds, masked)[0]]
        return [sum(sizes[: t + 1]) for t in range(rounds)]

    def cta_stream(self, rounds: int, gpu: GpuModel, masked: int = 0, tail: bool = False,
                   qtail: bool = False) -> list[list[Step]]:
        """Per warp, its Steps (what fa_sim.timing.sm.run_sm takes for one CTA)."""
        return [self.steps(w, gpu) for w in self.warp_walks(rounds, masked, tail, qtail)]


def occupancy(model: KernelModel, gpu: GpuModel) -> int:
    cfg = model.config
    regs_per_warp = -(-model.registers * 32 // 256) * 256  # allocated per warp in units of 256
    by_regs = gpu.regs_per_sm // (regs_per_warp * cfg.n_warps)
    by_smem = gpu.smem_per_sm // (model.cta_smem + gpu.smem_reserved)
    by_threads = gpu.threads_per_sm // cfg.n_threads
    return max(0, min(by_regs, by_smem, by_threads, gpu.ctas_per_sm))


@dataclass(frozen=True)
class Rates:
    per_round: tuple  # c_j for j = 1..k
    fixed: tuple  # o_j
    first_fixed: tuple  # o_j of the first wave's CTAs, which start together
    masked: float  # a masked round's cycles over a plain one's, less 1 (full occupancy)
    run: SmRun  # the longer full-occupancy run (for utilisation and stalls)
    runs: dict = field(default_factory=dict)  # j -> the accounted steady run with j CTAs resident (timed levels)


def sm_rates(model: KernelModel, gpu: GpuModel, k: int, account: bool = True) -> Rates:
    """c_j and o_j for j = 1..k: timed at j = 1, k (and k // 2 from k = 4), linear in j between;
    each j under the copy latency of its load (GpuModel.loaded).

    Co-resident CTAs start staggered, one j-th of a round's instructions apart: in a running grid
    an SM's CTAs started whenever a slot freed, so they are at spread-out points of their rounds,
    not in lockstep (lockstep CTAs all want the shared-memory pipe, then all the tensor pipe, at
    once). c_j is the mean time of a steady round (from round 1 to the first round that prefetches
    nothing), o_j the rest of a CTA's start-to-end time; both are means over PHASES relative phases
    of the CTAs (one fixed offset locks a deterministic model into one phase relation, which alone
    moved c_j by up to 10 %)."""
    short = model.cta_stream(TOGETHER_RUN, gpu)
    timed, run, runs = {}, None, {}
    for j in sorted({1, k} | ({k // 2} if k >= 4 else set())):
        at_load = sm_gpu(model, gpu, j, k)
        c, life, run = _steady(model, at_load, j, 0, account)
        runs[j] = run  # each level accounted: a launch's limiter and stalls weigh them by its residency (_report)
        together = run_sm([short] * j, model.config.n_warps, at_load, account=False)
        timed[j] = (c, max(0.0, life - STEADY_RUN * c), max(0.0, _life(together) - TOGETHER_RUN * c))
    levels = sorted(timed)
    per, fixed, first_fixed = (np.interp(range(1, k + 1), levels, [timed[j][i] for j in levels]) for i in range(3))
    masked = _steady(model, sm_gpu(model, gpu, k, k), k, STEADY_RUN, False)[0] / timed[k][0] - 1
    return Rates(tuple(per.tolist()), tuple(fixed.tolist()), tuple(first_fixed.tolist()), masked, run, runs)


def sm_gpu(model: KernelModel, gpu: GpuModel, j: int, k: int) -> GpuModel:
    """The parameters of an SM with j of its k CTA slots filled: the copy latency at that load
    (GpuModel.loaded) and the share of local-memory requests its L1 holds (GpuModel.with_local)."""
    cfg = model.config
    return gpu.loaded(j, k).with_local(model.stack_bytes, cfg.n_threads, model.cta_smem, j, k)


@functools.lru_cache(maxsize=256)
def _rates(config: KernelConfig, causal: bool, gpu: GpuModel, kernel, k: int, features: Features = PLAIN) -> Rates:
    """sm_rates of one kernel at occupancy k, cached in memory and on disk: they depend on the
    kernel (its features' build), the GPU and the occupancy, not on the shape (which only the dispatch sees), so a sweep
    over shapes or a ranking over lengths runs each config's SM once, and a second process none
    (`rates_key`: everything the SM runs read)."""
    from ..cache import cache_root, read_text_entry, store_atomic

    model = kernel_model(config, causal, gpu.arch, kernel, features)
    path = cache_root() / "timing-rates" / f"{rates_key(model, gpu, k)}.json"
    stored = read_text_entry(path)
    if stored is not None:
        try:
            return _rates_from_json(json.loads(stored))
        except (ValueError, TypeError, KeyError, AttributeError):
            pass  # damaged: run again
    rates = sm_rates(model, gpu, k)
    store_atomic(path, json.dumps(_rates_to_json(rates)).encode())
    return rates


def rates_key(model: KernelModel, gpu: GpuModel, k: int) -> str:
    """The disk-cache key of sm_rates(model, gpu, k): the SASS listing (instructions and control
    bits), the shared-memory wavefronts, every warp's walk the SM runs take (block starts), the GPU's
    parameters, the occupancy, the runs' lengths and phases, and the source of the timing package
    (a change to the SM model, the Steps or this module is a new key, never a stale entry)."""
    from ..cache import cache_key

    walks = [model.stream.warp_walks(STEADY_RUN, m) for m in (0, STEADY_RUN)] + \
        [model.stream.warp_walks(TOGETHER_RUN, 0)]
    return cache_key(v=1, sass=model.fingerprint, wavefronts=sorted(model.wavefronts.items()), gpu=repr(gpu), k=k,
                     memory=sorted((c, repr(m)) for c, m in model.memory.items()), stack=model.stack_bytes,
                     runs=(STEADY_RUN, TOGETHER_RUN, PHASES), code=_timing_source_digest(),
                     walks=hashlib.sha256(repr(walks).encode()).hexdigest())


@functools.cache
def _timing_source_digest() -> str:
    """sha256 over the source files of fa_sim.timing (the SM model and everything feeding it)."""
    from pathlib import Path

    h = hashlib.sha256()
    for f in sorted(Path(__file__).parent.glob("*.py")):
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def _run_to_json(run: SmRun) -> dict:
    return {"cycles": run.cycles, "done_at": run.done_at, "started_at": run.started_at,
            "marked": [list(m) for m in run.marked], "issued": run.issued, "busy": run.busy,
            "stalls": dict(run.stalls), "warp_cycles": run.warp_cycles}


def _run_from_json(run: dict) -> SmRun:
    from collections import Counter

    return SmRun(run["cycles"], list(run["done_at"]), list(run["started_at"]), [tuple(m) for m in run["marked"]],
                 run["issued"], dict(run["busy"]), Counter(run["stalls"]), run["warp_cycles"])


def _rates_to_json(r: Rates) -> dict:
    return {"per_round": list(r.per_round), "fixed": list(r.fixed), "first_fixed": list(r.first_fixed),
            "masked": r.masked, "run": _run_to_json(r.run),
            "runs": [[j, _run_to_json(run)] for j, run in sorted(r.runs.items())]}


def _rates_from_json(d: dict) -> Rates:
    return Rates(tuple(d["per_round"]), tuple(d["fixed"]), tuple(d["first_fixed"]), d["masked"],
                 _run_from_json(d["run"]), {int(j): _run_from_json(run) for j, run in d["runs"]})


def _steady(model: KernelModel, gpu: GpuModel, j: int, masked: int, account: bool) -> tuple[float, float, SmRun]:
    """Cycles of a steady round and a CTA's start-to-end time with j CTAs resident, staggered
    (`masked`: rounds masked), each the mean over PHASES relative phases of the co-resident CTAs,
    and the run of the middle phase (accounted if `account`)."""
    stream = model.cta_stream(STEADY_RUN, gpu, masked)
    starts = model.round_starts(STEADY_RUN, masked)
    first, last = 1, STEADY_RUN - model.config.kv_stages
    per_round = (starts[last] - starts[first]) / (last - first)
    rounds, lives, middle = [], [], None
    phases = PHASES if j > 1 else 1  # a lone CTA has no relative phase
    for p in range(phases):
        shift = (p + 0.5) / PHASES - 0.5  # CTA i starts (i + shift) / j of a round after the first
        stagger = [round((i + shift) * per_round / j) for i in range(1, j)]
        run = run_sm([stream] * j, model.config.n_warps, gpu, account=account and 2 * p + 1 == phases,
                     stagger=stagger, marks=(starts[first], starts[last]))
        rounds.append(float(np.mean([b - a for a, b in run.marked])) / (last - first))
        lives.append(_life(run))
        middle = run if 2 * p + 1 == phases or middle is None else middle
    return float(np.mean(rounds)), float(np.mean(lives)), middle


def _life(run: SmRun) -> float:
    """A CTA's mean start-to-end time."""
    return float(np.mean(np.subtract(run.done_at, run.started_at)))


def dispatch(prob: Problem, rates: Rates, sms: int, extra_rounds: np.ndarray,
             trace: list | None = None, progress: Progress | None = None,
             residency: np.ndarray | None = None) -> tuple[float, list[list[int]]]:
    """Makespan in cycles, and the Q blocks each SM ran in order: `schedule` of the CTAs' work in
    launch order, a CTA's work o_k/c_k + its rounds (Problem.n_rounds_of: a window's K/V tile range)
    + its masked rounds' extra (`cta_work`), an SM with j residents advancing each by 1/c_j rounds
    per cycle. `trace`, `progress`, `residency`: schedule's."""
    mb, rounds, fixed = cta_work(prob, rates, sms, extra_rounds)
    end, ran = schedule(rounds + fixed, sms, rates.per_round, trace, progress, residency)
    blocks = mb.tolist()
    return end, [[blocks[i] for i in mine] for mine in ran]


def schedule(work: np.ndarray, sms: int, per_round, trace: list | None = None, progress: Progress | None = None,
             residency: np.ndarray | None = None) -> tuple[float, list[list[int]]]:
    """The GPU's CTA dispatch as a list schedule (no SM model runs): makespan in cycles, and the
    launch indices of the CTAs each SM ran, in order. The CTAs (`work`, in launch order, in units
    of which an SM with j residents advances each by 1 / per_round[j - 1] per cycle: processor
    sharing; len(per_round) is the occupancy k) go in launch order to free SM slots: the first
    wave fills the k slots of every SM round-robin over the SMs, then each next CTA takes the slot
    that frees first, one SM after the other when several free slots at once (a tail spreads over
    the SMs, it does not fill the first SM's slots). The forward's `dispatch` and predict_launch's
    (fa_sim.timing.launch) both run it.
    `trace`: gets [CTA in launch order, SM, start cycle, end cycle] of every CTA (what
    experiments/timing_dispatch.py sets beside the GPU's); `progress`: told every PROGRESS_CTAS CTAs;
    `residency` (k + 1 zeros): gets the SM-cycles the SMs spent with j CTAs resident, j = 0 (idle,
    up to the makespan) .. k (what the launch's limiter and stalls are weighted by: `_report`)."""
    k = len(per_round)
    n = len(work)
    queue = list(zip(np.asarray(work, np.float64).tolist(), range(n)))[::-1]  # pop() takes the next CTA in launch order
    active: list[list[float]] = [[] for _ in range(sms)]
    ran: list[list[int]] = [[] for _ in range(sms)]  # launch indices, in the order each SM took them
    ids: list[list[int]] = [[] for _ in range(sms)]  # launch indices of `active`
    now = 0.0
    since = [0.0] * sms  # the cycle each SM's residency last changed

    def take(s: int) -> None:
        w, i = queue.pop()
        active[s].append(w)
        ran[s].append(i)
        ids[s].append(i)
        if trace is not None:
            trace.append([i, s, now, None])

    for _ in range(k):  # the first wave: slots filled round-robin over the SMs
        for s in range(sms):
            if queue:
                take(s)
    left, what = len(queue), f"dispatching {n:,} CTAs over {sms} SMs"
    if progress is not None:
        progress.step(what, 0, n)  # the step's clock starts
    heap = [(min(a) * per_round[len(a) - 1], s) for s, a in enumerate(active) if a]
    heapq.heapify(heap)
    end = 0.0
    while heap:
        t, s = heapq.heappop(heap)
        freed = [s]  # every SM whose CTA ends now (identical SMs end together)
        while heap and heap[0][0] <= t + 1e-9 * max(1.0, t):
            freed.append(heapq.heappop(heap)[1])
        now = t
        for s in freed:
            mine = active[s]
            if residency is not None:
                residency[len(mine)] += t - since[s]
                since[s] = t
            step_rounds = min(mine)
            if trace is not None:
                for i in (i for w, i in zip(mine, ids[s]) if w - step_rounds <= 1e-9):
                    trace[i][3] = t
            ids[s] = [i for w, i in zip(mine, ids[s]) if w - step_rounds > 1e-9]
            mine[:] = [w - step_rounds for w in mine if w - step_rounds > 1e-9]
        while queue and any(len(active[s]) < k for s in freed):  # refilled breadth-first, like the first wave
            for s in sorted(freed):
                if queue and len(active[s]) < k:
                    take(s)
        if progress is not None and len(queue) // PROGRESS_CTAS != left // PROGRESS_CTAS:
            left = len(queue)
            progress.step(what, n - left, n)
        end = max(end, t)
        for s in freed:
            if active[s]:
                heapq.heappush(heap, (t + min(active[s]) * per_round[len(active[s]) - 1], s))
    if residency is not None:
        residency[0] += sms * end - residency[1:].sum()
    return end, ran


def cta_work(prob: Problem, rates: Rates, sms: int, extra_rounds: np.ndarray) -> tuple:
    """Each CTA in launch order: (its Q block, its rounds with its masked rounds' extra, its fixed
    cost - start-up and epilogue, o/c - in rounds): the work `dispatch` gives it. The first wave's
    CTAs (j started together on each SM, CTA i on SM i % sms) take the fixed cost of CTAs started
    together at their j."""
    k = len(rates.per_round)
    mb = launch_order(prob)
    rounds = prob.n_rounds_of(mb).astype(float) + extra_rounds[mb]
    fixed = np.full(len(mb), rates.fixed[-1] / rates.per_round[-1])
    first = min(len(mb), k * sms)
    j = np.minimum(first // sms + (np.arange(first) % sms < first % sms), k) - 1
    fixed[:first] = np.array(rates.first_fixed)[j] / np.array(rates.per_round)[j]
    return mb, rounds, fixed


def launch_order(prob: Problem) -> np.ndarray:
    """The Q block of each CTA in launch order (blockIdx.x fastest; heavy_first with causal reverses
    the Q blocks, longest first)."""
    mb = np.arange(prob.n_ctas) % prob.n_m_blocks
    if prob.config.heavy_first and prob.causal:
        mb = prob.n_m_blocks - 1 - mb
    return mb


def exact_cycles(model: KernelModel, prob: Problem, gpu: GpuModel, k: int, ran: list[list[int]]) -> float:
    """Every CTA timed: each SM runs its CTAs (as `dispatch` assigned them), `k` resident at a time,
    cycle by cycle; the slowest SM's end. For shapes small enough (EXACT_MAX_CTA_ROUNDS)."""
    classes = cta_classes(prob)
    streams: dict = {}
    ends: dict = {}
    for mbs in ran:
        key = tuple(mbs)
        if key and key not in ends:
            for m in key:
                if classes[m] not in streams:
                    streams[classes[m]] = model.cta_stream(classes[m][0], gpu, *classes[m][1:])
            run = run_sm([streams[classes[m]] for m in key], model.config.n_warps, sm_gpu(model, gpu, min(len(key), k), k),
                         account=False, slots=k)
            ends[key] = run.cycles
    return max(ends.values())


PROGRESS_CTAS = 4096  # dispatch tells its progress every this many CTAs
EXACT_MAX_CTA_ROUNDS = 20000  # per SM-queue sum, above which exact=True is refused (minutes of CPU)


def predict_probed(prob: Problem, gpu: GpuModel | str = "h200", kernel=None, exact: bool = False,
                   ctas_per_sm: int | None = None, progress: bool | None = None) -> Prediction:
    """The kernel time of `prob` on `gpu` from the probes (fa_sim.timing.stream), or a StreamMismatch
    where they cannot follow the build (fa_sim.timing.predict, in launches.py, then times it as any
    launch); `exact`: time every CTA on its SM instead of the representative CTAs (small shapes only); `ctas_per_sm`: the occupancy forced below the kernel's
    own, as launching it with more dynamic shared memory than it uses does on the GPU
    (experiments/timing_occupancy.py; None: the kernel's own). Arguments are checked first: prob a
    Problem within the launch limits (fa_sim.validate.check_launch), gpu a GpuModel or a key of GPUS,
    kernel None or a variant's path (fa_sim.contract.kernel_source), exact a bool. Refused before any
    work when its cost (fa_sim.timing.cost) is past the limit or this machine's memory; `progress`
    None: the estimate and progress lines on stderr for a prediction estimated at
    fa_sim.simulate.PROGRESS_MIN_SECONDS or more; True: always; False: never."""
    from ..simulate import PROGRESS_MIN_SECONDS

    gpu = _checked(prob, gpu, kernel, exact)
    cost = timing_cost(prob)
    cost.check(f"batch={prob.batch}, heads={prob.heads}, seqlen_q={prob.seqlen_q}, seqlen_k={prob.seqlen_k}",
               "lower batch, heads or the sequence lengths")
    show = cost.seconds >= PROGRESS_MIN_SECONDS if progress is None else bool(progress)
    if show:
        print(f"fa_sim.timing: {cost.describe()}", file=sys.stderr, flush=True)
    meter = Progress(show)
    features = Features.of(prob)
    if exact and prob.has_window:
        raise ValueError("exact timing of a sliding window is not modelled (its CTAs' masked rounds sit at both ends "
                         "of the K/V loop); use the representative CTAs (exact=False)")
    model = kernel_model(prob.config, prob.causal, gpu.arch, kernel, features)
    model.stream.check_fixed(TOGETHER_RUN, STEADY_RUN)  # the runs the fixed costs come from (sm_rates)
    k = occupancy(model, gpu)
    if k < 1:
        raise ValueError(f"{prob.config.tag} does not fit on one SM of the {gpu.name}")
    if ctas_per_sm is not None:
        if isinstance(ctas_per_sm, bool) or not isinstance(ctas_per_sm, (int, np.integer)) or not 1 <= ctas_per_sm <= k:
            raise ValueError(f"ctas_per_sm must be an integer from 1 to {k} ({prob.config.tag}'s own occupancy on "
                             f"the {gpu.name}), got {ctas_per_sm!r}")
        k = int(ctas_per_sm)
    rates = _rates(prob.config, prob.causal, gpu, kernel, k, features)
    extra = masked_extra(rates, prob)
    residency = np.zeros(k + 1)
    cycles, ran = dispatch(prob, rates, gpu.sms, extra, progress=meter, residency=residency)
    if exact:
        work = max(sum(prob.n_rounds_of(np.array(m)).tolist()) for m in ran if m)
        if work > EXACT_MAX_CTA_ROUNDS:
            raise ValueError(f"exact timing runs every CTA cycle by cycle: an SM here has {work:,} CTA-rounds, "
                             f"more than {EXACT_MAX_CTA_ROUNDS:,}; use the representative CTAs (exact=False)")
        cycles = exact_cycles(model, prob, gpu, k, ran)
    overhead_ms = gpu.overhead_us(prob.n_ctas, k) / 1e3
    ms = cycles / (gpu.clock_ghz * 1e6) + overhead_ms
    _, rounds, fixed = cta_work(prob, rates, gpu.sms, extra)
    shape = LaunchShape(residency / residency.sum(), float(fixed.sum() / (rounds.sum() + fixed.sum())),
                        overhead_ms / ms, gpu.sms)
    return _report(prob, model, gpu, k, rates, ms, grid_instructions(model, prob, meter), shape)


def _checked(prob, gpu, kernel, exact=False) -> GpuModel:
    """predict's and issue_timeline's arguments, one ValueError line each before any compile."""
    from ..validate import check_launch

    if not isinstance(prob, Problem):
        raise ValueError(f"prob must be a fa_sim.Problem (or use fa_sim.predict_time), got {type(prob).__name__}")
    check_launch(prob)
    if not isinstance(exact, (bool, np.bool_)):
        raise ValueError(f"exact must be True or False, got {exact!r:.60}")
    if kernel is not None:
        kernel_source(kernel, option="kernel=")
    return gpu_model(gpu)


def grid_instructions(model: KernelModel, prob: Problem, progress: Progress | None = None) -> int:
    """Warp instructions of the whole grid: each CTA's warps' paths (its rounds, its masked rounds).
    With a window, a CTA's masked rounds sit at both ends of its loop: its count is its plain path's
    plus, per masked round, a masked round's extra instructions (the all-masked steady run's over
    the plain one's)."""
    classes = cta_classes(prob)
    if prob.has_window:
        per_masked = (model.walk_length(STEADY_RUN, STEADY_RUN) - model.walk_length(STEADY_RUN)) / STEADY_RUN
        classes = [(r, 0, t, q) for r, _, t, q in classes]
        extra = round(per_masked * float(_masked_rounds(prob).sum()))
    else:
        extra = 0
    distinct = sorted(set(classes))
    per = {}
    for i, c in enumerate(distinct):
        if progress is not None:
            progress.step(f"walking the paths of {len(distinct):,} CTA classes", i, len(distinct))
        per[c] = model.walk_length(*c)
    return (sum(per[c] for c in classes) + extra) * prob.batch * prob.heads


def cta_classes(prob: Problem) -> list[tuple[int, int, bool, bool]]:
    """(rounds, masked rounds, keys ending in a tail block, queries ending in a tail block) of each
    Q block: its path class."""
    mbs = np.arange(prob.n_m_blocks)
    tail = (prob.n_block_max(mbs) * prob.config.block_n > prob.seqlen_k).tolist()
    qtail = ((mbs + 1) * prob.config.block_m > prob.seqlen_q).tolist()
    return list(zip(prob.n_rounds_of(mbs).tolist(), _masked_rounds(prob).tolist(), tail, qtail))


def _masked_rounds(prob: Problem) -> np.ndarray:
    """Masked rounds per Q block: the causal diagonal's, else a key tail's last round; with a window,
    the kernel's rule (fa2_fwd.cu: a K/V block is masked when it holds a key past N_k, after the Q
    block's first query (causal) or outside some query's window, `window_masked_rounds`)."""
    cfg = prob.config
    if prob.has_window:
        return window_masked_rounds(prob)
    rounds = prob.n_block_max(np.arange(prob.n_m_blocks))
    if prob.causal:
        return np.minimum(-(-cfg.block_m // cfg.block_n), rounds)
    return np.minimum(rounds, int(prob.seqlen_k % cfg.block_n != 0))


def window_masked_rounds(prob: Problem) -> np.ndarray:
    """Masked K/V rounds of each Q block m by fa2_fwd.cu's rule, in closed form: among its blocks
    n_block_min .. n_block_max - 1 (keys key0 = n block_n ..), block n is masked iff
    key0 + block_n > N_k, or causal and key0 + block_n - 1 > row0, or key0 + block_n - 1 > row0 + right,
    or key0 < row0 + block_m - 1 - left (row0 = m block_m). The right-hand conditions hold from a
    block on, the left one up to a block: two ranges at the ends of the loop."""
    bm, bn = prob.config.block_m, prob.config.block_n
    m = np.arange(prob.n_m_blocks, dtype=np.int64)
    lo, hi = prob.n_block_min(m), prob.n_block_max(m)
    row0 = m * bm
    right = np.full_like(m, (prob.seqlen_k - bn) // bn + 1)  # the first n with key0 + bn > Nk
    if prob.causal:  # first n with n bn + bn - 1 > row0
        right = np.minimum(right, (row0 - bn + 1) // bn + 1)
    if prob.window_right >= 0:
        right = np.minimum(right, (row0 + prob.window_right - bn + 1) // bn + 1)
    right = np.clip(right, lo, hi)
    if prob.window_left >= 0:  # blocks n with n bn < row0 + bm - 1 - left: n < ceil((row0 + bm - 1 - left) / bn)
        left = np.clip(-(-(row0 + bm - 1 - prob.window_left) // bn), lo, right)
    else:
        left = lo
    return (left - lo) + (hi - right)


def issue_timeline(prob: Problem, gpu: GpuModel | str = "h200", kernel=None, rounds: int = TIMELINE_ROUNDS) -> dict:
    """Chrome trace-event JSON (Perfetto, chrome://tracing) of one SM with its resident CTAs running
    `rounds` K/V rounds each: one process per sub-partition, one track per warp, every issued
    instruction a slice from its issue cycle (ts, in cycles) for its stall count."""
    gpu = _checked(prob, gpu, kernel)
    model = kernel_model(prob.config, prob.causal, gpu.arch, kernel, Features.of(prob))
    k = occupancy(model, gpu)
    issued: list = []
    run = run_sm([model.cta_stream(rounds, gpu)] * k, prob.config.n_warps, gpu, account=False, timeline=issued)
    tracks = sorted({(smsp, cta, warp) for _, cta, warp, smsp, _, _ in issued})
    events = [{"ph": "M", "name": "process_name", "pid": smsp, "args": {"name": f"sub-partition {smsp}"}}
              for smsp in sorted({t[0] for t in tracks})]
    events += [{"ph": "M", "name": "thread_name", "pid": smsp, "tid": cta * 64 + warp,
                "args": {"name": f"CTA {cta} warp {warp}"}} for smsp, cta, warp in tracks]
    events += [{"name": name, "ph": "X", "ts": t, "dur": max(1, stall), "pid": smsp, "tid": cta * 64 + warp}
               for t, cta, warp, smsp, name, stall in issued]
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"config": prob.config.tag, "gpu": gpu.name, "ctas": k, "rounds": rounds,
                          "cycles": run.cycles, "unit": "ts and dur are SM cycles"}}


def masked_extra(rates: Rates, prob: Problem) -> np.ndarray:
    """Extra rounds' worth of cycles per Q block for its masked rounds (causal diagonal, a key tail):
    a masked round's time over a plain one's, timed at full occupancy (the masking's ALU work
    overlaps the other warps' as the rest of the round does)."""
    return _masked_rounds(prob) * rates.masked


@dataclass(frozen=True)
class LaunchShape:
    """What the launch being timed does with the SMs, beside the SM model's runs (`_report`)."""

    residency: np.ndarray  # share of SM-time (all SMs, up to the makespan) with j CTAs resident, j = 0..k
    fixed_share: float  # the CTAs' start-up and epilogue (o / c) over all their work (dispatch units)
    overhead_share: float  # the launch overhead (GpuModel.overhead_us) over the predicted time
    sms: int

    @property
    def busy(self) -> float:
        """Share of SM-time with a CTA resident."""
        return float(self.residency[1:].sum())

    @property
    def resident(self) -> float:
        """Mean CTAs resident on an SM while it has one."""
        return float(np.arange(len(self.residency)) @ self.residency / self.busy) if self.busy else 0.0


LAUNCH_BOUND = 0.5  # the launch overhead's share of the time from which a launch is called launch bound
FIXED_BOUND = 0.5  # the CTAs' start-up and epilogue's share of their work from which it is called so
IDLE_NOTED = 0.1  # the share of SM-time without a CTA from which the limiter line names it


def _mix(rates: Rates, weights: np.ndarray) -> tuple[float, dict, dict, float, dict]:
    """(issue slots, pipe utilisations, stalls per issued instruction, achieved occupancy, level
    weights) of the SM runs at the timed occupancy levels, each level weighted by the SM-time the
    launch spends at the residencies nearest it (`weights[j]`, j = 1..k; a level's run is a steady
    one, per cycle)."""
    runs = rates.runs or {len(rates.per_round): rates.run}
    levels = sorted(runs)
    at = {L: 0.0 for L in levels}
    for j in range(1, len(weights)):
        if weights[j] > 0:
            at[min(levels, key=lambda L: (abs(L - j), -L))] += float(weights[j])
    total = sum(at.values()) or 1.0
    if not any(at.values()):
        at[levels[-1]] = total = 1.0
    share = {L: w / total for L, w in at.items() if w}

    def per_cycle(f):
        return sum(w * f(runs[L]) / runs[L].cycles for L, w in share.items())

    issued = per_cycle(lambda r: r.issued)
    names = sorted({n for L in share for n in runs[L].busy})  # sorted: a set's order follows the hash seed
    pipes = {n.lower(): min(1.0, per_cycle(lambda r: r.busy.get(n, 0)) / (1 if n == "SMEM" else 4)) for n in names}
    stalls = {r: per_cycle(lambda run: run.stalls.get(r, 0)) / issued for r in REASONS}
    return (issued / 4, pipes, {r: v for r, v in stalls.items() if v}, per_cycle(lambda r: r.warp_cycles) / 64,
            share)


def _report(prob, model, gpu, k, rates: Rates, ms: float, instructions: int, shape: LaunchShape | None = None) -> Prediction:
    """The prediction with the launch's limiter and stalls: the SM runs at each timed occupancy,
    weighted by the SM-time this launch spends at each residency (a lone CTA: the one-CTA run; a
    full grid: mostly the full-occupancy run; a causal grid's tail: the lower levels too), and the
    limiter named from those numbers and the launch's shape: launch bound where the launch
    overhead is half the time or more, start-up/epilogue bound where the CTAs' fixed cost is half
    their work or more, else issue bound (issue slots over 80 %), shared-memory bound (the smem
    pipe first and over 60 %) or latency bound."""
    if shape is None:
        shape = LaunchShape(np.eye(k + 1)[k], 0.0, 0.0, gpu.sms)
    issue, pipes, stalls, occ, share = _mix(rates, shape.residency)
    top = sorted(((v, n) for n, v in pipes.items() if n in ("tensor", "smem", "fma", "alu", "xu")), reverse=True)
    if shape.overhead_share >= LAUNCH_BOUND:
        kind = "launch bound"
    elif shape.fixed_share >= FIXED_BOUND:
        kind = "start-up/epilogue bound"
    elif issue > 0.8:
        kind = "issue bound"
    elif top and top[0][1] == "smem" and top[0][0] > 0.6:
        kind = "shared-memory bound"
    else:
        kind = "latency bound"
    idle = 1 - shape.busy
    why = {"launch bound": f"launch overhead {shape.overhead_share:.0%} of the time; ",
           "start-up/epilogue bound": f"the CTAs' start-up and epilogue {shape.fixed_share:.0%} of their work; "}
    if f"{shape.resident:.1f}" == "1.0":
        where = f"; one CTA per busy SM ({model.config.n_warps} warps of 64)"
    elif shape.resident < k - 0.25:  # a full grid's tail moves it a little below k
        where = f"; {shape.resident:.1f} of {k} CTAs per busy SM"
    else:
        where = ""
    if idle >= IDLE_NOTED:
        where += (f"; SMs idle {idle:.0%} of the time ("
                  + (f"{prob.n_ctas} CTA{'s' if prob.n_ctas > 1 else ''} for {shape.sms} SMs)" if prob.n_ctas < shape.sms else "the last wave's tail)"))
    limiter = (f"{kind}: {why.get(kind, '')}issue slots {issue:.0%}, "
               + ", ".join(f"{n} pipe {v:.0%}" for v, n in top[:2]) + where)
    launch = (f"{shape.resident:.1f} of {k} CTAs resident per busy SM ({shape.resident * model.config.n_warps:.0f} "
              f"warps of 64), SMs idle {idle:.0%} of the time, CTA start-up/epilogue {shape.fixed_share:.0%} of "
              f"the work, launch overhead {shape.overhead_share:.0%} of the time")
    return Prediction(kernel_ms=ms, tflops=prob.flops / (ms * 1e-3) / 1e12, occupancy=k, limiter=limiter,
                      pipes=pipes, issue_slots=issue, achieved_occupancy=occ,
                      stalls=stalls, cycles_per_round=rates.per_round, instructions=instructions,
                      notes={"gpu": gpu.name, "launch": launch, "limiter_kind": kind, "resident_ctas": shape.resident,
                             "idle_sms": idle, "fixed_share": shape.fixed_share,
                             "overhead_share": shape.overhead_share,
                             "level_weights": {str(L): w for L, w in sorted(share.items())}})


@functools.lru_cache(maxsize=256)
def kernel_model(config: KernelConfig, causal: bool, arch: str, kernel=None, features: Features = PLAIN) -> KernelModel:
    """Compile, disassemble, tie the SASS to the PTX the engine runs, cost the shared-memory
    classes (cached). `features`: issue 38's (GQA, window, softcap) compiled in, as the launch's
    build has them (bf16 is config.dtype); the probes run that build (a window: its wide twin,
    fa_sim.timing.stream)."""
    from ..ptx.fa2 import _program

    # -lineinfo: the same code, with each instruction's source location (what ties it to the PTX)
    ck = compile_build(KernelBuild(config, causal, arch, False, kernel_source(kernel), lineinfo=True,
                                   kv_group=features.kv_group, window=features.window, softcap=features.softcap))
    text = disassemble(ck.cubin, encodings=True, inlined=True)
    controls = {i.addr: i.control for i in parse(kernel_listing(text, KERNEL_NAME))}
    program = _program(kernel_source(kernel), config, bool(causal), False, features.kv_group, features.window,
                       features.softcap)
    if program.loop is None:
        raise StreamMismatch(f"{config.tag}: the kernel has no loop the rounds could be counted by")
    if features.window != features.probe_window and not same_structure(program, probe_program(config, causal, kernel,
                                                                                               features)):
        raise StreamMismatch(f"{config.tag}: window {features.window} compiles to other PTX than its wide twin "
                             f"{features.probe_window} (not only other constants), so the probes cannot run it")
    graph = SassGraph(text, KERNEL_NAME)
    walker = Walker(graph, PtxGraph(program.kernel))
    return KernelModel(config, causal, graph, controls, ck.usage.registers, bank_wavefronts(config, kernel),
                       KernelStream(config, causal, kernel, graph, walker, round_latch(program.kernel), features),
                       hashlib.sha256(text.encode()).hexdigest(), memory=global_sectors(config, kernel),
                       stack_bytes=ck.usage.stack_bytes, static_smem=program.dynamic_smem_offset)


def bank_wavefronts(config: KernelConfig, kernel=None) -> dict:
    """Average shared-memory wavefronts per warp instruction of each class, from a one-CTA run of
    the kernel (a --kernel variant runs on the PTX engine: its own layout's conflicts)."""
    return _one_cta_counts(config, kernel)[0]


def global_sectors(config: KernelConfig, kernel=None) -> dict:
    """The global-memory requests of each class (LDGSTS, LDG, STG) of the same one-CTA run, with
    the sectors and lines they touched (fa_sim.observers.sectors.MemoryCounts): how well the
    kernel's copies coalesce (a `--kernel` variant's own)."""
    return _one_cta_counts(config, kernel)[1]


@functools.lru_cache(maxsize=256)
def _one_cta_counts(config: KernelConfig, kernel=None) -> tuple[dict, dict]:
    from ..observers.banks import BankCounter
    from ..observers.sectors import SectorCounter
    from ..simulate import simulate

    from .stream import probe_inputs

    # the config's dtype: a bf16 config reads bf16 inputs (their bit patterns, as the GPU's). GQA, a
    # window and softcap change no shared-memory access (the same tiles at the same addresses per
    # round), so the plain build of the config is counted
    prob = Problem(1, 1, config.block_m, 3 * config.block_n, False, 1.0 / np.sqrt(config.head_dim), config)
    q, k, v = probe_inputs(prob, bits=False)
    counter, sectors, pieces = BankCounter(), SectorCounter(), CopyPieces()
    simulate(q, k, v, config=config, observers=[counter, sectors, pieces], progress=False, kernel=kernel,
             dtype=config.dtype)
    # LDGSTS: its shared-memory writes take the pipe at the ideal rate (one wavefront per 128 bytes);
    # the excess Nsight Compute counts for it (observers.banks.ldgsts_wavefronts) is not pipe time
    # (the padded layout's 10.5-15 per copy would make it 1.5-2.5x slower than measured; the H100's
    # data-pipe counter shows none of it). What the padded rows do cost, the source sectors fetched
    # once per destination sector they feed: CopyPieces
    return ({cls.value: (c.ideal if cls.value == "LDGSTS" else c.wavefronts) / c.instructions
             for cls, c in counter.report().by_class().items() if c.instructions}, pieces.charge(sectors.report()))


class CopyPieces:
    """Observer: the source sectors the L1 fetches for each cp.async warp instruction, one per
    (source sector, destination sector) pair its fetched lanes join (a lane's 4-16 aligned bytes
    lie in one sector of each side). Rows whose shared-memory start is 16 bytes off their source
    sectors (the padded layout's odd rows) pair each source sector with two destination sectors:
    twice the sectors of rows that keep them whole (plain, swizzled), 1.5x over a padded tile.

    Why (issue 35 item 4; experiments/timing_padded_swizzled.md): Nsight Compute on the H100
    (tests/data/h100/ncu_layouts_edits.json, m64n64d64w4 at (4, 16, 2048, 64)) counts 51.1 M
    sectors sent to the L2 (`lts__t_sectors_srcunit_tex`) by the padded layout against 30.8 M by
    the swizzled one (the same global addresses), while the shared-memory data pipe's wavefronts
    are the same (41.9 M both: the copies' excess wavefronts of `ldgsts_wavefronts` are not data-pipe
    time, as `_one_cta_counts` says). The model charges each extra sector as what it is, one more
    request: its 32 bytes on the SM's share of L2 bandwidth (Step.bytes) and a quarter of a 128-byte
    line's wavefront of the L1 at issue (Step.tag_wavefronts, the rule for lines an uncoalesced
    request touches beyond its bytes, in sectors)."""

    def __init__(self) -> None:
        self.fetches = 0
        self.sectors = 0

    def wants(self, op, phase: str, round: int) -> bool:
        from ..events import Op

        return op is Op.LDGSTS

    def on_launch(self, launch) -> None:
        self.__init__()

    def on_instr(self, event) -> None:
        from ..events import Op
        from ..observers.sectors import distinct_keys

        if event.op is not Op.LDGSTS or event.gmem is None or event.smem is None:
            return
        src = np.asarray(event.gmem.addr, np.int64) // 32
        dst = np.asarray(event.smem.addr, np.int64) // 32
        mask = (np.asarray(event.smem.mask, bool) & np.asarray(event.active, bool)[None]
                & np.asarray(event.gmem.mask, bool))
        self.fetches += int(distinct_keys((src << 16) | dst, mask).sum())  # shared memory: < 2**21 bytes
        self.sectors += int(distinct_keys(src, mask).sum())

    def charge(self, memory: dict) -> dict:
        """The run's global counts with each cp.async request's sectors scaled by its fetches over
        its distinct source sectors."""
        import dataclasses

        from ..observers.sectors import LINE, SECTOR

        c = memory.get("LDGSTS")
        if c is None or not self.sectors:
            return memory
        extra = c.sectors * (self.fetches / self.sectors - 1)
        return {**memory, "LDGSTS": dataclasses.replace(c, sectors=round(c.sectors + extra),
                                                          lines=round(c.lines + extra * SECTOR / LINE))}

