"""`--config LABEL|auto` with --backward: the backward's tuning candidates (fa_hw.tuned_backward.CANDIDATES)
by the labels experiments/tune_bwd.py gives them (fa_sim.contract.backward.LABEL_FORMS), run and timed by
every command where the tiles change what runs: fa time (the timing model, the config's own build), fa sim,
fa banks, fa trace (the PTX engine), fa hw and fa compare (their CPU parts, with the engine as the GPU);
`auto` is the tuned table's choice for the modelled GPU (fa time) or the device (fa hw, fa compare). Bad
labels are one line before any work. Shapes are tiny: every lane of the PTX engine is simulated."""

from __future__ import annotations

import json
import math
import types
from pathlib import Path

import numpy as np
import pytest

from fa_sim.cli import main
from fa_sim.contract.backward import LABEL_FORMS, BackwardConfig, label, parse_label

EXPECTED_FORMS = "<block_m>x<n_warps>s<q_stages>[f][r<dq_red>][p][m][l][z]"
SHAPE = ["--heads", "1", "--seqlen", "128", "--head-dim", "64"]  # (1, 1, 128, 64)


def _engine():
    pytest.importorskip("cuda.bindings.nvrtc", reason="the PTX engine compiles with NVRTC (the hw extra)")


# -- the label syntax -------------------------------------------------------------------------------------
def test_every_candidate_label_names_its_config_and_back():
    """Each candidate's label parses to the same BackwardConfig, and the labels are distinct per head_dim."""
    from fa_hw.tuned_backward import CANDIDATES, candidates

    for d in CANDIDATES:
        cands = candidates(d)
        labels = [c.label for c in cands]
        assert len(set(labels)) == len(labels), d
        for cfg in cands:
            assert BackwardConfig.from_label(cfg.label, d) == cfg
            assert BackwardConfig.from_label(cfg.label, d, "bf16") == BackwardConfig(**{
                **{f: getattr(cfg, f) for f in cfg.__dataclass_fields__}, "dtype": "bf16"})
    assert BackwardConfig(64).label == "64x4s1" and BackwardConfig(128).label == "32x4s1"
    assert label(64, 8, 1, "ffma", 4, True, True, 32) == "64x8s1fr4pml"
    assert parse_label("128x8s2fr2") == (128, 8, 2, "ffma", 2, False, False, 16, False)
    assert parse_label("64x8s1r1p") == (64, 8, 1, "fmul_fsub", 1, True, False, 16, False)
    assert parse_label("64x8s1r4pmz") == (64, 8, 1, "fmul_fsub", 4, True, False, 32, True)
    assert BackwardConfig.from_label("64x8s1r4pmz", 128) == BackwardConfig(128, block_m=64, n_warps=8, dq_red=4,
                                                                            dq_frag=True, dq_warp_rows=32,
                                                                            smem_swizzle=True)


def test_tune_bwd_uses_the_contracts_labels():
    """experiments/tune_bwd.py names its candidates and reads its records with the contract's syntax."""
    import importlib.util
    import sys

    path = Path(__file__).resolve().parent.parent / "experiments" / "tune_bwd.py"
    spec = importlib.util.spec_from_file_location("tune_bwd_labels", path)
    tune = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(tune)
    finally:
        sys.path.remove(str(path.parent))
    assert tune._label is label and tune._parse_label is parse_label
    assert tune._label_of(BackwardConfig(64, block_m=64, n_warps=8, softmax="ffma", dq_red=4, dq_frag=True)) == \
        "64x8s1fr4p"


@pytest.mark.parametrize("text", ["64x8", "64x8s1q", "x4s1", "64x8s1pf", "64x8s1rp", "64X8S1", " 64x8s1", "", "64x8s1zl", "64x8s1zz"])
def test_a_text_that_is_no_label_names_the_forms(text):
    with pytest.raises(ValueError) as exc:
        parse_label(text)
    assert EXPECTED_FORMS in str(exc.value) and "\n" not in str(exc.value)


# -- bad --config with --backward: one line before any work -------------------------------------------------
@pytest.mark.parametrize("argv, message", [
    (["time", "--backward", "--config", "64x8"], f"--config 64x8: '64x8' is not a backward config label; labels look "
                                                 f"like {LABEL_FORMS}; or auto"),
    (["time", "--backward", "--config", "fast"], "--config fast: 'fast' is not a config tag like 'm64n64d64w4-swizzled' "
                                                 "or 'm128n64d128w4-swizzled-s2-qr'; with --backward a backward label "
                                                 "like 64x8s1fr4p, or auto"),
    (["time", "--backward", "--config", "m64n64d64w4-swizzled"],
     "--config m64n64d64w4-swizzled is a forward config tag; with --backward --config takes a backward label ("
     + EXPECTED_FORMS),
    (["time", "--config", "64x8s1fr4p"], "--config 64x8s1fr4p is a backward label"),
    (["sim", "--config", "64x4s1"], "--config 64x4s1 is a backward label"),
    (["time", "--backward", "--config", "128x8s1", "--head-dim", "128"],
     "--config 128x8s1 at head_dim 128: BackwardConfig(head_dim=128, block_m=128, n_warps=8) needs 175104 bytes"),
    (["sim", "--backward", "--config", "128x8s1", "--head-dim", "128"], "--config 128x8s1 at head_dim 128"),
    (["hw", "--backward", "--config", "32x8s1", "--head-dim", "96"], "--config 32x8s1 at head_dim 96: "),
    (["time", "--backward", "--config", "64x8s1r4", "--gpu", "a100"],
     "--config 64x8s1r4: dq_red=4 (red.global.add.v4.f32) needs sm_90 or newer, the a100 model is sm_80"),
    (["sim", "--backward", "--config", "auto"], "--config auto with --backward picks a GPU's tuned backward tiles"),
    (["banks", "--backward", "--config", "auto"], "so it applies to fa time (the modelled GPU's), fa hw and fa compare"),
    (["trace", "--backward", "--config", "64x8s1r4pm"], "--config 64x8s1r4pm: fa trace --backward reads the dQ GEMM's "
                                                        "16-row warp tiles"),
])
def test_bad_backward_configs_are_one_line(capsys, argv, message):
    assert main([*argv, "--seqlen", "64", *([] if "--head-dim" in argv else ["--head-dim", "64"])]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


# -- fa time --backward --config ------------------------------------------------------------------------------
def test_fa_time_backward_times_the_labels_config(capsys):
    """The label's build is what is timed: the prediction is predict_backward_seeded's with that config,
    and differs from DEFAULT_TILES' (other tiles, another grid)."""
    _engine()
    from fa_sim.timing import predict_backward_seeded

    assert main(["time", "--backward", "--config", "64x8s1fr4p", "--dq", "atomic", *SHAPE, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    cfg = BackwardConfig(64, block_m=64, n_warps=8, softmax="ffma", dq_red=4, dq_frag=True)
    assert out["config"] == {"head_dim": 64, "block_m": 64, "block_n": 128, "warps": 8, "label": "64x8s1fr4p"}
    assert out["config_source"] is None
    want = predict_backward_seeded(1, 1, 128, 128, 64, gpu="h200", config=cfg)
    assert out["kernel_ms"] == pytest.approx(want.kernel_ms, rel=1e-12)
    default = predict_backward_seeded(1, 1, 128, 128, 64, gpu="h200")
    assert out["kernel_ms"] != pytest.approx(default.kernel_ms, rel=1e-6)
    assert out["kernels"]["fa2_bwd_kernel"]["ctas"] == 1  # 128 keys in one 8-warp block (default: 2)
    assert main(["time", "--backward", "--config", "64x8s1fr4p", "--dq", "atomic", *SHAPE]) == 0
    text = capsys.readouterr().out
    assert "\n  config 64x8s1fr4p       d=64 block_m=64 block_n=128 warps=8 softmax=ffma dq_red=4 dq_frag\n" in text
    assert f"predicted time          {want.kernel_ms:.4f} ms" in text


@pytest.mark.parametrize("gpu, causal", [("h200", False), ("h200", True), ("a100", False)])
def test_fa_time_backward_config_auto_is_the_modelled_gpus_table_entry(capsys, gpu, causal):
    """auto: fa_hw.tuned_backward.lookup for the model's driver name and arch (the H200 borrows the H100's
    sm_90 table; the A100 model, sm_80, has none: DEFAULT_TILES), printed with its source."""
    _engine()
    from fa_hw.tuned_backward import lookup
    from fa_sim.timing import GPUS, predict_backward_seeded

    model = GPUS[gpu]
    choice = lookup(64, causal, 128, gpu=model.marketing_name, arch=model.arch)
    flag = ["--causal"] if causal else []
    assert main(["time", "--backward", "--config", "auto", "--gpu", gpu, *flag, *SHAPE, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["config"]["label"] == choice.config.label and out["config_source"] == choice.source
    if gpu == "h200":
        assert "h100_80gb_hbm3.json" in choice.source and choice.config != BackwardConfig(64)
    else:
        assert choice.source.startswith("DEFAULT_TILES") and choice.config == BackwardConfig(64)
    want = predict_backward_seeded(1, 1, 128, 128, 64, causal, deterministic=True, gpu=gpu, config=choice.config)
    assert out["kernel_ms"] == pytest.approx(want.kernel_ms, rel=1e-12)
    assert main(["time", "--backward", "--config", "auto", "--gpu", gpu, *flag, *SHAPE]) == 0
    assert f"\n  config auto: {choice.source}\n" in capsys.readouterr().out


# -- the PTX engine: fa sim, fa banks, fa trace ---------------------------------------------------------------
def test_fa_sim_backward_runs_the_labels_config(capsys):
    """fa sim --backward --config: the label's tiles and options run (its instruction counts, its gradients
    within the bound; dK and dV the default tiles' bits, as tests/test_backward_tiles.py shows they must be)."""
    _engine()
    import fa_sim
    from fa_sim.backward import simulate_backward
    from fa_sim.reference import random_inputs_backward

    argv = ["sim", "--backward", "--config", "128x8s1r4p", "--dq", "atomic", *SHAPE, "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["config"] == {"head_dim": 64, "block_m": 128, "block_n": 128, "warps": 8, "label": "128x8s1r4p"}
    assert out["above_bound"] == []
    q, k, v, do = random_inputs_backward(1, 1, 128, 128, 64, seed=0)
    fwd = fa_sim.simulate(q, k, v)
    cfg = BackwardConfig.from_label("128x8s1r4p", 64)
    res = simulate_backward(q, k, v, fwd.o, fwd.lse, do, deterministic=False, config=cfg)
    assert out["instructions"] == _counts(res)
    default = simulate_backward(q, k, v, fwd.o, fwd.lse, do, deterministic=False)
    assert np.array_equal(res.dk.view(np.uint16), default.dk.view(np.uint16))
    assert _counts(res) != _counts(default)
    assert main(argv[:-1]) == 0
    assert "d=64 block_m=128 block_n=128 warps=8 dq_red=4 dq_frag (--config 128x8s1r4p) dQ atomic" in \
        capsys.readouterr().out


def _counts(res) -> dict:
    from fa_sim.events import COUNTED_OPS

    return {kern: {op.value: int(c.get(op, 0)) for op in COUNTED_OPS} for kern, c in res.instructions.items()}


def test_fa_banks_backward_counts_the_labels_kernel(capsys):
    _engine()
    from fa_sim.backward import simulate_backward
    from fa_sim.observers.banks import BankCounter
    import fa_sim
    from fa_sim.reference import random_inputs_backward

    assert main(["banks", "--backward", "--config", "64x8s2", *SHAPE, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["config"]["label"] == "64x8s2" and out["config"]["block_n"] == 128
    q, k, v, do = random_inputs_backward(1, 1, 128, 128, 64, seed=0)
    fwd = fa_sim.simulate(q, k, v)
    counter = BankCounter()
    simulate_backward(q, k, v, fwd.o, fwd.lse, do, deterministic=False, observers=[counter],
                      config=BackwardConfig.from_label("64x8s2", 64))
    want = counter.report().to_json()
    assert out["phases"] == want["phases"] and out["rounds"] == want["rounds"]
    assert set(out["rounds"]) == {"prologue", "0", "1"}  # two Q blocks of 64 in the one CTA of 128 keys


def test_fa_trace_backward_follows_a_lane_of_the_labels_tiles(capsys):
    """Warp 5 exists only with the label's 8 warps; its S, dP and dV sit at the coordinates the view gives
    (keys 80..95 of the CTA's 128) and equal float64 there."""
    _engine()
    from fa_sim.reference import attention, random_inputs_backward

    assert main(["trace", "--backward", "--config", "64x8s1fr4p", *SHAPE, "--warp", "5", "--lane", "3",
                 "--round", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mmas"] == {"S": 32, "dV": 32, "dP": 32, "dK": 32, "dQ": 32} and out["m_block"] == 1
    q, k, v, do = (x[0, 0].astype(np.float64) for x in random_inputs_backward(1, 1, 128, 128, 64, seed=0))
    s = 1 / math.sqrt(64)
    o, lse = attention(q, k, v, scale=s)
    sco = out["scores"]
    key, query = np.array(sco["key"]), np.array(sco["query"])
    assert set(key) == {80, 88} and query.min() >= 64
    np.testing.assert_allclose(np.array(sco["s"]), (q @ k.T)[query, key], rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(np.array(sco["dp"]), (do @ v.T)[query, key], rtol=1e-5, atol=1e-4)
    assert main(["trace", "--backward", "--config", "64x8s1fr4p", *SHAPE, "--warp", "8"]) == 2
    assert "--warp 8 is outside the CTA: 8 warps" in capsys.readouterr().err


# -- fa hw, fa compare: their CPU parts with the engine as the GPU --------------------------------------------
def _engine_as_gpu(monkeypatch, name="NVIDIA H100 80GB HBM3", arch="sm_90"):
    """fa_hw's forward and backward replaced by the simulator's (as tests/test_cli_backward.py's), the device
    by one of this name and arch (what --config auto looks up); fa_hw.backward records its config."""
    import fa_hw
    import fa_hw.runtime
    import fa_sim
    from cli_helpers import as_hw_backward
    from fa_sim.backward import simulate_backward

    seen = []

    def backward(*a, config=None, **kw):
        seen.append(config)
        return as_hw_backward(simulate_backward(*a, mma_model="h200", config=config, **kw))

    monkeypatch.setattr(fa_hw.runtime, "device", lambda *a: types.SimpleNamespace(name=name))
    monkeypatch.setattr(fa_hw.runtime, "device_arch", lambda *a: arch)
    monkeypatch.setattr(fa_hw, "forward", lambda q, k, v, causal=False, scale=None, dtype=None: fa_sim.simulate(
        q, k, v, causal=causal, scale=scale, dtype=dtype))
    monkeypatch.setattr(fa_hw, "backward", backward)
    return seen


def test_fa_hw_backward_config_auto_runs_the_devices_table_entry(capsys, monkeypatch):
    _engine()
    from fa_hw.tuned_backward import lookup

    seen = _engine_as_gpu(monkeypatch)
    choice = lookup(64, True, 128, gpu="NVIDIA H100 80GB HBM3", arch="sm_90")
    assert main(["hw", "--backward", "--config", "auto", "--causal", *SHAPE, "--dq", "atomic", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert seen == [choice.config] and out["config"]["label"] == choice.config.label
    assert out["config_source"] == choice.source and "h100_80gb_hbm3.json (d=64, causal, short)" in choice.source
    assert out["above_bound"] == []
    assert main(["hw", "--backward", "--config", "64x8s1", *SHAPE]) == 0
    text = capsys.readouterr().out
    assert seen[-1] == BackwardConfig(64, block_m=64, n_warps=8) and "  --config 64x8s1\n" in text
    seen.clear()
    _engine_as_gpu(monkeypatch, "NVIDIA A100-SXM4-80GB", "sm_80")  # a label the GPU cannot compile: before the forward
    assert main(["hw", "--backward", "--config", "64x8s1r2", *SHAPE]) == 2
    assert "dq_red=2 (red.global.add.v2.f32) needs sm_90 or newer, this GPU is sm_80" in capsys.readouterr().err


def test_fa_compare_backward_runs_the_label_on_both_sides(capsys, monkeypatch):
    """Both sides run the label's tiles (the checkpoint layout follows them: 8 warps, block_m 32)."""
    _engine()
    seen = _engine_as_gpu(monkeypatch)
    shape = ["--seqlen", "70", "--seqlen-k", "90", "--head-dim", "64", "--causal"]
    assert main(["compare", "--backward", "--config", "32x8s1", *shape, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert seen == [BackwardConfig(64, block_m=32, n_warps=8)] and out["config"]["label"] == "32x8s1"
    assert out["ok"] and out["ctas"] == [0] and out["config_source"] is None  # 90 keys: one CTA of 128
    assert all(c["fraction_identical"] == 1.0 for c in out["checkpoints"].values())


@pytest.mark.gpu
def test_fa_hw_and_compare_backward_config_on_the_gpu(capsys):
    """On a GPU: fa hw --backward --config auto runs the device's tuned entry within the bound; fa compare
    --backward --config LABEL (a tuned candidate) deterministic: bit for bit against the PTX engine."""
    import fa_hw
    if not fa_hw.has_gpu():
        pytest.skip("no NVIDIA GPU / driver here")
    from fa_hw.tuned_backward import device_config

    shape = ["--seqlen", "100", "--seqlen-k", "70", "--heads", "2", "--head-dim", "64", "--causal"]
    assert main(["hw", "--backward", "--config", "auto", *shape, "--dq", "atomic", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["above_bound"] == [] and out["config"]["label"] == device_config(64, True, 70).label
    assert main(["compare", "--backward", "--config", "64x8s1", *shape, "--dq", "deterministic", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["config"]["label"] == "64x8s1"
    assert all(g["identical"] == 1.0 for g in out["gradients"].values())


def test_fa_banks_and_check_hazards_run_a_swizzled_label(capsys):
    """--config with the z suffix (smem_swizzle): fa banks --backward names the swizzled layout and counts the
    cp.async copies at their ideal wavefronts (the padded label's 10.5 per instruction at d = 64), no LDSM, LDS
    or STS conflict; fa sim --backward --check-hazards finds no hazard in either kernel."""
    _engine()
    argv = ["banks", "--backward", "--heads", "1", "--seqlen", "128", "--head-dim", "64", "--json", "--config"]
    got = {}
    for lab in ("64x8s1fr4p", "64x8s1fr4pz"):
        assert main(argv + [lab]) == 0
        got[lab] = json.loads(capsys.readouterr().out)
    z, p = got["64x8s1fr4pz"], got["64x8s1fr4p"]
    assert z["config"]["label"] == "64x8s1fr4pz" and z["smem"].startswith("swizzled") and p["smem"].startswith("padded")
    cz, cp = z["classes"]["LDGSTS"], p["classes"]["LDGSTS"]
    assert cz["wavefronts"] == cz["ideal"] == cp["ideal"] and cp["wavefronts"] * 4 == cp["ideal"] * 10.5
    assert all(z["classes"][c]["conflicts"] == 0 for c in ("LDSM", "LDS", "STS"))
    assert main(["sim", "--backward", "--check-hazards", "--dq", "deterministic", "--heads", "1", "--seqlen", "70",
                 "--seqlen-k", "90", "--head-dim", "64", "--causal", "--config", "64x8s1fr4pz"]) == 0
    out = capsys.readouterr().out
    assert "main kernel (fa2_bwd_kernel) hazards: none" in out and "dQ kernel (fa2_bwd_dq_kernel) hazards: none" in out
