"""One SM, cycle by cycle: four sub-partitions issuing the warps' SASS streams under ptxas's
control bits. With `steady`, a loop's identical iterations are not simulated one by one once the
SM repeats the same period: the periods are skipped and their cycles and counts added (_Steady
states the rule).

The model (parameters: fa_sim.timing.gpus):
- Warps are spread over the four sub-partitions (SMSPs) by their index in the SM (w mod 4); each
  SMSP issues at most one instruction per cycle, greedy-then-oldest: the warp that issued last
  keeps issuing while it can, unless that instruction carries ptxas's yield hint (its control
  bit 109 clear: maxas's decoder prints `Y` then; ptxas sets it on one instruction in six or
  seven of the kernel's round, and on its stall counts above 11), else the oldest eligible warp. Measured on the H200
  (fa_sim.calibrate.timing_microbench's POLICY probes, tests/test_timing_model.py): warps that can
  each issue every cycle run one at a time (the first of k finishes after one warp's block, the
  last after k), latency-bound ones interleave. The SMSPs take their turn at the
  SM's shared queues (the shared-memory pipe, the L2 bandwidth) in an order that rotates every
  cycle: a fixed order would starve the last SMSP's warps and hold their CTAs' barriers.
  With `GpuModel.issue_in_turn` (off in the shipped models: it worsens the option signs; docs/timing.md,
  "Features", softcap): greedy-then-in-turn, a cycle in which the SMSP issues nothing ends the greedy
  claim and the next pick is the first eligible warp after the SMSP's last pick (its warps in a ring),
  not the oldest; and the SM's shared queues take the SMSPs in turn from the one after the last MIO
  issuer. On the H100 four warps bound by one SMSP's XU each take nearly the whole benchmark
  (oldest-first finishes the oldest after a quarter of it), and the softcap's tanh beside HMMAs
  (tanh_hmma_16w) takes 5996 cycles where oldest-first, its warps drifting apart, overlaps the XU and
  the tensor pipe into 5104 (in turn: 5740); the turn with the cycle number meets the XU's 8-cycle
  period always at the same phase and starves one SMSP of the shared-memory pipe in ex2_ldsm_16w.
- A warp may issue when the stall count of its previous instruction has elapsed, every scoreboard
  in the instruction's wait mask is zero (DEPBAR.LE SB0, n: at most n cp.async groups in flight),
  its pipe in the SMSP is free, it is not waiting at a barrier, and, for MIO instructions, the
  SM's shared-memory pipe has at most `mio_queue` cycles of work queued.
- Issuing sets the write / read scoreboard; it is released after the instruction's latency: MIO
  instructions first wait their turn in the SM's shared-memory pipe, which drains
  `smem_wavefronts_per_cycle` wavefronts per cycle (the bank model's exact count per instruction);
  LDGSTS copies queue on the SM's share of L2 bandwidth and arrive `global_latency` later (the
  caller passes the latency at the SM's load: GpuModel.loaded), when
  their shared-memory writes take the shared-memory pipe; a cp.async group (LDGDEPBAR's
  scoreboard) is released when its last copy arrived. A global request's bytes are the sectors
  it touches (Step.bytes); one that touches more 128-byte lines than its bytes packed takes the
  extra lines through the shared-memory pipe at issue (a wavefront of the L1 each).
  Local memory (LDL, STL) takes the shared-memory pipe as the L1 it goes through; a store's bytes
  (write-through) and the share `1 - local_hit` of a load's the L1 does not hold (GpuModel.with_local)
  also take the L2's bandwidth, and an LDL waits that share of the L2's queue and latency more
  (fa_sim.timing.local.l2_leg).
- Global atomics and reductions (REDG, ATOMG) also queue on the SM's share of the L2's atomic units,
  `atomic_rate` lanes per cycle (GpuModel.atomic_rate); a warp may issue one only while that queue
  holds at most `atomic_queue` cycles of work (Nsight Compute's lg_throttle: the SM's local/global
  queue is full), so a burst of reductions holds its warps back once the L2 falls behind. An ATOMG's
  answer arrives the copy latency after the L2 executed it.
- BAR.SYNC releases the CTA's warps `bar_latency` cycles after the last one arrived.
Each cycle in which a resident warp does not issue is charged to one Nsight Compute stall reason:
barrier, long_scoreboard (a cp.async group), short_scoreboard (other scoreboards), wait (the stall
count), math_pipe_throttle, mio_throttle (with `issue_in_turn` also a MUFU or conversion waiting for
its XU: Nsight Compute counts the XU among the MIO pipelines, and the H100's softcap profile shows the
XU's load as mio_throttle), lg_throttle, not_selected; the issuing warp counts as selected.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from dataclasses import dataclass, field

from .gpus import GpuModel
from .local import l2_leg
from .program import Pipe, Step, Sync

N_SMSP = 4
REASONS = ("selected", "not_selected", "wait", "short_scoreboard", "long_scoreboard", "barrier",
           "math_pipe_throttle", "mio_throttle", "lg_throttle", "no_instruction")


_ORDERS = tuple((*range(first, N_SMSP), *range(first)) for first in range(N_SMSP))  # SMSPs in turn from `first`
_XU = int(Pipe.XU)
# the Sync kinds as module names (the scheduler's inner loop: one lookup, not two)
_BAR, _LDGDEPBAR, _DEPBAR, _EXIT = Sync.BAR, Sync.LDGDEPBAR, Sync.DEPBAR, Sync.EXIT
_GLOBAL_COPY, _GLOBAL_LOAD, _GLOBAL_STORE = Sync.GLOBAL_COPY, Sync.GLOBAL_LOAD, Sync.GLOBAL_STORE
_LOCAL_LOAD, _LOCAL_STORE = Sync.LOCAL_LOAD, Sync.LOCAL_STORE
heappush, heappop = heapq.heappush, heapq.heappop
_INF = float("inf")
_NINF = -_INF
# A warp's stall reasons that depend on its own state alone and so stay until that state changes, kept
# in _Warp.why so that the scheduler does not ask _blocked again each cycle (the same answers): a barrier
# until the CTA's release, a scoreboard wait until one of its scoreboards is released (the warp sets
# none while it does not issue), the stall count's wait until its ready cycle (nothing else moves it),
# a math pipe's throttle until that pipe of its sub-partition is free (the checks before it - barrier,
# scoreboards, stall count - cannot change while the warp does not issue; only its sub-partition's
# issues move the pipe), an MIO throttle until its pipe is free or, where the pipe was free and the SM's
# shared-memory queue full, until the cycle the queue may take it (_mio_wake: the queue's free cycle only
# grows until then - issues and copies' arrivals add work to it -, so the throttle cannot end sooner; not
# for an atomic, whose lg_throttle check comes between). lg_throttle, which the atomics' queue decides
# after the pipe's check, is not one of these (tests/test_timing_steady.py compares the run with the one
# that asks every cycle).
_HELD = frozenset(("barrier", "long_scoreboard", "short_scoreboard", "wait", "math_pipe_throttle", "mio_throttle"))
_CODE = {r: i for i, r in enumerate(REASONS)}
_SELECTED, _NOT_SELECTED = _CODE["selected"], _CODE["not_selected"]
_GONE = len(REASONS)  # a warp that left: `ones`' slot past REASONS', never added to the stalls


class Deadlock(RuntimeError):
    """No warp can ever issue again (a barrier some warp never reaches, a scoreboard never set)."""


class _Warp:
    __slots__ = ("cta", "stream", "end", "pc", "ready", "sb", "smsp", "at_bar", "open_arrival", "long_sb", "why",
                 "wake", "code")

    def __init__(self, cta: "_Cta", stream: list[Step], smsp: int) -> None:
        self.cta, self.stream, self.pc, self.ready, self.smsp = cta, stream, 0, 0, smsp
        self.end = len(stream)  # the stream's length: the warp has left once pc reaches it
        self.sb = [0] * 6
        self.at_bar = False
        self.open_arrival = 0.0
        self.long_sb = 0  # scoreboards last set by a cp.async group: waits on them are long
        self.why = None  # a stall reason of this warp's own that stays until it is cleared (_HELD)
        # the cycle from which `why` is asked again: -inf without one, its ready cycle for a wait, its pipe's
        # free cycle for a math throttle (neither moves while the warp does not issue, but by a steady jump,
        # which moves this too), inf for a barrier or a scoreboard (cleared, with `why`, by their release)
        self.wake = _NINF
        self.code = 0  # REASONS.index(why) while it holds one
        if not self.end:
            self.wake, self.code = _INF, _GONE


@dataclass
class _Cta:
    warps: list = field(default_factory=list)
    arrived: int = 0
    live: int = 0
    done_at: float = -1.0
    slot: int = 0
    started: float = 0.0
    marked: list = field(default_factory=list)


@dataclass
class SmRun:
    """What one SM did: the cycle each CTA finished, issue and pipe activity, stall reasons."""

    cycles: float
    done_at: list[float]
    started_at: list[float]
    marked: list[tuple]  # per CTA: the cycles its first warp issued the instructions at `marks`
    issued: int
    busy: dict  # pipe name -> busy cycles summed over the SMSPs
    stalls: Counter  # reason -> warp-cycles
    warp_cycles: float  # resident warps summed over cycles
    skipped: float = 0.0  # cycles of a periodic steady state jumped over, not simulated (run_sm's `steady`)


def run_sm(streams: list[list[Step]], n_warps: int, gpu: GpuModel, account: bool = True, slots: int | None = None,
           max_cycles: float = 5e8, timeline: list | None = None, stagger: list[int] | None = None,
           marks: tuple[int, ...] = (), steady: bool = False) -> SmRun:
    """Run CTAs (one stream each, shared by its `n_warps` warps, or a list of `n_warps` streams,
    one per warp: warps of a CTA on different paths) on one SM: `slots` of them resident
    at a time (None: all at once), the next starting in the slot of the first to finish;
    `account`: charge every non-issuing warp-cycle to a stall reason (slower); `timeline`: append
    (cycle, CTA, warp, sub-partition, opcode, stall) for every instruction issued; `stagger`: the
    first slots' CTAs after the first start one by one, CTA i + 1 when the first CTA's first warp
    has issued stagger[i] instructions (None: all at cycle 0); `marks`: instruction indices whose
    issue cycle in each CTA's first warp is recorded (SmRun.marked); `steady`: skip the periods of a
    periodic steady state (`_Steady`: the same result, up to the rounding stated there; not with
    `timeline`, `stagger` or `marks`)."""
    return _run_sm(streams, n_warps, gpu, account, slots, max_cycles, timeline, stagger, marks, steady)[0]


def run_sm_prefix(streams: list, fork: int, n_warps: int, gpu: GpuModel, account: bool = True,
                  slots: int | None = None, max_cycles: float = 5e8, steady: bool = False) -> tuple[SmRun, SmRun]:
    """(run_sm(streams[:fork], ...), run_sm(streams, ...)) for about the cost of the longer one
    (run_sm_prefixes)."""
    if not (isinstance(fork, int) and 0 < fork <= len(streams)):
        raise ValueError(f"fork must be 1 to {len(streams)} CTAs, got {fork!r:.40}")
    short, long = run_sm_prefixes(streams, (fork, len(streams)), n_warps, gpu, account, slots, max_cycles, steady)
    return short, long


def run_sm_prefixes(streams: list, forks, n_warps: int, gpu: GpuModel, account: bool = True,
                    slots: int | None = None, max_cycles: float = 5e8, steady: bool = False,
                    known: dict | None = None) -> list[SmRun]:
    """[run_sm(streams[:f], ...) for f in forks] for about the cost of the longest one: the run of
    streams[:f] and of streams[:g], f < g, are the same cycle by cycle (run_sm is deterministic) up to
    the moment a CTA finishes when f CTAs have started, where the shorter one starts no CTA and the
    longer one starts CTA f; there the state is copied (deepcopy; the streams and their Steps are
    shared), the shorter run goes on to its end and the longer one from the copy, up to the next fork.
    The results are those of the separate runs, bit for bit (tests/test_timing_steady.py).
    fa_sim.timing.launch's chunks use it: each chunk's run is the start of its run with the next chunk,
    and the last, shorter chunk's run with the one before is the start of theirs with a whole one.
    `known`: a dict shared by the runs of one launch (and steady_size) in which each stream's anchor
    and Step ids are found once (_Steady's; the streams are held there, so their ids stay theirs)."""
    forks = list(forks)
    if not forks or not all(isinstance(f, int) and 0 < f <= len(streams) for f in forks):
        raise ValueError(f"forks must be 1 to {len(streams)} CTAs, got {forks!r:.60}")
    n = len(streams) if slots is None else min(slots, len(streams))
    done: dict = {}
    snapshot = None
    for f in sorted(set(forks)):
        if f < n:  # fewer CTAs than slots: different from the first cycle on
            done[f] = _run_sm(streams[:f], n_warps, gpu, account, slots, max_cycles, None, None, (), steady,
                              known=known)[0]
            continue
        done[f], snapshot = _run_sm(streams, n_warps, gpu, account, slots, max_cycles, None, None, (), steady,
                                    fork=f if f < len(streams) else None, resume=snapshot, known=known)
    return [done[f] for f in forks]


def run_sm_tree(runs: list, n_warps: int, gpu: GpuModel, account: bool = True, slots: int | None = None,
                max_cycles: float = 5e8, steady: bool = False, known: dict | None = None) -> list[SmRun]:
    """[run_sm(r, ...) for r in runs] (each run a list of CTA streams, as run_sm takes them) for about
    the cost of their trie: two runs whose first CTAs are the same streams (the same objects) are the
    same cycle by cycle (run_sm is deterministic) up to the moment a CTA finishes when f CTAs have
    started, f the first CTA in which they differ, where each starts its own CTA f (or, the shorter
    one, none: run_sm_prefixes' fork, which this generalises). There the state is copied (the streams
    and their Steps shared) and each group of runs that goes on alike goes on from its copy, up to its
    next fork. Runs with fewer CTAs than the slots differ from the first cycle on (they start fewer) and
    run alone. The results are those of the separate runs, bit for bit (tests/test_timing_steady.py).
    `known`: run_sm_prefixes'."""
    results: list = [None] * len(runs)
    roots: dict = {}
    for j, r in enumerate(runs):
        if not r:
            raise ValueError("a run needs at least one CTA")
        n = len(r) if slots is None else min(slots, len(r))  # the CTAs started at cycle 0
        roots.setdefault((n, tuple(map(id, r[:n]))), []).append(j)

    def grow(group: list, snap) -> None:
        """Runs `group` (indices), which share their first CTAs, from `snap` (the state about to start
        the first CTA past those the snapshot's run started; None: nothing started)."""
        longest = max(group, key=lambda j: len(runs[j]))
        rep = runs[longest]
        q = min(len(runs[j]) for j in group)  # the group's common prefix: q CTAs
        for j in group:
            q = next((c for c in range(q) if runs[j][c] is not rep[c]), q)
        ends = [j for j in group if len(runs[j]) == q]
        more = len(rep) > q
        run, shot = _run_sm(rep, n_warps, gpu, account, slots, max_cycles, None, None, (), steady,
                            fork=q if more else None, resume=snap, known=known, stop=more and not ends)
        for j in ends:
            results[j] = run
        if more:
            children: dict = {}
            for j in group:
                if len(runs[j]) > q:
                    children.setdefault(id(runs[j][q]), []).append(j)
            kids = list(children.values())
            for c, kid in enumerate(kids):  # the last one goes on from the state itself, the others from copies
                grow(kid, shot if c == len(kids) - 1 else _snapshot(rep, shot))

    for group in roots.values():
        grow(group, None)
    return results


def _run_sm(streams, n_warps, gpu, account, slots, max_cycles, timeline, stagger, marks, steady, fork=None,
            resume=None, known=None, stop=False) -> tuple[SmRun | None, tuple | None]:
    """run_sm, and run_sm_prefixes' pieces: with `fork`, the run of streams[:fork] and the state
    (a snapshot) at the moment the run of all the streams would start CTA `fork`; with `resume`,
    the run of all the streams (with `fork` too, of streams[:fork], and its snapshot) from such a
    snapshot; with `stop` (and `fork`), (None, the state) at that moment: the run of streams[:fork]
    is not wanted (run_sm_tree)."""
    slots = len(streams) if slots is None else slots
    limit = len(streams) if fork is None else fork  # the CTAs this run starts
    snapshot = None
    periodic = _Steady(known) if steady and timeline is None and not stagger and not marks else None
    pending = list(stagger or [])[: max(0, min(slots, len(streams)) - 1)]
    ctas: list[_Cta] = []
    warps: list[_Warp] = []
    by_smsp: list[list[_Warp]] = [[] for _ in range(N_SMSP)]

    def start(slot: int, t: float) -> None:
        cta = _Cta(live=n_warps)
        cta.slot, cta.started = slot, t
        mine = streams[len(ctas)]
        per_warp = bool(mine) and isinstance(mine[0], list)
        if per_warp and len(mine) != n_warps:
            raise ValueError(f"CTA {len(ctas)} has {len(mine)} warp streams for {n_warps} warps")
        for w in range(n_warps):
            warp = _Warp(cta, mine[w] if per_warp else mine, (slot * n_warps + w) % N_SMSP)
            warp.ready = t
            cta.warps.append(warp)
            warps.append(warp)
            by_smsp[warp.smsp].append(warp)
        ctas.append(cta)
        if periodic is not None:
            periodic.reset()

    first = 0  # the first of this cycle's sub-partitions in turn still to issue (a resumed run's: the next)
    in_turn = gpu.issue_in_turn
    extras = bool(in_turn or timeline is not None or marks)  # an issue's rarer bookkeeping (one test in the loop)
    if resume is None:
        for slot in range(min(slots, len(streams)) - len(pending)):
            start(slot, 0.0)
        lead = warps[0]
        pipe_free = [[0.0] * len(Pipe) for _ in range(N_SMSP)]
        state = {"mio_free": 0.0, "global_free": 0.0, "atomic_free": 0.0}
        events: list = []  # (time, seq, warp, scoreboard)
        last: list = [None] * N_SMSP
        stalls: dict = {}  # plain dicts in the loop (a Counter's item assignment costs twice a dict's); the
        busy: dict = {}  # same keys, order and sums (a missing key counted from 0, as Counter's), returned as before
        issued, t, seq, warp_cycles = 0, 0.0, 0, 0.0
        skipped = 0.0  # cycles jumped over by the steady state (not simulated)
        live = len(warps)
        get = stalls.get
        ring = [0] * N_SMSP  # issue_in_turn: per SMSP, where its warps' turn starts (after its last pick)
        turn = cycle_turn = 0  # issue_in_turn: the SMSP first at the SM's shared queues (after the last MIO
        # issuer), and this cycle's (the order is set at the cycle's start)
    else:  # run_sm_prefix's longer run: start CTA len(ctas) where the shorter one did not, go on
        (ctas, warps, by_smsp, pipe_free, state, events, last, stalls, busy, issued, t, seq, warp_cycles, skipped,
         live, first, slot, due, ring, turn, cycle_turn) = resume
        get = stalls.get
        lead, any_issue = None, True  # (no stagger here; the shorter run issued at t)
        if periodic is not None:
            periodic.due = due
        start(slot, t + 1)
        live += n_warps
    anchored = (None, None)  # (a stream, its anchor): _Steady's, for the oldest warp's stream
    # A warp's cycles under a held reason are counted per reason here (REASONS' order), not added to `stalls`
    # one by one: they are added (_flush, the same sums bit for bit) before any other addition to that reason
    # (a gap's, a jump's) and before `stalls` is read (a steady state's record, a snapshot, the result).
    ones = [0] * (len(REASONS) + 1)
    # per order of the sub-partitions (_ORDERS), each one's (index, pipes' free cycles, warps): the lists
    # themselves, changed in place by the run
    lanes = [tuple((s, pipe_free[s], by_smsp[s]) for s in order) for order in _ORDERS]
    while live:
        if not first:
            while events and events[0][0] <= t:
                when, _, w, sb = heappop(events)
                if sb >= 0:
                    w.sb[sb] -= 1
                    if w.pc < w.end:  # (a warp that left keeps its inf wake)
                        w.why = None
                        w.wake = _NINF
                else:  # a cp.async's data arrived: its shared-memory writes take the pipe now
                    state["mio_free"] = max(state["mio_free"], when) - sb / gpu.smem_wavefronts_per_cycle
            any_issue = False
            cycle_turn = turn
        oi = cycle_turn if in_turn else int(t) % N_SMSP
        for s, pipes, mine in lanes[oi] if not first else lanes[oi][first:]:  # the SM's shared queues serve the
            ls = last[s]  # sub-partitions in turn
            if account:  # each warp's stall reason (None: it may issue) decides the pick and is charged
                if in_turn and mine:  # the SMSP's warps in turn, from the one after its last pick
                    k = ring[s] % len(mine)
                    mine = mine[k:] + mine[:k]
                pick, ready = None, 0
                for w in mine:
                    if t < w.wake:  # a held reason: counted in `ones`, added to `stalls` later (_flush); a warp
                        ones[w.code] += 1  # that left: counted in the slot past REASONS' (never added)
                        continue
                    st = w.stream[w.pc]  # no reason held, or the held one's wait or throttle may have ended
                    r = _blocked(w, st, t, pipes, state, gpu)
                    if r is None:
                        w.why = None
                        w.wake = _NINF
                        ready += 1
                        if pick is None or w is ls:  # the greedy warp, else the oldest (or the next in turn)
                            pick = w
                        continue
                    if r in _HELD:
                        w.why = r
                        w.code = _CODE[r]
                        if r == "mio_throttle":  # its pipe's free cycle, else the cycle the MIO queue may take it
                            p = pipes[st.slot]
                            w.wake = p if p > t else _mio_wake(state, gpu) if not st.atomic else _NINF
                        else:
                            w.wake = w.ready if r == "wait" else pipes[st.slot] if r == "math_pipe_throttle" else _INF
                    else:
                        w.why = None
                        w.wake = _NINF
                    stalls[r] = get(r, 0) + 1  # (a reason's first charge is here: the keys' order as before)
                if ready:  # counted in `ones` too once charged first (the keys' order as before)
                    if "selected" in stalls:
                        ones[_SELECTED] += 1
                    else:
                        stalls["selected"] = 1
                    if ready > 1:
                        if "not_selected" in stalls:
                            ones[_NOT_SELECTED] += ready - 1
                        else:
                            stalls["not_selected"] = _add_ones(0, ready - 1)
            else:
                pick = ls if ls is not None and _can_issue(ls, ls.stream[ls.pc], t, pipes, state, gpu) else None
                if pick is None:
                    if in_turn and mine:  # the SMSP's warps in turn, from the one after its last pick
                        k = ring[s] % len(mine)
                        mine = mine[k:] + mine[:k]
                    for w in mine:
                        if w is not ls and w.pc < w.end and _can_issue(w, w.stream[w.pc], t, pipes, state, gpu):
                            pick = w
                            break
            if pick is not None:
                st = pick.stream[pick.pc]
                if extras:  # issue_in_turn's rings, a timeline, marks
                    if in_turn:
                        if pick is not ls:
                            ring[s] = by_smsp[s].index(pick) + 1
                        if st.is_mio:
                            turn = (s + 1) % N_SMSP
                    if timeline is not None:
                        timeline.append((t, ctas.index(pick.cta), pick.cta.warps.index(pick), s, st.name, st.stall))
                    if marks and pick.pc in marks and pick is pick.cta.warps[0]:
                        pick.cta.marked.append(t)
                if periodic is not None and pick is warps[0]:
                    if pick.stream is not anchored[0]:  # the oldest warp's anchor, looked up when it changes
                        anchored = (pick.stream, periodic.anchor(pick.stream))
                    if st is anchored[1]:
                        periodic.due = True
                if st.plain:  # _issue's work for an instruction that only takes its pipe (Step.plain)
                    pick.pc += 1
                    pick.why = None
                    pick.wake = _NINF
                    pick.ready = t + st.gap
                    pipes[st.slot] = t + st.cycles
                    name = st.pipe_name
                    busy[name] = busy.get(name, 0) + st.cycles
                    if pick.pc >= pick.end:
                        _leave(pick, t, gpu)
                else:
                    seq = _issue(pick, t, pipes, state, gpu, events, seq, busy)
                while pending and pick is lead and (pick.pc >= pending[0] or pick.pc >= pick.end):
                    pending.pop(0)
                    start(len(ctas), t + 1)
                    live += n_warps
                issued += 1
                any_issue = True
                last[s] = None if st.switch else pick  # a yield: no greedy claim (one that left: None below)
                if pick.pc >= pick.end:
                    live -= 1
                    last[s] = None
                    if pick.cta.live == 0:  # the CTA is done: its warps leave, the next CTA takes its slot
                        for w in pick.cta.warps:
                            warps.remove(w)
                            by_smsp[w.smsp].remove(w)
                        if len(ctas) < limit:
                            start(pick.cta.slot, t + 1)
                            live += n_warps
                        elif fork is not None and snapshot is None and len(ctas) < len(streams):
                            _flush(stalls, ones)
                            here = (ctas, warps, by_smsp, pipe_free, state, events, last, stalls, busy, issued, t, seq,
                                    warp_cycles, skipped, live, _ORDERS[oi].index(s) + 1, pick.cta.slot,
                                    periodic is not None and periodic.due, ring, turn, cycle_turn)
                            if stop:  # the run of streams[:fork] is not wanted: the state itself, not a copy
                                return None, here
                            snapshot = _snapshot(streams, here)
            elif in_turn:  # a cycle without issue ends the greedy claim: the next pick is in turn
                last[s] = None
        first = 0
        if periodic is not None and periodic.due:
            periodic.due = False
            turns = (tuple(r % max(1, len(by_smsp[s])) for s, r in enumerate(ring)), turn) if in_turn else None
            _flush(stalls, ones)
            jump = periodic.at(t, warps, last, turns, pipe_free, state, events, issued, busy, stalls, warp_cycles)
            if jump is not None:
                m, period, deltas, counts = jump
                shift = m * period
                for w in warps:
                    w.pc += m * deltas[id(w)]
                    w.ready += shift
                    w.wake += shift
                    if w.why == "mio_throttle":  # its wake has a margin of a few ulps of the queue's cycle (_mio_wake),
                        w.why = None  # which the shifted times' rounding could eat: asked again
                        w.wake = _NINF
                    w.open_arrival += shift
                for pipes in pipe_free:
                    pipes[:] = [p + shift for p in pipes]
                for q in state:  # the SM's queues' free cycles
                    state[q] += shift
                events[:] = [(e[0] + shift, *e[1:]) for e in events]  # a uniform shift keeps the heap order
                issued += m * counts[0]
                warp_cycles += m * counts[1]
                for mine, theirs in ((busy, counts[2]), (stalls, counts[3])):
                    for key, v in theirs.items():
                        mine[key] += m * v
                t += shift
                skipped += shift
        nxt = t + 1 if any_issue else _next_time(t, warps, events, pipe_free, state, gpu)
        warp_cycles += live * (nxt - t)
        if account and nxt - t > 1:  # the skipped cycles, charged to the same reasons
            gap = nxt - t - 1
            charged: dict = {}
            for w in warps:  # (no warp issued at t: each one's reason, or not_selected)
                if w.pc < w.end:
                    # a held reason was checked at t by this cycle's pass, and nothing changed since (no issue)
                    r = w.why or _blocked(w, w.stream[w.pc], t, pipe_free[w.smsp], state, gpu) or "not_selected"
                    charged[r] = charged.get(r, 0) + 1
            for r, n in charged.items():
                if ones[_CODE[r]]:
                    _flush(stalls, ones, _CODE[r])
                stalls[r] = n * gap + get(r, 0)
        t = nxt
        if t - skipped > max_cycles:
            raise Deadlock(f"no end after {max_cycles:.0f} cycles")
    _flush(stalls, ones)
    return SmRun(t, [c.done_at for c in ctas], [c.started for c in ctas], [tuple(c.marked) for c in ctas], issued,
                 dict(busy), Counter(stalls), warp_cycles, skipped), snapshot


def _flush(stalls: dict, ones: list, code: int | None = None) -> None:
    """Add the held reasons' counted cycles (`ones`, per REASONS index; only `code`'s if given) to `stalls`,
    as that many additions of 1 would have (the key is there: each reason was charged once when first held)."""
    for c in range(len(REASONS)) if code is None else (code,):
        n = ones[c]
        if n:
            ones[c] = 0
            r = REASONS[c]
            stalls[r] = _add_ones(stalls[r], n)


def _add_ones(x, n: int):
    """x + 1 + 1 + ... (n ones), each addition rounded as Python's (the same result, bit for bit), in a few
    additions: for 1 <= x < 2**52 adding 1 to a float is exact unless the sum reaches the next power of two, so
    the ones below it are added at once and the one that reaches it alone."""
    if type(x) is int:
        return x + n
    if 1.0 <= x < 4503599627370496.0:  # 2**52: from there on an addition of 1 may be rounded away
        y = x + n
        if math.frexp(y)[1] == math.frexp(x)[1]:  # no power of two reached: every step was exact
            return y
    while n > 0:
        e = math.frexp(x)[1]  # 2**(e-1) <= x < 2**e
        if x < 1.0 or e > 52:  # one at a time
            x += 1.0
            n -= 1
            continue
        k = min(n, math.ceil(2.0 ** e - x) - 1)  # the ones that keep x below 2**e (2**e - x is exact)
        x += k
        n -= k
        if n:
            x += 1.0  # the one that reaches 2**e, rounded
            n -= 1
    return x


def _snapshot(streams: list, state: tuple) -> tuple:
    """A deep copy of run_sm's state in which the streams (and so their Steps) stay shared."""
    import copy

    memo = {}
    for mine in streams:
        memo[id(mine)] = mine
        if mine and isinstance(mine[0], list):
            for w in mine:
                memo[id(w)] = w
    return copy.deepcopy(state, memo)


STEADY_ROUND = 6  # decimals of the relative times compared in a steady state's key (see _Steady)
STEADY_SNAPS = 256  # states remembered per resident set; past it they are forgotten and remembered anew
STEADY_CONFIRM = 2  # periods alike in a row, ending in the same state, before the steady state is extrapolated
STEADY_TIMING_CONFIRM = 4  # periods alike in a row between consecutive anchors, whatever the state, likewise
STEADY_WINDOW = 32  # anchors in a window whose timing, repeated twice in a row, is a period too (see _Steady)


class _Steady:
    """A periodic steady state of the SM, detected and skipped (run_sm's `steady`).

    The rule. run_sm is deterministic and reads the clock t only relative to the times in its state
    (a warp's ready cycle, its scoreboards' release events, the pipes', the shared-memory and L2
    queues' free cycles) and through the sub-partitions' turn (int(t) mod 4; with `issue_in_turn` each
    one's ring of warps and the SM's ring of sub-partitions, which the state includes). Each time the oldest
    resident warp issues its stream's anchor (the instruction it issues most often: one in the body
    of its innermost loop), run_sm records the state relative to t: per resident warp its ready and
    copy-arrival times past t, scoreboards and barrier state, the greedy warp of each sub-partition,
    the pipes' and queues' free cycles and the pending events, times before t clipped to t (nothing
    later tells them apart: every later comparison is with a cycle >= t), each rounded to
    STEADY_ROUND decimals. A period is what happened between two such records: its cycles P, each
    warp's instructions d_w, the issued instructions, warp-cycles, pipe-busy cycles and stall reasons.
    The SM is taken to be in a periodic steady state, with period P, when either
    - the state recurs (the same resident warps in the same relative state) after the same period
      STEADY_CONFIRM times in a row: the next period starts from the same state, or
    - the last STEADY_TIMING_CONFIRM periods between consecutive anchors took the same cycles,
      instructions per warp and warp-cycles, though the state differs in what does not change the
      timing (which warp's copies lead in the L2 queue rotates among the warps, and the state can
      come back only after many periods); the period's stall reasons and busy cycles are then the
      mean of those periods', or
    - (windows) the last two windows of n consecutive periods (2 <= n <= STEADY_WINDOW) took the same
      cycles, instructions per warp and warp-cycles: a period of n anchors (two resident CTAs whose
      loops interleave at a phase that comes back only every n iterations).
    It then jumps m periods at once, m the most that keeps every warp inside the part of its stream
    that repeats with period d_w (the next d_w instructions, and the one it then waits to issue, are
    the same instructions as the last d_w and the one it waited on: a loop's identical iterations),
    so that no warp ends (no CTA ends or starts; `stagger` and `marks` are off): every time in the
    state moves by m P, every pc by m d_w, and the counts grow by m periods'. Then the simulation goes
    on cycle by cycle (the loop's last iterations, a causal tail, the epilogue, the next CTA). The
    paths are the run's: only the stream's own repeats are skipped, never an iteration that differs.
    Exactness: a schedule whose periods are all alike is extrapolated exactly. The full run can
    differ where they are not: P need not be a multiple of 4 cycles (the L2 queue's 96 bytes per cycle
    make times fractional), so the sub-partitions' turn meets the period at a phase that drifts by
    frac(P) each period, and where the drift crosses a cycle boundary the full run has a period a
    cycle or so longer or shorter (the backward's main kernel: 1620.7 instead of 1620.03 cycles once
    in 28 periods), which the jump does not repeat; the timing-only rule also skips periods whose
    stalls differ by their attribution.
    tests/test_timing_steady.py bounds the difference at STEADY_BOUND (5e-4) of the SM's cycles,
    forward and backward, causal and not (measured: docs/timing.md)."""

    def __init__(self, known: dict | None = None) -> None:
        self.snaps: dict = {}  # relative state -> (its record, the last period seen ending in it, times in a row)
        self.chain: list = []  # the records of the last anchors, in order (the timing-only rule)
        self.due = False
        known = {} if known is None else known  # (run_sm_prefixes' `known`: shared by a launch's runs)
        self._anchor: dict = known.setdefault("anchor", {})  # id(stream) -> (stream, its anchor Step)
        self._ids: dict = known.setdefault("ids", {})  # id(stream) -> (stream, the id of each Step, as an array)

    def anchor(self, stream: list) -> Step | None:
        hit = self._anchor.get(id(stream))
        if hit is None:
            counts = Counter(map(id, stream))
            best = max(counts.values(), default=0)
            top = next((st for st in stream if counts[id(st)] == best), None) if best > 1 else None
            hit = self._anchor[id(stream)] = (stream, top)  # the stream is held, so its id stays its own
        return hit[1]

    def _ids_of(self, stream: list):
        hit = self._ids.get(id(stream))
        if hit is None:
            import numpy as np

            hit = self._ids[id(stream)] = (stream, np.fromiter(map(id, stream), np.int64, len(stream)))
        return hit[1]

    def reset(self) -> None:
        """Another resident set: no earlier state can recur."""
        self.snaps.clear()
        self.chain.clear()

    def at(self, t, warps, last, turns, pipe_free, state, events, issued, busy, stalls, warp_cycles):
        """None, or (m, P, {id(warp): d_w}, the period's (issued, warp-cycles, busy, stalls)) to jump."""
        def rel(x):
            return round(x - t, STEADY_ROUND) if x > t else 0.0

        wid = {id(w): i for i, w in enumerate(warps)}
        key = (tuple(rel(state[q]) for q in sorted(state)),  # the SM's queues' free cycles
               tuple(rel(p) for pipes in pipe_free for p in pipes),
               tuple(wid.get(id(w), -1) if w is not None else None for w in last),
               turns,  # issue_in_turn: each SMSP's ring of warps and the SM's ring of SMSPs (else None)
               tuple((id(w), rel(w.ready), tuple(w.sb), w.at_bar, rel(w.open_arrival), w.long_sb,
                      w.pc >= w.end, w.cta.arrived, w.cta.live) for w in warps),
               # a copy's arrival (negative: its wavefronts) takes the shared-memory pipe, whoever issued it
               tuple(sorted((rel(e[0]), wid.get(id(e[2]), -1) if e[3] >= 0 else -1, e[3]) for e in events)))
        now = (t, [w.pc for w in warps], issued, warp_cycles, dict(busy), dict(stalls))
        if len(self.snaps) >= STEADY_SNAPS:
            self.snaps.clear()
        before = self.snaps.get(key)
        period = None if before is None else _period(before[0], now, warps)
        times = 1 if period is None or period[0] != before[1] else before[2] + 1
        self.snaps[key] = (now, None if period is None else period[0], 0 if period is None else times)
        if period is not None and times >= STEADY_CONFIRM:
            return self._jump(before[0], now, warps, period[1])
        chain = self.chain  # the timing alone: the same period between consecutive anchors
        chain.append(now)
        if len(chain) > 1 and len(chain[-2][1]) != len(now[1]):  # a CTA left: another resident set
            del chain[:-1]
        del chain[: -2 * STEADY_WINDOW - 1]
        if len(chain) < STEADY_TIMING_CONFIRM + 1:
            return None
        last = chain[-STEADY_TIMING_CONFIRM - 1:]
        periods = [_period(a, b, warps) for a, b in zip(last, last[1:])]
        if all(p[0][:4] == periods[0][0][:4] for p in periods):  # cycles, instructions, warp-cycles alike
            n = len(periods)  # the stall reasons and pipe-busy cycles of a period: their mean over the confirmed ones
            total = _period(last[0], now, warps)[1]
            counts = (total[0] // n, total[1] / n, {k: v / n for k, v in total[2].items()},
                      {k: v / n for k, v in total[3].items()})
            return self._jump(chain[-2], now, warps, counts)
        for n in range(2, (len(chain) - 1) // 2 + 1):  # a window of n anchors repeated: the same timing twice
            a, b = chain[-2 * n - 1], chain[-n - 1]
            if round(now[0] - b[0], STEADY_ROUND) != round(b[0] - a[0], STEADY_ROUND):
                continue
            first, second = _period(a, b, warps), _period(b, now, warps)
            if first[0][:4] == second[0][:4]:
                jump = self._jump(b, now, warps, second[1])
                if jump is not None:
                    return jump
        return None


    def _jump(self, before, now, warps, counts):
        """(m, P, d_w, counts) from the record `before` to `now`, m the periods every warp's stream repeats."""
        t1, pcs1 = before[0], before[1]
        m = None
        for w, pc1 in zip(warps, pcs1):
            d = w.pc - pc1
            if d == 0:
                continue
            ids = self._ids_of(w.stream)
            n = len(ids)
            differ = (ids[w.pc:] != ids[pc1:n - d]).nonzero()[0]
            end = w.pc + int(differ[0]) if len(differ) else n  # the stream repeats with period d up to here
            # the jumped periods issue up to pc + m d - 1 and look at pc + m d (the warp's next instruction,
            # which the last period looked at as pc): all inside the repeating part
            mw = (end - 1 - w.pc) // d
            m = mw if m is None else min(m, mw)
        if not m or m < 1:
            return None
        self.reset()
        return m, now[0] - t1, {id(w): w.pc - pc1 for w, pc1 in zip(warps, pcs1)}, counts


def _period(before, now, warps) -> tuple:
    """(the period from record `before` to `now`, comparable; its counts (issued, warp-cycles, busy,
    stalls)), or None where the warps moved back (not one resident set)."""
    (t1, pcs1, issued1, wc1, busy1, stalls1), (t, pcs, issued, wc, busy, stalls) = before, now[:6]
    if len(pcs1) != len(pcs):
        return None
    counts = (issued - issued1, wc - wc1, {k: v - busy1.get(k, 0) for k, v in busy.items()},
              {k: v - stalls1.get(k, 0) for k, v in stalls.items()})
    key = (round(t - t1, STEADY_ROUND), tuple(b - a for a, b in zip(pcs1, pcs)), counts[0], round(counts[1], STEADY_ROUND),
           tuple(sorted((k, round(v, STEADY_ROUND)) for k, v in counts[2].items())),
           tuple(sorted((k, round(v, STEADY_ROUND)) for k, v in counts[3].items())))
    return key, counts


def steady_size(stream: list, known: dict | None = None) -> int:
    """About how many of a warp stream's instructions run_sm with `steady` simulates: the stream's
    iterations between two issues of its anchor (_Steady) that repeat the one before are skipped past
    the first STEADY_CONFIRM + 2 of each run of them (the first, the confirmations, the last)."""
    seen = _Steady(known)  # (`known`: run_sm_prefixes')
    top = seen.anchor(stream)
    if top is None:
        return len(stream)
    ids = seen._ids_of(stream)
    at = (ids == id(top)).nonzero()[0].tolist()
    skipped, run = 0, 0
    for a, b, c in zip(at, at[1:], at[2:]):
        same = c - b == b - a and bool((ids[b:c] == ids[a:b]).all())
        run = run + 1 if same else 0
        if run > STEADY_CONFIRM + 1:
            skipped += c - b
    return len(stream) - skipped


def _can_issue(w: _Warp, st: Step, t: float, pipes: list[float], state: dict, gpu: GpuModel) -> bool:
    """`_blocked(...) is None`, its checks in the order that rejects a waiting warp soonest (the
    scheduler's inner loop; `_blocked` names the reason for the stall accounting)."""
    if t < w.ready or w.at_bar or pipes[st.slot] > t:
        return False
    if st.atomic and state["atomic_free"] - t > gpu.atomic_queue:
        return False
    if st.sync is Sync.DEPBAR:
        if w.sb[0] > st.depbar_n:
            return False
    elif st.wait_mask:
        sb = w.sb
        for b in st.waits:
            if sb[b]:
                return False
    return not (st.is_mio and st.wavefronts and state["mio_free"] - t > gpu.mio_queue)


def _mio_wake(state: dict, gpu: GpuModel) -> float:
    """A cycle before which a warp that the SM's full shared-memory queue holds (`_blocked`'s last check,
    state["mio_free"] - t > gpu.mio_queue) stays held: the queue's free cycle less mio_queue, less a margin
    of 8 ulps of it, so that for every t below it the check's own rounding still finds the queue full (the
    queue's free cycle only grows meanwhile); from it on `_blocked` is asked again."""
    free = state["mio_free"]
    return free - gpu.mio_queue - 8 * math.ulp(free)


def _blocked(w: _Warp, st: Step, t: float, pipes: list[float], state: dict, gpu: GpuModel) -> str | None:
    """None when `w` may issue `st` at cycle t, else the stall reason."""
    if w.at_bar:
        return "barrier"
    if st.sync is _DEPBAR:
        if w.sb[0] > st.depbar_n:
            return "long_scoreboard"
    elif st.wait_mask:
        sb = w.sb
        for b in st.waits:
            if sb[b]:
                return "long_scoreboard" if w.long_sb >> b & 1 else "short_scoreboard"
    if t < w.ready:
        return "wait"
    if pipes[st.slot] > t:
        return "mio_throttle" if st.is_mio or st.slot == _XU and gpu.issue_in_turn else "math_pipe_throttle"
    if st.atomic and state["atomic_free"] - t > gpu.atomic_queue:
        return "lg_throttle"
    if st.is_mio and st.wavefronts and state["mio_free"] - t > gpu.mio_queue:
        return "mio_throttle"
    return None


def _issue(w: _Warp, t: float, pipes: list[float], state: dict, gpu: GpuModel, events: list, seq: int,
           busy: dict) -> int:
    st = w.stream[w.pc]
    sync = st.sync
    w.pc += 1
    w.why = None
    w.wake = _NINF
    w.ready = t + st.gap
    pipes[st.slot] = t + st.cycles
    name = st.pipe_name
    busy[name] = busy.get(name, 0) + st.cycles
    done = t
    if st.tag_wavefronts:  # an uncoalesced global request: its extra lines, a wavefront of the L1 each
        state["mio_free"] = max(state["mio_free"], t) + st.tag_wavefronts / gpu.smem_wavefronts_per_cycle
        busy["SMEM"] = busy.get("SMEM", 0) + st.tag_wavefronts / gpu.smem_wavefronts_per_cycle
    if sync is _GLOBAL_COPY:
        state["global_free"] = max(state["global_free"], t) + st.bytes / gpu.global_bytes_per_cycle
        arrival = state["global_free"] + gpu.global_latency
        w.open_arrival = max(w.open_arrival, arrival)
        if st.wavefronts:
            heappush(events, (arrival, seq, w, -st.wavefronts))  # negative: wavefronts to write
            seq += 1
            busy["SMEM"] = busy.get("SMEM", 0) + st.wavefronts / gpu.smem_wavefronts_per_cycle
    elif sync is _GLOBAL_LOAD or sync is _GLOBAL_STORE:
        state["global_free"] = max(state["global_free"], t) + st.bytes / gpu.global_bytes_per_cycle
        if st.atomic:  # the L2's atomic units execute its lanes after those queued before
            state["atomic_free"] = max(state["atomic_free"], t) + st.atomic / gpu.atomic_rate
        if sync is _GLOBAL_LOAD:
            done = max(state["global_free"], state["atomic_free"] if st.atomic else 0.0) + gpu.global_latency
    elif st.is_mio and st.wavefronts:
        begin = max(state["mio_free"], t)
        state["mio_free"] = begin + st.wavefronts / gpu.smem_wavefronts_per_cycle
        done = state["mio_free"]
        busy["SMEM"] = busy.get("SMEM", 0) + st.wavefronts / gpu.smem_wavefronts_per_cycle
        if sync is _LOCAL_LOAD or sync is _LOCAL_STORE:  # stores and misses go on to the L2
            done = l2_leg(state, st, t, done, gpu, sync is _LOCAL_STORE)
    write = st.write_sb
    if write >= 0:
        w.sb[write] += 1
        bit = 1 << write
        if sync is _LDGDEPBAR:
            w.long_sb |= bit
            when = max(w.open_arrival, t + 1)
        else:
            w.long_sb &= ~bit
            when = done + st.latency
        heappush(events, (when, seq, w, write))
        seq += 1
    if sync is _LDGDEPBAR:
        w.open_arrival = 0.0
    read = st.read_sb
    if read >= 0:
        w.sb[read] += 1
        heappush(events, (done + gpu.read_latency, seq, w, read))
        seq += 1
    if sync is _BAR:
        _arrive(w, t, gpu)
    elif sync is _EXIT or w.pc >= w.end:
        _leave(w, t, gpu)
    return seq


def _arrive(w: _Warp, t: float, gpu: GpuModel) -> None:
    cta = w.cta
    w.at_bar = True
    cta.arrived += 1
    if cta.arrived == cta.live:
        _release(cta, t + gpu.bar_latency)


def _release(cta: _Cta, when: float) -> None:
    cta.arrived = 0
    for x in cta.warps:
        if x.at_bar:
            x.at_bar = False
            x.why = None
            x.wake = _NINF
            x.ready = max(x.ready, when)


def _leave(w: _Warp, t: float, gpu: GpuModel) -> None:
    w.pc = w.end
    w.wake, w.code = _INF, _GONE  # the scheduler passes it with one comparison (its why is None)
    cta = w.cta
    cta.live -= 1
    if cta.live == 0:
        cta.done_at = t
    elif cta.arrived and cta.arrived == cta.live:  # the others wait at a barrier this warp skipped
        _release(cta, t + gpu.bar_latency)


def _next_time(t: float, warps, events, pipe_free, state, gpu) -> float:
    """The next cycle at which anything can change, when nothing issued at t: max(t + 1, the first
    time past t of an event, a warp's ready cycle, a pipe's or a queue's free cycle), found with an
    early return once one is at most t + 1 (the later ones can only be sooner: the same t + 1)."""
    t1 = t + 1
    best = events[0][0] if events else _INF
    if best <= t1:
        return t1
    for w in warps:
        if w.pc < w.end and not w.at_bar:
            r = w.ready
            if t < r < best:
                if r <= t1:
                    return t1
                best = r
    for pipes in pipe_free:
        if max(pipes) > t:  # (most of a sub-partition's pipes are free: skipped at once)
            for p in pipes:
                if t < p < best:
                    if p <= t1:
                        return t1
                    best = p
    x = state["mio_free"] - gpu.mio_queue
    if t < x < best:
        best = x
    x = state["atomic_free"] - gpu.atomic_queue
    if t < x < best:
        best = x
    if best == _INF:
        raise Deadlock(f"cycle {t:.0f}: every warp waits and nothing is in flight")
    return t1 if t1 >= best else best
