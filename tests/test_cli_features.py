"""The everyday commands on issue 38's features (docs/features.md, "The commands"): `fa trace` and
`fa banks` on packed batches (--seqlens, a packed --npz), `fa compare --gpu-npz` replaying
recordings (saved-run format 4) of GQA, window, softcap and bf16 runs, and the one-line refusals
with --backward (fa compare on a packed batch and on split-KV: tests/test_compare_packed.py,
tests/test_compare_splitkv.py).

The recordings here are made by the simulator (the PTX engine with the H200 tensor-core model,
what `fa compare` runs against the GPU), so the replay path is checked on the CPU;
tests/test_cli_features_gpu.py records on a GPU.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from fa_sim.cli import main
from fa_sim.config import KernelConfig
from fa_sim.contract import seed_source
from fa_sim.crosscheck import SavedRun, simulate_with_checkpoints
from fa_sim.reference import random_inputs

from cli_helpers import ok_json as _json, refused_line as _refused


# -- fa trace / fa banks on a packed batch -------------------------------------------------------------
LENS = (5, 70)  # block_m 64: sequence 0 has one Q block (its CTA 1 exits at once), sequence 1 two


def _dense_npz(tmp_path, b: int) -> str:
    """Sequence b of `fa ... --seqlens 5,70` (seed 0, H 1, d 32) as a dense [1, 1, N_b, 32] file."""
    q, k, v = random_inputs(1, 1, sum(LENS), sum(LENS), 32, 0)
    lo, hi = sum(LENS[:b]), sum(LENS[:b + 1])
    path = tmp_path / f"seq{b}.npz"
    np.savez(path, q=q[:, :, lo:hi], k=k[:, :, lo:hi], v=v[:, :, lo:hi])
    return str(path)


def test_trace_of_a_packed_lane_is_that_of_its_sequence_alone(tmp_path):
    """A lane of CTA 3 (sequence 1, Q block 1) of the packed launch gets the MMA results the same lane
    of the sequence's own dense launch gets (a packed launch equals the dense ones bit for bit), and
    its header names the sequence, head, Q block and packed rows."""
    packed = _json(["trace", "--seqlens", "5,70", "--head-dim", "32", "--cta", "3", "--lane", "5", "--round", "1",
                    "--json"])
    dense = _json(["trace", "--npz", _dense_npz(tmp_path, 1), "--engine", "ptx", "--cta", "1", "--lane", "5",
                   "--round", "1", "--json"])
    assert packed["packed"].startswith("packed batch, CTA 3: sequence 1 (CTAs 2..3), head 0, Q block 1: queries "
                                       "64..69 of the sequence (rows 69..74 of the packed q); the sequence's keys "
                                       "0..69 are rows 5..74 of the packed k, v")
    assert packed["launch"]["cu_seqlens_q"] == [0, 5, 75] and "packed" not in dense
    mma = [[s["values"] for s in t["steps"] if s["op"] == "HMMA"] for t in (packed, dense)]
    assert mma[0] and mma[0] == mma[1]
    # the packed checkpoint build's S, m, l, P, O slots at the sequence's coordinates: the dense launch's
    assert set(packed["state"]) >= {"s_acc", "s_masked", "row_max", "row_sum", "p_f16", "o_acc", "o_final"}
    assert packed["state"] == dense["state"]


def test_trace_of_a_packed_batch_refuses_ctas_and_rounds_it_does_not_run(capsys):
    base = ["trace", "--seqlens", "5,70", "--head-dim", "32"]
    assert "--cta 1 runs no round: CTA 1: sequence 0 (CTAs 0..1), head 0, Q block 1; it exits at once: sequence 0 " \
           "has 5 queries, Q blocks 0..0 (block_m 64)" in _refused([*base, "--cta", "1"], capsys)
    assert "--cta 4 is outside the grid: 4 CTAs, 0..3 (grid 2 Q blocks of the longest sequence x 1 heads x 2 " \
           "sequences)" in _refused([*base, "--cta", "4"], capsys)
    assert "--round 1 is not a round of CTA 0 (sequence 0, Nq 5, Nk 5): it runs round 0 only" in \
        _refused([*base, "--round", "1"], capsys)
    assert "--engine program does not run a packed batch" in _refused([*base, "--engine", "program"], capsys)
    assert "--seqlen does not apply with --seqlens" in _refused([*base, "--seqlen", "9"], capsys)
    assert "--seqlens does not apply with --backward" in _refused([*base, "--backward"], capsys)


def test_trace_header_of_a_packed_lane(capsys):
    assert main(["trace", "--seqlens", "5,70", "--head-dim", "32", "--cta", "2", "--ops", "HMMA"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("CTA 2 (m_block 0, batch-head 1)")
    assert lines[2].startswith("packed batch, CTA 2: sequence 1 (CTAs 2..3), head 0, Q block 0: queries 0..63 of "
                               "the sequence (rows 5..68 of the packed q)")


def test_banks_of_a_packed_batch_add_up_the_sequences(tmp_path):
    """fa banks counts the FA_VARLEN build: its ldmatrix, ld.shared and st.shared instructions and
    wavefronts are those of the sequences' dense launches added up (LDGSTS is left out: its
    wavefronts depend on the global addresses, which the packing shifts)."""
    packed = _json(["banks", "--seqlens", "5,70", "--head-dim", "32", "--json"])
    dense = [_json(["banks", "--npz", _dense_npz(tmp_path, b), "--engine", "ptx", "--json"]) for b in (0, 1)]
    assert packed["problem"]["cu_seqlens_q"] == [0, 5, 75] and packed["problem"]["batch"] == 2
    for cls in ("LDSM", "LDS", "STS"):
        for key in ("instructions", "wavefronts", "conflicts"):
            assert packed["classes"][cls][key] == sum(d["classes"][cls][key] for d in dense), (cls, key)
        assert packed["classes"][cls]["instructions"] > 0


def test_banks_header_of_a_packed_batch(capsys):
    assert main(["banks", "--seqlens", "5,70", "--heads", "2", "--heads-k", "1", "--head-dim", "32"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == ("fa banks: packed (H,d) = (2,32) of 2 sequences, Nq 5,70, heads_k=1, varlen(total_q=75, "
                     "total_k=75), config m64n64d32w4-swizzled, PTX of fa2_fwd.cu")


def test_banks_count_the_feature_build():
    """A window of (0, 0) at Nq = Nk = 128, block 64 runs one K/V round per Q block instead of two:
    with two heads (GQA, one K/V head) the window build issues as many ldmatrix as one plain head
    (two heads x half the rounds) and twice its epilogue's st.shared; the JSON names the features."""
    plain = _json(["banks", "--seqlen", "128", "--head-dim", "32", "--json"])
    window = _json(["banks", "--seqlen", "128", "--head-dim", "32", "--window", "0,0", "--heads", "2", "--heads-k",
                    "1", "--json"])
    assert window["problem"]["window"] == [0, 0] and window["problem"]["heads_k"] == 1
    assert window["classes"]["LDSM"]["instructions"] == plain["classes"]["LDSM"]["instructions"]
    assert window["classes"]["STS"]["instructions"] == 2 * plain["classes"]["STS"]["instructions"]


def test_banks_of_split_kv_count_the_split_launch():
    """Split-KV decoding: the split launch (FA_SPLITKV) is counted. One split runs each sequence's own
    K/V tiles: its ldmatrix are those of the dense launches on each sequence's keys added up; three
    splits run the same tiles (the same ldmatrix) and store fp32 O to the workspace from registers
    (no st.shared / ld.shared staging)."""
    base = ["banks", "--batch", "2", "--seqlen", "1", "--seqlen-k", "300", "--head-dim", "32", "--cache-seqlens",
            "300,170", "--json"]
    one, three = _json([*base, "--splits", "1"]), _json([*base, "--splits", "3"])
    dense = [_json(["banks", "--seqlen", "1", "--seqlen-k", str(n), "--head-dim", "32", "--engine", "ptx", "--json"])
             for n in (300, 170)]
    assert one["problem"]["splits"] == 1 and three["problem"]["splits"] == 3
    assert one["problem"]["cache_seqlens"] == [300, 170] and three["smem"] == "swizzled"
    assert one["classes"]["LDSM"]["instructions"] == sum(d["classes"]["LDSM"]["instructions"] for d in dense) > 0
    assert three["classes"]["LDSM"] == one["classes"]["LDSM"]
    assert three["classes"]["STS"]["instructions"] == three["classes"]["LDS"]["instructions"] == 0 < \
        one["classes"]["STS"]["instructions"]


@pytest.mark.parametrize("argv, message", [
    (["--splits", "2", "--causal"], "take no --causal or --window"),
    (["--splits", "2", "--engine", "program"], "without --engine program or --kernel"),
    (["--splits", "9"], "splits must be an integer from 1 to 5"),
])
def test_banks_refuses_split_kv_it_cannot_run(capsys, argv, message):
    assert message in _refused(["banks", "--seqlen", "1", "--seqlen-k", "300", "--head-dim", "32", *argv], capsys)


# -- fa compare: recordings of feature runs, replayed on the CPU ------------------------------------------
def _record(path, dtype="fp16", window=(8, 0), softcap=None, heads_k=1) -> SavedRun:
    """A recording as `fa compare --save` writes it, its 'GPU side' made by the simulator."""
    config = KernelConfig(head_dim=32, dtype=dtype)
    q, k, v = random_inputs(1, 2, 40, 40, 32, 3, heads_k=heads_k, dtype=dtype)
    res, buf = simulate_with_checkpoints(q, k, v, True, 0.125, config, [0, 1], engine="ptx", window=window,
                                         softcap=softcap)
    run = SavedRun(q, k, v, res.o, res.lse, buf, (0, 1), config, True, res.scale, "fa2_fwd.cu", seed_source().text,
                   window, softcap)
    run.save(path)
    return run


@pytest.mark.parametrize("dtype, window, softcap", [("fp16", (8, 0), None), ("bf16", (8, 0), 5.0),
                                                    ("fp16", None, 3.0)])
def test_compare_replays_a_feature_recording(tmp_path, dtype, window, softcap):
    path = tmp_path / "run.npz"
    run = _record(path, dtype, window, softcap)
    back = SavedRun.load(path)
    assert (back.window, back.softcap, back.heads_k, back.config.dtype) == (window, softcap, 1, dtype)
    assert np.array_equal(np.asarray(back.o).view(np.uint16 if dtype == "fp16" else np.uint32),
                          np.asarray(run.o).view(np.uint16 if dtype == "fp16" else np.uint32))
    report = _json(["compare", "--gpu-npz", str(path), "--json"])
    assert report["ok"] and report["o"]["dtype"] == dtype and "heads_k=1" in report["features"]
    assert [f for f in report["features"] if f.startswith("softcap")] == ([] if softcap is None else
                                                                          [f"softcap={softcap:g}"])


def test_a_replay_uses_the_recorded_features(tmp_path, capsys):
    """A recording whose softcap (window) is altered no longer matches its own checkpoints: the
    replay simulates what the file says, so the comparison fails (exit 1), it is not skipped."""
    path = tmp_path / "run.npz"
    _record(path, softcap=5.0)
    data = dict(np.load(path))
    for change in ({"softcap": np.float64(6.0)}, {"window": np.array([16, 0], np.int32)}):
        np.savez(tmp_path / "altered.npz", **{**data, **change})
        assert main(["compare", "--gpu-npz", str(tmp_path / "altered.npz")]) == 1
        assert "DIFFERENCES" in capsys.readouterr().out


def test_compare_options_must_agree_with_a_feature_recording(tmp_path, capsys):
    path = str(tmp_path / "run.npz")
    _record(path, softcap=5.0)
    assert "--window 4,0 disagrees with --gpu-npz" in _refused(["compare", "--gpu-npz", path, "--window", "4,0"],
                                                                capsys)
    assert "recorded with --heads-k 1" in _refused(["compare", "--gpu-npz", path, "--heads-k", "2"], capsys)
    assert "recorded with --softcap 5" in _refused(["compare", "--gpu-npz", path, "--softcap", "2"], capsys)
    assert "--seed 4: the inputs in --gpu-npz" in _refused(["compare", "--gpu-npz", path, "--seed", "4"], capsys)
    assert main(["compare", "--gpu-npz", path, "--heads-k", "1", "--window", "8,0", "--softcap", "5", "--seed",
                 "3"]) == 0


@pytest.mark.parametrize("change, message", [
    ({"window": np.array([8], np.int32)}, "field window holds an array of shape (1,) and dtype int32"),
    ({"window": np.array([8, -2], np.int32)}, "field window: window must be (left, right)"),
    ({"softcap": np.float64(-1.0)}, "field softcap: softcap must be a positive finite number"),
    ({"k": np.zeros((1, 3, 40, 32), np.float16)}, "field k holds an array of shape (1, 3, 40, 32)"),
    ({"q": np.full((1, 2, 40, 32), 1.1, np.float32)}, "field q holds an array of shape (1, 2, 40, 32) and dtype "
                                                       "float32"),
])
def test_bad_feature_fields_are_one_line(tmp_path, capsys, change, message):
    path = tmp_path / "run.npz"
    _record(path, window=(8, 0))
    np.savez(tmp_path / "bad.npz", **{**dict(np.load(path)), **change})
    assert message in _refused(["compare", "--gpu-npz", str(tmp_path / "bad.npz")], capsys)


def test_a_bf16_recording_holds_bf16_values(tmp_path, capsys):
    path = tmp_path / "run.npz"
    _record(path, dtype="bf16", window=None)
    data = dict(np.load(path))
    np.savez(tmp_path / "bad.npz", **{**data, "o": data["o"] + np.float32(1e-6)})
    assert "field o holds float32 values that are not bf16 values" in \
        _refused(["compare", "--gpu-npz", str(tmp_path / "bad.npz")], capsys)


@pytest.mark.parametrize("argv, message", [
    (["--splits", "2", "--backward"], "--splits does not apply with --backward"),
    (["--seqlens", "5,70", "--backward"], "--seqlens does not apply with --backward"),
])
def test_compare_refuses_what_has_no_checkpoint_build(capsys, argv, message):
    assert message in _refused(["compare", *argv], capsys)


def test_a_recording_stores_inputs_in_the_kernels_type(tmp_path):
    """Inputs given as float32 values that fp16 holds exactly (an --npz file's, which the input policy
    takes) are recorded as float16, so that the recording loads and replays."""
    path, again = tmp_path / "run.npz", tmp_path / "again.npz"
    run = _record(path, window=(8, 0))
    SavedRun(run.q.astype(np.float32), run.k.astype(np.float32), run.v, run.o, run.lse, run.checkpoints, run.ctas,
             run.config, run.causal, run.scale, run.kernel_name, run.kernel_source, run.window).save(again)
    back = SavedRun.load(again)
    assert back.q.dtype == back.k.dtype == np.float16 and np.array_equal(back.q, run.q)
    assert main(["compare", "--gpu-npz", str(again)]) == 0


def test_compare_save_records_the_features_it_launched(tmp_path, monkeypatch):
    """The --save path of a launch with GQA, a window, softcap and bf16, its GPU stood in for by the
    simulator (the same checkpoints fa_hw.forward returns): the recording holds the features and
    inputs it ran, and its replay agrees. tests/test_cli_features_gpu.py runs it on a GPU."""
    import fa_hw
    from fa_hw import runtime

    calls = []

    class Out:
        def __init__(self, q, k, v, causal, scale, config, checkpoint_ctas, kernel, window, softcap):
            res, self.checkpoints = simulate_with_checkpoints(q, k, v, causal, scale, config, checkpoint_ctas,
                                                              engine="ptx", window=window, softcap=softcap)
            self.o, self.lse, self.scale = res.o, res.lse, res.scale

    def forward(q, k, v, *, causal, scale, config, checkpoint_ctas, kernel, window, softcap):
        calls.append((k.shape, window, softcap, config.dtype))
        return Out(q, k, v, causal, scale, config, checkpoint_ctas, kernel, window, softcap)

    monkeypatch.setattr(fa_hw, "forward", forward)
    monkeypatch.setattr(runtime, "check_launch", lambda *a, **k: None)
    path = str(tmp_path / "run.npz")
    argv = ["compare", "--seqlen", "40", "--heads", "2", "--heads-k", "1", "--head-dim", "32", "--window", "8,0",
            "--softcap", "5", "--dtype", "bf16", "--ctas", "0,1", "--save", path, "--json"]
    live = _json(argv)
    assert calls == [((1, 1, 40, 32), (8, 0), 5.0, "bf16")] and live["ok"]
    run = SavedRun.load(path)
    assert (run.heads_k, run.window, run.softcap, run.config.dtype, run.ctas) == (1, (8, 0), 5.0, "bf16", (0, 1))
    assert _json(["compare", "--gpu-npz", path, "--json"])["features"] == live["features"]


# -- --pack-gqa: split-KV decoding with the Q heads of a K/V head run as one -------------------------------
GQA_DECODE = ["--heads", "4", "--heads-k", "1", "--seqlen", "1", "--seqlen-k", "130", "--head-dim", "32",
              "--splits", "2"]


def test_sim_pack_gqa_on_and_off_give_the_same_bits():
    """--pack-gqa on runs the 4 Q heads of the K/V head as one head of 4 rows (a quarter of the CTAs and
    of their K/V loads), off as 4 heads; each row's arithmetic is the same, so the errors against
    float64 are equal to the last bit; auto packs here (g = 4 > 1, Nq = 1 < block_m)."""
    on, off, auto = (_json(["sim", *GQA_DECODE, "--pack-gqa", x, "--json"]) for x in ("on", "off", "auto"))
    assert (on["pack_gqa"], off["pack_gqa"], auto["pack_gqa"]) == (True, False, True)
    assert on["rel_err_o"] == off["rel_err_o"] and on["max_abs_err_lse"] == off["max_abs_err_lse"]
    assert on["instructions"] == auto["instructions"]
    assert 4 * on["instructions"]["LDSM"] == off["instructions"]["LDSM"] > 0


def test_time_and_banks_take_pack_gqa():
    """fa time's split grid and fa banks' counts are those of the packed launch with --pack-gqa on."""
    on, off = (_json(["time", *GQA_DECODE, "--pack-gqa", x, "--json"]) for x in ("on", "off"))
    assert (on["pack_gqa"], off["pack_gqa"]) == (True, False)
    assert on["split_grid"] == [1, 1, 2] and off["split_grid"] == [1, 4, 2]
    on, off = (_json(["banks", *GQA_DECODE, "--pack-gqa", x, "--json"]) for x in ("on", "off"))
    assert (on["problem"]["pack_gqa"], off["problem"]["pack_gqa"]) == (True, False)
    assert 4 * on["classes"]["LDSM"]["instructions"] == off["classes"]["LDSM"]["instructions"] > 0


def test_predict_time_takes_pack_gqa():
    from fa_sim import predict_time

    with pytest.raises(ValueError, match="pack_gqa applies to split-KV decoding"):
        predict_time(1, 4, 1, 130, 32, heads_k=1, pack_gqa=True)
    pred = predict_time(1, 4, 1, 130, 32, heads_k=1, splits=2, pack_gqa=False)
    assert pred.notes["pack_gqa"] is False and pred.notes["split_grid"] == [1, 4, 2]


@pytest.mark.parametrize("command", ["sim", "hw", "time", "banks"])
def test_pack_gqa_needs_split_kv(capsys, command):
    assert _refused([command, "--pack-gqa", "auto"], capsys).endswith(
        "--pack-gqa auto applies to split-KV decoding only: give --splits N|auto or --cache-seqlens with it")


def test_compare_refuses_pack_gqa_alone(capsys):
    assert _refused(["compare", "--pack-gqa", "on"], capsys).endswith(
        "--pack-gqa on applies to split-KV decoding only: give --splits N|auto or --cache-seqlens with it")


# -- fa hw --npz / --seqlens, the GPU stood in for by the simulator ---------------------------------------------
@pytest.fixture
def hw_on_the_simulator(monkeypatch):
    """fa_hw.forward replaced by the PTX engine's run of the same launch (what fa_hw.forward returns,
    bit for bit, on a GPU: tests/test_cli_features_gpu.py); `calls` records its keywords, `spoil`
    adds to O's row of the packed batch (a wrong result the accuracy check must catch)."""
    import fa_hw
    from fa_hw import runtime
    from fa_hw.forward import HwResult

    from fa_sim import simulate

    state = {"calls": [], "spoil": None}

    def forward(q, k, v, *, causal, scale, config, kernel, **kw):
        state["calls"].append((np.shape(q), np.shape(k), {n: x for n, x in kw.items() if x is not None}))
        res = simulate(q, k, v, causal=causal, scale=scale, config=config, engine="ptx", **kw)
        o = np.array(res.o)
        if state["spoil"] is not None:
            o[state["spoil"]] += 1.0
        return HwResult(o, res.lse, res.config, res.causal, res.scale, 1e-3, 64, splits=res.splits)

    monkeypatch.setattr(fa_hw, "forward", forward)
    monkeypatch.setattr(runtime, "check_launch", lambda *a, **k: None)
    return state


def test_hw_runs_a_packed_batch(hw_on_the_simulator):
    out = _json(["hw", "--seqlens", "5,70", "--heads", "2", "--heads-k", "1", "--head-dim", "32", "--causal",
                 "--json"])
    (q_shape, k_shape, kw), = hw_on_the_simulator["calls"]
    assert q_shape == (75, 2, 32) and k_shape == (75, 1, 32)
    assert [list(kw["cu_seqlens_q"]), list(kw["cu_seqlens_k"])] == [[0, 5, 75], [0, 5, 75]]
    assert out["cu_seqlens_q"] == out["cu_seqlens_k"] == [0, 5, 75]
    assert out["shape"] == [2, 2, 70, 70, 32] and out["heads_k"] == 1 and out["rel_err_o"] < 1e-3
    assert not out["above_bound"] and not out["nonfinite"]


def test_hw_packed_accuracy_is_per_sequence(hw_on_the_simulator, capsys):
    """A wrong row of sequence 1 (packed row 40) puts that sequence's O above its bound: exit status 1."""
    hw_on_the_simulator["spoil"] = (40, 0)
    assert main(["hw", "--seqlens", "5,70", "--head-dim", "32"]) == 1
    out = capsys.readouterr().out
    assert "packed (H, d) = (4, 32) of 2 sequences, Nq 5,70" in out and "ABOVE BOUND" in out


def test_hw_reads_npz_files(hw_on_the_simulator, tmp_path):
    """--npz: a packed file (its offsets passed on, Nk != Nq) and a dense one (its shape reported)."""
    q, k, v = random_inputs(1, 2, 30, 50, 32, 1)
    packed = tmp_path / "packed.npz"
    np.savez(packed, q=q[0].transpose(1, 0, 2), k=k[0].transpose(1, 0, 2), v=v[0].transpose(1, 0, 2),
             cu_seqlens_q=np.array([0, 10, 30], np.int32), cu_seqlens_k=np.array([0, 35, 50], np.int32))
    out = _json(["hw", "--npz", str(packed), "--json"])
    assert out["cu_seqlens_k"] == [0, 35, 50] and out["shape"] == [2, 2, 20, 35, 32] and out["rel_err_o"] < 1e-3
    dense = tmp_path / "dense.npz"
    np.savez(dense, q=q, k=k, v=v)
    out = _json(["hw", "--npz", str(dense), "--window", "8,8", "--json"])
    assert out["shape"] == [1, 2, 30, 50, 32] and out["window"] == [8, 8] and "cu_seqlens_q" not in out
    assert hw_on_the_simulator["calls"][-1][2] == {"window": (8, 8)}


@pytest.mark.parametrize("argv, message", [
    (["--seqlens", "5,70", "--seqlen", "4"], "--seqlen does not apply with --seqlens"),
    (["--seqlens", "5,70", "--config", "auto"], "--config auto does not apply to a packed batch"),
    (["--seqlens", "5,70", "--splits", "2"], "take a padded batch, not a packed one"),
    (["--seqlens", "5,70", "--backward"], "--seqlens does not apply with --backward"),
])
def test_hw_refuses_packed_batches_it_cannot_run(capsys, argv, message):
    assert message in _refused(["hw", *argv], capsys)


# -- fa compare --banks / --timing with the features -----------------------------------------------------------
def test_compare_banks_counts_the_feature_build(tmp_path, monkeypatch):
    """--banks with GQA, a window and softcap: the simulator's side is `fa banks`'s count of that build
    and Nsight Compute profiles the same launch (its k with H_k heads, the window and softcap reach the
    profiled process). The GPU and ncu are stood in for: the launch by the simulator, the profile by
    recording what it was given; tests/test_cli_features_gpu.py runs both."""
    import fa_hw
    from fa_hw import profile, runtime

    profiled = []

    def forward(q, k, v, *, causal, scale, config, checkpoint_ctas, kernel, window, softcap):
        res, buf = simulate_with_checkpoints(q, k, v, causal, scale, config, checkpoint_ctas, engine="ptx",
                                             window=window, softcap=softcap)
        return type("Out", (), {"o": res.o, "lse": res.lse, "scale": res.scale, "checkpoints": buf})

    def profile_launch(q, k, v, causal, scale, config, kernel, metrics=None, window=None, softcap=None):
        profiled.append((k.shape, window, softcap))
        return {}

    monkeypatch.setattr(fa_hw, "forward", forward)
    monkeypatch.setattr(runtime, "check_launch", lambda *a, **k: None)
    monkeypatch.setattr(profile, "profile_launch", profile_launch)
    monkeypatch.setattr(fa_hw.device, "device_arch", lambda: "sm_90")  # the SASS walked: an H100's
    shape = ["--seqlen", "40", "--heads", "2", "--heads-k", "1", "--head-dim", "32", "--window", "8,0",
             "--softcap", "5"]
    out = _json(["compare", *shape, "--banks", "--json"])
    assert profiled == [((1, 1, 40, 32), (8, 0), 5.0)]
    counted = _json(["banks", *shape, "--json"])
    for name, cls in out["banks"]["classes"].items():
        sim = cls["sim"]
        assert sim["ptx_instructions"] == counted["classes"][name]["instructions"], name
        assert sim["instructions"] == sim["ptx_instructions"] + sim["sass_guard_off"], name  # as the SASS issues
        assert cls["match"] is False  # ncu stood in for by nothing: no counts to match


def test_the_profiled_process_runs_the_features(tmp_path, monkeypatch):
    """fa_hw.profile's target (the process ncu profiles) launches the recorded window and softcap, and
    none for a file without them."""
    from fa_hw import profile

    launched = []
    monkeypatch.setattr(profile, "forward", lambda *a, **kw: launched.append((kw["window"], kw["softcap"])))
    q, k, v = random_inputs(1, 2, 8, 8, 32, 0, heads_k=1)
    for window, softcap in (((8, 0), 5.0), (None, None)):
        path = tmp_path / "inputs.npz"
        np.savez(path, q=q, k=k, v=v, causal=False, scale=np.nan, config=json.dumps(KernelConfig(head_dim=32).to_json()),
                 kernel="", window=np.array((-1, -1) if window is None else window, np.int64),
                 softcap=0.0 if softcap is None else softcap)
        profile._target(str(path))
    assert launched == [((8, 0), 5.0), (None, None)]


# -- fa trace --splits: a lane of split-KV's split launch -------------------------------------------------------
SPLIT = ["trace", "--seqlen", "1", "--seqlen-k", "300", "--head-dim", "32", "--splits", "3", "--lane", "5"]


def _qk(story) -> tuple[list, list]:
    """The QK-phase MMA results of a story and their (query, key) coordinates, and its sK reads' coordinates."""
    mma = [(s["values"], s["coords"]) for s in story["steps"] if s["op"] == "HMMA" and s["phase"] == "QK"]
    ldsm = [s["coords"] for s in story["steps"] if s["op"] == "LDSM" and s["touch"].startswith("sK")]
    return mma, ldsm


def test_trace_of_a_split_lane_is_that_of_its_keys_in_the_unsplit_launch():
    """Round 1 of split 1 (CTA 1: K/V blocks 2..3) runs K/V block 3: the lane's S values and their
    (query, key) coordinates, and the sK rows it reads, are those of round 3 of the unsplit launch;
    the header says which split, batch-head and Q block the CTA is and which tiles it covers."""
    split = _json([*SPLIT, "--cta", "1", "--round", "1", "--json"])
    dense = _json(["trace", "--seqlen", "1", "--seqlen-k", "300", "--head-dim", "32", "--engine", "ptx", "--lane", "5",
                   "--round", "3", "--json"])
    assert split["split"] == ("split-KV, CTA 1: split 1 of 3, batch 0, head 0, Q block 0: queries 0..0; the split "
                              "covers K/V blocks 2..3 (keys 128..255) of the sequence's 300 cached keys (2 K/V tiles "
                              "per split, block_n 64; round t runs block 2 + t)")
    assert split["launch"]["splits"] == 3 and split["launch"]["grid"] == [1, 1, 3] and "split" not in dense
    (mma, ldsm), (want_mma, want_ldsm) = _qk(split), _qk(dense)
    assert mma and mma == want_mma and ldsm and ldsm == want_ldsm
    assert {c[1] for _, coords in mma for c in coords} <= set(range(192, 256))
    # the split checkpoint build's scores at the cache's keys: the unsplit launch's round 3 (its m, l, P, O
    # run over the split's keys only: tests/test_trace_packed_split.py)
    assert split["state"]["s_acc"] == dense["state"]["s_acc"] and split["state"]["s_acc"]


def test_trace_of_a_gqa_packed_split_names_the_group():
    out = _json(["trace", "--batch", "2", "--heads", "4", "--heads-k", "1", "--seqlen", "1", "--seqlen-k", "300",
                 "--head-dim", "32", "--splits", "3", "--cache-seqlens", "300,170", "--cta", "3", "--json"])
    assert out["split"].startswith("split-KV, CTA 3: split 1 of 3, batch 1, K/V head 0 (GQA packed: Q heads 0..3 as "
                                   "rows of 1 query each), Q block 0: rows 0..3; the split covers K/V blocks 2..2 "
                                   "(keys 128..169) of the sequence's 170 cached keys")
    assert out["bh"] == 1 and out["launch"]["gqa_group"] == 4


@pytest.mark.parametrize("argv, message", [
    (["--cta", "3"], "--cta 3 is outside the split launch's grid: 3 CTAs, 0..2 (1 Q blocks x 1 batch-heads x 3 "
                     "splits)"),
    (["--cta", "2", "--round", "1"], "--round 1 is not a round of CTA 2: it runs round 0 only; CTA 2: split 2 of 3"),
    (["--cta", "2", "--cache-seqlens", "200"], "--cta 2 runs no round: CTA 2: split 2 of 3, batch 0, head 0, Q block "
                                               "0: queries 0..0; the split covers no K/V block of the sequence's 200 "
                                               "cached keys: it starts at block 4, past their 4"),
    (["--engine", "program"], "without --engine program or --kernel"),
    (["--causal"], "take no --causal or --window"),
])
def test_trace_refuses_split_ctas_and_rounds_it_does_not_run(capsys, argv, message):
    assert message in _refused([*SPLIT, *argv], capsys)


def test_trace_of_a_window_counts_keys_from_the_ctas_first_block():
    """Under --window a CTA's round 0 runs its window's first K/V block (Problem.n_block_min), not
    block 0: CTA 3 (queries 192..199, window 10 to the left) starts at block 2, so its sK reads are
    keys 128..191 and every key it keeps after masking is one its query sees."""
    out = _json(["trace", "--seqlen", "200", "--head-dim", "32", "--window", "10,0", "--causal", "--cta", "3",
                 "--json"])
    assert out["launch"]["window"] == [10, 0]
    rows = {c[0] for s in out["steps"] if s["op"] == "LDSM" and s["touch"].startswith("sK") for c in s["coords"]}
    assert rows and rows <= set(range(128, 192))
    kept = {int(q): keys for q, keys in out["kept_keys"].items() if keys}
    assert kept and all(q - 10 <= k <= q for q, keys in kept.items() for k in keys)
