"""Fast launch timing (fa_sim/timing/launch.py, docs/timing.md "How long it takes"): path classes
declared by the launch (KernelLaunch.uniform_axes: one CTA per class on the PTX engine), the
backward timed without the forward (seeded O, LSE, dO), the busiest SM in memoized chunks, and
the launch predictions' disk cache. CPU only: NVRTC and nvdisasm."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("cuda.bindings")

import fa_sim  # noqa: E402
from fa_sim import ptx  # noqa: E402
from fa_sim.backward import backward_launches  # noqa: E402
from fa_sim.observers.branches import BranchRecorder  # noqa: E402
from fa_sim.problem import Problem  # noqa: E402
from fa_sim.config import KernelConfig  # noqa: E402
from fa_sim.reference import random_inputs_backward  # noqa: E402
from fa_sim.splitkv import check_splitkv, splitkv_launches  # noqa: E402
from fa_sim.timing import launch as tl  # noqa: E402
from fa_sim.timing.backward import predict_backward, predict_backward_seeded, seeded_backward_inputs  # noqa: E402
from fa_sim.timing.launches import _host_inputs  # noqa: E402


def _paths(launch, ctas=None):
    rec = BranchRecorder()
    args = [a.copy() if isinstance(a, np.ndarray) else a for a in launch.args]
    ptx.launch(launch.source, launch.grid, launch.block, launch.smem_bytes, args, kernel=launch.kernel,
               macros=launch.macros, observers=[rec], ctas=ctas)
    return rec.paths()


def _n_warps(launch) -> int:
    return -(-launch.block[0] * launch.block[1] * launch.block[2] // 32)


def _check_classes(launch):
    """Every CTA's recorded path in the full launch is its class representative's in the run of the
    representatives alone; the prediction is the same with and without the declaration."""
    assert launch.uniform_axes, launch.kernel
    reps, cls = tl.path_classes(launch.grid, launch.uniform_axes)
    n = int(np.prod(launch.grid))
    assert len(reps) < n  # the declaration saves engine work here
    full, some = _paths(launch), _paths(launch, reps)
    assert {c for c, _ in some} <= set(reps.tolist())  # only the representatives ran
    for c in range(n):
        for w in range(_n_warps(launch)):
            assert full.get((c, w), ()) == some.get((int(reps[cls[c]]), w), ()), (launch.kernel, c, w)
    preds = [tl.predict_launch(launch.source, launch.grid, launch.block, launch.args, launch.smem_bytes,
                               kernel=launch.kernel, macros=launch.macros, uniform_axes=ax, cache=False)
             for ax in ((), launch.uniform_axes)]
    assert preds[0].notes["engine_ctas"] == n and preds[1].notes["engine_ctas"] == len(reps)
    strip = [{k: v for k, v in p.to_json().items() if k != "engine_ctas"} for p in preds]
    assert strip[0] == strip[1]


@pytest.mark.parametrize("causal", [False, True])
def test_backward_batch_head_axis_is_one_path_class(causal):
    """(2, 3, 130, 64): the grid's y (B*H = 6) is declared uniform; the Q / K/V tail blocks of
    length 130 keep x's CTAs on different paths, which stay separate classes."""
    q, k, v, do = random_inputs_backward(2, 3, 130, 130, 64, 0)
    fwd = fa_sim.simulate(q, k, v, causal=causal)
    for launch in backward_launches(q, k, v, fwd.o, fwd.lse, do, causal, None, causal)[0]:
        _check_classes(launch)


@pytest.mark.parametrize("deterministic", [True, False])
def test_backward_block_axis_is_one_path_class_without_mask_or_tail(deterministic):
    """(1, 2, 256, 256, 64) without the mask: no Q or K/V tail block, so grid x is declared uniform
    too and one CTA per launch runs on the engine; the paths of the full launch and the prediction
    (sectors and lines included) are those of the representative. With the mask, a tail or a
    user's variant of the kernel, x stays a class key."""
    q, k, v, do = random_inputs_backward(1, 2, 256, 256, 64, 0)
    fwd = fa_sim.simulate(q, k, v)
    launches = backward_launches(q, k, v, fwd.o, fwd.lse, do, False, None, deterministic)[0]
    for launch in launches:
        assert launch.uniform_axes == (0, 1) and launch.grid[0] > 1, launch.kernel
        _check_classes(launch)
    seeded = seeded_backward_inputs(1, 2, 256, 256, 64)
    assert all(ln.uniform_axes == (1,) for ln in backward_launches(*seeded, True, None, deterministic)[0])
    tail = seeded_backward_inputs(1, 2, 250, 256, 64)
    assert [ln.uniform_axes for ln in backward_launches(*tail, False, None, deterministic)[0]][:2] == [(1,), (0, 1)]
    named = backward_launches(*seeded, False, None, deterministic, kernel=launches[0].source)[0]
    assert all(ln.uniform_axes == (1,) for ln in named)  # the shipped file passed as a variant: not assumed


def test_split_kv_declares_its_head_axis_only_for_one_cache_length():
    prob = Problem(2, 2, 1, 300, False, 0.125, KernelConfig(head_dim=64))
    q, k, v = _host_inputs([(2, 2, 1, 64), (2, 2, 300, 64), (2, 2, 300, 64)], "fp16", 0)
    launches = splitkv_launches(check_splitkv(prob, 3, None), q, k, v)[0]
    assert launches[0].uniform_axes == (1,) and launches[1].uniform_axes == ()
    _check_classes(launches[0])
    uneven = splitkv_launches(check_splitkv(prob, 3, np.array([300, 100], np.int32)), q, k, v)[0]
    assert uneven[0].uniform_axes == ()  # batch b's length cache_seqlens[b] changes its CTAs' loops


def test_split_kv_packed_gqa_declares_its_head_axis():
    """GQA packed (pack_gqa): the split launch's grid y is B*H_k (the packed problem's batch-heads),
    and its CTAs still take one path per (Q block, split) when every sequence has one cache length."""
    prob = Problem(2, 4, 3, 300, False, 0.125, KernelConfig(head_dim=64), heads_k=2)
    q, k, v = _host_inputs([(2, 4, 3, 64), (2, 2, 300, 64), (2, 2, 300, 64)], "fp16", 0)
    plan = check_splitkv(prob, 3, None, pack_gqa=True)
    assert plan.unpacked is prob and plan.grid[1] == 2 * 2
    launches = splitkv_launches(plan, q, k, v)[0]
    assert launches[0].grid == plan.grid and launches[0].uniform_axes == (1,)
    _check_classes(launches[0])
    lens = np.array([300, 100], np.int32)
    assert splitkv_launches(check_splitkv(prob, 3, lens, pack_gqa=True), q, k, v)[0][0].uniform_axes == ()


@pytest.mark.parametrize("causal", [False, True])
def test_backward_paths_do_not_read_o_lse_or_do(causal):
    """The recorded paths of every backward launch are the same for the forward's real O and LSE and
    for seeded ones (seeded_backward_inputs), so fa time --backward runs no forward."""
    q, k, v, do = random_inputs_backward(1, 2, 200, 200, 64, 1)
    fwd = fa_sim.simulate(q, k, v, causal=causal)
    _, _, _, o, lse, do2 = seeded_backward_inputs(1, 2, 200, 200, 64, 5)
    real = backward_launches(q, k, v, fwd.o, fwd.lse, do, causal, None, False)[0]
    seeded = backward_launches(q, k, v, o, lse, do2, causal, None, False)[0]
    for a, b in zip(real, seeded):
        assert _paths(a) == _paths(b), a.kernel
    assert not np.array_equal(np.asarray(fwd.lse), lse)  # the values differ indeed


def test_seeded_backward_prediction_is_the_real_ones_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHSIM_CACHE", str(tmp_path))
    q, k, v, do = random_inputs_backward(1, 2, 128, 128, 64, 0)
    fwd = fa_sim.simulate(q, k, v, causal=True)
    real = predict_backward(q, k, v, fwd.o, fwd.lse, do, True)
    seeded = predict_backward_seeded(1, 2, 128, 128, 64, True)
    assert real.to_json() == seeded.to_json()
    assert len(list((tmp_path / "timing-launches").glob("*.json"))) == 6  # three launches, two arg keys

    def boom(*a, **kw):
        raise AssertionError("predicted again instead of read from the disk cache")

    monkeypatch.setattr(tl, "_predict", boom)
    assert predict_backward_seeded(1, 2, 128, 128, 64, True).to_json() == seeded.to_json()


def test_seeded_backward_bf16_is_the_real_bf16_prediction(tmp_path, monkeypatch):
    """dtype "bf16": seeded bf16 values (float32 arrays of bf16 values, as random_inputs_backward
    gives them) on the FA_BF16 build give the prediction of the forward's real bf16 O and LSE; the
    disk cache keeps fp16 and bf16 apart."""
    monkeypatch.setenv("FLASHSIM_CACHE", str(tmp_path))
    arrays = seeded_backward_inputs(1, 1, 64, 64, 32, 0, "bf16")
    assert all(a.dtype == np.float32 for a in arrays)
    bits = arrays[0].view(np.uint32)
    assert not (bits & np.uint32(0xFFFF)).any()  # exactly bf16 values
    q, k, v, do = random_inputs_backward(1, 1, 64, 64, 32, 0, dtype="bf16")
    fwd = fa_sim.simulate(q, k, v, dtype="bf16")
    real = predict_backward(q, k, v, fwd.o, fwd.lse, do, deterministic=True, dtype="bf16")
    seeded = predict_backward_seeded(1, 1, 64, 64, 32, deterministic=True, dtype="bf16")
    assert real.to_json() == seeded.to_json()
    n = len(list((tmp_path / "timing-launches").glob("*.json")))
    predict_backward_seeded(1, 1, 64, 64, 32, deterministic=True)  # fp16: its own entries
    assert len(list((tmp_path / "timing-launches").glob("*.json"))) == n + 3
    with pytest.raises(ValueError, match="dtype must be 'fp16' or 'bf16'"):
        seeded_backward_inputs(1, 1, 64, 64, 32, 0, "fp8")


COPY = r"""
extern "C" __global__ void copy(const float* x, float* y, int n, int reps) {
  for (int r = 0; r < reps; ++r)
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) y[i] = x[i] + r;
}
"""


def test_sm_chunks_are_memoized_and_close_to_the_whole_run():
    """A grid-stride copy on 132 x 40 CTAs: 40 CTAs on the busiest SM. In chunks of 2k CTAs the SM
    model simulates a few chunk runs instead of all 40 CTAs, within 3 % of the one-piece run (2.5 %
    under it: a memory-bound kernel whose loads in flight span the chunks' boundaries)."""
    n = 132 * 40 * 512
    x = np.arange(n, dtype=np.float32)
    args = [x, np.zeros_like(x), np.int32(n), np.int32(2)]
    kw = dict(grid=(132 * 40,), block=(512,), args=args, kernel="copy", cache=False, uniform_axes=())
    whole = tl.predict_launch(COPY, **kw)
    chunked = tl.predict_launch(COPY, exact_sm_work=0, **kw)
    assert not whole.notes["sm_chunked"] and chunked.notes["sm_chunked"]
    k = whole.occupancy
    assert whole.notes["sm_ctas"] == 40 and k < 7  # more than 3 chunks of 2k
    assert chunked.notes["sm_simulated_instructions"] < whole.notes["sm_simulated_instructions"]
    assert chunked.notes["sm_cycles"] == pytest.approx(whole.notes["sm_cycles"], rel=0.03)


def test_uniform_axes_are_checked():
    with pytest.raises(ValueError, match="uniform_axes must name distinct grid axes"):
        tl.path_classes((2, 2, 1), (3,))
    with pytest.raises(ValueError, match="ctas must be a 1-D sequence of linear CTA ids in \\[0, 4\\)"):
        ptx.launch(COPY, (4,), (32,), 0, [np.zeros(4, np.float32), np.zeros(4, np.float32), 4, 1], ctas=[4])


def test_backward_past_the_limits_is_refused_before_any_engine_run(capsys, monkeypatch):
    """(1, 1, 131072, 128) causal: 2,048 K/V-block classes of up to 4,096 Q blocks each (without the
    mask the K/V blocks are one class, whose one CTA the engine runs); the estimate
    (fa_sim.backward.ESTIMATED_INSTRUCTIONS) refuses it in one line before any launch runs: the
    engine's run of them, about 35 min (the SM's share is only bounded up front, its steady state
    skips the loops' repeats; without it the SM's instructions refuse (1, 1, 65536, 128) too, whose
    engine run, about 9 min with the engine's re-measured cost per step, is allowed)."""
    from fa_sim.cli import main

    def ran(*a, **kw):
        raise AssertionError("the PTX engine ran")

    monkeypatch.setattr(ptx, "launch", ran)
    with pytest.raises(ValueError, match="fa2_bwd_kernel: its 2,048 representative CTAs would run on the PTX engine "
                                         "for about [0-9,]+ min"):
        predict_backward_seeded(1, 1, 131072, 131072, 128, causal=True)
    assert main(["time", "--backward", "--heads", "1", "--seqlen", "131072", "--head-dim", "128", "--causal"]) == 2
    err = capsys.readouterr().err.strip()
    assert "the timing model allows" in err and len(err.splitlines()) == 1, err
    monkeypatch.setattr(tl, "STEADY", False)
    with pytest.raises(ValueError, match="fa2_bwd_kernel: the busiest SM.s 8 CTAs need about [0-9,]+ warp "
                                         "instructions simulated"):
        predict_backward_seeded(1, 1, 65536, 65536, 128, causal=True)


def test_estimates_are_close_to_the_counts():
    """fa_sim.backward.ESTIMATED_INSTRUCTIONS against the walks' exact counts on a causal shape it was
    not counted on: within 10 % per kernel."""
    from fa_sim.backward import estimated_cta_instructions
    from fa_sim.contract.backward import BackwardConfig

    pred = predict_backward_seeded(1, 1, 300, 300, 96, True)
    est = estimated_cta_instructions(BackwardConfig(96), 300, 300, True, False)
    for name, p in pred.kernels.items():
        assert float(est[name].sum()) == pytest.approx(p.instructions, rel=0.10), name


def test_a_backward_config_reaches_the_timed_launches_and_keeps_its_own_cache_entries(tmp_path, monkeypatch):
    """predict_backward_seeded(config=): the tuned candidate's launches are timed (its grid of
    block_n = 16 n_warps keys per CTA, its build's macros: FA_DQ_RED for dq_red 2), each with its own
    disk-cache entries; the default's are left as they were."""
    from fa_sim.contract.backward import BackwardConfig

    monkeypatch.setenv("FLASHSIM_CACHE", str(tmp_path))
    base = predict_backward_seeded(1, 1, 256, 256, 64)
    n = len(list((tmp_path / "timing-launches").glob("*.json")))
    cfg = BackwardConfig(64, block_m=64, n_warps=8, dq_red=2)
    tuned = predict_backward_seeded(1, 1, 256, 256, 64, config=cfg)
    main = "fa2_bwd_kernel"
    assert base.kernels[main].notes["ctas"] == 4 and tuned.kernels[main].notes["ctas"] == 2  # 64 and 128 keys a CTA
    assert len(list((tmp_path / "timing-launches").glob("*.json"))) == n + 3
    assert predict_backward_seeded(1, 1, 256, 256, 64).to_json() == base.to_json()
