"""The backward's tile candidates (fa_hw.tuned_backward.CANDIDATES: what experiments/tune_bwd.py times
on a GPU and fa_hw.attention's backward may run): each compiles for sm_90 without spills (both dQ
modes, causal or not, fp16 and bf16); on the PTX engine, causal at Nq = 70, Nk = 90 (tails on both
sides, masked and skipped Q blocks), each gives DEFAULT_TILES' dK, dV and deterministic dQ bit for
bit (every element sums the same k16 segments in ascending order in one fp32 accumulator, whatever
the tiles and stages) and its atomic dQ within the derived bound of float64; the second Q stage
(FA_Q_STAGES 2) is hazard-free and a prefetch into the stage being read is caught; the per-GPU
table's format, lookup and errors."""

import json

import numpy as np
import pytest

pytest.importorskip("cuda.bindings.nvrtc", reason="compiling needs NVRTC (the hw extra)")

from fa_hw.tuned_backward import CANDIDATES, Entry, Table, candidates, lookup  # noqa: E402
from fa_sim.backward import simulate_backward  # noqa: E402
from fa_sim.contract.backward import BWD_PATH, DEFAULT_TILES, BackwardBuild, BackwardConfig, compile_backward  # noqa: E402
from fa_sim.observers import HazardChecker  # noqa: E402
from test_backward import _assert_within_bound, _problem  # noqa: E402

ALL = [(d, *c) for d, cands in CANDIDATES.items() for c in cands]
OTHERS = [(d, *c) for d, cands in CANDIDATES.items() for c in cands[1:]]


def _ids(cases):
    return [f"d{d}-m{bm}-w{nw}-s{st}" for d, bm, nw, st in cases]


@pytest.mark.parametrize("tiles", ALL, ids=_ids(ALL))
def test_every_candidate_compiles_for_sm90_without_spills(tiles):
    d, bm, nw, st = tiles
    builds = [BackwardBuild(BackwardConfig(d, block_m=bm, n_warps=nw, dtype=dtype, q_stages=st), causal, det, "sm_90")
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
    d, bm, nw, st = tiles
    nq, nk, causal = 70, 90, True
    q, k, v, o, lse, do = _problem(nq, nk, d, causal)
    cfg = BackwardConfig(d, block_m=bm, n_warps=nw, q_stages=st)
    assert cfg != BackwardConfig(d) and nq % bm and nk % cfg.block_n  # tails in both directions
    for det in (True, False):
        want = simulate_backward(q, k, v, o, lse, do, causal=causal, deterministic=det)
        got = simulate_backward(q, k, v, o, lse, do, causal=causal, deterministic=det, config=cfg)
        assert got.config == cfg and want.config == BackwardConfig(d)
        same = ("dq", "dk", "dv") if det else ("dk", "dv")  # atomic dQ: one partial per K/V block of block_n keys
        for name in same:
            assert np.array_equal(_bits(getattr(got, name)), _bits(getattr(want, name))), (name, det)
        _assert_within_bound(got, q, k, v, do, causal, ulps=64 if d >= 96 else 41)  # test_backward's caps


@pytest.mark.parametrize("shape", [(70, 90, 64, 64, 8, True), (130, 45, 32, 32, 4, False)],
                         ids=["causal-tails", "five-q-blocks"])
def test_the_second_q_stage_is_free_of_hazards(shape):
    nq, nk, d, bm, nw, causal = shape
    hz = HazardChecker()
    simulate_backward(*_problem(nq, nk, d, causal), causal=causal, deterministic=False, observers=[hz],
                      config=BackwardConfig(d, block_m=bm, n_warps=nw, q_stages=2))
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
               Entry(64, False, "long", 128, 8, 2, 1.6, 1.05, ((1, 16, 16384, 64),)))
    table = Table(gpu, "sm_90", entries, "13.0")
    (tmp_path / "h100_80gb_hbm3.json").write_text(json.dumps(table.to_json()))
    assert Table.load(tmp_path / "h100_80gb_hbm3.json") == table
    got = lookup(64, False, 3000, gpu, "sm_90", directory=tmp_path)  # medium: short and long are as near; short
    assert got.config == BackwardConfig(64, block_m=64, n_warps=8) and "short" in got.source
    got = lookup(64, False, 9000, gpu, "sm_90", "bf16", directory=tmp_path)
    assert got.config == BackwardConfig(64, block_m=128, n_warps=8, dtype="bf16", q_stages=2)
    for args, why in (((64, True, 3000, gpu, "sm_90"), "no d=64 causal entry"),
                      ((32, False, 3000, gpu, "sm_90"), "no d=32 non-causal entry"),
                      ((64, False, 3000, gpu, "sm_80"), "table is for sm_90"),
                      ((64, False, 3000, "NVIDIA A100", "sm_80"), "no backward table")):
        got = lookup(*args, directory=tmp_path)
        assert got.config == BackwardConfig(args[0]) and got.source.startswith("DEFAULT_TILES") and why in got.source


@pytest.mark.parametrize("change, words", [
    ({"block_m": 48}, "does not tile"), ({"q_stages": 3}, "q_stages must be 1 or 2"), ({"head_dim": 256}, r"bad key \(head_dim=256"),
    ({"size": "huge"}, "bad key"), ({"format": 2}, "format 2")])
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
    assert (entry.head_dim, entry.causal, entry.size, entry.block_m, entry.n_warps, entry.q_stages) == \
        (64, False, "short", 64, 8, 2)
    assert entry.vs_default == 1.6 and entry.vs_flash == 0.8 and len(entry.shapes) == 2
    table = Table("NVIDIA H100 80GB HBM3", "sm_90", (entry,), "13.0")
    (tmp_path / "h100_80gb_hbm3.json").write_text(json.dumps(table.to_json()))
    got = lookup(64, False, 900, "NVIDIA H100 80GB HBM3", "sm_90", directory=tmp_path)
    assert got.config == BackwardConfig(64, block_m=64, n_warps=8, q_stages=2)
