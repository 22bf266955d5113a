"""config="auto" for split-KV decoding (fa_hw.tuned_decode; docs/features.md "Split-KV decoding").

CPU: two non-default members of the decode family (FlashAttention-2's split tile m64n128, and
m64n64 with three K/V stages and Q in registers) run split-KV on the PTX engine on shapes with tails
(Nq 3, a cache of 300 keys, sequences of 300 and 170 keys, 2 splits) hazard-free and within the
documented bounds; with one split each is the unsplit kernel of that config on each sequence's keys
bit for bit, and the spec-schedule tile is also the hand-written program's bits. The decode class
keys, the table (round trip, exact and nearest lookup, a malformed file named), the choice (the
table's entry; else the autotuner's timings, cached on disk and reused without timing by a second
choice), experiments/tune_decode.py's choice and table on recorded times, fa_hw.splitkv's
config="auto" flow and the autotuner's DecodeTimer with the device stood in for (the chosen config
runs with its own "auto" splits), and the one-line refusals (config="auto" with an integer splits,
in fa_hw.forward before any device call and in `fa hw`).
GPU (marked gpu): every decode candidate's split-KV run is the PTX engine's bit for bit;
config="auto" split-KV output equals the explicit chosen config's bit for bit and is within the
bounds against float64; without a table the autotuner times, caches, and a second
call reuses the cached choice.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from fa_hw.tuned_decode import decode_candidates
from fa_sim import KernelConfig, Problem, simulate
from fa_sim.observers.hazards import HazardChecker, format_hazards
from fa_sim.splitkv import check_splitkv, measure_splitkv
from splitkv_inputs import cache_inputs, out_bits

LENS = np.array([300, 170], np.int32)
CANDIDATES = ["m64n128d128w4-swizzled", "m64n64d128w4-swizzled-s3-qr"]


@pytest.mark.parametrize("tag", CANDIDATES)
def test_decode_candidates_run_split_kv_on_the_engine_with_tails(tag):
    config = KernelConfig.from_tag(tag)
    assert config in decode_candidates(128) and config != KernelConfig(head_dim=128)
    q, k, v = cache_inputs(2, 1, 1, 3, 300, d=128, seed=len(tag))
    checker = HazardChecker()
    res = simulate(q, k, v, config=config, splits=2, cache_seqlens=LENS, observers=[checker])
    rep = checker.report()
    assert rep.ok, format_hazards(rep)
    assert res.splits == 2 and res.config == config
    acc = measure_splitkv(res, q, k, v, LENS)
    assert acc.ok, acc.failures()
    for b, n in enumerate(LENS):  # one split: the unsplit kernel of this config on the sequence's keys
        got = simulate(q[b:b + 1], k[b:b + 1], v[b:b + 1], config=config, splits=1, cache_seqlens=LENS[b:b + 1])
        plain = simulate(q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n], config=config, engine="ptx")
        for a, e in zip(out_bits(got), out_bits(plain)):
            assert np.array_equal(a, e)
        if config.kv_stages == 1 and not config.q_in_regs:  # the spec's schedule: the hand-written program too
            prog = simulate(q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n], config=config, engine="program")
            for a, e in zip(out_bits(got), out_bits(prog)):
                assert np.array_equal(a, e)


def test_decode_family_and_class_keys():
    from fa_hw.tuned_decode import DecodeClass

    fam = decode_candidates(128)
    assert fam[0].tag == "m64n128d128w4-swizzled" and KernelConfig(head_dim=128) in fam and len(fam) == len(set(fam))
    assert all(c.head_dim == 256 for c in decode_candidates(256)) and len(decode_candidates(256)) >= 2
    dense = check_splitkv(Problem(48, 8, 1, 12000, False, 0.1, KernelConfig(head_dim=128)), "auto", None, 132)
    assert DecodeClass.of(dense).key == "decode-d128-fp16-q1-k16384-bh512"
    gqa = Problem(3, 32, 2, 3000, False, 0.1, KernelConfig(head_dim=128, dtype="bf16"), heads_k=8, softcap=5.0)
    packed = DecodeClass.of(check_splitkv(gqa, 2, None))
    assert packed.key == "decode-d128-bf16-q8-k4096-bh32-g4p-softcap"  # 4 Q heads x 2 rows, B H_k = 24
    unpacked = DecodeClass.of(check_splitkv(gqa, 2, None, pack_gqa=False))
    assert unpacked.key == "decode-d128-bf16-q2-k4096-bh128-g4-softcap"
    huge = check_splitkv(Problem(1024, 64, 1, 64, False, 0.1, KernelConfig(head_dim=64)), 1, None)
    assert DecodeClass.of(huge).bh == 4096
    for cls in (packed, unpacked):
        assert DecodeClass.parse(cls.key) == cls
    for bad in ("decode-d128-fp16-q3-k4096-bh32", "dense-d128", "decode-d128-fp32-q1-k4096-bh32"):
        with pytest.raises(ValueError, match="decode class"):
            DecodeClass.parse(bad)


def _entry(key, tag, splits=1):
    return {"class": key, "config": KernelConfig.from_tag(tag).to_json(), "splits": splits,
            "times_ms": {tag: 1.0}, "vs_seed": 1.1, "shapes": [[48, 8, 8, 1, 12000]]}


def _write_table(directory, entries, gpu="NVIDIA H100 80GB HBM3", arch="sm_90"):
    from fa_hw.device import gpu_key

    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{gpu_key(gpu)}.json"
    path.write_text(json.dumps({"format": 1, "gpu": gpu, "arch": arch, "nvrtc": "13.0", "entries": entries}))
    return path


def test_table_round_trip_and_lookup(tmp_path):
    from fa_hw.tuned_decode import DecodeClass, DecodeTable

    path = _write_table(tmp_path, [_entry("decode-d128-fp16-q1-k16384-bh512", "m64n128d128w4-swizzled"),
                                   _entry("decode-d128-fp16-q1-k4096-bh16", "m64n64d128w4-swizzled-s3", 8),
                                   _entry("decode-d64-fp16-q1-k4096-bh16", "m64n128d64w4-swizzled")])
    table = DecodeTable.load(path)
    back = DecodeTable.from_json(table.to_json())  # written sorted by class
    assert sorted(back.entries, key=lambda e: e.key) == sorted(table.entries, key=lambda e: e.key)
    want = DecodeClass.parse("decode-d128-fp16-q1-k16384-bh512")
    assert table.lookup(want).config.tag == "m64n128d128w4-swizzled"
    near = table.lookup(DecodeClass.parse("decode-d128-bf16-q1-k8192-bh16"))  # nearer the bh16 entry
    assert near.config.tag == "m64n64d128w4-swizzled-s3"
    assert table.lookup(DecodeClass.parse("decode-d128-fp16-q1-k4096-bh16-softcap")) is None
    bad = _write_table(tmp_path / "bad", [_entry("decode-d128-fp16-q1-k4096-bh16", "m64n128d64w4-swizzled")])
    with pytest.raises(ValueError, match=r"bad.*is not a valid decode table.*head_dim 64"):
        DecodeTable.load(bad)
    dup = _write_table(tmp_path / "dup", [_entry("decode-d128-fp16-q1-k4096-bh16", "m64n128d128w4-swizzled")] * 2)
    with pytest.raises(ValueError, match="two entries for one decode class"):
        DecodeTable.load(dup)


def test_choice_from_the_table_else_autotuned_and_cached(tmp_path, monkeypatch):
    from fa_hw import tuned_decode

    monkeypatch.setenv("FLASHSIM_CACHE", str(tmp_path / "cache"))
    gpu, arch = "NVIDIA H100 80GB HBM3", "sm_90"
    prob = Problem(48, 8, 1, 12000, False, 0.1, KernelConfig(head_dim=128, dtype="bf16"))
    plan = check_splitkv(prob, "auto", None, 132)
    _write_table(tmp_path / "tables", [_entry("decode-d128-bf16-q1-k16384-bh512", "m64n128d128w4-swizzled")])

    def no_timing(*a):
        pytest.fail("timed although the table answers")

    got = tuned_decode.choose(plan, gpu, arch, no_timing, tmp_path / "tables", kernel="fp")
    assert got.config == KernelConfig.from_tag("m64n128d128w4-swizzled-bf16")
    assert "decode/h100_80gb_hbm3.json (decode-d128-bf16-q1-k16384-bh512)" in got.source
    other_arch = tuned_decode.choose  # a table of another arch is not used: the autotuner answers
    calls = []

    def factory(cls, shape, pool):
        calls.append((cls.key, shape, [c.tag for c in pool]))
        return lambda c: {"m64n64d128w4-swizzled-s3": 0.5}.get(c.tag, 1.0)

    first = other_arch(plan, gpu, "sm_80", factory, tmp_path / "tables", kernel="fp")
    assert first.config == KernelConfig.from_tag("m64n64d128w4-swizzled-s3-bf16") and "autotuned" in first.source
    (key, shape, pool), = calls
    assert key == "decode-d128-bf16-q1-k16384-bh512" and shape == (384, 1, 12000, 128)
    assert pool[0] == "m64n128d128w4-swizzled" and len(pool) == tuned_decode.MAX_AUTOTUNE_CANDIDATES
    again = tuned_decode.choose(plan, gpu, "sm_80", no_timing, tmp_path / "tables", kernel="fp")  # the cache
    assert again.config == first.config and "cached in" in again.source
    stale = tuned_decode.choose(plan, gpu, "sm_80", factory, tmp_path / "tables", kernel="other kernel")
    assert len(calls) == 2 and stale.config == first.config


def test_config_auto_with_integer_splits_is_one_line_before_any_device_call(monkeypatch, capsys):
    import fa_hw
    import fa_hw.splitkv

    monkeypatch.setattr(fa_hw.splitkv, "to_device", lambda *a, **kw: pytest.fail("placed on the device"))
    q, k, v = cache_inputs(2, 2, 2, 1, 300, d=64)
    with pytest.raises(ValueError) as err:
        fa_hw.forward(q, k, v, config="auto", splits=2, cache_seqlens=LENS)
    msg = str(err.value)
    assert "config='auto' chooses the split-KV config and its splits together: pass splits='auto'" in msg
    assert "\n" not in msg
    with pytest.raises(ValueError, match="cache_seqlens must be int32"):  # the input checks stay first
        fa_hw.forward(q, k, v, config="auto", splits="auto", cache_seqlens=LENS.astype(np.int64))
    from fa_sim.cli import main

    assert main(["hw", "--batch", "2", "--heads", "2", "--seqlen", "1", "--seqlen-k", "300", "--config", "auto",
                 "--splits", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--config auto with split-KV decoding chooses the splits for its config" in err and "\n" not in err, err


def test_prepare_splitkv_runs_the_chosen_config_with_its_own_splits(tmp_path, monkeypatch):
    """fa_hw.splitkv.prepare_splitkv with config="auto", the device stood in for: the decode table's
    config for the class, its splits "auto" for that config (not the seed's), the caller's problem
    given the chosen config, the source passed on; the autotuner's path gets the caller's problem,
    cache lengths and SM count."""
    import fa_hw.splitkv as hs
    from fa_hw import tuned_decode
    from fa_hw.tensors import DeviceProblem

    sms = 132
    gpu = type("Dev", (), {"name": "NVIDIA H100 80GB HBM3",
                           "properties": type("P", (), {"multiprocessor_count": sms})()})()
    monkeypatch.setattr(hs, "device", lambda: gpu)
    monkeypatch.setattr(hs, "device_arch", lambda: "sm_90")
    monkeypatch.setattr(hs, "to_device", lambda inputs, kind, prob: DeviceProblem("numpy", prob, None, 1, 2, 3, 4, 5,
                                                                                 None, None))
    monkeypatch.setattr(hs, "launch_plan", lambda plan, ptrs, stream, keep, ctas=None: hs.SplitLaunchPlan(
        plan, None, [], 0, tuple(ctas or ())))
    q, k, v = cache_inputs(2, 8, 8, 1, 3000, d=128)
    tag = "m64n128d128w4-swizzled-s2"
    _write_table(tmp_path / "decode", [_entry("decode-d128-fp16-q1-k4096-bh16", tag)])
    tuned_decode.use_directory(tmp_path / "decode")
    try:
        sp = hs.prepare_splitkv(q, k, v, config="auto", splits="auto")
        config = KernelConfig.from_tag(tag)
        want = check_splitkv(Problem(2, 8, 1, 3000, False, 128 ** -0.5, config), "auto", None, sms)
        seed = check_splitkv(Problem(2, 8, 1, 3000, False, 128 ** -0.5, KernelConfig(head_dim=128)), "auto", None, sms)
        assert sp.plan.problem.config == config and sp.dev.problem.config == config
        assert sp.plan.splits == want.splits != seed.splits and sp.plan.auto_from == want.auto_from
        assert sp.source == "decode/h100_80gb_hbm3.json (decode-d128-fp16-q1-k4096-bh16)"
        tuned_decode.use_directory(tmp_path / "empty")  # no table: the autotuner, with a timer of these inputs
        seen = {}

        def factory(problem, splits, lens, pack, n_sms, ptrs, stream):
            seen.update(problem=problem, splits=splits, lens=lens.tolist(), sms=n_sms, ptrs=ptrs)
            return lambda cls, shape, pool: (lambda c: 0.5 if c.tag == "m64n32d128w4-swizzled-s3" else 1.0)

        monkeypatch.setattr(hs, "decode_timer_factory", factory)
        monkeypatch.setenv("FLASHSIM_CACHE", str(tmp_path / "cache"))
        lens = np.array([3000, 1200], np.int32)
        sp = hs.prepare_splitkv(q, k, v, config="auto", splits="auto", cache_seqlens=lens)
        assert sp.plan.problem.config.tag == "m64n32d128w4-swizzled-s3" and "autotuned" in sp.source
        assert seen["splits"] == "auto" and seen["lens"] == [3000, 1200] and seen["sms"] == sms
        assert seen["problem"].config == KernelConfig(head_dim=128) and seen["ptrs"] == (1, 2, 3, 4, 5)
    finally:
        tuned_decode.use_directory(None)


def test_decode_timer_plans_each_candidate_with_its_own_splits(monkeypatch):
    """fa_hw.splitkv.DecodeTimer (the device stood in for): a candidate's plan is the caller's
    problem with that config (in the caller's dtype) and "auto"'s splits for it, GQA packed as the
    caller asked; the cubins it compiles first are the split builds (FA_SPLITKV) the cache lacks."""
    import fa_hw.runtime
    import fa_sim.contract.cubins as cubins
    from fa_hw.splitkv import DecodeTimer

    monkeypatch.setattr(fa_hw.runtime, "device_arch", lambda: "sm_90")
    prob = Problem(4, 16, 1, 5000, False, 0.1, KernelConfig(head_dim=128, dtype="bf16"), heads_k=4)
    lens = np.array([5000, 10, 4096, 77], np.int32)
    timer = DecodeTimer(prob, "auto", lens, None, 132, ptrs=(1, 2, 3, 4, 5), stream=object())
    pool = decode_candidates(128)[:3]
    for c in pool:
        plan = timer.plan(c)
        assert plan.problem.config == KernelConfig.from_json({**c.to_json(), "dtype": "bf16"})
        assert plan.unpacked is not None and plan.cache_seqlens.tolist() == lens.tolist()
        assert plan.splits == check_splitkv(replace_config(prob, plan.problem.config), "auto", lens, 132).splits
    built = []
    monkeypatch.setattr(cubins, "is_cached", lambda b: b.config.block_n != 64)
    monkeypatch.setattr(cubins, "compile_many", lambda builds, workers=None: built.extend(builds))
    timer.compile(decode_candidates(128))
    assert built and all(b.splitkv and b.config.block_n == 64 and b.config.dtype == "bf16" for b in built)


def replace_config(prob, config):
    from dataclasses import replace

    return replace(prob, config=config)


# ---- GPU --------------------------------------------------------------------------------------------
def _gpu():
    import fa_hw

    if not fa_hw.has_gpu():
        pytest.skip("no GPU")


@pytest.mark.gpu
@pytest.mark.parametrize("case", [
    # B, H, H_k, Nq, Nk, lens, d: tails in the cache and the rows; GQA packed; many sequences (one split)
    (2, 4, 4, 1, 5000, (5000, 1777), 128),
    (3, 8, 2, 2, 3001, (3001, 17, 2000), 128),
    (48, 8, 8, 1, 3000, None, 128),
    (2, 4, 4, 1, 700, (700, 333), 64),
])
def test_gpu_config_auto_equals_the_chosen_config(case):
    _gpu()
    import fa_hw

    b, h, hk, nq, nk, lens, d = case
    q, k, v = cache_inputs(b, h, hk, nq, nk, d=d, seed=b * nk)
    lens = None if lens is None else np.array(lens, np.int32)
    auto = fa_hw.forward(q, k, v, config="auto", splits="auto", cache_seqlens=lens)
    assert auto.config_source and auto.splits >= 1
    explicit = fa_hw.forward(q, k, v, config=auto.config, splits="auto", cache_seqlens=lens)
    assert explicit.splits == auto.splits
    for a, e in zip(out_bits(auto), out_bits(explicit)):
        assert np.array_equal(a, e)
    acc = measure_splitkv(auto, q, k, v, lens)
    assert acc.ok, acc.failures()


@pytest.mark.gpu
@pytest.mark.parametrize("tag", [c.tag for c in decode_candidates(128)])
def test_gpu_every_decode_candidate_is_bit_identical_to_the_engine(tag):
    """Each member config="auto" may choose, split-KV on the GPU against the PTX engine (mma_model="h200"):
    tails in the rows (Nq 3), the cache (300 keys) and the splits (the 170-key sequence's last split empty)."""
    _gpu()
    import fa_hw

    config = KernelConfig.from_tag(tag)
    q, k, v = cache_inputs(2, 2, 2, 3, 300, d=128, seed=5)
    hw = fa_hw.forward(q, k, v, config=config, splits=2, cache_seqlens=LENS)
    sim = simulate(q, k, v, config=config, splits=2, cache_seqlens=LENS, mma_model="h200")
    assert hw.splits == sim.splits == 2
    for a, e in zip(out_bits(hw), out_bits(sim)):
        assert np.array_equal(a, e)


@pytest.mark.gpu
def test_gpu_autotunes_without_a_table_and_reuses_the_cached_choice(tmp_path, monkeypatch):
    _gpu()
    import fa_hw
    from fa_hw import tuned_decode

    monkeypatch.setenv("FLASHSIM_CACHE", str(tmp_path / "cache"))
    tuned_decode.use_directory(tmp_path / "none")  # no decode table: the autotuner answers
    try:
        q, k, v = cache_inputs(4, 8, 8, 1, 6000, d=128, seed=11)
        first = fa_hw.forward(q, k, v, config="auto", cache_seqlens=np.full(4, 6000, np.int32))
        assert "autotuned decode-d128-fp16-q1-k8192-bh32" in first.config_source and "timed" in first.config_source
        again = fa_hw.forward(q, k, v, config="auto", splits="auto")
        assert "cached in" in again.config_source and again.config == first.config
        assert first.config in tuned_decode.decode_candidates(128)
        acc = measure_splitkv(again, q, k, v)
        assert acc.ok, acc.failures()
    finally:
        tuned_decode.use_directory(None)


def test_tune_decode_chooses_per_class_and_writes_a_table_lookup_reads(tmp_path):
    """experiments/tune_decode.py's choice on recorded times (no GPU): per class the smallest geometric
    mean of time / the seed's; a candidate missing on one of the class's shapes (failed) is not chosen;
    --base keeps the entries of classes this run did not time."""
    from experiment_scripts import load

    from fa_hw.tuned_decode import DecodeClass, DecodeTable

    tune = load("tune_decode")
    seed, a, b = "m64n64d128w4-swizzled", "m64n128d128w4-swizzled", "m64n64d128w4-swizzled-s3"
    spread = lambda m: {"median": m, "lo": m, "hi": m}  # noqa: E731

    def row(batch, nk, times, failed=()):
        bh = 1 << (8 * batch - 1).bit_length()
        return {"batch": batch, "heads": 8, "heads_k": 8, "nq": 1, "nk": nk, "head_dim": 128,
                "class": f"decode-d128-fp16-q1-k16384-bh{bh}", "seed": seed,
                "splits": {t: 1 for t in times}, "ms": {t: spread(m) for t, m in times.items()},
                "runs": {}, "failed": {t: "RuntimeError: no" for t in failed}}

    rows = [row(32, 12000, {seed: 1.0, a: 0.8, b: 0.9}), row(48, 12000, {seed: 2.0, b: 1.5}, failed=[a]),
            row(64, 16000, {seed: 1.0, a: 0.5, b: 0.9})]
    chosen = tune.choose(rows)
    assert chosen["decode-d128-fp16-q1-k16384-bh256"][:2] == (a, 1.25)
    # bh512 (batch 48 and 64): a failed on one of its shapes, so b (geomean of 0.75 and 0.9) wins
    assert chosen["decode-d128-fp16-q1-k16384-bh512"][0] == b
    base = _write_table(tmp_path / "base", [_entry("decode-d128-fp16-q1-k4096-bh16", "m64n32d128w4-swizzled-s3")])
    args = type("A", (), {"out": str(tmp_path / "out"), "nq": 1, "heads": 8, "heads_k": 8, "runs": 3, "reps": 10})()
    md = tune.write(rows, args, "NVIDIA H100 80GB HBM3", "sm_90", "13.0", DecodeTable.load(base))
    assert "| decode-d128-fp16-q1-k16384-bh256 | m64n128d128w4-swizzled | 1.250 | 1 |" in md
    table = DecodeTable.load(tmp_path / "out" / "decode" / "h100_80gb_hbm3.json")
    assert len(table.entries) == 3
    assert table.lookup(DecodeClass.parse("decode-d128-fp16-q1-k16384-bh512")).shapes == ((48, 8, 8, 1, 12000),
                                                                                          (64, 8, 8, 1, 16000))
    assert table.lookup(DecodeClass.parse("decode-d128-fp16-q1-k16384-bh256")).config.tag == a
    assert table.lookup(DecodeClass.parse("decode-d128-fp16-q1-k4096-bh8")).config.tag == "m64n32d128w4-swizzled-s3"
