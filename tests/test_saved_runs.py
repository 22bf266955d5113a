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
