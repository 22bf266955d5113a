"""The backward's tile candidates (fa_hw.tuned_backward.CANDIDATES: what experiments/tune_bwd.py times
on a GPU and fa_hw.attention's backward may run): each compiles for sm_90 without spills (both dQ
modes, causal or not, fp16 and bf16); on the PTX engine, causal at Nq = 70, Nk = 90 (tails on both
sides, masked and skipped Q blocks), each gives DEFAULT_TILES' dK, dV and deterministic dQ bit for
bit (every element sums the same k16 segments in ascending order in one fp32 accumulator, whatever
the tiles and stages; a softmax "ffma" candidate those of the default tiles with softmax "ffma") and
its atomic dQ within the derived bound of float64; P in the debug build's checkpoints is the
hand-written ex2(fl(fl(S sl2) - lse2)) or ex2(fma(S, sl2, -lse2)) of the round's own S, bit for bit; the second Q stage
(FA_Q_STAGES 2) is hazard-free and a prefetch into the stage being read is caught; the per-GPU
table's format, lookup and errors."""

import json

import numpy as np
import pytest

pytest.importorskip("cuda.bindings.nvrtc", reason="compiling needs NVRTC (the hw extra)")

from fa_hw.tuned_backward import CANDIDATES, Entry, Table, candidates, lookup  # noqa: E402
from fa_sim.backward import simulate_backward  # noqa: E402
from fa_sim.contract.backward import (BWD_PATH, DEFAULT_TILES, SOFTMAX_FORMS, BackwardBuild, BackwardConfig,  # noqa: E402
                                      compile_backward)
from fa_sim.observers import HazardChecker  # noqa: E402
from test_backward import _assert_within_bound, _problem  # noqa: E402

ALL = [(d, *c) for d, cands in CANDIDATES.items() for c in cands]
OTHERS = [(d, *c) for d, cands in CANDIDATES.items() for c in cands[1:]]


def _ids(cases):
    return [f"d{d}-m{bm}-w{nw}-s{st}" + ("-ffma" if sm == "ffma" else "") + (f"-r{red}" if red != 1 else "")
            + ("-frag" if frag else "") + ("-wr32" if wr == 32 else "") + ("-lse-async" if la else "")
            + ("-swizzled" if swz else "")
            for d, bm, nw, st, sm, red, frag, la, wr, swz in cases]


@pytest.mark.parametrize("tiles", ALL, ids=_ids(ALL))
def test_every_candidate_compiles_for_sm90_without_spills(tiles):
    d, bm, nw, st, sm, red, frag, la, wr, swz = tiles
    builds = [BackwardBuild(BackwardConfig(d, block_m=bm, n_warps=nw, dtype=dtype, q_stages=st, softmax=sm, dq_red=red,
                                           dq_frag=frag, lse_async=la, dq_warp_rows=wr, smem_swizzle=swz),
                            causal, det, "sm_90")
              for dtype in ("fp16", "bf16") for causal in (False, True) for det in (False, True)]
    for build in builds:
        usage = compile_backward(build).usage
        print(build.describe(), {k: (u.registers, u.stack_bytes) for k, u in usage.items()})
        for name, u in usage.items():
            assert u.stack_bytes == 0, f"{build.describe()}: {name} spills ({u.stack_bytes} bytes of local memory)"
            assert 0 < u.registers <= 255


def _bits(a):
    return a.view(np.uint16)


@pytest.mark.parametrize("tiles", OTHERS, ids=_ids(OTHERS))
def test_candidates_compute_the_default_tiles_bits_on_the_ptx_engine(tiles):
    d, bm, nw, st, sm, red, frag, la, wr, swz = tiles
    nq, nk, causal = 70, 90, True
    q, k, v, o, lse, do = _problem(nq, nk, d, causal)
    cfg = BackwardConfig(d, block_m=bm, n_warps=nw, q_stages=st, softmax=sm, dq_red=red, dq_frag=frag, lse_async=la,
                         dq_warp_rows=wr, smem_swizzle=swz)
    base = BackwardConfig(d, softmax=sm)  # the default tiles of the same softmax form
    assert cfg != base and nq % bm and nk % cfg.block_n  # tails in both directions
    for det in (True, False):
        want = simulate_backward(q, k, v, o, lse, do, causal=causal, deterministic=det, config=base)
        got = simulate_backward(q, k, v, o, lse, do, causal=causal, deterministic=det, config=cfg)
        assert got.config == cfg and want.config == base
        same = ("dq", "dk", "dv") if det else ("dk", "dv")  # atomic dQ: one partial per K/V block of block_n keys
        for name in same:
            assert np.array_equal(_bits(getattr(got, name)), _bits(getattr(want, name))), (name, det)
        _assert_within_bound(got, q, k, v, do, causal, ulps=64 if d >= 96 else 41)  # test_backward's caps


VECTOR_RED = [(d, *c) for d, cands in CANDIDATES.items() for c in cands if c[4] != 1 and c[3] == "fmul_fsub"
              and not c[8]]  # (the swizzled ones: test_swizzled_tiles_compute_the_padded_tiles_bits_hazard_free)


@pytest.mark.parametrize("tiles", VECTOR_RED, ids=_ids(VECTOR_RED))
def test_vector_dq_reductions_add_the_scalar_forms_terms_on_the_engine_as_compiled_for_sm90(tiles):
    """dq_red 2 and 4 (red.global.add.v2/.v4.f32, sm_90), and dq_frag (dq_accum in the fragment order: the
    16-row slices below Nq permuted, the one across Nq = 70 row-major, the convert kernel reading both back):
    the PTX NVRTC emits for sm_90, run on the PTX
    engine (causal, Nq = 70, Nk = 90: tails both ways, the v4 form's odd lanes on the guarded row
    g + 8), gives the scalar form's dQ, dK and dV bit for bit - each dQ_accum element gets the same
    adds in the same CTA order (the engine applies a vector reduction as its elements' scalar ones) -
    and has no hazard (the v4 form's lane exchange is a shuffle: no shared memory)."""
    from fa_sim.backward import backward_launches
    from fa_sim.contract.nvrtc import compile_ptx
    from fa_sim.ptx import launch

    d, bm, nw, st, sm, red, frag, la, wr, swz = tiles
    nq, nk, causal = 70, 90, True
    q, k, v, o, lse, do = _problem(nq, nk, d, causal)
    cfg = BackwardConfig(d, block_m=bm, n_warps=nw, q_stages=st, softmax=sm, dq_red=red, dq_frag=frag, lse_async=la,
                         dq_warp_rows=wr, smem_swizzle=swz)
    want = simulate_backward(q, k, v, o, lse, do, causal=causal, deterministic=False,
                             config=BackwardConfig(d, block_m=bm, n_warps=nw, q_stages=st, softmax=sm))
    launches, _, out = backward_launches(q, k, v, o, lse, do, causal, None, False, config=cfg)
    hz = HazardChecker()
    for ln in launches:
        ptx = compile_ptx(BWD_PATH.read_text(), name=str(BWD_PATH), arch="sm_90", macros=ln.macros)
        assert ln.kernel != "fa2_bwd_kernel" or f"red.global.add.v{red}.f32" in ptx
        launch(ptx, ln.grid, ln.block, ln.smem_bytes, ln.args, kernel=ln.kernel, observers=[hz])
    assert hz.report().ok, hz.report().hazards[:3]
    for name in ("dq", "dk", "dv"):
        assert np.array_equal(_bits(out[name]), _bits(getattr(want, name))), name
    with pytest.raises(ValueError, match=f"dq_red={red} .* needs sm_90"):
        compile_backward(BackwardBuild(cfg, causal, False, "sm_80"))


@pytest.mark.parametrize("softmax", SOFTMAX_FORMS)
def test_p_is_the_hand_written_exp2_of_the_rounds_own_s_bit_for_bit(softmax):
    """The debug build's S and P checkpoints (Nq = 70, Nk = 90, d = 64, causal, tails both ways, every
    CTA): each visible P is ex2.approx.ftz of the exp2 argument formed from that S in fp32 as the
    softmax form says - fmul_fsub fl(fl(S sl2) - lse2), ffma fma.rn(S, sl2, -lse2) with one rounding
    (fa_sim.isa.fp32, the hand-written program's arithmetic) - and 0 elsewhere; the two forms'
    arguments differ on this data (the check tells them apart; after the fp16 packing of P and dS
    this small problem's gradients happen to agree)."""
    from fa_sim.checkpoints import BackwardCheckpoint as C, BackwardCheckpointLayout
    from fa_sim.isa.fp32 import LOG2E, ex2_approx_ftz, fma_rn

    nq, nk, d = 70, 90, 64
    q, k, v, o, lse, do = _problem(nq, nk, d, True)
    cfg = BackwardConfig(d, softmax=softmax)
    ctas = list(range(cfg.n_kv_blocks(nk)))
    res = simulate_backward(q, k, v, o, lse, do, causal=True, config=cfg, checkpoint_ctas=ctas)
    layout = BackwardCheckpointLayout(cfg, cfg.n_q_blocks(nq))
    rounds = layout.rounds_per_cta(ctas, cfg.n_kv_blocks(nk), nq, True)
    sl2 = np.float32(np.float32(res.scale) * LOG2E)
    lse2_all = (lse[0, 0].astype(np.float32) * LOG2E).astype(np.float32)
    checked = differ = 0
    for cta in ctas:
        key0 = cta * cfg.block_n
        keys = key0 + np.arange(cfg.block_n)
        for r in range(rounds[cta]):
            row0 = (key0 // cfg.block_m + r) * cfg.block_m
            queries = row0 + np.arange(cfg.block_m)
            s_ck, p_ck = (layout.fragment_matrix(ck, res.checkpoints[cta, layout.index(ck), r]).astype(np.float32)
                          for ck in (C.S, C.P))
            visible = (keys[:, None] < nk) & (queries[None, :] < nq) & (keys[:, None] <= queries[None, :])
            lse2 = lse2_all[np.minimum(queries, nq - 1)][None, :]
            forms = {"ffma": fma_rn(s_ck, sl2, -lse2).astype(np.float32),
                     "fmul_fsub": (s_ck * sl2).astype(np.float32) - lse2}
            x = forms[softmax]
            differ += int(((forms["ffma"] != forms["fmul_fsub"]) & visible).sum())
            want = np.where(visible, ex2_approx_ftz(x.astype(np.float32)), np.float32(0))
            assert want.view(np.uint32).tobytes() == p_ck.view(np.uint32).tobytes(), (cta, r)
            checked += int(visible.sum())
    assert checked > 2000 and differ > 100, (checked, differ)


@pytest.mark.parametrize("shape", [(70, 90, 64, 64, 8, True), (130, 45, 32, 32, 4, False)],
                         ids=["causal-tails", "five-q-blocks"])
def test_the_second_q_stage_is_free_of_hazards(shape):
    """(the first shape with softmax ffma and both dQ modes: its masked and unmasked rounds)"""
    nq, nk, d, bm, nw, causal = shape
    hz = HazardChecker()
    sm = "ffma" if causal else "fmul_fsub"
    simulate_backward(*_problem(nq, nk, d, causal), causal=causal, deterministic=False, observers=[hz],
                      config=BackwardConfig(d, block_m=bm, n_warps=nw, q_stages=2, softmax=sm))
    rep = hz.report()
    assert rep.ok, rep.hazards[:3]


def test_a_prefetch_into_the_stage_being_read_is_a_hazard(tmp_path):
    """FA_Q_STAGES 2 with the next Q block copied into the current stage: its copies overwrite sQ,
    sdO while other warps still read them (WAR), and LSE, D before they are read."""
    text = BWD_PATH.read_text()
    line = "load_q_block(gQ, gdO, gLSE, gD, row0 + kBlockM, seqlen_q, cur ^ 1);"
    assert text.count(line) == 1
    path = tmp_path / "fa2_bwd_same_stage.cu"
    path.write_text(text.replace(line, line.replace("cur ^ 1", "cur")))
    hz = HazardChecker(limit=10**6)
    simulate_backward(*_problem(70, 45, 32, False), deterministic=False, observers=[hz], kernel=path,
                      config=BackwardConfig(32, block_m=32, n_warps=4, q_stages=2))
    assert not hz.report().ok


def test_the_table_round_trips_and_lookup_takes_the_nearest_size_class(tmp_path):
    gpu = "NVIDIA H100 80GB HBM3"
    entries = (Entry(64, False, "short", 64, 8, 1, 1.4, 0.9, ((8, 16, 1024, 64),)),
               Entry(64, False, "long", 128, 8, 2, 1.6, 1.05, ((1, 16, 16384, 64),), softmax="ffma"))
    table = Table(gpu, "sm_90", entries, "13.0")
    (tmp_path / "h100_80gb_hbm3.json").write_text(json.dumps(table.to_json()))
    assert Table.load(tmp_path / "h100_80gb_hbm3.json") == table
    got = lookup(64, False, 3000, gpu, "sm_90", directory=tmp_path)  # medium: short and long are as near; short
    assert got.config == BackwardConfig(64, block_m=64, n_warps=8) and "short" in got.source
    got = lookup(64, False, 9000, gpu, "sm_90", "bf16", directory=tmp_path)
    assert got.config == BackwardConfig(64, block_m=128, n_warps=8, dtype="bf16", q_stages=2, softmax="ffma")
    del_sm = table.to_json()
    for e in del_sm["entries"]:
        e.pop("softmax")  # a table written before the softmax field: fmul_fsub
    assert all(e.softmax == "fmul_fsub" for e in Table.from_json(del_sm).entries)
    for args, why in (((64, True, 3000, gpu, "sm_90"), "no d=64 causal entry"),
                      ((32, False, 3000, gpu, "sm_90"), "no d=32 non-causal entry"),
                      ((64, False, 3000, gpu, "sm_80"), "table is for sm_90"),
                      ((64, False, 3000, "NVIDIA A100", "sm_80"), "no backward table")):
        got = lookup(*args, directory=tmp_path)
        assert got.config == BackwardConfig(args[0]) and got.source.startswith("DEFAULT_TILES") and why in got.source
    # another sm_90 GPU without a table of its own borrows the H100's, and says so
    got = lookup(64, False, 9000, "NVIDIA H200", "sm_90", directory=tmp_path)
    assert got.config == BackwardConfig(64, block_m=128, n_warps=8, q_stages=2, softmax="ffma")
    assert got.source == "backward/h100_80gb_hbm3.json (d=64, non-causal, long; NVIDIA H200: no backward table, " \
                         "sm_90 like this one)"
    got = lookup(64, True, 9000, "NVIDIA H200", "sm_90", directory=tmp_path)
    assert got.config == BackwardConfig(64) and "no d=64 causal entry; NVIDIA H200: no backward table" in got.source


def test_dq_warp_rows_32_needs_32_row_slices_that_divide_the_warps():
    assert BackwardConfig(128, block_m=64, n_warps=8, dq_frag=True, dq_warp_rows=32).describe().endswith(
        "dq_frag dq_warp_rows=32")
    with pytest.raises(ValueError, match=r"block_m=16, n_warps=4, dq_warp_rows=32\) does not tile"):
        BackwardConfig(128, block_m=16, n_warps=4, dq_frag=True, dq_warp_rows=32)


@pytest.mark.parametrize("change, words", [
    ({"block_m": 48}, "does not tile"), ({"q_stages": 3}, "q_stages must be 1 or 2"), ({"softmax": "fma"}, "softmax 'fma'"), ({"head_dim": 256}, r"bad key \(head_dim=256"),
    ({"size": "huge"}, "bad key"), ({"format": 2}, "format 2"), ({"lse_async": 1}, "lse_async must be True or False"),
    ({"dq_warp_rows": 24}, "dq_warp_rows must be 16 or 32"), ({"dq_warp_rows": 32}, "dq_warp_rows=32 needs dq_frag=True"),
    ({"smem_swizzle": "yes"}, "smem_swizzle must be True or False")])
def test_a_malformed_table_is_one_value_error_naming_the_file(tmp_path, change, words):
    data = Table("NVIDIA H100 80GB HBM3", "sm_90", (Entry(64, False, "short", 64, 8),)).to_json()
    if "format" in change:
        data.update(change)
    else:
        data["entries"][0].update(change)
    path = tmp_path / "h100_80gb_hbm3.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=words) as err:
        lookup(64, False, 1000, "NVIDIA H100 80GB HBM3", "sm_90", directory=tmp_path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_candidates_start_with_the_default_and_refuse_what_the_backward_refuses():
    for d in CANDIDATES:
        assert candidates(d)[0] == BackwardConfig(d) and (candidates(d)[0].block_m, candidates(d)[0].n_warps) == \
            DEFAULT_TILES[d]
    with pytest.raises(ValueError, match="head_dim 256 is not supported"):
        candidates(256)


def test_fa_hw_backward_names_the_configs_it_takes():
    import fa_hw

    q, k, v, o, lse, do = _problem(16, 16, 32, False)
    with pytest.raises(ValueError, match="config must be a BackwardConfig, None .* or 'auto', got 'fast'"):
        fa_hw.backward(q, k, v, o, lse, do, config="fast")


def test_tune_bwd_chooses_the_best_worst_ratio_and_writes_a_table_lookup_reads(tmp_path):
    """experiments/tune_bwd.py's choice on recorded times (no GPU): per key the candidate whose worst
    ratio to SDPA-flash over the key's shapes is best (not the best mean: 128x8s1 is faster on one
    shape and much slower on the other), its table read back by lookup."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "tune_bwd", Path(__file__).resolve().parent.parent / "experiments" / "tune_bwd.py")
    tune = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tune)
    recs = [{"case": [8, 16, 1024, 64], "causal": False, "default": "64x4s1", "notes": {"32x4s1": "failed"},
             "runs_ms": {"flash": [1.0, 1.0], "64x4s1": [2.0, 2.0], "64x8s2": [1.25, 1.25], "128x8s1": [2.5, 2.5]}},
            {"case": [6, 8, 700, 64], "causal": False, "default": "64x4s1", "notes": {},
             "runs_ms": {"flash": [1.0, 1.0], "64x4s1": [2.0, 2.0], "64x8s2": [1.25, 1.25], "128x8s1": [0.5, 0.5]}}]
    (entry,) = tune.choose(recs)
    assert (entry.head_dim, entry.causal, entry.size, entry.block_m, entry.n_warps, entry.q_stages, entry.softmax) == \
        (64, False, "short", 64, 8, 2, "fmul_fsub")
    for r in recs:  # an ffma candidate ahead of all: its label carries the form into the entry
        r["runs_ms"]["64x8s2f"] = [1.0, 1.0]
    (entry,) = tune.choose(recs)
    assert (entry.block_m, entry.n_warps, entry.q_stages, entry.softmax) == (64, 8, 2, "ffma")
    assert tune._label(64, 8, 2, "ffma") == "64x8s2f" and tune._parse_label("128x8s1") == \
        (128, 8, 1, "fmul_fsub", 1, False, False, 16, False)
    assert tune._label(128, 8, 1, "ffma", 4) == "128x8s1fr4" and tune._parse_label("64x8s1r2") == \
        (64, 8, 1, "fmul_fsub", 2, False, False, 16, False)
    assert tune._label(64, 8, 1, "ffma", 4, True) == "64x8s1fr4p" and tune._parse_label("64x8s1fr4p") == \
        (64, 8, 1, "ffma", 4, True, False, 16, False)
    assert tune._label(64, 8, 1, "ffma", 4, True, True, 32) == "64x8s1fr4pml" and tune._parse_label("64x8s1r4pl") == \
        (64, 8, 1, "fmul_fsub", 4, True, True, 16, False) and tune._parse_label("64x8s1fr4pm")[-3:] == (False, 32, False)
    assert tune._label(64, 8, 1, "fmul_fsub", 4, True, False, 32, True) == "64x8s1r4pmz" and \
        tune._parse_label("128x8s1fr4pz") == (128, 8, 1, "ffma", 4, True, False, 16, True)
    for r in recs:  # a vector-reduction candidate ahead of all: dq_red reaches the entry and its table
        r["runs_ms"]["128x8s1fr2"] = [0.9, 0.9]
    (entry,) = tune.choose(recs)
    assert (entry.block_m, entry.n_warps, entry.q_stages, entry.softmax, entry.dq_red) == (128, 8, 1, "ffma", 2)
    table = Table("NVIDIA H100 80GB HBM3", "sm_90", (entry,), "13.0")
    assert Table.from_json(table.to_json()).entries[0].config() == \
        BackwardConfig(64, block_m=128, n_warps=8, softmax="ffma", dq_red=2)
    for r in recs:  # a fragment-order candidate ahead of all: dq_frag reaches the entry and its table
        r["runs_ms"]["128x8s1fr4p"] = [0.8, 0.8]
    (entry,) = tune.choose(recs)
    assert (entry.dq_red, entry.dq_frag) == (4, True)
    assert Table.from_json(Table("NVIDIA H100 80GB HBM3", "sm_90", (entry,), "13.0").to_json()).entries[0].config() == \
        BackwardConfig(64, block_m=128, n_warps=8, softmax="ffma", dq_red=4, dq_frag=True)
    for r in recs:  # the loop options ahead of all: lse_async and dq_warp_rows reach the entry and its table
        r["runs_ms"]["128x8s1fr4pml"] = [0.7, 0.7]
    (entry,) = tune.choose(recs)
    assert Table.from_json(Table("NVIDIA H100 80GB HBM3", "sm_90", (entry,), "13.0").to_json()).entries[0].config() == \
        BackwardConfig(64, block_m=128, n_warps=8, softmax="ffma", dq_red=4, dq_frag=True, lse_async=True,
                       dq_warp_rows=32)
    for r in recs:  # a swizzled candidate ahead of all: smem_swizzle reaches the entry and its table
        r["runs_ms"]["128x8s1fr4pmz"] = [0.6, 0.6]
    (entry,) = tune.choose(recs)
    assert entry.smem_swizzle and Table.from_json(Table("NVIDIA H100 80GB HBM3", "sm_90", (entry,), "13.0")
                                                  .to_json()).entries[0].config() == \
        BackwardConfig(64, block_m=128, n_warps=8, softmax="ffma", dq_red=4, dq_frag=True, dq_warp_rows=32,
                       smem_swizzle=True)
    recs = [{**r, "runs_ms": {k: v for k, v in r["runs_ms"].items() if k not in ("64x8s2f", "128x8s1fr2", "128x8s1fr4p",
                                                                                "128x8s1fr4pml", "128x8s1fr4pmz")}}
            for r in recs]
    (entry,) = tune.choose(recs)
    assert entry.vs_default == 1.6 and entry.vs_flash == 0.8 and len(entry.shapes) == 2
    table = Table("NVIDIA H100 80GB HBM3", "sm_90", (entry,), "13.0")
    (tmp_path / "h100_80gb_hbm3.json").write_text(json.dumps(table.to_json()))
    got = lookup(64, False, 900, "NVIDIA H100 80GB HBM3", "sm_90", directory=tmp_path)
    assert got.config == BackwardConfig(64, block_m=64, n_warps=8, q_stages=2)


def test_tune_bwd_base_keeps_the_same_gpus_untimed_keys_and_refuses_another_gpus_table(tmp_path):
    """tune_bwd.py --base: the shipped table's entries stay for the keys a --head-dims or --labels run did
    not time (a d=64 run keeps d=32, 96, 128), the run's own entries replace the base's; a table of
    another GPU is refused in one line before any timing (its entries were not measured here)."""
    import importlib.util
    import json
    from pathlib import Path

    from fa_hw.tuned_backward import BWD_TUNED_DIR

    spec = importlib.util.spec_from_file_location(
        "tune_bwd", Path(__file__).resolve().parent.parent / "experiments" / "tune_bwd.py")
    tune = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tune)
    shipped = BWD_TUNED_DIR / "h100_80gb_hbm3.json"
    base = tune.load_base(shipped, "NVIDIA H100 80GB HBM3", "sm_90")
    recs = [{"case": [8, 16, 1024, 64], "causal": False, "default": "64x4s1", "notes": {},
             "runs_ms": {"flash": [1.0, 1.0], "64x4s1": [2.0, 2.0], "64x8s2": [0.9, 0.9]}}]
    out = tune.merged(tune.choose(recs), base)
    keys = [(e.head_dim, e.causal, e.size) for e in out]
    assert len(keys) == len(set(keys)) == len(base)
    (mine,) = [e for e in out if (e.head_dim, e.causal, e.size) == (64, False, "short")]
    assert (mine.block_m, mine.q_stages) == (64, 2)
    assert [e for e in out if e.head_dim != 64] == [e for e in base if e.head_dim != 64]
    assert tune.load_base(None, "NVIDIA H200", "sm_90") == ()
    with pytest.raises(SystemExit, match="NVIDIA H100 80GB HBM3's .* table; this run tunes NVIDIA H200"):
        tune.load_base(shipped, "NVIDIA H200", "sm_90")
    with pytest.raises(SystemExit, match="no such file"):
        tune.load_base(tmp_path / "missing.json", "NVIDIA H200", "sm_90")
    assert json.loads(shipped.read_text())["gpu"] == "NVIDIA H100 80GB HBM3"


# (head_dim, tiles label): the default tiles at every head_dim (128-column atoms at d = 128, 64 at 64 and 192,
# Swizzle<2,3,3> of 32 columns at 32, 96 and 160; 96, 160, 192's atoms narrower than their rows), the swizzled candidates' padded
# forms, a second Q stage (its buffer at another 128-byte line), lse_async (LSE and D by 4-byte cp.async).
SWIZZLED = [(64, "64x4s1"), (128, "32x4s1"), (32, "64x4s1"), (96, "64x4s1"), (64, "64x8s1fr4p"),
            (128, "64x8s1r4pm"), (64, "128x8s1fr4p"), (64, "64x8s2"), (160, "32x4s1"), (192, "16x4s1"),
            (128, "64x8s1r4pml")]


@pytest.mark.parametrize("d, padded", SWIZZLED, ids=[f"d{d}-{p}" for d, p in SWIZZLED])
def test_swizzled_tiles_compute_the_padded_tiles_bits_hazard_free(d, padded):
    """smem_swizzle (FA_SMEM_SWIZZLE: sQ, sdO, sK, sV of both kernels in rows of d halves, the 16-byte chunks
    XOR-swizzled): on the PTX engine, causal at Nq = 70, Nk = 90 (tails both ways, masked and skipped Q
    blocks), dQ, dK, dV bit for bit those of the same tiles padded, in both dQ modes (the same values
    reach the same registers through other shared-memory places), with no hazard in either kernel; shared
    memory shrinks by the padding (8 halves a row)."""
    nq, nk, causal = 70, 90, True
    q, k, v, o, lse, do = _problem(nq, nk, d, causal)
    base = BackwardConfig.from_label(padded, d)
    cfg = BackwardConfig.from_label(padded + "z", d)
    assert cfg.smem_swizzle and cfg.row_pitch == d and base.row_pitch == d + 8 and cfg.label == padded + "z"
    q_rows = base.q_stages * base.block_m
    assert base.smem_bytes - cfg.smem_bytes == 2 * 8 * (2 * q_rows + 2 * base.block_n)
    assert base.dq_smem_bytes - cfg.dq_smem_bytes == 2 * 8 * (2 * base.dq_block_m + 2 * base.block_n)
    for det in (True, False):
        hz, hz_dq = HazardChecker(), HazardChecker()
        want = simulate_backward(q, k, v, o, lse, do, causal=causal, deterministic=det, config=base)
        got = simulate_backward(q, k, v, o, lse, do, causal=causal, deterministic=det, config=cfg, observers=[hz],
                                dq_observers=[hz_dq] if det else ())
        for name in ("dq", "dk", "dv"):
            assert np.array_equal(_bits(getattr(got, name)), _bits(getattr(want, name))), (name, det)
        for rep in (hz.report(), hz_dq.report()):
            assert rep.ok, rep.hazards[:3]


def test_swizzled_smem_offset_is_a_permutation_of_whole_16_byte_chunks_within_8_row_atoms():
    """BackwardConfig.smem_offset (fa2_bwd.cu's off): for every head_dim, a bijection of a 16-row tile onto
    [0, 16 d) that moves whole 16-byte chunks, keeps each 8-row group in its own 8 d halves, and puts the 8
    rows of one chunk column (one ldmatrix 8 x 8 matrix) in 8 distinct 16-byte bank groups."""
    from fa_sim.contract.backward import HEAD_DIMS

    for d in HEAD_DIMS:
        cfg = BackwardConfig(d, smem_swizzle=True)
        r, c = np.meshgrid(np.arange(16), np.arange(d), indexing="ij")
        p = cfg.smem_offset(r, c)
        assert sorted(p.ravel()) == list(range(16 * d)), d
        assert (p % 8 == c % 8).all() and (p // (8 * d) == r // 8).all(), d
        for col in range(0, d, 8):
            groups = (p[:8, col] * 2 // 16) % 8  # 16-byte bank group of each row's chunk
            assert len(set(groups)) == 8, (d, col)
        assert (BackwardConfig(d).smem_offset(r, c) == r * (d + 8) + c).all()


@pytest.mark.parametrize("d", [64, 128])
def test_swizzled_tiles_copy_at_ideal_wavefronts_and_stay_conflict_free(d):
    """fa banks --backward's count (the main kernel, atomic mode; the dQ kernel in the deterministic mode) of a
    swizzled candidate: every cp.async (LDGSTS) at its ideal wavefronts, where the padded rows make 16-byte
    chunks straddle 128-byte lines (10.5 wavefronts per instruction against 4), and every LDSM, LDS and STS
    conflict-free in both layouts."""
    from fa_sim.observers.banks import BankCounter, SmemClass

    label = {64: "64x8s1fr4p", 128: "64x8s1r4pm"}[d]
    q, k, v, o, lse, do = _problem(256, 256, d, False)
    for swz in ("", "z"):
        cfg = BackwardConfig.from_label(label + swz, d)
        main, dq = BankCounter(), BankCounter()
        simulate_backward(q, k, v, o, lse, do, deterministic=False, config=cfg, observers=[main])
        simulate_backward(q, k, v, o, lse, do, deterministic=True, config=cfg, dq_observers=[dq])
        for counter in (main, dq):
            by = counter.report().by_class()
            cp = by[SmemClass.LDGSTS]
            assert cp.instructions > 0 and (cp.wavefronts == cp.ideal) == bool(swz), (swz, cp)
            if not swz:
                assert cp.wavefronts * 4 == cp.ideal * 10.5, cp
            for cls in (SmemClass.LDSM, SmemClass.LDS, SmemClass.STS):
                assert by[cls].conflicts == 0, (swz, cls, by[cls])


def test_swizzled_checkpoint_tiles_read_back_as_the_padded_builds_tiles():
    """The debug build's sQ, sdO, sK, sV images of a swizzled config are [rows][d] in the swizzled order
    (BackwardCheckpointLayout.tile_words); tile_matrix unswizzles them into the padded build's tiles
    without the padding, and every other checkpoint is the padded build's word for word."""
    from fa_sim.checkpoints import BACKWARD_TILES, BackwardCheckpointLayout

    nq, nk, d = 70, 90, 64
    q, k, v, o, lse, do = _problem(nq, nk, d, True)
    runs = {}
    for swz in (False, True):
        cfg = BackwardConfig(d, smem_swizzle=swz)
        ctas = list(range(cfg.n_kv_blocks(nk)))
        res = simulate_backward(q, k, v, o, lse, do, causal=True, config=cfg, checkpoint_ctas=ctas)
        runs[swz] = (cfg, BackwardCheckpointLayout(cfg, cfg.n_q_blocks(nq)), res.checkpoints)
    (cfg_p, lay_p, ck_p), (cfg_s, lay_s, ck_s) = runs[False], runs[True]
    assert lay_s.tile_words(BACKWARD_TILES[0]) == cfg_s.block_m * d // 2
    compared = 0
    for ck in lay_p.CHECKPOINTS:
        i = lay_p.index(ck)
        for cta in range(ck_p.shape[0]):
            for r in range(ck_p.shape[2]):
                if ck in BACKWARD_TILES:
                    want = lay_p.tile_matrix(ck, ck_p[cta, i, r])[:, :d]
                    got = lay_s.tile_matrix(ck, ck_s[cta, i, r])
                    assert got.view(np.uint16).tobytes() == want.view(np.uint16).tobytes(), (ck, cta, r)
                    compared += int((want != 0).sum())
                else:
                    w = lay_p.used_words(ck)
                    assert ck_s[cta, i, r, :, :w].tobytes() == ck_p[cta, i, r, :, :w].tobytes(), (ck, cta, r)
    assert compared > 10000
