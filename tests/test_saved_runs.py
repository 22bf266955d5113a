"""Saved GPU runs (fa_sim.crosscheck.SavedRun, `fa compare --save` / `--gpu-npz`): a versioned
.npz. Format 1 (no "format" entry) predates the softmax-form field: every such run was made with
the FFMA form, and loads as such; format 2 names the form in the config tag."""

from pathlib import Path

import numpy as np
import pytest

from fa_sim.config import KernelConfig, SmemLayout, SoftmaxForm
from fa_sim.crosscheck import SAVED_RUN_FORMAT, SavedRun, config_from_tag

H200 = Path(__file__).parent / "data" / "h200"


def _run(config: KernelConfig) -> SavedRun:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 1, 8, config.head_dim)).astype(np.float16)
    return SavedRun(x, x, x, x, np.zeros((1, 1, 8), np.float32), np.zeros((1, 11, 1, 128, 32), np.uint32),
                    (0,), config, True, 0.125)


@pytest.mark.parametrize("name", ["compare_seed_n128", "compare_causal_tails"])
def test_unversioned_recordings_load_in_the_ffma_form(name):
    run = SavedRun.load(H200 / f"{name}.npz")
    assert "format" not in np.load(H200 / f"{name}.npz").files
    assert run.config == KernelConfig(softmax=SoftmaxForm.FFMA) and run.config.tag == "m64n64d64w4-swizzled-ffma"


@pytest.mark.parametrize("form", list(SoftmaxForm))
def test_round_trip_keeps_the_form(form, tmp_path):
    run = _run(KernelConfig(smem="padded", softmax=form))
    run.save(tmp_path / "run.npz")
    back = SavedRun.load(tmp_path / "run.npz")
    assert int(np.load(tmp_path / "run.npz")["format"]) == SAVED_RUN_FORMAT
    assert back.config == run.config and back.ctas == run.ctas and back.causal and back.scale == 0.125
    assert np.array_equal(back.q, run.q) and np.array_equal(back.checkpoints, run.checkpoints)


def test_with_config_adopts_the_runs_form():
    run = _run(KernelConfig(softmax="ffma"))
    assert run.with_config(KernelConfig(smem="plain")) == KernelConfig(smem="plain", softmax="ffma")


def test_every_tag_parses_back():
    for cfg in KernelConfig.family():
        for form in SoftmaxForm:
            c = KernelConfig(cfg.block_m, cfg.block_n, cfg.head_dim, cfg.n_warps, cfg.smem, form)
            assert config_from_tag(c.tag) == c
    assert config_from_tag("m64n64d64w4-plain", SoftmaxForm.FFMA).softmax is SoftmaxForm.FFMA
    assert config_from_tag("m64n64d64w4-plain").smem is SmemLayout.PLAIN


@pytest.mark.parametrize("tag, message", [("seed", "not a config tag"), ("m64n64d64w4-swizzled-fma", "softmax form"),
                                          ("m64n64d48w4-swizzled", "head_dim=48"),
                                          ("m64n64d64w4-swizzled-s2-s3", "'s3' contradicts 's2'"),
                                          ("m64n64d64w4-swizzled-ffma-fmul_fsub", "'fmul_fsub' contradicts 'ffma'"),
                                          ("m64n64d64w4-swizzled-hf-hf", "'hf' repeats 'hf'")])
def test_bad_tags_are_value_errors(tag, message):
    with pytest.raises(ValueError, match=message):
        config_from_tag(tag)


def _write(path, kind):
    good = {k: np.asarray(v) for k, v in np.load(H200 / "compare_seed_n128.npz").items()}
    if kind == "future format":
        np.savez(path, format=SAVED_RUN_FORMAT + 1, **good)
    elif kind == "missing array":
        np.savez(path, **{k: v for k, v in good.items() if k != "checkpoints"})
    elif kind == "one array":
        with open(path, "wb") as f:  # np.save would append .npy to the name
            np.save(f, good["q"])
    elif kind == "truncated":
        np.savez(path, **good)
        path.write_bytes(path.read_bytes()[:500])
    elif kind == "text":
        path.write_text("q, k, v\n")


@pytest.mark.parametrize("kind, message", [
    ("future format", f"saved-run format {SAVED_RUN_FORMAT + 1}"), ("missing array", "lacks checkpoints"),
    ("one array", "not an .npz archive"), ("truncated", "cannot read"), ("text", "cannot read"),
])
def test_unreadable_runs_are_one_line_errors(kind, message, tmp_path):
    path = tmp_path / "run.npz"
    _write(path, kind)
    with pytest.raises(ValueError, match=message) as info:
        SavedRun.load(path)
    assert "\n" not in str(info.value)


def test_fa_compare_replays_a_recording_in_its_form(capsys):
    from fa_sim.cli import main

    assert main(["compare", "--gpu-npz", str(H200 / "compare_seed_n128.npz")]) == 0
    out = capsys.readouterr().out
    assert "config m64n64d64w4-swizzled-ffma" in out and "every checkpoint, O and LSE bit-identical" in out


FORMAT3 = H200 / "compare_causal_s200_k333.npz"  # format 3: config_json, kernel name and source


def _altered(path, **change):
    data = {k: np.asarray(v) for k, v in np.load(FORMAT3).items()}
    data.update(change)
    np.savez(path, **{k: v for k, v in data.items() if v is not None})


@pytest.mark.parametrize("change, message", [
    ({"causal": "no"}, "field causal holds 'no' (<U2); a saved run holds the causal flag, True or False"),
    ({"causal": "maybe"}, "field causal holds 'maybe'"),
    ({"causal": np.ones((2, 2), bool)}, "field causal holds an array of shape (2, 2) and dtype bool"),
    ({"causal": 1}, "field causal holds 1 (int64)"),
    ({"o": np.zeros((1, 2, 100, 64), np.float16)}, "field o holds an array of shape (1, 2, 100, 64) and dtype "
                                                    "float16; a saved run holds the GPU's output O, of q's shape: "
                                                    "float16 of shape (1, 2, 200, 64)"),
    ({"o": np.zeros((1, 2, 200, 64), np.float32)}, "field o holds an array of shape (1, 2, 200, 64) and dtype float32"),
    ({"lse": np.zeros((1, 2, 200, 1), np.float32)}, "field lse holds an array of shape (1, 2, 200, 1)"),
    ({"k": np.zeros((1, 2, 333, 32), np.float16)}, "field k holds an array of shape (1, 2, 333, 32)"),
    ({"q": np.zeros((2, 200, 64), np.float16)}, "field q holds an array of shape (2, 200, 64)"),
    ({"q": np.zeros((1, 2, 200, 128), np.float16)}, "field q has head_dim 128, but the run's config"),
    ({"config": "m64n64d64w4-plain"}, "field config 'm64n64d64w4-plain' contradicts field config_json, which "
                                      "describes 'm64n64d64w4-swizzled'"),
    ({"config": "m64n64d64w4-swizzled-s2-s3"}, "field config: config tag"),
    ({"config_json": "{"}, "field config_json: KernelConfig JSON is not valid JSON"),
    ({"scale": -1.0}, "field scale holds -1.0; a saved run holds a positive finite softmax scale"),
    ({"scale": "0.125"}, "field scale holds '0.125' (<U5)"),
    ({"format": "3"}, "field format holds '3' (<U1)"),
    ({"ctas": np.array([0, 99])}, "field ctas holds [0, 99]; a saved run holds distinct CTA ids of its grid there, "
                                  "0..7"),
    ({"ctas": np.array([[0, 7]])}, "field ctas holds an array of shape (1, 2)"),
    ({"checkpoints": np.zeros((2, 11, 6, 128, 32), np.float32)}, "field checkpoints holds an array of shape "
                                                                  "(2, 11, 6, 128, 32) and dtype float32"),
    ({"checkpoints": np.zeros((1, 11, 6, 128, 32), np.uint32)}, "a saved run holds the checkpoint buffer"),
    ({"kernel_name": None}, "format 3 lacks kernel_name"),
])
def test_every_field_is_checked_in_one_line(change, message, tmp_path):
    """A field of the wrong type, shape or dtype, or fields that disagree: one line naming the
    field, never a numpy message, never a silently misread value ("no" is not causal)."""
    path = tmp_path / "run.npz"
    _altered(path, **change)
    with pytest.raises(ValueError) as info:
        SavedRun.load(path)
    text = str(info.value)
    assert "\n" not in text and text.startswith(f"{path}: ") and message in text, text


def test_a_consistent_run_loads():
    run = SavedRun.load(FORMAT3)
    assert run.causal is True and run.ctas == (0, 7) and run.kernel_name == "fa2_fwd.cu"

