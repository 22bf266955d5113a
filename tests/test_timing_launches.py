"""The timing of packed batches and split-KV decoding launch by launch (fa_sim/timing/launches.py):
`fa_sim.predict_time(..., cu_seqlens_q=, cu_seqlens_k=)` / `(..., splits=, cache_seqlens=)` and
`fa time --seqlens / --splits / --cache-seqlens / --npz` (docs/timing.md, "Features"). CPU only:
each launch runs on the PTX engine and is walked through its SASS (NVRTC and nvdisasm)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("cuda.bindings")

import fa_sim  # noqa: E402
from fa_sim.cli import main  # noqa: E402
from fa_sim.config import KernelConfig  # noqa: E402
from fa_sim.contract import KERNEL_NAME, SEED_PATH, KernelBuild  # noqa: E402
from fa_sim.problem import Problem  # noqa: E402
from fa_sim.splitkv import COMBINE_KERNEL, check_splitkv, num_splits_heuristic  # noqa: E402
from fa_sim.contract.occupancy import min_blocks_per_sm  # noqa: E402
from fa_sim.timing import predict_launch  # noqa: E402
from fa_sim.timing.launches import check_size, varlen_cta_rounds  # noqa: E402

LENS = (70, 130, 5)  # block_m 64: Q blocks 2, 3, 1 of a grid of 3; three CTAs per head exit at once


def _cu(lens) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)


def _packed(lens, heads=2):
    cu = _cu(lens)
    return fa_sim.predict_time(None, heads, None, head_dim=64, cu_seqlens_q=cu, cu_seqlens_k=cu)


def test_split_kv_decode_with_eight_splits_beats_one_on_a_small_grid():
    """Batch 2, one head, Nq 1, Nk 2048: 2 CTAs on 132 SMs without splits, each 32 K/V tiles; with 8
    splits 16 CTAs of 4 tiles each, then the combine launch. The split launch's busiest SM runs
    about 8x fewer rounds; the total, combine and a second launch's overhead included, is faster."""
    one = fa_sim.predict_time(2, 1, 1, 2048, splits=1)
    eight = fa_sim.predict_time(2, 1, 1, 2048, splits=8)
    assert list(one.kernels) == [KERNEL_NAME]  # one split: no combine launch, as the simulator runs it
    assert list(eight.kernels) == [KERNEL_NAME, COMBINE_KERNEL]
    assert one.kernels[KERNEL_NAME].notes["ctas"] == 2 and eight.kernels[KERNEL_NAME].notes["ctas"] == 16
    cycles = [p.kernels[KERNEL_NAME].notes["sm_cycles"] for p in (one, eight)]
    assert cycles[0] / cycles[1] > 4, cycles  # 32 rounds against 4 on the busiest SM
    assert eight.kernel_ms == pytest.approx(sum(p.kernel_ms for p in eight.kernels.values()))
    assert eight.kernel_ms < 0.6 * one.kernel_ms, (eight.kernel_ms, one.kernel_ms)
    assert (eight.notes["splits"], eight.notes["kv_tiles_per_split"]) == (8, 4)


def test_split_kv_auto_is_the_simulators_choice_and_short_sequences_leave_empty_splits():
    lens = np.array([2048, 300], np.int32)
    auto = fa_sim.predict_time(2, 1, 1, 2048, splits="auto", cache_seqlens=lens)
    cfg = KernelConfig(head_dim=64)
    want = num_splits_heuristic(2, 132 * min_blocks_per_sm(cfg), 32)  # the simulator's num_sms default: 132
    assert auto.notes["splits"] == want and auto.notes["splits_auto"]
    assert check_splitkv(Problem(2, 1, 1, 2048, False, 0.125, cfg), "auto", lens).splits == want
    assert auto.notes["cache_seqlens"] == [2048, 300]
    assert auto.kernels[KERNEL_NAME].notes["ctas"] == 2 * want


SPLITKV_NCU = json.loads((Path(__file__).parent / "data" / "h100" / "timing_ncu_splitkv.json").read_text())["kernels"]


@pytest.mark.parametrize("row", SPLITKV_NCU, ids=lambda r: r["key"])
def test_split_kv_split_launch_issues_what_nsight_compute_counted(row):
    """The split launch's SASS walk, every warp of every CTA, against Nsight Compute's warp
    instructions executed on the H100 (tests/data/h100/timing_ncu_splitkv.json): equal. The 6 CTAs
    that run keys diverge in warp 0 (store_partial: the lanes of the 4 packed rows store, the others
    branch straight to the BSYNC), and each lane group issues that BSYNC; walked once, the stream
    was 6 short (84,918)."""
    b, h, hk, nq, nk, d = row["shape"]
    assert KernelConfig.from_tag(row["config"]).head_dim == d
    pred = fa_sim.predict_time(b, h, nq, nk, config=KernelConfig.from_tag(row["config"]), heads_k=hk,
                               splits=row["splits"], cache_seqlens=np.array(row["cache_seqlens"], np.int32))
    assert pred.notes["split_grid"][2] == row["splits"] and pred.kernels[KERNEL_NAME].notes["ctas"] == 8
    assert pred.kernels[KERNEL_NAME].instructions == row["smsp__inst_executed.sum"]


def test_packed_batch_times_as_its_longest_sequence_when_every_cta_has_an_sm():
    """(70, 130, 5), 2 heads: 18 CTAs on 132 SMs, each alone on its SM, so the busiest SM is that of
    one CTA of the 130-query sequence: the same cycles as that sequence packed alone; the time
    differs only by the launch overhead's fill share (18 CTAs against 6). Instructions: the three
    sequences' own launches summed, plus the 6 exiting CTAs' few (sum-of-work)."""
    packed = _packed(LENS)
    k = packed.kernels[KERNEL_NAME]
    assert packed.notes["grid_ctas"] == 3 * 2 * 3 and packed.notes["working_ctas"] == (2 + 3 + 1) * 2
    assert packed.notes["cta_rounds"] == 2 * (2 * 2 + 3 * 3 + 1 * 1)
    singles = {n: _packed((n,)).kernels[KERNEL_NAME] for n in LENS}
    assert k.notes["sm_cycles"] == pytest.approx(singles[130].notes["sm_cycles"])
    assert k.kernel_ms == pytest.approx(singles[130].kernel_ms, rel=0.03)
    exited = packed.notes["grid_ctas"] - packed.notes["working_ctas"]
    extra = k.instructions - sum(s.instructions for s in singles.values())
    assert 0 < extra <= exited * 4 * 32, extra  # 4 warps each, a few dozen instructions to exit


def test_packed_launch_is_near_the_dense_launch_of_its_longest_sequence():
    """The dense plain-build launch of (1, 2, 130, 130) does the same work per CTA without the
    offsets: the packed launch is at most ~15% slower (its CTAs first load cu_seqlens, a dependent
    global load before any tile), never faster."""
    cfg = KernelConfig(head_dim=64)
    prob = Problem(1, 2, 130, 130, False, 0.125, cfg)
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 130, 64)).astype(np.float16) for _ in range(3))
    args = [q, k, v, np.zeros((1, 2, 130, 64), np.uint16), np.zeros((1, 2, 130), np.float32), np.int32(130),
            np.int32(130), np.float32(0.125)]
    dense = predict_launch(str(SEED_PATH), prob.launch_grid, (cfg.n_threads, 1, 1), args, cfg.smem_bytes, "h200",
                           kernel=KERNEL_NAME, macros=KernelBuild.of(prob, "sm_80").macros())
    ratio = _packed(LENS).kernel_ms / dense.kernel_ms
    assert 1.0 <= ratio <= 1.15, ratio


def test_varlen_cta_rounds_follow_each_sequence():
    cfg = KernelConfig(head_dim=64)
    from fa_sim.varlen import make_varlen_problem

    cu = _cu((70, 0, 130))
    prob = make_varlen_problem((1, 1, 200, 64), (1, 1, 205, 64), (1, 1, 205, 64), cu, _cu((70, 5, 130)), True,
                               None, cfg)
    # causal, top-left per sequence: Q block m sees keys up to (m + 1) * 64
    assert list(varlen_cta_rounds(prob)) == [1, 2, 0, 0, 0, 0, 1, 2, 3]


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(cu_seqlens_q=_cu(LENS)), "needs both cu_seqlens_q and cu_seqlens_k"),
    (dict(cu_seqlens_q=_cu(LENS), cu_seqlens_k=_cu(LENS), splits=2), "takes a padded batch, not a packed one"),
    (dict(cu_seqlens_q=_cu(LENS).astype(np.int64), cu_seqlens_k=_cu(LENS)), "must be a 1-D int32 array"),
    (dict(batch=4, cu_seqlens_q=_cu(LENS), cu_seqlens_k=_cu(LENS)), "batch = 4 disagrees with the offsets"),
    (dict(splits=33), "splits must be an integer from 1 to 32"),
    (dict(splits=2, causal=True), "no causal mask or window"),
    (dict(splits=2, kernel="variant.cu"), "pass kernel=None"),
    (dict(splits=2, cache_seqlens=np.array([1, 2], np.int64)), "cache_seqlens must be int32"),
    (dict(batch=64, heads=64, seqlen_k=1 << 20, splits=1), "past the 11,"),
])
def test_bad_input_is_one_line_before_any_work(kwargs, fragment, monkeypatch):
    import fa_sim.timing.launches as launches

    def boom(*a, **k):
        raise AssertionError("predict_launch ran")

    monkeypatch.setattr(launches, "predict_launch", boom)
    args = dict(batch=2, heads=1, seqlen_q=1, seqlen_k=2048)
    args.update(kwargs)
    if "cu_seqlens_q" in kwargs:
        args.update(seqlen_q=None, seqlen_k=None)
        args.setdefault("batch", None)
        if args["batch"] == 2:
            args["batch"] = None
    with pytest.raises(ValueError) as err:
        fa_sim.predict_time(**args)
    assert fragment in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_size_refusal_names_the_limit_in_rounds_and_instructions():
    cfg = KernelConfig(head_dim=64)
    with pytest.raises(ValueError, match=r"past the [\d,]+ rounds \(20,000,000 warp instructions\)"):
        check_size(cfg, np.full(132, 20_000), fa_sim.timing.GPUS["h200"], "this launch", "lower it")
    with pytest.raises(ValueError, match="min the timing model allows"):  # the engine's run of every CTA
        check_size(cfg, np.full(132 * 10, 1_000), fa_sim.timing.GPUS["h200"], "this launch", "lower it")
    check_size(cfg, np.full(264, 40), fa_sim.timing.GPUS["h200"], "this launch", "lower it")  # fine


def test_cli_prints_each_launch_and_the_total(tmp_path, capsys):
    assert main(["time", "--heads", "2", "--seqlens", "70,130,5"]) == 0
    out = capsys.readouterr().out
    assert "packed batch: Nq 70,130,5" in out and "12 of the grid's 18 run K/V rounds" in out
    assert "fa2_fwd_kernel" in out and "predicted total time" in out
    assert main(["time", "--batch", "2", "--heads", "1", "--seqlen", "1", "--seqlen-k", "2048", "--splits", "8",
                 "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert list(got["kernels"]) == [KERNEL_NAME, COMBINE_KERNEL] and got["splits"] == 8
    assert got["kernel_ms"] == pytest.approx(sum(k["kernel_ms"] for k in got["kernels"].values()))
    rng = np.random.default_rng(0)
    f = tmp_path / "cache.npz"
    np.savez(f, q=rng.standard_normal((2, 2, 1, 64)).astype(np.float16),
             k=rng.standard_normal((2, 1, 1024, 64)).astype(np.float16),
             v=rng.standard_normal((2, 1, 1024, 64)).astype(np.float16), cache_seqlens=np.array([1024, 300], np.int32))
    assert main(["time", "--npz", str(f), "--splits", "auto"]) == 0
    out = capsys.readouterr().out
    assert "cache_seqlens 1024,300" in out and "(auto, for 132 SMs)" in out and "heads_k=1" in out
    p = tmp_path / "packed.npz"
    cu = _cu(LENS)
    np.savez(p, q=rng.standard_normal((205, 2, 64)).astype(np.float16),
             k=rng.standard_normal((205, 2, 64)).astype(np.float16),
             v=rng.standard_normal((205, 2, 64)).astype(np.float16), cu_seqlens_q=cu, cu_seqlens_k=cu)
    assert main(["time", "--npz", str(p)]) == 0
    assert "packed batch: Nq 70,130,5" in capsys.readouterr().out


@pytest.mark.parametrize("argv, fragment", [
    (["--seqlens", "70,130", "--batch", "2"], "--batch does not apply with --seqlens"),
    (["--seqlens", "70,130", "--splits", "2"], "take a padded batch, not a packed one"),
    (["--splits", "2", "--causal"], "take no --causal or --window"),
    (["--seqlens", "5,6", "--kernel", "x.cu"], "--kernel does not apply to a packed batch"),
    (["--seqlens", "5,6", "--backward"], "--seqlens does not apply with --backward"),
    (["--seqlens", "5,6", "--config", "auto"], "--config auto does not apply"),
    (["--heads", "64", "--seqlens", "1000000"], "(20,000,000 warp instructions)"),
])
def test_cli_refuses_in_one_line(argv, fragment, capsys, monkeypatch):
    import fa_sim.timing.launches as launches

    monkeypatch.setattr(launches, "predict_launch", lambda *a, **k: (_ for _ in ()).throw(AssertionError("ran")))
    assert main(["time", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and len(err.splitlines()) == 1, err
