"""Kernel options of issue 11 without NVRTC or a GPU: KernelConfig fields, tags and validation, the
shared-memory stages, the macros, which simulator front end runs what, and config="auto"
(fa_hw.tuned: size classes, tables, lookup, heuristic) with the CLI's --config auto."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fa_sim
from fa_hw import tuned
from fa_sim import validate
from fa_sim.contract import KernelBuild
from fa_sim.cli import main
from fa_sim.config import KV_STAGES, MIN_BLOCKS, SMEM_LIMIT_BYTES, KernelConfig
from fa_sim.kernels import FA2Labels, Tile, engine_for

FAMILY = KernelConfig.family()
SEED = KernelConfig()


# ---- KernelConfig -----------------------------------------------------------------------------
def test_family_and_seed_are_the_spec_kernels():
    assert len(FAMILY) == 78 and FAMILY[0] == SEED and SEED.tag == "m64n64d64w4-swizzled"
    assert all(c.spec_schedule and c.min_blocks == 0 and c.tag.count("-") == 1 for c in FAMILY)
    assert SEED.smem_bytes == 3 * 64 * 64 * 2 and SEED.sv_offset_bytes == 2 * 64 * 64 * 2


@st.composite
def option_configs(draw):
    base = draw(st.sampled_from(FAMILY))
    stages = draw(st.sampled_from(KV_STAGES))
    flags = dict(q_in_regs=draw(st.booleans()), heavy_first=draw(st.booleans()),
                 defer_pv=stages > 1 and draw(st.booleans()))
    blocks = draw(st.sampled_from(MIN_BLOCKS))
    try:
        return replace(base, kv_stages=stages, min_blocks=blocks, softmax=draw(st.sampled_from(["fmul_fsub", "ffma"])),
                       **flags)
    except ValueError:  # more stages than shared memory holds
        return replace(base, min_blocks=blocks, **{**flags, "defer_pv": False})


@settings(max_examples=300, deadline=None)
@given(option_configs())
def test_tag_and_json_round_trip(cfg):
    assert KernelConfig.from_tag(cfg.tag) == cfg
    assert KernelConfig.from_json(json.dumps(cfg.to_json())) == cfg
    assert cfg.smem_bytes == 2 * cfg.tile_halves(cfg.block_m) + 2 * cfg.kv_stages * cfg.kv_tile_bytes
    assert cfg.spec_schedule == (cfg.kv_stages == 1 and not (cfg.q_in_regs or cfg.heavy_first or cfg.defer_pv))


def test_tag_suffixes_in_order():
    cfg = KernelConfig(block_m=128, head_dim=128, kv_stages=2, q_in_regs=True, heavy_first=True, defer_pv=True,
                       min_blocks=2, softmax="ffma")
    assert cfg.tag == "m128n64d128w4-swizzled-ffma-s2-qr-hf-dp-b2"
    assert cfg.schedule_options() == ["kv_stages=2", "q_in_regs=True", "heavy_first=True", "defer_pv=True"]


@pytest.mark.parametrize("kwargs, message", [
    (dict(defer_pv=True), "defer_pv keeps round t's V tile until round t+1: it needs kv_stages >= 2"),
    (dict(kv_stages=4), "kv_stages=4 is not one of (1, 2, 3)"),
    (dict(min_blocks=7), "min_blocks=7 is not one of"),
    (dict(q_in_regs=1), "q_in_regs=1 is not a bool"),
    (dict(block_m=256, block_n=128, head_dim=128, n_warps=8, kv_stages=3), f"over {SMEM_LIMIT_BYTES}, the most any"),
])
def test_bad_options_are_one_clear_error(kwargs, message):
    with pytest.raises(ValueError, match="unsupported KernelConfig") as exc:
        KernelConfig(**kwargs)
    assert message in str(exc.value)


@pytest.mark.parametrize("tag, message", [
    ("m64n64d64w4-swizzled-x2", "unknown suffix 'x2'"), ("m64n64", "is not a config tag"),
    ("m64n64d64w4-swizzled-s9", "kv_stages=9 is not one of"),
])
def test_bad_tags(tag, message):
    with pytest.raises(ValueError, match=message):
        KernelConfig.from_tag(tag)


def test_stages_lie_back_to_back_and_labels_name_every_stage():
    cfg = KernelConfig(kv_stages=3)
    tile = 64 * 64 * 2
    assert (cfg.sk_offset_bytes, cfg.sv_offset_bytes, cfg.smem_bytes) == (tile, 4 * tile, 7 * tile)
    assert [cfg.stage_offset_bytes(s) for s in range(3)] == [0, tile, 2 * tile]
    labels = FA2Labels(cfg, {})
    row, col = 13, 40
    for tile_name, base in ((Tile.SK, cfg.sk_offset_bytes), (Tile.SV, cfg.sv_offset_bytes)):
        for s in range(3):
            addr = np.array([base + cfg.stage_offset_bytes(s) + 2 * int(cfg.smem_offset(row, col))])
            name, r, c = labels.smem(addr, np.array([True]), 0)
            assert (name, int(r[0]), int(c[0])) == (tile_name, row, col)


def test_macros_carry_the_options():
    cfg = KernelConfig(block_m=128, kv_stages=3, q_in_regs=True, heavy_first=True, defer_pv=True, min_blocks=2)
    m = KernelBuild(cfg, causal=True).macros()
    assert (m["FA_KV_STAGES"], m["FA_Q_IN_REGS"], m["FA_HEAVY_FIRST"], m["FA_DEFER_PV"], m["FA_MIN_BLOCKS"]) == (3, 1, 1, 1, 2)
    assert m["FA_SV_OFFSET"] == m["FA_SK_OFFSET"] + 3 * cfg.kv_tile_bytes and m["FA_SMEM_BYTES"] == cfg.smem_bytes
    seed = KernelBuild().macros()
    assert (seed["FA_KV_STAGES"], seed["FA_Q_IN_REGS"], seed["FA_HEAVY_FIRST"], seed["FA_DEFER_PV"]) == (1, 0, 0, 0)
    assert KernelBuild(KernelConfig(min_blocks=3), min_blocks_override=5).min_blocks == 5  # the diagnostic wins


# ---- which front end runs what --------------------------------------------------------------------
def test_the_program_refuses_schedule_options_and_names_the_ptx_engine():
    q = np.ones((1, 1, 16, 64), np.float16)
    for cfg in (KernelConfig(kv_stages=2), KernelConfig(q_in_regs=True, heavy_first=True)):
        assert engine_for(cfg) == "ptx"
        with pytest.raises(ValueError, match=r"engine='program' runs the spec's schedule only; .* engine='ptx'"):
            fa_sim.simulate(q, q, q, config=cfg, engine="program")


def test_min_blocks_is_no_schedule_change():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, 70, 64)).astype(np.float16) for _ in range(3))
    cfg = KernelConfig(min_blocks=3)
    assert cfg.spec_schedule and engine_for(cfg) == "program"
    a, b = fa_sim.simulate(q, k, v, config=cfg), fa_sim.simulate(q, k, v)
    assert np.array_equal(a.o.view(np.uint16), b.o.view(np.uint16))


# ---- config="auto" --------------------------------------------------------------------------------
def test_size_classes_and_gpu_keys():
    assert [tuned.size_class(n) for n in (1, 1024, 1025, 4096, 4097, 16384)] == [
        "short", "short", "medium", "medium", "long", "long"]
    assert tuned.gpu_key("NVIDIA H200") == "h200"
    assert tuned.gpu_key("NVIDIA A100-SXM4-80GB") == "a100_sxm4_80gb"


def _table(entries, arch="sm_90") -> tuned.Table:
    return tuned.Table("NVIDIA H200", arch, tuple(tuned.Entry(d, c, s, KernelConfig.from_tag(t)) for d, c, s, t in entries))


def test_lookup_exact_then_nearest_size():
    t = _table([(64, False, "short", "m64n64d64w4-swizzled-s2"), (64, False, "long", "m128n128d64w4-swizzled"),
                (64, True, "medium", "m128n64d64w4-swizzled-s2-hf-dp")])
    assert t.lookup(64, False, "long").config.tag == "m128n128d64w4-swizzled"
    assert t.lookup(64, False, "medium").size == "short"  # equally near: the smaller class
    assert t.lookup(64, True, "long").size == "medium"
    assert t.lookup(128, False, "medium") is None
    assert tuned.Table.from_json(json.loads(json.dumps(t.to_json()))) == t


#: The candidates the model ranks here: the real ones whose cubins and PTX other tests build anyway
#: (the family's members, test_hw_compile and test_ptx_family; an option build of
#: test_kernel_options_build), so that ranking costs predictions only, no NVRTC compile of its own.
#: Ranking all 17 per head_dim cold is about two minutes of the suite for the same lookup order.
SHARED_BUILDS = {KernelConfig.from_tag("m128n64d64w4-swizzled-s2-qr-hf-dp"), *FAMILY}


def _ranked_here(model_candidates):
    def candidates(head_dim: int, causal: bool, seqlen_k: int, arch: str = "sm_90") -> list[KernelConfig]:
        pool = [c for c in model_candidates(head_dim, causal, seqlen_k, arch) if c in SHARED_BUILDS] \
            or [c for c in tuned.candidates(head_dim, causal, arch) if c in SHARED_BUILDS]
        assert len(pool) >= 2, pool  # a ranking, not a single candidate
        return pool
    return candidates


@pytest.mark.slow  # ranks candidates on the timing model from a cold cache: a parallel run starts it first
def test_auto_config_reads_the_gpus_table(tmp_path, monkeypatch):
    real_candidates = tuned.model_candidates
    monkeypatch.setattr(tuned, "model_candidates", _ranked_here(real_candidates))
    (tmp_path / "h200.json").write_text(json.dumps(_table([(128, True, "long", "m128n32d128w4-swizzled-s2-hf-dp")]).to_json()))
    got = tuned.auto_config(128, True, 8192, "NVIDIA H200", "sm_90", tmp_path)
    assert got.config.tag == "m128n32d128w4-swizzled-s2-hf-dp" and got.source == "h200.json (d=128, causal, long)"
    near = tuned.auto_config(128, True, 512, "NVIDIA H200", "sm_90", tmp_path)
    assert near.config == got.config and "nearest to short" in near.source
    from fa_sim.timing.rank import rank

    # no entry: the timing model of the arch ranks the candidates (sm_90: the H200's, sm_80: the A100's)
    for args, why, model in (((64, True, 8192, "NVIDIA H200", "sm_90"), "no entry for d=64", "h200"),
                             ((128, True, 2048, "NVIDIA H200", "sm_80"), "the table is for sm_90", "a100")):
        choice = tuned.auto_config(*args, tmp_path)
        ranked = rank(tuple(tuned.model_candidates(args[0], True, args[2], args[4])), args[2], True, model)
        assert choice.config == ranked[0].config and why in choice.source and "timing model" in choice.source
        assert f"ranked {len(ranked)} candidates on the {model} model" in choice.source
        assert [r.kernel_ms for r in ranked] == sorted(r.kernel_ms for r in ranked)
    for d in tuned.CANDIDATES:  # the model ranks the autotuner's pool: what the GPU would time
        for causal in (False, True):
            for nk in (512, 8192):
                pool = real_candidates(d, causal, nk)
                assert pool == tuned.autotune_candidates(d, causal, nk)
                h = tuned.heuristic(d)
                assert 2 <= len(pool) <= tuned.MAX_AUTOTUNE_CANDIDATES
                assert (h.block_m, h.block_n, h.n_warps) in {(c.block_m, c.block_n, c.n_warps) for c in pool}
    # an arch no timing model covers: the heuristic
    choice = tuned.auto_config(128, True, 8192, "NVIDIA B200", "sm_100", tmp_path)
    assert choice.config == tuned.heuristic(128) and "no table for this GPU" in choice.source


@pytest.mark.parametrize("text, message", [
    ("{", "cannot read the tuned table"), ('{"format": 2}', "format 2, expected 1"),
    ('{"format": 1, "gpu": "x", "arch": "sm_90", "entries": [{"head_dim": 48, "causal": false, "size": "short", '
     '"config": {}}]}', "bad key (head_dim=48"),
    ('{"format": 1, "gpu": "x", "arch": "sm_90", "entries": [{"head_dim": 128, "causal": false, "size": "short", '
     '"config": {}}]}', "entry for head_dim 128 holds a config of head_dim 64"),
])
def test_bad_tables_name_the_file(tmp_path, text, message):
    (tmp_path / "h200.json").write_text(text)
    with pytest.raises(ValueError, match="h200.json") as exc:
        tuned.auto_config(64, False, 100, "NVIDIA H200", "sm_90", tmp_path)
    assert message in str(exc.value)


def test_heuristic_and_candidates_are_valid_configs():
    for d in (32, 64, 128):
        cfg = tuned.heuristic(d)
        assert cfg.head_dim == d and cfg.block_m == 128 and cfg.n_warps == 4 and cfg.spec_schedule
    for d in tuned.CANDIDATES:
        for causal in (False, True):
            got = tuned.candidates(d, causal)
            assert len(set(got)) == len(got) and all(c.head_dim == d for c in got)
            assert causal or not any(c.heavy_first for c in got)
    assert tuned.resolve("fastest", (1, 1, 8, 64), (1, 1, 8, 64), False) == "fastest"  # not auto: as given
    with pytest.raises(ValueError, match="config must be None .the seed config., a KernelConfig or a config tag"):
        validate.check_config("fastest", 64)
    assert tuned.resolve(SEED, None, None, False) is SEED


@pytest.mark.parametrize("argv, message", [
    (["sim", "--config", "auto"], "--config auto picks a GPU's fastest measured config"),
    (["hw", "--config", "auto", "--block-m", "128"], "--block-m does not apply with --config auto"),
    (["hw", "--config", "fast"], "--config fast: 'fast' is not a config tag"),
])
def test_cli_config_auto_refusals(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


