"""The timing model (fa_sim.timing): its units on synthetic instruction streams, the grid's
instruction count against Nsight Compute, the measured H200 cases replayed, and its interfaces.

- Units: one SM of fa_sim.timing.sm on streams whose time follows from the rules alone (stall
  counts, the tensor pipe's rate, the shared-memory pipe's wavefronts, scoreboards, a barrier, a
  cp.async group), each against the closed-form cycle count.
- Nsight Compute: `smsp__inst_executed.sum` of 12 kernels profiled on the H200
  (tests/data/h200/timing_ncu.json) against the model's dynamic SASS stream of every CTA.
- Replay: a fixed sample of the validation half of tests/data/h200/timing_cases.json (measured
  with experiments/timing_measure.py; the parameters were fitted on the other half): the
  predictions must stay within the accuracy the README reports.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("cuda.bindings")

from fa_sim.config import KernelConfig  # noqa: E402
from fa_sim.problem import Problem  # noqa: E402
from fa_sim.timing import GPUS, predict, predict_time  # noqa: E402
from fa_sim.timing.program import step  # noqa: E402
from fa_sim.timing.sass import Control  # noqa: E402
from fa_sim.timing.sm import run_sm  # noqa: E402

DATA = Path(__file__).parent / "data" / "h200"
H200 = GPUS["h200"]
NONE = 7  # no scoreboard


def ctl(stall=1, wb=NONE, rb=NONE, wait=0) -> Control:
    return Control.decode((stall | (1 << 4) | (wb << 5) | (rb << 8) | (wait << 11)) << 41)


def ins(opcode, operands="R0, R1, R2", stall=1, wb=NONE, rb=NONE, wait=0, wavefronts=None, gpu=H200):
    return step(opcode, operands, "", ctl(stall, wb, rb, wait), gpu, wavefronts or {})


EXIT = ins("EXIT", "")


# ---- units -------------------------------------------------------------------------------------------
def test_stall_counts_pace_one_warp():
    stream = [ins("FFMA", stall=4)] * 100 + [EXIT]
    assert run_sm([stream], 1, H200).cycles == 4 * 100 + 1


def test_four_warps_issue_in_their_own_sub_partitions():
    stream = [ins("FFMA", stall=1)] * 100 + [EXIT]
    one = run_sm([stream], 1, H200).cycles
    assert run_sm([stream], 4, H200).cycles == one  # one warp per sub-partition: no contention
    assert run_sm([stream], 8, H200).cycles == 2 * 101  # two per sub-partition share one issue slot


def test_the_tensor_pipe_rate():
    gpu = H200.with_(hmma_cycles=8)
    stream = [ins("HMMA.16816.F32", stall=1, gpu=gpu)] * 50 + [EXIT]
    assert run_sm([stream], 1, gpu).cycles == pytest.approx(8 * 49 + 1 + 1)


def test_shared_memory_wavefronts_pace_the_sm():
    """LDSM.x4 of 4 wavefronts each: 4 warps x 25 of them need 400 cycles of the shared-memory pipe,
    which the last one's consumer waits for; 8-way conflicts (32 wavefronts) take 8 times as long."""
    gpu = H200.with_(mio_queue=10**6, smem_latency=20)

    def stream(wf):
        load = ins("LDSM.16.M88.4", "R4, [R8]", wb=1, wavefronts={"LDSM": wf}, gpu=gpu)
        return [load] * 25 + [ins("HMMA.16816.F32", "R0, R4, R6, R0", wait=1 << 1, gpu=gpu), EXIT]

    run = run_sm([stream(4)], 4, gpu)
    assert run.busy["SMEM"] == 400 and run.cycles == pytest.approx(400 + 20 + 2, abs=2)
    assert run_sm([stream(32)], 4, gpu).cycles == pytest.approx(8 * 400 + 20 + 2, abs=2)


def test_a_scoreboard_holds_the_consumer_until_the_result():
    gpu = H200.with_(mufu_latency=30)
    stream = [ins("MUFU.EX2", "R1, R2", wb=2, gpu=gpu), ins("FFMA", wait=1 << 2, gpu=gpu), EXIT]
    run = run_sm([stream], 1, gpu)
    assert run.cycles == 30 + 1 + 1  # issue at 0, release at 30, the consumer at 30, EXIT at 31
    assert run.stalls["short_scoreboard"] > 0


def test_a_barrier_releases_every_warp_after_the_last_arrival():
    gpu = H200.with_(bar_latency=20)
    stream = [ins("FFMA", stall=3)] * 10 + [ins("BAR.SYNC.DEFER_BLOCKING", "0x0"), EXIT]
    run = run_sm([stream], 8, gpu)  # 2 warps per sub-partition: the second arrives 10 cycles later
    assert run.cycles == pytest.approx(31 + 20 + 1, abs=2)
    assert run.stalls["barrier"] > 0


def test_a_cp_async_group_completes_after_the_global_latency():
    gpu = H200.with_(global_latency=500, global_bytes_per_cycle=512.0)
    stream = [ins("LDGSTS.E.BYPASS.128", "[R1], desc[UR4][R2.64]", rb=1, wavefronts={"LDGSTS": 4}, gpu=gpu),
              ins("LDGDEPBAR", "", wb=0, gpu=gpu), ins("DEPBAR.LE", "SB0, 0x0", gpu=gpu), EXIT]
    run = run_sm([stream], 1, gpu)
    assert 500 <= run.cycles <= 510
    assert run.stalls["long_scoreboard"] >= 490


def test_the_copy_latency_rises_with_the_share_of_slots_filled():
    """GpuModel.loaded: from global_latency_idle (extrapolated to an empty SM) to global_latency with
    every CTA slot filled, linearly; the SM run of one copy group takes it."""
    assert (H200.global_latency_idle, H200.global_latency) == (200, 450)
    assert [H200.loaded(j, 4).global_latency for j in (1, 2, 4)] == [262, 325, 450]
    assert H200.loaded(1, 1).global_latency == 450 and H200.loaded(1, 4).global_latency_idle is None
    flat = H200.with_(global_latency_idle=None)
    assert flat.loaded(1, 4) is flat
    gpu = H200.with_(global_bytes_per_cycle=512.0)
    stream = [ins("LDGSTS.E.BYPASS.128", "[R1], desc[UR4][R2.64]", rb=1, wavefronts={"LDGSTS": 4}, gpu=gpu),
              ins("LDGDEPBAR", "", wb=0, gpu=gpu), ins("DEPBAR.LE", "SB0, 0x0", gpu=gpu), EXIT]
    alone, full = (run_sm([stream], 1, gpu.loaded(j, 4)).cycles for j in (1, 4))
    assert 262 <= alone <= 272 and 450 <= full <= 460


def test_ctas_queue_for_the_slots():
    stream = [ins("FFMA", stall=2)] * 50 + [EXIT]
    assert run_sm([stream] * 3, 4, H200, slots=1).cycles == pytest.approx(3 * 101, abs=3)


# ---- against Nsight Compute ------------------------------------------------------------------------
NCU = json.loads((DATA / "timing_ncu.json").read_text())["kernels"]
# and the small launches of m64n32d32w4 with a query tail (block_m 64 = 2 block_n: at N = 333 and 1500 the
# causal diagonal CTA's keys end in its first diagonal key block, so it masks one round, not two)
NCU += [r for r in json.loads((DATA / "timing_ncu_small.json").read_text())["kernels"]
        if r["key"].startswith("m64n32d32w4") and int(r["key"].split("/")[1].split("x")[2]) % 64]


def _problem(key: str) -> Problem:
    tag, shape, causal = key.split("/")[:3]
    b, h, nq, nk, _ = map(int, shape.split("x"))
    return Problem(b, h, nq, nk, causal == "causal", 1.0, KernelConfig.from_tag(tag))


@pytest.mark.parametrize("row", NCU, ids=lambda r: r["key"])
def test_executed_instructions_equal_nsight_compute(row):
    """Every warp's path through the SASS (its rounds, masked rounds, first and last round, copy
    arms, query tail, an early exit: the functional run walked through the SASS,
    fa_sim.timing.walk) summed over the grid: Nsight Compute's smsp__inst_executed.sum within
    0.02 % either way. Measured on the walk: equal on 12 of these 14; 192 fewer (2 per warp whose
    LSE rows all lie past N_q) on m128n32d128w8 at N = 1500, which the same kind of warps of the
    other query-tail launches do not show, and 16 more on m64n32d32w4 causal at N = 333 (0.0002 %
    and 0.005 %). The region model before it issued 2 instructions too many for every such warp."""
    from fa_sim.timing.predict import grid_instructions, kernel_model

    prob = _problem(row["key"])
    model = kernel_model(prob.config, prob.causal, "sm_90")
    executed = row["smsp__inst_executed.sum"]
    assert abs(grid_instructions(model, prob) - executed) <= executed * 2e-4


SASS_COUNTS = json.loads((DATA / "timing_sass_counts.json").read_text())["kernels"]


@pytest.mark.parametrize("row", SASS_COUNTS, ids=lambda r: r["key"])
def test_each_sass_instruction_executes_as_often_as_nsight_compute_counts(row):
    """Nsight Compute's source page (Instructions Executed per SASS instruction) of a causal launch
    against the model's dynamic stream, instruction by instruction: equal everywhere. (The epilogue
    takes __frcp_rn's MUFU.RCP arm, never its slow-path call: a row that is not empty sums at
    least 1; with the call arm the totals agreed but 16 instructions did not.)"""
    from collections import Counter

    from fa_sim.timing.predict import cta_classes, kernel_model

    prob = _problem(row["key"])
    model = kernel_model(prob.config, prob.causal, "sm_90")
    opcodes = {i.addr: i.opcode for b in model.sass.blocks.values() for i in b.instrs}
    counts: Counter = Counter()
    for cls, n in Counter(cta_classes(prob)).items():
        for i in model.cta_walk(*cls):
            counts[i.addr] += n * prob.config.n_warps * prob.batch * prob.heads
    for offset, opcode, executed in row["instructions"]:
        addr = int(offset, 16)
        if addr in opcodes:  # the kernel's reachable blocks
            assert opcodes[addr] == opcode, (offset, "the profiled cubin differs from this one")
            assert counts[addr] == executed, (offset, opcode)
        else:  # the slow-path callee, the padding after EXIT: never executed
            assert executed == 0, (offset, opcode)


# ---- the measured cases, replayed -----------------------------------------------------------------
CASES = [c for c in json.loads((DATA / "timing_cases.json").read_text())["cases"] if c["half"] == "validate"][::8]


@pytest.mark.slow  # one test of about two minutes: a parallel run starts it first (conftest.py)
def test_validation_cases_replay_within_the_reported_accuracy():
    """16 of the 127 held-out cases (every 8th): mean absolute percentage error at most 10 % and
    rank correlation at least 0.95, the issue's goals (the README reports all 127: 5.2 %, 0.996)."""
    measured, predicted = [], []
    for c in CASES:
        b, h, nq, nk, _ = c["shape"]
        prob = Problem(b, h, nq, nk, c["causal"], 1.0, KernelConfig.from_tag(c["tag"]))
        kernel = str(Path(__file__).parents[1] / c["kernel"]) if c["kernel"] else None
        measured.append(c["kernel_ms"])
        predicted.append(predict(prob, "h200", kernel).kernel_ms)
    m, p = np.array(measured), np.array(predicted)
    mape = float(np.mean(np.abs(p / m - 1)))
    ranks = np.corrcoef(np.argsort(np.argsort(m)), np.argsort(np.argsort(p)))[0, 1]
    assert len(CASES) == 16 and mape <= 0.10 and ranks >= 0.95, (mape, ranks)


SMALL = [c for c in json.loads((DATA / "timing_small.json").read_text())["cases"]
         if c["tag"] == "m64n64d64w4-swizzled" and c["kernel_ms"] > 0.019 and c["shape"][1] < 132]


def test_small_launches_replay_with_the_launch_latency():
    """The small launches of the seed config that the GPU, not the host's launch rate, times (over
    19 us: one CTA of 64 rounds; N = 1000 and 1500 causal, with query tails, 64 and 96 CTAs):
    each within 10 % (+1.9 %, -1.8 %, +2.9 % since a launch of one wave pays no fill; -0.1 %, +5.1 %,
    +2.2 % with the first wave's share of it; -3.0 %, +3.9 %, -1.8 % with the flat copy latency).
    With the overhead of a full first wave (9.1 us) charged to every launch, as before the launch
    latency and the first wave's fill were told apart: +8 %, +19 %, +20 %."""
    assert len(SMALL) == 3
    for c in SMALL:
        b, h, nq, nk, _ = c["shape"]
        prob = Problem(b, h, nq, nk, c["causal"], 1.0, KernelConfig.from_tag(c["tag"]))
        assert predict(prob, "h200").kernel_ms == pytest.approx(c["kernel_ms"], rel=0.10), c["key"]
    # one wave pays the launch latency alone, however many slots it fills; a refill pays the fill too
    assert H200.overhead_us(1, 4) == H200.overhead_us(H200.sms * 4, 4) < 5 < 9 < H200.overhead_us(H200.sms * 4 + 1, 4)


@pytest.mark.slow
@pytest.mark.parametrize("tag, shape, causal", [("m64n64d64w4-swizzled", (1, 2, 256, 256), False),
                                                ("m64n64d64w4-swizzled", (2, 8, 512, 512), True),
                                                ("m128n64d128w8-swizzled", (1, 4, 1024, 1024), False),
                                                ("m128n128d64w8-swizzled-hf", (2, 16, 1024, 1024), True)])
def test_representative_ctas_agree_with_timing_every_cta(tag, shape, causal):
    """The representative CTAs (steady rounds timed staggered, the first wave's fixed cost at its
    own occupancy, masked rounds timed) against every CTA timed on its SM: within 1 % (the issue
    asks 2 %)."""
    prob = Problem(*shape, causal, 1.0, KernelConfig.from_tag(tag))
    fast, exact = predict(prob).kernel_ms, predict(prob, exact=True).kernel_ms
    assert fast == pytest.approx(exact, rel=0.01)


# ---- interfaces -----------------------------------------------------------------------------------
def test_predict_time_names_its_bad_arguments():
    with pytest.raises(ValueError, match="gpu must be one of"):
        predict_time(1, 1, 128, gpu="b200")
    with pytest.raises(ValueError, match="head_dim 128 disagrees"):
        predict_time(1, 1, 128, head_dim=128, config=KernelConfig(head_dim=32))


def test_fa_time_prints_the_prediction_and_json(capsys):
    from fa_sim.cli import main

    assert main(["time", "--batch", "1", "--heads", "2", "--seqlen", "256"]) == 0
    out = capsys.readouterr().out
    assert "predicted kernel time" in out and "limiter" in out and "short_scoreboard" in out
    assert main(["time", "--batch", "1", "--heads", "2", "--seqlen", "256", "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["kernel_ms"] > 0 and {"limiter", "pipes", "stalls", "issue_slots", "achieved_occupancy",
                                     "instructions"} <= set(obj)
    with pytest.raises(SystemExit) as info:  # argparse's one line (fa_sim.cli.Parser)
        main(["time", "--seqlen", "256", "--gpu", "b200"])
    assert info.value.code == 2 and "invalid choice: 'b200'" in capsys.readouterr().err


def test_the_a100_table_is_marked_not_validated(capsys):
    from fa_sim.cli import main

    assert main(["time", "--batch", "1", "--heads", "2", "--seqlen", "256", "--gpu", "a100"]) == 0
    assert "(not validated)" in capsys.readouterr().out


def test_the_issue_timeline_has_a_track_per_warp(tmp_path, capsys):
    """fa time --perfetto: Chrome trace events, one track per resident warp, one slice per issued
    instruction, each from its issue cycle for its stall count."""
    from fa_sim.cli import main

    out = tmp_path / "issue.json"
    assert main(["time", "--batch", "1", "--heads", "2", "--seqlen", "256", "--perfetto", str(out)]) == 0
    trace = json.loads(out.read_text())
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    tracks = {(e["pid"], e["tid"]) for e in slices}
    assert len(tracks) == trace["otherData"]["ctas"] * 4  # 4 warps per CTA of the seed config
    assert all(e["dur"] >= 1 and e["ts"] >= 0 for e in slices)
    assert {e["name"] for e in slices} >= {"HMMA", "LDSM", "MUFU", "BAR", "EXIT"}
    assert max(e["ts"] for e in slices) < trace["otherData"]["cycles"]
    assert main(["time", "--seqlen", "256", "--perfetto", str(out)]) == 2  # exists: refused without --force


MICRO = json.loads((DATA / "timing_microbench.json").read_text())["rows"]


@pytest.mark.parametrize("name", sorted(MICRO))
def test_the_model_units_against_the_h200_microbenchmarks(name):
    """fa_sim.calibrate.timing_microbench: straight-line kernels of one instruction kind (tensor pipe,
    MUFU rate and latency, fma pipe, shared-memory pipe with and without 8-way conflicts); the model
    runs the same SASS and must take the H200's cycles within 6 % (measured: 0-6 %; the MUFU latency is
    the kernel fit's 18 cycles where this benchmark says 17)."""
    from fa_sim.calibrate.timing_microbench import model_cycles

    assert model_cycles(name) == pytest.approx(MICRO[name]["cycles"], rel=0.06)


H100_MICRO = json.loads((DATA.parent / "h100" / "timing_microbench_h100.json").read_text())["rows"]
#: the H100 rows greedy-then-oldest (GpuModel.issue_in_turn off) misses by more than 6 %: the XU-bound warps
#: take the XU in turn on the GPU (docs/timing.md, "Features", softcap: the issue_in_turn rule)
H100_KNOWN_GAPS = {"tanh_hmma_16w": "5104 cycles against 5995", "ex2_ldsm_16w": "2066 cycles against 2223"}
#: rows both issue rules miss: div.rn's rate in 16 warps (MUFU.RCP, FCHK, the FFMAs and the branch of each
#: division, 8 chains per warp) - the model 5795 cycles greedy-then-oldest, 5030 in turn, the H100 4616
H100_GAPS_BOTH = {"div_rate": "5795 (in turn 5030) cycles against 4616"}


def _h100_case(name: str, in_turn: bool):
    why = H100_GAPS_BOTH.get(name) or (None if in_turn else H100_KNOWN_GAPS.get(name))
    return pytest.param(name, in_turn, marks=pytest.mark.xfail(strict=True, reason=why)) if why else (name, in_turn)


@pytest.mark.parametrize("name, in_turn", [_h100_case(n, t) for n in sorted(H100_MICRO) for t in (False, True)])
def test_the_model_units_against_the_h100_microbenchmarks(name, in_turn):
    """The same benchmarks recorded on an H100 (tests/data/h100/timing_microbench_h100.json), with the
    softcap's probes (docs/timing.md, "Features"): the model within the same 6 %, under either issue
    rule (GpuModel.issue_in_turn). Greedy-then-oldest misses two rows (strict xfail: a change that
    meets them must say so here): tanh_hmma_16w (5995 cycles; 7526 were the XU and the tensor pipe
    never to overlap) and ex2_ldsm_16w; issue_in_turn meets both (5740 and 2277). div.rn's chain
    (each step (x + 1) / d, never a zero numerator: the first recording's chain 0 divided lane 0's zero
    and took the slow path, 9396 cycles) is met (1968 cycles, the model 2071); div.rn's rate in 16
    warps is missed by both rules (H100_GAPS_BOTH). Recorded again on the H100 in round 40: every other
    row within 4 cycles of the first recording."""
    from fa_sim.calibrate.timing_microbench import model_cycles
    from fa_sim.timing import GPUS

    gpu = GPUS["h200"].with_(issue_in_turn=in_turn)
    assert model_cycles(name, gpu) == pytest.approx(H100_MICRO[name]["cycles"], rel=0.06)


# issue 38's softcap benchmarks: each one's SASS mix per warp (MUFU.EX2, MUFU.RCP, HMMA, LDSM)
SOFTCAP_BENCHES = {"rcp_rate": (0, 256, 0, 0), "ex2_rate_16w": (64, 0, 0, 0), "tanh_rate_16w": (64, 64, 0, 0),
                   "tanh_hmma_16w": (64, 64, 128, 0), "ex2_ldsm_16w": (64, 0, 0, 32)}


@pytest.mark.parametrize("name", sorted(SOFTCAP_BENCHES))
def test_the_softcap_benchmarks_compile_to_the_mix_they_measure(name):
    """The MUFU benchmarks the softcap's error calls for (docs/timing.md, "Features") are the straight-line
    SASS they are named for: no division (FCHK, a branch), nothing folded away, every ldmatrix kept; and
    where one pipe bounds them the model takes that pipe's cycles (8 per MUFU on its sub-partition's XU,
    4 sub-partitions; rcp_rate's chains are MUFU.RCP and an FADD, 256 per warp)."""
    from collections import Counter

    from fa_sim.calibrate.timing_microbench import model_cycles, source
    from fa_sim.contract.nvrtc import compile_cubin
    from fa_sim.contract.sass import disassemble
    from fa_sim.timing import GPUS
    from fa_sim.timing.sass import parse

    cubin, _ = compile_cubin(source(name), name=f"{name}.cu", arch="sm_90")
    instrs = parse(disassemble(cubin, encodings=True))
    clocks = [n for n, i in enumerate(instrs) if i.opcode.startswith("CS2R") and "SR_CLOCK" in i.operands]
    assert len(clocks) == 2
    ops = Counter(i.opcode.split(".")[0] if i.opcode.startswith(("BRA", "FCHK")) else i.opcode
                  for i in instrs[clocks[0]:clocks[1]])  # the timed block
    assert (ops["MUFU.EX2"], ops["MUFU.RCP"], ops["HMMA.16816.F32"], ops["LDSM.16.M88.4"]) == SOFTCAP_BENCHES[name]
    assert ops["FCHK"] == 0 and ops["BRA"] == 0
    h200 = GPUS["h200"]
    xu = {"rcp_rate": 256, "ex2_rate_16w": 4 * 64, "tanh_rate_16w": 4 * 128}.get(name)
    if xu is not None:  # XU-bound: the MUFUs of a sub-partition's warps, 8 cycles each
        assert model_cycles(name, h200) == pytest.approx(xu * h200.xu_cycles, rel=0.06)


POLICY = json.loads((DATA / "timing_microbench.json").read_text())["policy"]


def _finishes(ends: np.ndarray, warps: int) -> tuple[np.ndarray, np.ndarray]:
    """Per sub-partition (warp w runs on w mod 4): the first and the last warp's end clock."""
    per = ends.reshape(warps // 4, 4)
    return per.min(0), per.max(0)


@pytest.mark.parametrize("in_turn", [False, True])
@pytest.mark.parametrize("name", sorted(POLICY))
def test_the_issue_policy_against_the_h200_probe(name, in_turn):
    """The warp scheduler's issue policy (fa_sim.calibrate.timing_microbench's POLICY probes: 2-4
    warps per sub-partition, each the same block of FFMAs). On the H200, with 8 independent chains
    (one warp can issue every cycle) a sub-partition's first warp finishes after one warp's block
    (~390 cycles) and its last after k blocks: greedy, one warp at a time. With one dependent chain
    all interleave and finish within ~25 cycles of each other. The model (greedy-then-oldest, and with
    GpuModel.issue_in_turn greedy-then-in-turn: 0.6-6.6 %) must
    show the same pattern, each sub-partition's first and last finish within 8 % of the H200's
    (medians over 20 launches; measured 0-6.6 %, the dependent chain in 16 warps 5.9 %); a
    loose-round-robin scheduler would finish the first independent warp ~k times later."""
    from fa_sim.calibrate.timing_microbench import model_policy

    rec = POLICY[name]
    warps, runs = rec["warps"], np.array(rec["runs"], float)[:, :, 1]
    hw = np.median([np.stack(_finishes(r, warps)) for r in runs], axis=0)
    from fa_sim.timing import GPUS

    model = np.stack(_finishes(np.array(model_policy(name, GPUS["h200"].with_(issue_in_turn=in_turn))[1]), warps))
    greedy = name.startswith("ffma_indep")
    for first, last in (hw, model):  # the pattern: staggered (greedy) or together (interleaved)
        stagger = (last - first) / last
        assert (stagger > 0.4).all() if greedy else (stagger < 0.1).all(), (name, first, last)
    np.testing.assert_allclose(model, hw, rtol=0.08)


def test_sm_rates_are_timed_once_per_config_and_change_no_prediction():
    """The SM rates depend on the kernel, the GPU and the occupancy, not on the shape: a second shape
    of the same config reuses them (a cache hit, no SM run) and predicts exactly what a fresh run gives."""
    import importlib

    pm = importlib.import_module("fa_sim.timing.predict")  # the module (the package's `predict` is its function)
    cfg = KernelConfig()
    pm.predict_probed(Problem(1, 4, 512, 512, True, 1.0, cfg))
    hits = pm._rates.cache_info().hits
    cached = pm.predict_probed(Problem(2, 8, 1000, 1000, True, 1.0, cfg))
    assert pm._rates.cache_info().hits == hits + 1
    pm._rates.cache_clear()
    fresh = pm.predict_probed(Problem(2, 8, 1000, 1000, True, 1.0, cfg))
    assert (fresh.kernel_ms, fresh.stalls, fresh.pipes, fresh.instructions) == \
        (cached.kernel_ms, cached.stalls, cached.pipes, cached.instructions)


def test_the_stall_comparison_sets_the_models_reasons_beside_nsight_computes(tmp_path, capsys):
    """experiments/timing_stalls.py: per recorded profile the GPU's stall reasons (as recorded) and
    the model's (as predict gives them); a pattern that matches nothing is argparse's error."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "experiments" / "timing_stalls.py"
    spec = importlib.util.spec_from_file_location("timing_stalls", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    key = "m128n32d128w8-swizzled/2x24x1500x1500x128/full"
    out = tmp_path / "s.json"
    assert mod.main(["--only", "m128n32d128w8", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())
    recorded = next(k for k in json.loads((DATA / "timing_ncu.json").read_text())["kernels"] if k["key"] == key)
    pred = predict(mod.problem(key), "h200")
    assert row["key"] == key and row["gpu"]["dispatch_stall"] == recorded[mod.NCU.format("dispatch_stall")]
    assert row["model"]["barrier"] == pred.stalls["barrier"] and row["model"]["dispatch_stall"] == 0.0
    assert 0 < row["bank_conflicted"] < 1
    text = capsys.readouterr().out
    assert f"| {key} | gpu | {recorded[mod.NCU.format('wait')]:.2f} |" in text and "| model |" in text
    with pytest.raises(SystemExit):
        mod.main(["--only", "no-such-kernel"])
    assert "matches none" in capsys.readouterr().err


def test_bank_conflicts_count_registers_the_reuse_cache_does_not_supply():
    """Two or more source registers in one bank (number mod 2) conflict unless the previous
    instruction kept the register for reuse in the same operand slot."""
    import importlib.util
    from types import SimpleNamespace as NS

    spec = importlib.util.spec_from_file_location(
        "timing_stalls", Path(__file__).resolve().parents[1] / "experiments" / "timing_stalls.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    ins = [NS(addr=0, operands="R0, R2, R4, R7"),    # R2, R4 in bank 0: conflicted; keeps R2 (slot a)
           NS(addr=16, operands="R1, R2, R4, R9"),   # R2 from the reuse cache: R4 alone in bank 0
           NS(addr=32, operands="R3, R5, -R9, RZ"),  # R5, R9 in bank 1: conflicted
           NS(addr=48, operands="R3, R5, 0x3f800000, R6")]  # one register per bank
    ctl = {0: NS(reuse=0b0001), 16: NS(reuse=0), 32: NS(reuse=0), 48: NS(reuse=0)}
    assert mod.bank_conflicted(ins, ctl) == 2 / 4
    ctl[0] = NS(reuse=0)  # without the reuse, the second conflicts too
    assert mod.bank_conflicted(ins, ctl) == 3 / 4


def _experiment(name: str):
    import importlib.util
    import sys

    path = Path(__file__).resolve().parents[1] / "experiments" / f"{name}.py"
    sys.path.insert(0, str(path.parent))  # timing_validate imports its neighbours as a script does
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        mod = sys.modules[name] = importlib.util.module_from_spec(spec)  # dataclasses look their module up
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(path.parent))
    return mod


def test_the_paired_measurements_hold_every_option_beside_its_base():
    """tests/data/h200/timing_pairs.json (timing_measure.py --pairs): the 62 options of the report,
    each with the base the report sets it beside, three passes of nine interleaved rounds each, and
    its speedup and range recomputed from the recorded batch medians."""
    measure, validate = _experiment("timing_measure"), _experiment("timing_validate")
    doc = json.loads((DATA / "timing_pairs.json").read_text())
    rows = {r["key"]: r for r in doc["pairs"]}
    pairs = measure.option_pairs(measure.cases())
    assert len(pairs) == 62 and {o.key: b.key for o, b in pairs} == {k: r["base"] for k, r in rows.items()}
    for r in rows.values():
        assert len(r["passes"]) == doc["meta"]["passes"] == 3
        assert all(len(p["base_ms"]) == len(p["option_ms"]) == doc["meta"]["rounds"] for p in r["passes"])
        s = measure.pair_summary(r["passes"])
        assert (s["speedup"], s["low"], s["high"]) == (r["speedup"], r["low"], r["high"])
        assert r["low"] <= r["speedup"] <= r["high"]  # the pooled median lies between the passes' medians
    cases = validate.load()
    pred = {c.key: 1.0 for c in cases}  # predictions do not enter which pairs are formed
    signs = validate.option_signs(cases, pred, validate.load_pairs())
    assert {g.key for g in signs} == set(rows) and all(g.measured == rows[g.key]["speedup"] for g in signs)
    apart = {g.key: g for g in validate.option_signs(cases, pred)}
    assert all(g.timed_apart == apart[g.key].measured for g in signs)


def test_a_pair_measured_beside_another_base_is_refused():
    validate = _experiment("timing_validate")
    cases = validate.load()
    pairs = validate.load_pairs()
    key = next(iter(pairs))
    pairs[key] = {**pairs[key], "base": "m64n64d64w4-plain/1x1x64x64x64/full"}
    with pytest.raises(ValueError, match="paired with m64n64d64w4-plain"):
        validate.option_signs(cases, {c.key: 1.0 for c in cases}, pairs)


def test_a_pairs_summary_is_the_median_of_its_rounds_and_the_range_of_its_passes():
    measure = _experiment("timing_measure")
    passes = [{"base_ms": [1.0, 1.1, 1.0], "option_ms": [0.5, 1.0, 1.0]},   # +100 %, +10 %, 0
              {"base_ms": [1.0, 1.0, 1.0], "option_ms": [1.25, 1.0, 0.8]}]  # -20 %, 0, +25 %
    s = measure.pair_summary(passes)
    assert s["pass_speedups"] == pytest.approx([0.1, 0.0]) and s["speedup"] == pytest.approx(0.05)
    assert (s["low"], s["high"]) == (min(s["pass_speedups"]), max(s["pass_speedups"]))


def test_pairs_pair_the_options_only_selects_with_their_bases(capsys):
    """timing_measure.py --pairs --list (no GPU): --only picks options, each beside its base even
    where the pattern does not match the base; --small and bad counts are refused."""
    measure = _experiment("timing_measure")
    assert measure.main(["--pairs", "--list", "--only", "s2-qr/1x16x8192"]) == 0
    out = capsys.readouterr()
    assert out.out.splitlines() == ["m128n128d64w8-swizzled-s2-qr/1x16x8192x8192x64/causal beside "
                                    "m128n128d64w8-swizzled/1x16x8192x8192x64/causal"] and "1 pairs" in out.err
    for argv in (["--pairs", "--small"], ["--pairs", "--passes", "0"]):
        with pytest.raises(SystemExit):
            measure.main(argv)
    with pytest.raises(SystemExit, match="no option case"):
        measure.main(["--pairs", "--list", "--only", "^m64n64d64w4-plain/"])
