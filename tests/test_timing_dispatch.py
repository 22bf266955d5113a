"""The timing model's CTA dispatch against the GPU's (experiments/timing_dispatch.py): the trace
variant's records, the model's dispatch trace, and the recorded launches of
tests/data/h200/timing_dispatch.npz (the GPU part is marked `gpu`)."""

from __future__ import annotations

import experiment_scripts
import numpy as np
import pytest

import fa_hw
from fa_sim.config import KernelConfig
from fa_sim.contract import KernelBuild, kernel_source
from fa_sim.contract.cubins import compile_build
from fa_sim.problem import Problem
from fa_sim.timing.predict import Rates, dispatch


@pytest.fixture(scope="module")
def td():
    return experiment_scripts.load("timing_dispatch")


def _lse_with_records(td, case, sm_of):
    """An LSE [B, H, Nq] holding the patch's record of every CTA where the kernel writes it."""
    cfg = case.config()
    b, h, nq, _, _ = case.shape
    n_m = -(-nq // cfg.block_m)
    lse = np.random.default_rng(0).standard_normal((b, h, nq)).astype(np.float32)
    words = lse.view(np.uint32).reshape(b * h, nq)
    for bh in range(b * h):
        for m in range(n_m):
            bx = n_m - 1 - m if cfg.heavy_first and case.causal else m  # the kernel's m_block -> blockIdx.x
            i = bh * n_m + bx  # launch order
            t0, t1 = 10_000 + 100 * i, 20_000 + 300 * i + (5 << 32)
            rounds = [1000 + i, 2000 + i, 3000 + i][:min(3, min(nq - m * cfg.block_m, cfg.block_m) - 8)]
            rec = [sm_of(i), bx, t0 & 0xFFFFFFFF, t0 >> 32, t1 & 0xFFFFFFFF, t1 >> 32, 7 * i, 3, *rounds]
            words[bh, m * cfg.block_m:m * cfg.block_m + len(rec)] = rec
    return lse


@pytest.mark.parametrize("tag", ["m64n64d64w4-swizzled", "m64n64d64w4-swizzled-hf"])
def test_decode_reads_each_ctas_record_in_launch_order(td, tag):
    case = td.Case(tag, (1, 3, 201, 201, 64), True)  # 4 Q blocks, the last of 9 rows: one round's start
    lse = _lse_with_records(td, case, lambda i: i % 5)
    rec = td.decode(lse, case)
    i = np.arange(12)
    assert rec["sm"].tolist() == (i % 5).tolist() and rec["cycles"].tolist() == (7 * i).tolist()
    assert rec["start_ns"].tolist() == (100 * i).tolist()  # from the launch's first start
    assert rec["end_ns"].tolist() == (10_000 + 300 * i + (5 << 32)).tolist()
    last = 4 * np.arange(3) + (0 if case.config().heavy_first else 3)  # the CTAs of the 8-row Q block: 1 round
    assert rec["round_n"].tolist() == [1 if j in last else 3 for j in i]
    assert rec["round_cycles"][:, 0].tolist() == (1000 + i).tolist()
    assert rec["round_cycles"][:, 2].tolist() == [0 if j in last else 3000 + j for j in i]


def test_decode_refuses_an_lse_without_records_and_a_q_tail_too_short(td):
    case = td.Case("m64n64d64w4-swizzled", (1, 2, 256, 256, 64), True)
    with pytest.raises(ValueError, match="not the trace's"):
        td.decode(np.zeros((1, 2, 256), np.float32), case)
    short = td.Case("m64n64d64w4-swizzled", (1, 2, 260, 260, 64), True)  # a last Q block of 4 rows
    with pytest.raises(ValueError, match="fewer than 8 rows"):
        td.decode(np.zeros((1, 2, 260), np.float32), short)
    assert short not in td.dispatch_cases("m64n64d64w4-swizzled/")


def test_the_dispatch_trace_is_the_schedule_the_makespan_comes_from():
    """dispatch(trace=): every CTA once, on the SM `ran` lists it on, ending after it started; no
    SM ever holds more than k; the last end is the makespan."""
    prob = Problem(2, 3, 1000, 1000, True, 1.0, KernelConfig.from_tag("m64n64d64w4-swizzled"))
    k, sms = 3, 7
    rates = Rates((900.0, 1400.0, 1800.0), (500.0, 600.0, 700.0), (450.0, 550.0, 650.0), 0.1, None)
    trace: list = []
    extra = np.full(prob.n_m_blocks, 0.1)
    cycles, ran = dispatch(prob, rates, sms, extra, trace=trace)
    assert (cycles, ran) == dispatch(prob, rates, sms, extra)
    tr = np.array(trace, float)
    assert tr[:, 0].tolist() == list(range(prob.n_ctas)) and (tr[:, 3] > tr[:, 2]).all()
    assert tr[:, 3].max() == cycles
    mb = np.arange(prob.n_ctas) % prob.n_m_blocks
    for s in range(sms):
        mine = tr[tr[:, 1] == s]
        assert mb[mine[:, 0].astype(int)].tolist() == ran[s]
        for t in mine[:, 2]:
            assert ((mine[:, 2] <= t) & (mine[:, 3] > t)).sum() <= k


@pytest.mark.slow
def test_the_model_dispatches_like_the_recorded_launches(td):
    """tests/data/h200/timing_dispatch.npz (24 causal cases, heavy_first beside its base): the
    GPU's first wave gives every SM the same number of CTAs, the model's occupancy; later CTAs
    start in launch order (all but a few per cent; on the grids of 6-7 CTAs per SM up to a fifth
    start a little out of it), a freed slot takes its next CTA about half a microsecond later, and
    the SMs ran near the model's fitted clock; the model's tail (span over the SMs' mean last end)
    is the GPU's within 0.03 on average, correlation above 0.85 (docs/timing.md, "CTA dispatch on
    the GPU": 0.026, 0.92)."""
    from fa_sim.timing.gpus import H200

    traced = td.load()
    assert len(traced) == 24 and all(t.sm.shape[0] == 3 for t in traced)
    for t in traced:
        wave = t.first_wave()
        assert len(set(wave[wave > 0].tolist())) == 1 and (wave > 0).sum() == H200.sms
        assert wave.max() == td.model_trace_occupancy(t.case)
        assert abs(t.clock_ghz() / H200.clock_ghz - 1) < 0.05
    assert np.mean([t.in_order() for t in traced]) > 0.95  # 0.82 on the grids of 6-7 CTAs per SM
    gaps = np.concatenate([t.refill_gaps_ns() for t in traced])
    assert 200 < np.median(gaps) < 1000
    model = np.array([td._model_row(t.case)[2] for t in traced])
    gpu = np.array([np.median([t.tail(i) for i in range(3)]) for t in traced])
    assert np.mean(abs(model - gpu)) < 0.03 and np.corrcoef(model, gpu)[0, 1] > 0.85


@pytest.mark.parametrize("tag", ["m64n32d32w4-swizzled-hf", "m128n64d64w4-swizzled-s2", "m128n128d64w8-swizzled"])
def test_the_cta_trace_keeps_the_seed_kernels_occupancy(td, tag):
    """The CTA trace stores its start record at once: the kernel keeps its occupancy (on the H200
    all 210 configs of the measured cases; the register count moves by a few on 10)."""
    from fa_sim.timing.gpus import H200

    cfg = KernelConfig.from_tag(tag)
    regs = [compile_build(KernelBuild(cfg, True, "sm_90", False, kernel_source(src))).usage.registers
            for src in (None, td.PATCH)]
    per_warp = [-(-r * 32 // 256) * 256 for r in regs]  # allocated per warp in units of 256
    assert len({H200.regs_per_sm // (w * cfg.n_warps) for w in per_warp}) == 1


def test_the_round_trace_keeps_one_cta_per_sm_where_it_is_recorded(td):
    """The round trace moves the register count (m64n32d32w4 with heavy_first: 7 CTAs per SM -> 6),
    so its records are kept only where the GPU ran one CTA per SM; on the recorded configs the seed
    kernel runs one CTA per SM too."""
    from fa_sim.contract.cubins import compile_many
    from fa_sim.timing.gpus import H200

    configs = sorted({t.case.config() for t in td.load(td.ROUNDS_DATA)}, key=repr)
    seed = compile_many([KernelBuild(cfg, True, "sm_90", False, kernel_source(None)) for cfg in configs])
    for cfg, ck in zip(configs, seed):
        per_warp = -(-ck.usage.registers * 32 // 256) * 256
        assert min(H200.regs_per_sm // (per_warp * cfg.n_warps), H200.smem_per_sm // (cfg.smem_bytes + 1024)) == 1


def test_a_lone_ctas_later_rounds_take_the_models_time(td):
    """tests/data/h200/timing_rounds.npz (the round trace, grids of one CTA per SM): a K/V round
    after the first takes the model's cycles within 7 % (3 % on average); round 0, which waits for
    the first copies, is the GPU's 350-600 cycles longer (docs/timing.md)."""
    traced = td.load(td.ROUNDS_DATA)
    assert len(traced) == 8 and all(td.model_trace_occupancy(t.case) == 1 for t in traced)
    later, first = [], []
    for t in traced:
        g, m = td.gpu_phases(t), td.model_phases(t.case)
        later.append(g[2] / m[2] - 1)
        first.append(g[1] - m[1])
    assert max(map(abs, later)) < 0.07 and np.mean(np.abs(later)) < 0.04
    assert 300 < min(first) and max(first) < 650


@pytest.mark.gpu
def test_the_trace_variant_on_the_gpu(td):
    """On a GPU: the round-trace variant's O is the seed kernel's, bit for bit; every CTA's record
    decodes, on an SM of the device, ending after it started, its rounds' starts rising, the first
    wave filling every SM alike."""
    if not fa_hw.has_gpu():
        pytest.skip("no NVIDIA GPU / driver here")
    torch = pytest.importorskip("torch")
    from fa_hw.forward import prepare

    case = td.Case("m128n64d64w4-swizzled-hf", (2, 8, 1024, 1024, 64), True)
    q, k, v = td._inputs(case)
    seed = fa_hw.forward(q, k, v, causal=True, config=case.config())
    plan, dev, _ = prepare(q, k, v, True, None, case.config(), kernel=str(td.ROUNDS_PATCH))
    plan.run(dev.stream)
    o, lse = dev.results()
    assert torch.equal(o.view(torch.int16), torch.as_tensor(seed.o).view(torch.int16))
    rec = td.decode(lse.cpu().numpy(), case)
    n_sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert rec["sm"].max() < n_sms and (rec["end_ns"] > rec["start_ns"]).all()
    for n, starts, total in zip(rec["round_n"], rec["round_cycles"], rec["cycles"]):
        assert n >= 1 and (np.diff(starts[:n].astype(np.int64)) > 0).all() and starts[n - 1] < total
    t = td.Traced(case, *(rec[f][None] for f in td.FIELDS))
    wave = t.first_wave()
    assert len(set(wave[wave > 0].tolist())) == 1
    assert 0.5 < t.clock_ghz() < 3.0


def test_the_list_schedule_balances_what_the_static_assignment_piles_up():
    """schedule (the forward's dispatch, over any CTAs' work) and predict_launch's dispatch_scale on a
    hand-worked grid: 2 SMs, 1 slot, CTAs of work 4, 1, 4, 1, ... CTA i on SM i mod 2 gives SM 0
    every long one (16); dispatched, SM 1 takes CTA 2 when its short CTA ends at 1, and both end at
    10. One SM alone refills from its own queue (the static SM's own schedule)."""
    from fa_sim.timing.launch import dispatch_scale
    from fa_sim.timing.predict import schedule

    work = np.array([4.0, 1.0] * 4)
    trace: list = []
    end, ran = schedule(work, 2, [1.0], trace=trace)
    assert end == 10.0 and ran == [[0, 3, 4, 7], [1, 2, 5, 6]]
    assert [t[3] for t in trace] == [4.0, 1.0, 5.0, 5.0, 9.0, 6.0, 10.0, 10.0]  # trace is in take order
    assert schedule(work[::2], 1, [1.0])[0] == 16.0
    assert dispatch_scale(work, np.arange(0, 8, 2), 2, 1) == 10.0 / 16.0
    assert schedule(np.array([3.0, 3.0, 3.0]), 1, [1.0, 1.0]) == (6.0, [[0, 1, 2]])  # two slots, one SM


def test_the_dispatch_scale_is_one_where_the_static_assignment_is_the_gpus():
    """Alike CTAs, or a grid of one wave (every CTA has a slot from the start): the two schedules
    are the same, so predict_launch's time is the SM model's, bit for bit as before."""
    from fa_sim.timing.launch import dispatch_scale

    assert dispatch_scale(np.full(1000, 7.0), np.arange(0, 1000, 132), 132, 3) == 1.0
    falling = np.arange(264, 0, -1, dtype=float)  # SM 0 takes the longest two: 264 + 132
    assert dispatch_scale(falling, np.array([0, 132]), 132, 2) == 1.0  # 264 CTAs in 264 slots
    assert dispatch_scale(falling, np.array([0, 132]), 132, 1) == 265.0 / 396.0  # the shortest first free
