"""The SM model's steady state (fa_sim.timing.sm's _Steady, run_sm's `steady`): a loop's identical
iterations, once the SM repeats the same period (the same state STEADY_CONFIRM times, or the same
timing STEADY_TIMING_CONFIRM times), are skipped, not simulated. On launches whose full SM run is
affordable, the skipped prediction is the full one within STEADY_BOUND of the SM's cycles, forward
and backward, causal and not.

Why a bound and not equality: the SM model turns its sub-partitions' order with int(t) mod 4, so a
period P that is not a whole multiple of 4 cycles (the L2 queue's 96 bytes per cycle make times
fractional) meets that turn at a phase that drifts by frac(P) each period; the full run then has a
rare period a cycle longer or shorter than the others where the drift crosses a cycle boundary
(1620.7 instead of 1620.03 cycles once in 28 periods of the backward's main kernel), which the
extrapolated periods do not repeat. Measured: at most 2.3e-4 of the SM's cycles."""

import numpy as np
import pytest

import fa_sim.timing.launch as tl
from fa_sim.timing.sm import STEADY_CONFIRM, steady_size

STEADY_BOUND = 5e-4  # of the busiest SM's cycles (see the module docstring)


def _compare(full, skipped) -> None:
    assert full.notes["sm_skipped_cycles"] == 0
    assert skipped.notes["sm_skipped_cycles"] > 0.25 * skipped.notes["sm_cycles"]  # (the dQ kernel of 8 K/V blocks: 37 %)
    assert skipped.instructions == full.instructions
    assert skipped.notes["sm_cycles"] == pytest.approx(full.notes["sm_cycles"], rel=STEADY_BOUND)
    assert skipped.kernel_ms == pytest.approx(full.kernel_ms, rel=STEADY_BOUND)
    for reason, v in full.stalls.items():  # per issued instruction: within the same share of the cycles
        assert skipped.stalls.get(reason, 0.0) == pytest.approx(v, abs=STEADY_BOUND * 10)


@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True])
def test_backward_skipped_equals_the_full_run(causal):
    from fa_sim.backward import backward_launches
    from fa_sim.timing.backward import seeded_backward_inputs

    launches = backward_launches(*seeded_backward_inputs(1, 1, 1024, 1024, 128), causal, None, True)[0]
    for launch in launches[1:]:  # the main kernel (a loop over the Q blocks) and the dQ kernel (over the K/V blocks)
        full, skipped = (tl.predict_launch(launch.source, launch.grid, launch.block, launch.args, launch.smem_bytes,
                                           kernel=launch.kernel, macros=launch.macros,
                                           uniform_axes=launch.uniform_axes, cache=False, steady=steady)
                         for steady in (False, True))
        _compare(full, skipped)


@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True])
def test_forward_skipped_equals_the_full_run(causal, tmp_path, monkeypatch):
    from fa_sim.timing import predict_time

    monkeypatch.setenv("FLASHSIM_CACHE", str(tmp_path))
    cu = np.array([0, 2048], np.int32)  # one sequence: fa2_fwd.cu's launch through predict_launch
    preds = []
    for steady in (False, True):
        monkeypatch.setattr(tl, "STEADY", steady)
        p = predict_time(None, 1, None, None, 64, causal, cu_seqlens_q=cu, cu_seqlens_k=cu)
        preds.append(next(iter(p.kernels.values())))
    _compare(*preds)


def test_steady_size_counts_a_loops_repeats_once():
    """A stream of a prologue, 20 identical iterations and an epilogue: the anchor (a, the most
    issued instruction) cuts 19 whole iterations (anchor to anchor) and the last one with the
    epilogue; steady_size keeps the prologue, the first STEADY_CONFIRM + 2 whole iterations and
    the last one with the epilogue."""
    a, b, c, x, y = (object() for _ in range(5))
    body = [a, b, c]
    stream = [x] + body * 20 + [y]
    assert steady_size(stream) == len(stream) - (19 - (STEADY_CONFIRM + 2)) * len(body)
    assert steady_size([x, y]) == 2


def test_steady_must_be_a_bool():
    with pytest.raises(ValueError, match="steady must be"):
        tl.predict_launch("x.cu", (1,), (32,), steady="yes")


def _loop_streams(trips):
    """One stream per CTA: a prologue, `trips` iterations of a loop that copies a tile from global
    memory (LDGSTS, LDGDEPBAR, DEPBAR), waits at a barrier and computes on it, and an epilogue."""
    from fa_sim.timing.gpus import H200
    from fa_sim.timing.program import step
    from fa_sim.timing.sass import Control

    def st(opcode, operands="R0, R1, R2", stall=2, write=None, read=None, wait=0, wavefronts=None):
        c = Control(stall=stall, yield_hint=False, write_barrier=write, read_barrier=read, wait_mask=wait, reuse=0)
        return step(opcode, operands, "", c, H200, wavefronts or {})

    pro = [st("S2R", "R0, SR_TID.X", write=0), st("IMAD", wait=1)]
    body = [st("LDGSTS.E.BYPASS.128", "[R1], desc[UR4][R2.64]"), st("LDGDEPBAR", ""), st("DEPBAR.LE", "SB0, 0x0"),
            st("BAR.SYNC.DEFER_BLOCKING", "0x0"), st("LDS.128", "R4, [R1]", write=1),
            st("HMMA.16816.F32", "R8, R4, R6, R8", wait=2), st("HMMA.16816.F32", "R12, R4, R6, R12", stall=4),
            st("FFMA"), st("IADD3")]
    epi = [st("STG.E.128", "desc[UR4][R2.64], R8"), st("EXIT", "")]
    return [pro + body * n + epi for n in trips]


def _gpu(in_turn):
    """The H200's model with the scheduler rule given (GpuModel.issue_in_turn)."""
    from dataclasses import replace

    from fa_sim.timing.gpus import H200

    return replace(H200, issue_in_turn=in_turn)


@pytest.mark.parametrize("in_turn", [False, True])
@pytest.mark.parametrize("steady", [False, True])
def test_a_runs_prefix_is_the_shorter_run_bit_for_bit(steady, in_turn):
    """run_sm_prefix: the run of the first CTAs and of all of them, sharing their common cycles,
    equal the two separate runs in every field (either issue rule: the snapshot holds its turns)."""
    from fa_sim.timing.sm import run_sm, run_sm_prefix

    H200 = _gpu(in_turn)

    streams = _loop_streams([40, 33, 27, 50, 12, 45])
    for fork in (1, 2, 3, 4, 6):
        short, long = run_sm_prefix(streams, fork, 4, H200, slots=2, steady=steady)
        assert short == run_sm(streams[:fork], 4, H200, slots=2, steady=steady)
        assert long == run_sm(streams, 4, H200, slots=2, steady=steady)
        assert len(short.done_at) == fork and len(long.done_at) == len(streams)
    with pytest.raises(ValueError, match="fork must be"):
        run_sm_prefix(streams, 0, 4, H200, slots=2)


@pytest.mark.parametrize("in_turn", [False, True])
@pytest.mark.parametrize("steady", [False, True])
def test_a_runs_prefixes_are_the_shorter_runs_bit_for_bit(steady, in_turn):
    """run_sm_prefixes: the runs of the first 1, 3, 4 and 5 CTAs and of all of them, in one pass,
    equal the separate runs in every field (time_sm's chunk runs: a chunk, it with a shorter last
    chunk, it with a whole one)."""
    from fa_sim.timing.sm import run_sm, run_sm_prefixes

    H200 = _gpu(in_turn)

    streams = _loop_streams([40, 33, 27, 50, 12, 45])
    forks = [4, 1, 6, 3, 5]
    for fork, run in zip(forks, run_sm_prefixes(streams, forks, 4, H200, slots=2, steady=steady)):
        separate = run_sm(streams[:fork], 4, H200, slots=2, steady=steady)
        assert run == separate and dict(run.stalls) == dict(separate.stalls)
        assert len(run.done_at) == fork
    with pytest.raises(ValueError, match="forks must be"):
        run_sm_prefixes(streams, [3, 7], 4, H200, slots=2)


@pytest.mark.parametrize("in_turn", [False, True])
@pytest.mark.parametrize("steady", [False, True])
@pytest.mark.parametrize("slots", [2, 3])
def test_a_trie_of_runs_is_the_separate_runs_bit_for_bit(slots, steady, in_turn):
    """run_sm_tree: runs that share their first CTAs and then differ (a CTA of another stream, or none:
    a prefix), a duplicate, a run of fewer CTAs than the slots, one that starts with other CTAs, and
    streams that recur within a run (time_sm's runs of a window's full-length Q blocks) equal the
    separate runs in every field, the stall reasons' order included."""
    from fa_sim.timing.sm import run_sm, run_sm_tree

    H200 = _gpu(in_turn)
    a, b, c, d, e, f, g, h = _loop_streams([40, 33, 27, 50, 12, 45, 20, 8])
    runs = [[a, b, c, d, e], [a, b, c, d, f], [a, b, c, g], [a, b, c], [a, b], [a], [a, b, c, d, e], [b, a, c],
            [a, b, h, a, b], [a, b, h, a, g, a], [a, a, a, a], [a, a, a, b]]
    for run, r in zip(run_sm_tree(runs, 4, H200, slots=slots, steady=steady), runs):
        separate = run_sm(r, 4, H200, slots=slots, steady=steady)
        assert run == separate and list(run.stalls.items()) == list(separate.stalls.items())
        assert list(run.busy.items()) == list(separate.busy.items()) and len(run.done_at) == len(r)
    with pytest.raises(ValueError, match="at least one CTA"):
        run_sm_tree([[a], []], 4, H200, slots=2)


@pytest.mark.parametrize("in_turn", [False, True])
@pytest.mark.parametrize("steady", [False, True])
def test_held_stall_reasons_change_nothing(steady, in_turn, monkeypatch):
    """The scheduler keeps a warp's own stall reasons (barrier, scoreboard, the stall count's wait)
    until its state changes (sm._HELD) instead of asking _blocked every cycle: the run equals the one
    that asks every cycle in every field and stall count, and the run without stall accounting (whose
    pick _can_issue decides) in its timing, under either issue rule."""
    import fa_sim.timing.sm as sm

    H200 = _gpu(in_turn)

    streams = _loop_streams([40, 33, 27, 50, 12, 45])
    held = sm.run_sm(streams, 4, H200, slots=3, steady=steady)
    monkeypatch.setattr(sm, "_HELD", frozenset())
    asked = sm.run_sm(streams, 4, H200, slots=3, steady=steady)
    assert held == asked and list(held.stalls.items()) == list(asked.stalls.items())  # the order too
    assert min(held.stalls[r] for r in ("barrier", "short_scoreboard", "wait", "math_pipe_throttle")) > 0
    plain = sm.run_sm(streams, 4, H200, account=False, slots=3, steady=steady)
    assert (plain.cycles, plain.done_at, plain.issued, plain.busy) == (held.cycles, held.done_at, held.issued,
                                                                       held.busy)


@pytest.mark.parametrize("in_turn", [False, True])
@pytest.mark.parametrize("steady", [False, True])
def test_held_mio_throttle_changes_nothing(steady, in_turn, monkeypatch):
    """A warp that the SM's full shared-memory queue (or its busy MIO pipe) holds keeps its mio_throttle
    until the queue may take it (sm._mio_wake) instead of asking _blocked every cycle: on loops of
    bank-conflicted shared-memory reads (32 wavefronts each, the queue full most cycles) beside global
    reductions (an MIO instruction whose lg_throttle check comes between: not held), the run equals the
    one that asks every cycle in every field and stall count, the keys' order included."""
    import fa_sim.timing.sm as sm
    from fa_sim.timing.program import step
    from fa_sim.timing.sass import Control

    from dataclasses import replace

    gpu = replace(_gpu(in_turn), atomic_share=1 / 1000)  # the L2's atomic units slow enough to fill their queue

    def st(opcode, operands="R0, R1, R2", stall=2, write=None, wait=0):
        c = Control(stall=stall, yield_hint=False, write_barrier=write, read_barrier=None, wait_mask=wait, reuse=0)
        return step(opcode, operands, "", c, gpu, {"LDS": 32, "LDSM": 4})

    body = [st("LDS.128", "R4, [R1]", stall=1), st("LDS", "R5, [R1]", stall=1, write=1),
            st("LDSM.16.M88.4", "R8, [R2]", stall=1), st("HMMA.16816.F32", "R8, R4, R6, R8", wait=2),
            st("REDG.E.ADD.F32.FTZ.RN.STRONG.GPU", "desc[UR4][R2.64], R9", stall=1), st("FFMA"), st("IADD3", stall=1)]
    streams = [[st("S2R", "R0, SR_TID.X", write=0), st("IMAD", wait=1)] + body * n + [st("EXIT", "")]
               for n in (30, 22, 41, 17, 26)]
    held = sm.run_sm(streams, 4, gpu, slots=3, steady=steady)
    monkeypatch.setattr(sm, "_HELD", sm._HELD - {"mio_throttle"})
    asked = sm.run_sm(streams, 4, gpu, slots=3, steady=steady)
    assert held == asked and list(held.stalls.items()) == list(asked.stalls.items())  # the order too
    assert held.stalls["mio_throttle"] > held.issued and held.stalls["lg_throttle"] > 0


def test_next_time_is_the_first_change_past_t():
    """sm._next_time (which returns t + 1 as soon as one candidate is at most t + 1) equals max(t + 1, the
    first event, ready cycle of a warp that can issue, pipe's free cycle or queue's threshold past t), on
    random states with fractional times, and raises Deadlock where nothing is in flight."""
    import random
    from types import SimpleNamespace

    import fa_sim.timing.sm as sm
    from fa_sim.timing.gpus import H200

    rng = random.Random(7)
    near = far = 0
    for _ in range(3000):
        t = rng.choice([0.0, 17.0, 1234.5, 98765.25]) + rng.random() * 3
        def when():
            return t + rng.choice([-2.0, 0.0, 0.25, 0.5, 1.0, 1.5, 3.0, 40.0]) * rng.random() * 4
        warps = [SimpleNamespace(pc=rng.randrange(3), end=2, at_bar=rng.random() < 0.2, ready=when())
                 for _ in range(rng.randrange(0, 9))]
        events = [(e, i) for e, i in sorted((when(), i) for i in range(rng.randrange(0, 3))) if e > t]
        pipes = [[when() if rng.random() < 0.3 else 0.0 for _ in range(9)] for _ in range(4)]
        state = {"mio_free": when() + H200.mio_queue * rng.random(), "atomic_free": when() + H200.atomic_queue * rng.random()}
        cands = [e[0] for e in events[:1]] + [w.ready for w in warps if w.pc < w.end and not w.at_bar]
        cands += [p for ps in pipes for p in ps] + [state["mio_free"] - H200.mio_queue,
                                                      state["atomic_free"] - H200.atomic_queue]
        later = [c for c in cands if c > t]
        if not later:
            with pytest.raises(sm.Deadlock):
                sm._next_time(t, warps, events, pipes, state, H200)
            continue
        want = max(t + 1, min(later))
        near += want == t + 1
        far += want > t + 1
        assert sm._next_time(t, warps, events, pipes, state, H200) == want
    assert near > 300 and far > 50  # both the early return and the full scan were taken


def test_add_ones_is_one_addition_at_a_time():
    """sm._add_ones(x, n), which adds a held stall reason's counted cycles at once, equals n additions of 1,
    each rounded, bit for bit: across powers of two (where a float's last bit is rounded away), below 1,
    at and past 2**52 (where ones are rounded away), and on ints."""
    from fa_sim.timing.sm import _add_ones

    rng = np.random.default_rng(5)
    xs = [0.0, 0.3, 1.0, 1.5, 7.0 / 3, 2.0**20 - 0.7, 2.0**20 - 3 + 1 / 3, 1e7 / 3, 2.0**31 - 2.75, 2.0**52 - 5.5,
          2.0**52 - 0.5, 2.0**53 - 3, 2.0**53, 2.0**60 + 2048.0]
    xs += [float(2.0 ** rng.integers(1, 40) - rng.random() * 40) for _ in range(40)]
    for x in xs:
        for n in (0, 1, 2, 3, 7, 64, 1000, 5000):
            one = x
            for _ in range(n):
                one += 1.0
            got = _add_ones(x, n)
            assert got == one and type(got) is float, (x, n, got, one)
    assert _add_ones(5, 3) == 8 and type(_add_ones(5, 3)) is int


def test_a_launchs_shared_anchors_change_nothing():
    """run_sm_prefixes with `known` (time_sm's: each stream's anchor and Step ids found once for its
    steady_size and every run of the launch) equals the runs without it in every field, reused across
    calls, and steady_size with it counts as without it; the streams' anchors are found once."""
    from fa_sim.timing.sm import _Steady, run_sm_prefixes

    H200 = _gpu(False)
    streams = _loop_streams([40, 33, 27, 50, 12, 45])
    known: dict = {}
    assert [steady_size(s, known) for s in streams] == [steady_size(s) for s in streams]
    assert len(known["anchor"]) == len(known["ids"]) == len(streams)
    calls = []
    anchor = _Steady.anchor

    def counted(self, stream):
        calls.append(id(stream) in self._anchor)
        return anchor(self, stream)
    for forks in ([2, 6], [1, 3, 5], [6]):
        plain = run_sm_prefixes(streams, forks, 4, H200, slots=2, steady=True)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(_Steady, "anchor", counted)
            shared = run_sm_prefixes(streams, forks, 4, H200, slots=2, steady=True, known=known)
        assert shared == plain and [dict(r.stalls) for r in shared] == [dict(r.stalls) for r in plain]
    assert calls and all(calls)  # every lookup a hit: found once, by steady_size
