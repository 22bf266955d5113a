"""Issue 38's feature classes in config="auto"'s tables (fa_hw.tuned.FeatureClass) and their tuning
(experiments/tune_hw.py --features), on the CPU with synthetic tables: the JSON form, the lookup's
order of preference, a window's size class, the device choice, and the pruned candidate pools."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from experiment_scripts import load
from fa_hw import autotune, tuned
from fa_sim.config import KernelConfig

FC = tuned.FeatureClass
BF16, GQA, CAP = FC(dtype="bf16"), FC(group="gqa"), FC(softcap=True)
GPU = ("NVIDIA H200", "sm_90")


def _entry(d, causal, size, tag, fc=FC()):
    return tuned.Entry(d, causal, size, KernelConfig.from_tag(tag), 300.0, 1.05, ((4, 16, 2048, d),), fc)


def _synthetic() -> tuned.Table:
    return tuned.Table(GPU[0], GPU[1], (
        _entry(128, False, "short", "m64n64d128w4-swizzled"),
        _entry(128, False, "medium", "m128n64d128w4-swizzled-s2"),
        _entry(128, False, "long", "m128n32d128w4-swizzled"),
        _entry(128, False, "medium", "m128n64d128w4-swizzled-s2-ls", BF16),
        _entry(128, False, "medium", "m256n64d128w8-swizzled-s2-pp", GQA),
        _entry(128, False, "long", "m128n64d128w4-swizzled-ls", CAP),
        _entry(96, False, "medium", "m128n64d96w8-swizzled"),
    ))


def test_feature_entries_round_trip_and_plain_ones_keep_their_form():
    t = _synthetic()
    data = t.to_json()
    again = tuned.Table.from_json(json.loads(json.dumps(data)))
    assert set(again.entries) == set(t.entries) and len(again.entries) == len(t.entries)  # written sorted
    plain = [e for e in data["entries"] if e["head_dim"] == 128 and e["size"] == "short"][0]
    assert not {"dtype", "group", "softcap"} & set(plain)  # written as format 1 always wrote it
    by_tag = {KernelConfig.from_json(e["config"]).tag: e for e in data["entries"]}
    assert by_tag["m128n64d128w4-swizzled-s2-ls"]["dtype"] == "bf16"
    assert by_tag["m256n64d128w8-swizzled-s2-pp"]["group"] == "gqa"
    assert by_tag["m128n64d128w4-swizzled-ls"]["softcap"] is True


@pytest.mark.parametrize("change,message", [
    ({"dtype": "fp32"}, "bad feature class .dtype='fp32'"),
    ({"group": "mqa"}, "group one of .'mha', 'gqa'."),
    ({"softcap": 1}, "softcap a bool"),
    ({"config": KernelConfig.from_tag("m128n64d128w4-swizzled-bf16").to_json()}, "holds a bf16 config"),
])
def test_a_bad_feature_key_is_refused_in_one_line(change, message):
    data = _synthetic().to_json()
    data["entries"][0].update(change)
    with pytest.raises(ValueError, match=message):
        tuned.Table.from_json(data)
    twice = _synthetic().to_json()
    twice["entries"].append(dict(twice["entries"][-1]))
    with pytest.raises(ValueError, match="two entries for one .head_dim, causal, size, dtype, group, softcap."):
        tuned.Table.from_json(twice)


def test_lookup_prefers_softcap_then_size_then_dtype_then_group():
    t = _synthetic()
    tag = lambda *a: t.lookup(*a).config.tag  # noqa: E731
    assert tag(128, False, "medium", BF16) == "m128n64d128w4-swizzled-s2-ls"        # exact
    assert tag(128, False, "medium", GQA) == "m256n64d128w8-swizzled-s2-pp"         # exact
    assert tag(128, False, "long", CAP) == "m128n64d128w4-swizzled-ls"              # exact
    assert tag(128, False, "short", CAP) == "m128n64d128w4-swizzled-ls"             # softcap first, any size
    assert tag(128, False, "long", BF16) == "m128n32d128w4-swizzled"                # size before dtype
    assert tag(128, False, "medium", FC("bf16", "gqa")) == "m128n64d128w4-swizzled-s2-ls"  # dtype before group
    assert tag(128, False, "medium", FC()) == "m128n64d128w4-swizzled-s2"           # plain stays plain
    assert tag(128, False, "long", FC()) == "m128n32d128w4-swizzled"                # not the softcap entry
    assert tag(96, False, "long", BF16) == "m128n64d96w8-swizzled"                  # the only d=96 entry
    assert t.lookup(128, True, "medium", BF16) is None
    assert t.plain().entries == tuple(e for e in t.entries if e.features == FC())


def test_a_window_is_classed_by_the_keys_a_row_sees():
    assert tuned.effective_keys(8192, (1024, 0)) == 1025
    assert tuned.effective_keys(8192, (100, 23)) == 124
    assert tuned.effective_keys(500, (1024, 0)) == 500
    assert tuned.effective_keys(8192, (-1, 0)) == 8192 and tuned.effective_keys(8192, (64, -1)) == 8192
    assert tuned.effective_keys(8192) == 8192
    assert tuned.effective_keys(8192, (1024, -1), causal=True) == 1025  # Problem's causal window: right side -1
    assert tuned.effective_keys(8192, (-1, -1), causal=True) == 8192
    assert [tuned.size_class(tuned.effective_keys(16000, w)) for w in ((1023, 0), (1024, 0), (4096, 0))] == [
        "short", "medium", "long"]


def test_feature_class_of_a_launch():
    assert FC.of(None) == FC() and FC.of(autotune.Features()).plain
    assert FC.of(autotune.Features(kv_group=4, softcap=30.0, dtype="bf16")) == FC("bf16", "gqa", True)
    assert FC.of(autotune.Features(window=(64, 0))) == FC()  # a window is a size class, not a feature class
    assert FC("bf16", "gqa", True).describe() == ", bf16, gqa, softcap" and FC().describe() == ""


def _write(table, directory):
    (directory / f"{tuned.gpu_key(table.gpu)}.json").write_text(json.dumps(table.to_json()))


def never(cls, shape, pool):
    raise AssertionError(f"timed {cls.key}: the table should have answered")


def test_device_and_model_choices_read_the_feature_entries(tmp_path):
    _write(_synthetic(), tmp_path)
    bf16 = autotune.Features(dtype="bf16")
    got = tuned.device_choice(128, False, 2048, 2048, 64, *GPU, never, tmp_path, kernel="k", features=bf16)
    assert got.config == KernelConfig.from_tag("m128n64d128w4-swizzled-s2-ls-bf16")  # run in the launch's dtype
    assert got.source == "h200.json (d=128, non-causal, medium, bf16)"
    cap = autotune.Features(softcap=30.0, window=(500, 0))  # 501 keys a row: short; the softcap entry is long
    got = tuned.device_choice(128, False, 8192, 8192, 64, *GPU, never, tmp_path, kernel="k", features=cap)
    assert got.config.tag == "m128n64d128w4-swizzled-ls"
    assert got.source == "h200.json (d=128, non-causal, long, nearest to short, softcap)"
    # a window of 2001 keys a row at N = 16384: the medium entry, not the long one
    assert tuned.device_choice(128, False, 16384, 16384, 64, *GPU, never, tmp_path, kernel="k",
                               features=autotune.Features(window=(2000, 0))).config.tag == "m128n64d128w4-swizzled-s2"
    gqa_bf16 = autotune.Features(kv_group=8, dtype="bf16")
    got = tuned.auto_config(128, False, 3000, *GPU, tmp_path, features=gqa_bf16)
    assert got.config.tag == "m128n64d128w4-swizzled-s2-ls-bf16"
    assert got.source == "h200.json (d=128, non-causal, medium, bf16, nearest to bf16, gqa)"
    assert tuned.auto_config(128, False, 3000, *GPU, tmp_path).config.tag == "m128n64d128w4-swizzled-s2"
    # the autotuner's pool for a GPU without a table takes the plain winners only
    pool = tuned.autotune_candidates(128, False, 3000, tmp_path)
    assert pool[0].tag == "m128n64d128w4-swizzled-s2"
    assert KernelConfig.from_tag("m256n64d128w8-swizzled-s2-pp") not in pool


@pytest.fixture(scope="module")
def tune_hw():
    load("hw_sets")
    load("bench_hw")
    load("bench_features")
    return load("tune_hw")


def test_the_feature_pool_is_pruned_from_the_plain_tables(tune_hw, tmp_path):
    _write(_synthetic(), tmp_path)
    pool = tune_hw.feature_candidates(128, False, 3000, 6, tmp_path)
    auto = tuned.autotune_candidates(128, False, 3000, tmp_path)
    assert pool[:len(auto)] == auto and len(pool) == 6 == len(set(pool))
    assert pool[len(auto):] == [c for c in reversed(tuned.candidates(128, False)) if c not in auto][:6 - len(auto)]
    assert all(c.dtype == "fp16" for c in pool)
    assert tune_hw.feature_candidates(128, False, 3000, 2, tmp_path) == auto[:2]
    # no table holds d=96 in another directory: CANDIDATES[96], heavy_first when causal
    empty = tmp_path / "none"
    empty.mkdir()
    assert tune_hw.feature_candidates(96, True, 2500, 6, empty)[0] == KernelConfig.from_tag("m128n64d96w4-swizzled-hf")


def test_feature_training_shapes_are_held_out_and_cover_the_benchmark(tune_hw):
    from bench_features import ROWS

    tune_hw.check_feature_sets(ROWS)
    with pytest.raises(ValueError, match=r"also benchmarked \[\(8, 16, 2048, 96\)\]"):
        tune_hw.check_feature_sets(ROWS, tune_hw.FEATURE_TRAIN + [(8, 16, 2048, 96, {})])
    with pytest.raises(ValueError, match="benchmarked keys without training shapes"):
        tune_hw.check_feature_sets(ROWS, [c for c in tune_hw.FEATURE_TRAIN if not c[4].get("softcap")])
    assert tune_hw.case_class((6, 32, 2300, 64, {"heads_k": 8})) == GQA
    assert tune_hw.case_class((6, 32, 2300, 64, {"heads_k": 32, "dtype": "bf16"})) == BF16


def test_feature_builds_carry_the_class(tune_hw):
    builds = tune_hw.feature_builds("sm_90", 6, [(6, 32, 2300, 64, {"heads_k": 8, "softcap": 40.0, "dtype": "bf16"})])
    assert len(builds) == len(tune_hw.feature_candidates(64, False, 2300, 6)) + len(
        tune_hw.feature_candidates(64, True, 2300, 6))
    assert {(b.kv_group, b.softcap, b.config.dtype) for b in builds} == {(4, 40.0, "bf16")}


def test_choose_and_merge_key_by_feature_class(tune_hw):
    case = (6, 16, 2300, 64)
    rows = [dict(tag="m128n128d64w4-swizzled-s2", ms=1.0, vs_flash=1.1, note=None),
            dict(tag="m128n128d64w4-swizzled", ms=0.9, vs_flash=1.2, note=None),
            dict(tag="m64n64d64w4-swizzled", ms=0.5, vs_flash=2.0, note="O differs from float64: not chosen")]
    entries = tune_hw.choose({(case, False, BF16): (None, rows)})
    assert [(e.key, e.config.tag) for e in entries] == [((64, False, "medium", BF16), "m128n128d64w4-swizzled")]
    assert math.isclose(entries[0].vs_flash, 1.2)
    base = tuned.Table(GPU[0], GPU[1], (_entry(64, False, "medium", "m64n64d64w4-swizzled"),
                                        _entry(64, False, "medium", "m128n128d64w4-swizzled-s2", BF16)))
    merged = tune_hw.merge(base, entries, *GPU, "13.0")
    assert sorted((e.features.dtype, e.config.tag) for e in merged.entries) == [
        ("bf16", "m128n128d64w4-swizzled"), ("fp16", "m64n64d64w4-swizzled")]
    assert tune_hw.merge(None, entries, *GPU, "13.0").entries == tuple(entries)


def test_tune_hw_refuses_bad_feature_options_before_any_work(tune_hw, capsys, tmp_path):
    for argv, message in ((["--features", "--max-candidates", "-1"], "--max-candidates -1: give 0 (the whole pool)"),
                          (["--base", "x.json"], "--base is for --features"),
                          (["--max-candidates", "3"], "--max-candidates is for --features"),
                          (["--labels", "m64n64d192w4-swizzled"], "--labels is for --features")):
        with pytest.raises(SystemExit):
            tune_hw.main(["--gpu-name", "X", *argv])
        assert message in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert tune_hw.main(["--gpu-name", "X", "--features", "--base", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tune_hw.py: cannot read the tuned table") and err.count("\n") == 1


def test_tune_features_merges_into_the_shipped_table(tune_hw, monkeypatch, tmp_path, capsys):
    """main --features end to end with the GPU parts faked: every FEATURE_TRAIN case and causal flag
    is measured, the fastest candidate (here: the last of each pool) becomes the class's entry, and
    the written table is the shipped H100 table with those keys' entries replaced (the shipped table
    may already hold some of them: those of its last --features run) and every other entry kept."""
    from fa_sim.contract import cubins

    class Dev:
        name = "NVIDIA H100 80GB HBM3"

    compiled = []
    monkeypatch.setattr(tune_hw, "device", lambda: Dev())
    monkeypatch.setattr(tune_hw, "device_arch", lambda: "sm_90")
    monkeypatch.setattr(cubins, "compile_many", lambda builds, workers: compiled.extend(builds))

    def fake(case, causal, args):
        pool = tune_hw.feature_candidates(case[3], causal, case[2], args.max_candidates)
        rows = [dict(tag=c.tag, ms=2.0 - 0.1 * i, vs_flash=1.0 + 0.1 * i, note=None) for i, c in enumerate(pool)]
        return tune_hw.Spread(1.0, 1.0, 1.0), rows
    monkeypatch.setattr(tune_hw, "measure_feature_case", fake)
    monkeypatch.setattr(tune_hw, "markdown", lambda *a: "table\n")
    assert tune_hw.main(["--gpu-name", Dev.name, "--features", "--out", str(tmp_path)]) == 0
    assert set(compiled) == tune_hw.feature_builds("sm_90", tuned.MAX_AUTOTUNE_CANDIDATES)
    table = tuned.Table.load(tmp_path / "h100_80gb_hbm3.json")
    shipped = tuned.table_for(Dev.name)
    tuned_keys = {(d, causal, tuned.size_class(n), tune_hw.case_class((b, h, n, d, feats)))
                  for b, h, n, d, feats in tune_hw.FEATURE_TRAIN for causal in (False, True)}
    classes = {(d, tuned.size_class(n), tune_hw.case_class((b, h, n, d, feats)))
               for b, h, n, d, feats in tune_hw.FEATURE_TRAIN}
    assert len(tuned_keys) == 2 * len(classes) < 2 * len(tune_hw.FEATURE_TRAIN)  # some classes have two shapes
    kept = [e for e in shipped.entries if e.key not in tuned_keys]
    assert kept, "the shipped H100 table holds plain entries that no feature class replaces"
    assert [e for e in table.entries if e.key not in tuned_keys] == kept  # the rest of the base, unchanged
    new = [e for e in table.entries if e.key in tuned_keys]
    assert len(new) == len(tuned_keys) and {e.key for e in new} == tuned_keys  # one entry per tuned key
    for b, h, n, d, feats in tune_hw.FEATURE_TRAIN:
        fc = tune_hw.case_class((b, h, n, d, feats))
        for causal in (False, True):
            e = table.lookup(d, causal, tuned.size_class(n), fc)
            assert (e.features, e.size) == (fc, "medium")
            assert e.config == tune_hw.feature_candidates(d, causal, n)[-1]
    assert "feature entries merged into" in capsys.readouterr().out


def test_tune_features_cases_tune_and_compile_only_those(tune_hw, monkeypatch, tmp_path, capsys):
    """--features --cases I J: only those FEATURE_TRAIN shapes are compiled and timed, their keys
    merged; an index past FEATURE_TRAIN is one usage line before any work."""
    from fa_sim.contract import cubins

    class Dev:
        name = "NVIDIA H100 80GB HBM3"

    compiled, measured = [], []
    monkeypatch.setattr(tune_hw, "device", lambda: Dev())
    monkeypatch.setattr(tune_hw, "device_arch", lambda: "sm_90")
    monkeypatch.setattr(cubins, "compile_many", lambda builds, workers: compiled.extend(builds))

    def fake(case, causal, args):
        measured.append((case, causal))
        pool = tune_hw.feature_candidates(case[3], causal, case[2], args.max_candidates)
        return tune_hw.Spread(1.0, 1.0, 1.0), [dict(tag=c.tag, ms=1.0, vs_flash=1.0, note=None) for c in pool]
    monkeypatch.setattr(tune_hw, "measure_feature_case", fake)
    monkeypatch.setattr(tune_hw, "markdown", lambda *a: "table\n")
    picked = [0, 10]  # head_dim 96's two shapes
    assert [tune_hw.FEATURE_TRAIN[i][3] for i in picked] == [96, 96]
    assert tune_hw.main(["--gpu-name", Dev.name, "--features", "--cases", *map(str, picked), "--out", str(tmp_path)]) == 0
    want = [tune_hw.FEATURE_TRAIN[i] for i in picked]
    assert [c for c, _ in measured] == [c for c in want for _ in (False, True)]
    assert set(compiled) == tune_hw.feature_builds("sm_90", tuned.MAX_AUTOTUNE_CANDIDATES, want)
    assert "2 feature entries merged into" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        tune_hw.main(["--gpu-name", Dev.name, "--features", "--cases", str(len(tune_hw.FEATURE_TRAIN))])
    assert "indices 0-14 of hw_sets.FEATURE_TRAIN" in capsys.readouterr().err


def test_tune_hw_labels_are_checked_before_any_work(tune_hw, monkeypatch, capsys):
    """--labels: a bad tag, a bf16 tag, a selected case's head_dim without a label, a label of a
    head_dim no selected case has, and --labels with --max-candidates are one usage line each,
    before the GPU is asked for."""
    monkeypatch.setattr(tune_hw, "device", lambda: pytest.fail("the GPU was asked for"))
    d192 = [str(i) for i, c in enumerate(tune_hw.FEATURE_TRAIN) if c[3] == 192]
    for argv, message in (
            (["--cases", *d192, "--labels", "m64n64d192w4-swizled"], "--labels m64n64d192w4-swizled: smem layout 'swizled' is not supported"),
            (["--cases", *d192, "--labels", "m64n64d192w4-swizzled-xx"], "unknown suffix 'xx'"),
            (["--cases", *d192, "--labels", "m128n128d192w4-swizzled"], "--labels m128n128d192w4-swizzled: unsupported"),
            (["--cases", *d192, "--labels", "m64n64d192w4-swizzled-bf16"], "give the fp16 tag"),
            (["--cases", "0", *d192, "--labels", "m64n64d192w4-swizzled"], "names no config of head_dim [96]"),
            (["--cases", *d192, "--labels", "m64n64d192w4-swizzled", "m64n64d256w4-swizzled"],
             "names configs of head_dim [256], which no selected"),
            (["--labels", "m64n64d192w4-swizzled"], "names no config of head_dim [64, 96, 128, 160, 256]"),
            (["--cases", *d192, "--labels", "m64n64d192w4-swizzled", "--max-candidates", "3"], "leave out --max-candidates")):
        with pytest.raises(SystemExit):
            tune_hw.main(["--gpu-name", "X", "--features", *argv])
        last = capsys.readouterr().err.strip().splitlines()[-1]  # the usage lines, then one error line
        assert ": error: " in last and message in last, last


def test_tune_features_labels_time_exactly_those(tune_hw, monkeypatch, tmp_path, capsys):
    """--labels T...: each selected case times exactly the labels of its head_dim (heavy_first in
    the causal cases only; duplicates once), compiled and measured as given, merged into the GPU's
    shipped table, here the H200's (any GPU's table takes feature entries); --max-candidates 0
    times the whole pool."""
    from fa_sim.contract import cubins

    class Dev:
        name = "NVIDIA H200"

    compiled, timed = [], {}
    monkeypatch.setattr(tune_hw, "device", lambda: Dev())
    monkeypatch.setattr(tune_hw, "device_arch", lambda: "sm_90")
    monkeypatch.setattr(cubins, "compile_many", lambda builds, workers: compiled.extend(builds))

    def fake(case, causal, args):
        pool = tune_hw.feature_candidates(case[3], causal, case[2], args.max_candidates, labels=args.labels)
        timed[(case[:4], causal)] = [c.tag for c in pool]
        rows = [dict(tag=c.tag, ms=2.0 - 0.1 * i, vs_flash=1.0 + 0.1 * i, note=None) for i, c in enumerate(pool)]
        return tune_hw.Spread(1.0, 1.0, 1.0), rows
    monkeypatch.setattr(tune_hw, "measure_feature_case", fake)
    monkeypatch.setattr(tune_hw, "markdown", lambda *a: "table\n")
    picked = [i for i, c in enumerate(tune_hw.FEATURE_TRAIN) if c[3] in (192, 256)]
    labels = ["m64n64d192w4-swizzled", "m128n64d192w8-swizzled-s2-hf", "m64n64d256w4-swizzled-ls",
              "m64n64d192w4-swizzled-hf"]
    assert tune_hw.main(["--gpu-name", Dev.name, "--features", "--cases", *map(str, picked), "--labels", *labels,
                         "--out", str(tmp_path)]) == 0
    for i in picked:
        case = tuple(tune_hw.FEATURE_TRAIN[i][:4])
        want = {192: ["m64n64d192w4-swizzled", "m128n64d192w8-swizzled-s2"], 256: ["m64n64d256w4-swizzled-ls"]}[case[3]]
        assert timed[(case, False)] == want
        assert timed[(case, True)] == [replace(KernelConfig.from_tag(t), heavy_first=True).tag for t in want]
    assert len(compiled) == len(set(compiled))  # compiled once, though each head_dim has two shapes
    assert {(b.config.tag, b.causal) for b in compiled} == {(t, k[1]) for k, v in timed.items() for t in v}
    table = tuned.Table.load(tmp_path / "h200.json")
    shipped = tuned.table_for(Dev.name)
    assert table.gpu == Dev.name and shipped is not None
    new = {e.key: e.config.tag for e in table.entries if e.head_dim in (192, 256)}
    assert new == {(192, False, "medium", tuned.FeatureClass()): "m128n64d192w8-swizzled-s2",
                   (192, True, "medium", tuned.FeatureClass()): "m128n64d192w8-swizzled-s2-hf",
                   (256, False, "medium", tuned.FeatureClass()): "m64n64d256w4-swizzled-ls",
                   (256, True, "medium", tuned.FeatureClass()): "m64n64d256w4-swizzled-hf-ls"}
    assert [e for e in table.entries if e.head_dim not in (192, 256)] == list(shipped.entries)
    assert "4 feature entries merged into" in capsys.readouterr().out
    # --max-candidates 0: the whole pool
    whole = tune_hw.feature_candidates(192, True, 3300, 0)
    assert len(whole) > tuned.MAX_AUTOTUNE_CANDIDATES and whole[:6] == tune_hw.feature_candidates(192, True, 3300, 6)


@pytest.mark.slow  # about 50 NVRTC compiles from a cold cache (1-2 s each)
@pytest.mark.parametrize("head_dim", [192, 256])
def test_the_big_head_dim_candidates_compile_without_spills_for_sm_90(head_dim):
    """CANDIDATES[192] / [256] are the spill-free configs of experiments/family_bigdims_sm90.md: every
    build tune_hw.py times (causal ones with heavy_first) holds no local memory on sm_90."""
    from fa_sim.contract import KernelBuild
    from fa_sim.contract.cubins import compile_build

    for causal in (False, True):
        for c in tuned.candidates(head_dim, causal):
            usage = compile_build(KernelBuild(c, causal, "sm_90")).usage
            assert usage.stack_bytes == 0, (c.tag, causal, usage)
