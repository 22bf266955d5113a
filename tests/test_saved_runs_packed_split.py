"""Saved GPU runs of packed batches and split-KV decoding (fa_sim.saved_run format 5; issue 38: "CPU
tests that the engine runs each one hazard-free and equal to recorded GPU runs").

`fa compare --seqlens ... --save` and `fa compare --splits ... --save` write a recording with
fa_hw.forward stood in for by the PTX engine's run of the same debug build (what fa_hw.forward
returns on a GPU, bit for bit: the GPU tests of tests/test_compare_packed.py and
tests/test_compare_splitkv.py); `fa compare --gpu-npz` replays it on the CPU, every checkpoint
(and for split-KV the workspace and the combine's O and LSE) bit-identical, and fails on one
spoiled checkpoint word, workspace value or output. A split-KV recording whose kernel source is
not today's fa2_fwd.cu is replayed with the recorded source. Malformed format-5 fields are one
line each. The real GPU recordings (tests/data/h100: compare_packed.npz, compare_splitkv.npz,
made on an NVIDIA H100 80GB HBM3 by experiments/device_round40.sh, the commands of
`STEPS=featrec bash experiments/device_round36.sh`; an h200 copy too where there is one) are replayed.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
import pytest

from fa_sim.cli import main
from fa_sim.crosscheck import SAVED_RUN_FORMAT, SavedRun, simulate_splitkv_with_checkpoints, simulate_with_checkpoints
from fa_sim.splitkv import COMBINE_PATH

from cli_helpers import cli_json as _json, refused_line as _refused

DATA = Path(__file__).parent / "data"

PACKED = ["--seqlens", "70,130,5", "--head-dim", "64", "--heads", "2", "--heads-k", "1", "--causal"]
SPLIT = ["--batch", "2", "--heads", "2", "--heads-k", "1", "--seqlen", "2", "--seqlen-k", "200", "--head-dim", "32",
         "--cache-seqlens", "200,75", "--splits", "3"]


class _Out:
    pass


def _standin(calls: list):
    """fa_hw.forward stood in for by the PTX engine's run of the same debug build (packed or split-KV)."""

    def forward(q, k, v, *, causal, scale, config, checkpoint_ctas, window=None, softcap=None, kernel=None,
                cu_seqlens_q=None, cu_seqlens_k=None, splits=None, cache_seqlens=None, pack_gqa=None):
        calls.append(list(checkpoint_ctas))
        out = _Out()
        if splits is not None:
            run, _ = simulate_splitkv_with_checkpoints(q, k, v, scale, config, checkpoint_ctas, splits, cache_seqlens,
                                                       pack_gqa, softcap)
            out.o, out.lse, out.checkpoints = run.o, run.lse, run.checkpoints
            out.workspace = (run.o_accum, run.lse_accum)
            out.scale = float(np.float32(scale if scale is not None else 1 / np.sqrt(q.shape[-1])))
            return out
        res, buf = simulate_with_checkpoints(q, k, v, causal, scale, config, checkpoint_ctas, engine="ptx",
                                             kernel=kernel, window=window, softcap=softcap, cu_seqlens_q=cu_seqlens_q,
                                             cu_seqlens_k=cu_seqlens_k)
        out.o, out.lse, out.checkpoints, out.scale = res.o, res.lse, buf, res.scale
        return out

    return forward


def _stand_in(mp) -> list:
    import fa_hw
    from fa_hw import runtime

    calls: list = []
    mp.setattr(fa_hw, "forward", _standin(calls))
    mp.setattr(runtime, "check_launch", lambda *a, **k: None)
    return calls


@pytest.fixture(scope="module")
def recordings(tmp_path_factory):
    """A packed and a split-KV recording written by `fa compare --save` (the engine as the GPU), and
    the live comparisons' reports."""
    mp = pytest.MonkeyPatch()
    out = tmp_path_factory.mktemp("rec")
    paths = {"packed": out / "packed.npz", "split": out / "split.npz"}
    try:
        calls = _stand_in(mp)
        live = {kind: _json(["compare", *argv, "--save", str(paths[kind]), "--json"])
                for kind, argv in (("packed", PACKED), ("split", SPLIT))}
    finally:
        mp.undo()
    assert len(calls) == 2 and all(status == 0 for status, _ in live.values())
    return paths, live


def _spoiled(src: Path, dst: Path, **change) -> Path:
    data = {k: np.asarray(v) for k, v in np.load(src).items()}
    for name, fn in change.items():
        data[name] = fn(data[name].copy())
    np.savez(dst, **data)
    return dst


def _all_identical(report) -> None:
    assert report["checkpoints"]
    for name, row in report["checkpoints"].items():
        assert row["values"] > 0 and row["fraction_identical"] == 1.0 and row["max_ulps"] == 0, (name, row)
    assert report["o"]["fraction_identical"] == 1.0 and report["lse"]["fraction_identical"] == 1.0


def test_a_packed_recording_holds_the_packed_run(recordings):
    paths, live = recordings
    run = SavedRun.load(paths["packed"])
    assert int(np.load(paths["packed"])["format"]) == SAVED_RUN_FORMAT == 5
    assert run.kind == "packed" and run.cu_seqlens == ((0, 70, 200, 205), (0, 70, 200, 205))
    assert run.q.shape == (205, 2, 64) and run.k.shape == (205, 1, 64) and run.lse.shape == (2, 205)
    # the first and the last CTA that runs: sequence 2's head 1, Q block 0, is 0 + 3 (1 + 2 * 2)
    assert run.causal and run.heads_k == 1 and run.ctas == tuple(live["packed"][1]["ctas"]) == (0, 15)
    assert run.checkpoints.shape[:3] == (2, 11, 3)  # 3 rounds: the longest sequence's 130 keys
    assert run.kernel_name == "fa2_fwd.cu" and run.kernel_source


def test_a_split_recording_holds_the_split_run(recordings):
    paths, live = recordings
    run = SavedRun.load(paths["split"])
    assert run.kind == "split" and run.splits == 3 and run.pack_gqa is True
    assert run.cache_seqlens.tolist() == [200, 75] and run.cache_seqlens.dtype == np.int32
    assert run.ctas == tuple(live["split"][1]["ctas"]) == (0, 2)
    assert run.o_accum.shape == (3, 2, 4, 32) and run.lse_accum.shape == (3, 2, 4)  # B*H_k, g*Nq rows
    assert run.combine_source == COMBINE_PATH.read_text() and run.kernel_name == "fa2_fwd.cu"
    assert run.plan.n_ctas == 6


@pytest.mark.parametrize("kind", ["packed", "split"])
def test_the_replay_of_a_recording_is_bit_identical_and_equals_the_live_run(recordings, kind):
    paths, live = recordings
    status, report = _json(["compare", "--gpu-npz", str(paths[kind]), "--json"])
    assert status == 0 and report["ok"]
    _all_identical(report)
    assert report == live[kind][1]  # the live comparison's report, field for field
    if kind == "split":
        assert report["workspace"]["o_accum"]["fraction_identical"] == 1.0
        assert report["workspace"]["lse_accum"]["fraction_identical"] == 1.0
        assert "splits=3" in report["features"] and "pack_gqa" in report["features"]
    else:
        assert report["features"] == ["heads_k=1", "varlen(total_q=205, total_k=205)"] and report["causal"]


def _flip_word(x):
    x[-1, 0, 0, 5, 1] ^= 1  # S_ACC of the last recorded CTA, round 0, thread 5
    return x


def _next_up(x):
    flat = x.reshape(-1)
    flat[7] = np.nextafter(flat[7], np.float32(np.inf))
    return x


def _flip_o(x):
    flat = x.reshape(-1)
    flat[3] = -flat[3] if flat[3] != 0 else np.float16(1)
    return x


@pytest.mark.parametrize("kind, field, spoil, failing", [
    ("packed", "checkpoints", _flip_word, "s_acc"),
    ("packed", "o", _flip_o, "o"),
    ("split", "checkpoints", _flip_word, "s_acc"),
    ("split", "o_accum", _next_up, "o_accum"),
    ("split", "lse_accum", _next_up, "lse_accum"),
])
def test_a_spoiled_recording_fails_the_replay(recordings, tmp_path, kind, field, spoil, failing):
    paths, _ = recordings
    bad = _spoiled(paths[kind], tmp_path / "bad.npz", **{field: spoil})
    status, report = _json(["compare", "--gpu-npz", str(bad), "--json"])
    assert status == 1 and not report["ok"]
    if failing in report["checkpoints"]:
        assert not report["checkpoints"][failing]["ok"]
        assert report["checkpoints"][failing]["first_mismatch"]["cta"] == report["ctas"][-1]
    elif failing == "o":
        assert report["o"]["fraction_identical"] < 1.0
    else:
        assert report["workspace"][failing]["max_ulps_f32"] == 1


def test_ctas_pick_a_subset_of_a_split_recording(recordings, capsys):
    paths, _ = recordings
    assert main(["compare", "--gpu-npz", str(paths["split"]), "--ctas", "2"]) == 0
    out = capsys.readouterr().out
    assert "splits=3" in out and "every checkpoint, the workspace, O and LSE bit-identical" in out


def test_a_split_recording_replays_its_recorded_source(recordings, tmp_path, capsys):
    """A recording whose fa2_fwd.cu is not today's (here: one comment more) runs the recorded text."""
    paths, _ = recordings
    other = _spoiled(paths["split"], tmp_path / "other.npz",
                     kernel_source=lambda s: np.asarray(str(s) + "\n// recorded before an edit\n"))
    assert main(["compare", "--gpu-npz", str(other)]) == 0
    captured = capsys.readouterr()
    assert "replaying the recorded kernel fa2_fwd.cu on the PTX engine" in captured.err
    assert "every checkpoint, the workspace, O and LSE bit-identical" in captured.out


def test_a_one_split_recording_has_no_workspace(tmp_path, monkeypatch, capsys):
    _stand_in(monkeypatch)
    path = tmp_path / "one.npz"
    argv = [*SPLIT[:-1], "1", "--pack-gqa", "off", "--ctas", "0,3"]
    assert main(["compare", *argv, "--save", str(path)]) == 0
    names = np.load(path).files
    assert "o_accum" not in names and "combine_source" not in names and "splits" in names
    monkeypatch.undo()
    capsys.readouterr()
    assert main(["compare", "--gpu-npz", str(path)]) == 0
    out = capsys.readouterr().out
    assert "splits=1" in out and "  sO " in out and "o_accum" not in out


@pytest.mark.parametrize("extra, message", [
    (["--splits", "2"], "--splits does not apply with --gpu-npz, whose recording fixes the launch"),
    (["--seqlens", "5,7"], "--seqlens does not apply with --gpu-npz"),
    (["--cache-seqlens", "3,3"], "--cache-seqlens does not apply with --gpu-npz"),
    (["--seqlen", "40"], "--seqlen does not apply with --gpu-npz"),  # packed: the offsets fix the lengths
    (["--heads", "4"], "--heads 4 disagrees with --gpu-npz"),
    (["--engine", "program"], "--engine program does not run"),
    (["--banks"], "--banks does not apply with --gpu-npz, which launches nothing"),
])
@pytest.mark.parametrize("kind", ["packed", "split"])
def test_replay_refusals_are_one_line(recordings, capsys, kind, extra, message):
    paths, _ = recordings
    if kind == "split" and extra[0] == "--seqlen":
        extra, message = ["--seqlen", "40"], "--seqlen 40 disagrees with --gpu-npz"
    assert message in _refused(["compare", "--gpu-npz", str(paths[kind]), *extra], capsys)


@pytest.mark.parametrize("kind", ["packed", "split"])
def test_the_seed_of_a_recording_is_checked(recordings, capsys, kind):
    paths, _ = recordings
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["compare", "--gpu-npz", str(paths[kind]), "--seed", "0"]) == 0
    assert "are not the random inputs of this seed" in _refused(
        ["compare", "--gpu-npz", str(paths[kind]), "--seed", "1"], capsys)


@pytest.mark.parametrize("flag", ["--banks", "--timing"])
@pytest.mark.parametrize("kind", ["packed", "split"])
def test_banks_and_timing_are_refused_with_a_recording(recordings, capsys, kind, flag):
    """A recording holds the GPU side of the checkpoint comparison only, no Nsight Compute counts or
    times (as a dense one): --banks / --timing with --gpu-npz are refused in one line."""
    paths, _ = recordings
    err = _refused(["compare", "--gpu-npz", str(paths[kind]), flag], capsys)
    assert f"{flag} does not apply with --gpu-npz, which launches nothing" in err


def test_save_with_banks_records_the_run_as_without(monkeypatch, tmp_path):
    """fa compare --save --banks of a packed batch (the GPU and ncu stood in for) writes the recording
    it writes without --banks, array for array: the counts are printed, not saved (as a dense run's)."""
    from cli_helpers import stand_in_ncu

    _stand_in(monkeypatch)
    stand_in_ncu(monkeypatch)
    argv = ["compare", "--seqlens", "5,70", "--head-dim", "32", "--json", "--save"]
    _, with_banks = _json([*argv, str(tmp_path / "banks.npz"), "--banks"])
    assert "banks" in with_banks
    _json([*argv, str(tmp_path / "plain.npz")])
    a, b = np.load(tmp_path / "banks.npz"), np.load(tmp_path / "plain.npz")
    assert sorted(a.files) == sorted(b.files) and all(np.array_equal(a[n], b[n]) for n in a.files)


# -- the format-5 fields, each checked in one line -----------------------------------------------------------
def _altered(src: Path, dst: Path, drop=(), **change) -> Path:
    data = {k: np.asarray(v) for k, v in np.load(src).items() if k not in drop}
    data.update(change)
    np.savez(dst, **data)
    return dst


@pytest.mark.parametrize("kind, drop, change, message", [
    ("packed", ("cu_seqlens_k",), {}, "a packed run holds both cu_seqlens_q and cu_seqlens_k"),
    ("packed", (), {"cu_seqlens_q": np.array([0, 70, 60, 205], np.int32)}, "it decreases at cu_seqlens_q[1]"),
    ("packed", (), {"cu_seqlens_k": np.array([0, 70, 200, 205], np.int64)}, "got dtype int64"),
    ("packed", (), {"lse": np.zeros((205, 2), np.float32)}, "field lse holds an array of shape (205, 2)"),
    ("packed", (), {"q": np.zeros((2, 1, 205, 64), np.float16)}, "a packed run holds float16 q [total_q, H, d]"),
    ("packed", (), {"format": 4}, "format 4 holds cu_seqlens_q, cu_seqlens_k, which only format 5 has"),
    ("packed", (), {"splits": 2}, "both present; a saved run is one launch"),
    ("packed", (), {"ctas": np.array([0, 18])}, "field ctas holds [0, 18]; a saved run holds distinct CTA ids of its "
                                                "grid there, 0..17"),
    ("split", ("pack_gqa",), {}, "this file lacks pack_gqa"),
    ("split", ("o_accum",), {}, "holds its workspace o_accum and lse_accum; this file lacks o_accum"),
    ("split", ("combine_source",), {}, "this file lacks it"),
    ("split", (), {"splits": 9}, "fields splits / cache_seqlens / pack_gqa: splits must be an integer from 1 to 4"),
    ("split", (), {"cache_seqlens": np.array([200, 201], np.int32)}, "cache_seqlens[1] = 201 is outside 1..200"),
    ("split", (), {"cache_seqlens": np.array([200, 75], np.int64)}, "field cache_seqlens holds an array of shape (2,) "
                                                                    "and dtype int64"),
    ("split", (), {"pack_gqa": "yes"}, "field pack_gqa holds 'yes'"),
    ("split", (), {"o_accum": np.zeros((3, 4, 2, 32), np.float32)}, "field o_accum holds an array of shape "
                                                                     "(3, 4, 2, 32)"),
    ("split", (), {"ctas": np.array([6])}, "0..5"),
    ("split", (), {"checkpoints": np.zeros((2, 11, 4, 128, 32), np.uint32)}, "field checkpoints holds an array of "
                                                                             "shape (2, 11, 4, 128, 32)"),
])
def test_every_format_5_field_is_checked_in_one_line(recordings, tmp_path, kind, drop, change, message):
    paths, _ = recordings
    path = _altered(paths[kind], tmp_path / "run.npz", drop, **change)
    with pytest.raises(ValueError) as info:
        SavedRun.load(path)
    text = str(info.value)
    assert "\n" not in text and text.startswith(f"{path}: ") and message in text, text


def test_pack_gqa_true_without_groups_is_refused(recordings, tmp_path):
    """A recording with H = H_k cannot have run GQA packed."""
    paths, _ = recordings
    data = {k: np.asarray(v) for k, v in np.load(paths["split"]).items()}
    data["k"] = np.concatenate([data["k"], data["k"]], axis=1)
    data["v"] = np.concatenate([data["v"], data["v"]], axis=1)
    np.savez(tmp_path / "run.npz", **data)
    with pytest.raises(ValueError, match="field pack_gqa holds True, but this run has one Q head per K/V head"):
        SavedRun.load(tmp_path / "run.npz")


# -- recordings of a real GPU (tests/data/h100 or h200) ------------------------------------------------------
# file -> what experiments/device_round36.sh's featrec step (and device_round40.sh) records (its options there):
# packed: --seqlens 70,130,5 --heads 4 --heads-k 2 --causal --head-dim 64 --ctas 0,17,33 (CTA 17: sequence 1's
# tail Q block; 33: the last that runs); splitkv: --batch 2 --heads 4 --heads-k 1 --seqlen 2 --seqlen-k 300
# --cache-seqlens 300,70 --head-dim 64 --splits 3 --ctas 0,1,4,5 (GQA packed: grid (1, 2, 3); CTA 1 sequence 1's
# split 0 with a tail, 4 sequence 0's split 2 with a tail, 5 an empty split)
GPU_RECORDINGS = {
    "compare_packed": ("packed", {"cu_seqlens": ((0, 70, 200, 205),) * 2, "causal": True, "ctas": (0, 17, 33)},
                       (4, 2)),
    "compare_splitkv": ("split", {"splits": 3, "pack_gqa": True, "causal": False, "ctas": (0, 1, 4, 5)}, (4, 1)),
}


@pytest.mark.parametrize("name", list(GPU_RECORDINGS))
def test_the_simulator_reproduces_a_recorded_gpu_run_bit_for_bit(name):
    found = [d / f"{name}.npz" for d in (DATA / "h100", DATA / "h200") if (d / f"{name}.npz").exists()]
    if not found:
        pytest.skip(f"{name}.npz is not recorded yet: STEPS=featrec bash experiments/device_round36.sh on a GPU "
                    f"writes it to $OUT (copy it to tests/data/h100/ or h200/)")
    kind, fields, (heads, heads_k) = GPU_RECORDINGS[name]
    for path in found:
        run = SavedRun.load(path)
        assert run.kind == kind and (run.problem.heads, run.heads_k) == (heads, heads_k), path
        assert all(getattr(run, f) == v for f, v in fields.items()), path
        assert kind == "packed" or run.cache_seqlens.tolist() == [300, 70]
        status, report = _json(["compare", "--gpu-npz", str(path), "--json"])
        assert status == 0 and report["ok"], path
        _all_identical(report)
        assert report["ctas"] == list(run.ctas)
        if run.kind == "split" and run.splits > 1:
            assert report["workspace"]["o_accum"]["fraction_identical"] == 1.0
            assert report["workspace"]["lse_accum"]["fraction_identical"] == 1.0
