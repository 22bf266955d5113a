"""Every recorded file has a command that regenerates it (fa_sim/calibrate/recordings.py,
tests/data/README.md), without a GPU where the file needs none.

- The table names every file under tests/data and traces/golden, the README lists the same
  files and commands, and experiments/device_regenerate.sh runs every GPU command.
- The CPU recordings regenerate equal to the committed files (seed_sass_sha256.json under NVRTC
  13.0, the golden traces).
- The CPU side of each GPU command reproduces what the committed file holds: the saved compare
  runs' inputs, config, causal flag, CTAs and launch (dense, a packed batch's offsets, split-KV's
  splits, cache lengths and GQA packing) come from their `fa compare` command line (a copy with
  one of them changed fails), the MMA excerpt's tiles from `mma_probe run --tiles 8192` at the
  documented tiles, the ALU forms and the LDGSTS patterns from their probes.
- The comparison finds a changed value.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from fa_sim.calibrate import golden_traces, ldgsts_probe, mma_probe, recordings, seed_sass
from fa_sim.calibrate.recordings import RECORDINGS, Kind, Recording

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
HAND_WRITTEN = {"tests/data/ptx_user_kernel.cu", "tests/data/README.md"}
GPU = [r for r in RECORDINGS if r.gpu]


def test_every_recorded_file_has_a_command():
    files = {p.relative_to(ROOT).as_posix() for p in DATA.rglob("*") if p.is_file()} - HAND_WRITTEN
    listed = {r.path for r in RECORDINGS}
    assert files | {"traces/golden"} == listed
    assert all((ROOT / r.path).exists() for r in RECORDINGS)


def test_the_readme_lists_every_file_and_its_command():
    text = (DATA / "README.md").read_text()
    for r in RECORDINGS:
        name = Path(r.path).name
        rows = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines() if line.startswith("| `")]
        cells = next((c for c in rows if c[0].strip("`").rstrip("/").endswith(name)), None)
        assert cells is not None, f"tests/data/README.md has no row for {name}"
        assert cells[1].startswith("yes" if r.gpu else "no"), name
        commands = re.findall(r"`([^`]+)`", cells[2])
        assert " && ".join(commands) == r.command, name


def test_the_device_script_runs_every_gpu_command():
    script = (ROOT / "experiments" / "device_regenerate.sh").read_text()
    lanes = [line.split("#")[0].split()[1:] for line in script.splitlines() if line.startswith("lane ")]
    named = [name for lane in lanes for name in lane if name != "&"]
    assert sorted(named) == sorted(Path(r.path).stem for r in GPU)
    assert sum(r.seconds for r in GPU) > 0 and all(r.seconds > 0 for r in GPU)


# ---- the CPU recordings, regenerated ------------------------------------------------------------
def test_seed_sass_hashes_regenerate(tmp_path):
    pytest.importorskip("cuda.core")
    committed = json.loads((DATA / "seed_sass_sha256.json").read_text())
    if seed_sass.nvrtc() != committed["nvrtc"]:
        pytest.skip(f"the committed hashes are NVRTC {committed['nvrtc']}'s")
    out = tmp_path / "seed_sass_sha256.json"
    assert seed_sass.main(["--out", str(out)]) == 0
    assert out.read_bytes() == (DATA / "seed_sass_sha256.json").read_bytes()


def test_golden_traces_regenerate(tmp_path):
    assert golden_traces.main(["--out", str(tmp_path / "golden")]) == 0
    verdict = recordings.compare(tmp_path, recordings.BY_NAME["golden"])
    assert verdict.equal, verdict.detail


# ---- the CPU side of the GPU commands -----------------------------------------------------------
def _argv(rec: Recording) -> list[str]:
    return shlex.split(recordings.command(rec, "OUT", "W"))


@pytest.mark.parametrize("rec", [r for r in GPU if r.kind is Kind.SAVED_RUN], ids=lambda r: Path(r.path).stem)
def test_saved_runs_come_from_their_command_line(rec):
    """What `fa compare` makes of the recording's command line, without the GPU: the inputs (dense,
    packed of --seqlens, or split-KV's padded batch), config, causal flag, the launch (a packed run's
    offsets; a split run's splits, cache lengths and GQA packing) and the CTAs (--ctas, or the default
    of that launch kind), each equal to what the file holds."""
    from fa_sim.cli import build_parser, explicit_options
    from fa_sim.commands.common import (config_from_args, packed_inputs, packed_problem, packed_random_inputs,
                                        random_inputs, splitkv)
    from fa_sim.commands.compare import _default_packed
    from fa_sim.crosscheck import SavedRun
    from fa_sim.problem import Problem
    from fa_sim.splitkv import check_splitkv

    argv = _argv(rec)[3:]  # after "python -m fa_sim.cli"
    args = build_parser().parse_args(argv)
    args.explicit = explicit_options(argv)
    run = SavedRun.load(ROOT / rec.path)
    config = config_from_args(args)
    split = splitkv(args)  # {} unless --splits / --cache-seqlens
    assert packed_inputs(args, split) is None  # random inputs; args.cu_seqlens set by --seqlens
    if args.cu_seqlens is not None:  # a packed batch: one token-major draw of the --seqlens lengths
        prob = packed_problem(args, None, config)
        q, k, v = packed_random_inputs(args, prob, config.dtype)
        assert run.kind == "packed" and run.cu_seqlens == tuple(tuple(map(int, c)) for c in args.cu_seqlens)
        n_ctas, default = prob.n_ctas, _default_packed(prob)  # the first and the last CTA that run
    else:
        q, k, v = random_inputs(args, config.dtype)  # a bf16 run: float32 of bf16 values
        prob = Problem(*q.shape[:3], k.shape[2], args.causal, run.scale, config, heads_k=k.shape[1])
        if split:  # split-KV decoding: the split grid, default its first and last CTA that run
            plan = check_splitkv(prob, split["splits"], split["cache_seqlens"], None, split.get("pack_gqa"))
            assert run.kind == "split" and (run.splits, run.pack_gqa) == (plan.splits, plan.unpacked is not None)
            assert np.array_equal(run.cache_seqlens, plan.cache_seqlens)
            live = [c for c in range(plan.n_ctas) if plan.cta(c)[4] > 0]
            n_ctas, default = plan.n_ctas, sorted({live[0], live[-1]})
        else:  # a dense launch: fa compare's default CTAs, the first and the last
            assert run.kind == "dense"
            n_ctas, default = prob.n_ctas, [0, prob.n_ctas - 1]
    assert all(np.array_equal(a, b) for a, b in ((q, run.q), (k, run.k), (v, run.v)))
    assert (config, args.causal) == (run.config, run.causal)
    ctas = default if args.ctas is None else [int(c) for c in args.ctas.split(",")]
    assert run.ctas == tuple(ctas) and all(0 <= c < n_ctas for c in ctas)
    if args.kernel is not None:
        assert (ROOT / args.kernel).is_file() and Path(args.kernel).name == run.kernel_name


def _flip_one(x):
    x.reshape(-1)[11] = -x.reshape(-1)[11]
    return x


@pytest.mark.parametrize("name, change", [
    ("compare_causal_tails.npz", {"k": _flip_one}),
    ("compare_packed.npz", {"q": _flip_one}),
    ("compare_packed.npz", {"cu_seqlens_q": lambda c: np.array([0, 71, 200, 205], np.int32),
                            "cu_seqlens_k": lambda c: np.array([0, 71, 200, 205], np.int32)}),
    ("compare_splitkv.npz", {"v": _flip_one}),
    ("compare_splitkv.npz", {"cache_seqlens": lambda c: np.array([300, 71], np.int32)}),
    ("compare_splitkv.npz", {"ctas": lambda c: np.array([0, 1, 4, 3])}),
])
def test_a_saved_run_that_its_command_line_does_not_make_fails(tmp_path, monkeypatch, name, change):
    """The check above on a copy with one input value, the offsets, the cache lengths or the CTAs
    changed: each fails (the unchanged copy passes)."""
    rec = recordings.BY_NAME[name]
    copy = tmp_path / rec.path
    copy.parent.mkdir(parents=True)
    data = {k: np.asarray(v) for k, v in np.load(ROOT / rec.path).items()}
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    np.savez(copy, **data)
    test_saved_runs_come_from_their_command_line(rec)
    np.savez(copy, **{**data, **{k: fn(data[k].copy()) for k, fn in change.items()}})
    with pytest.raises(AssertionError):
        test_saved_runs_come_from_their_command_line(rec)


def test_the_mma_excerpt_holds_the_documented_tiles(tmp_path):
    argv = _argv(recordings.BY_NAME["mma_probe_192.npz"])
    run, excerpt = argv[: argv.index("&&")], argv[argv.index("&&") + 1:]
    tiles = int(run[run.index("--tiles") + 1])
    a, b, c = mma_probe.make_inputs(tiles, 0)
    np.savez(tmp_path / "mma_probe.npz", a=a, b=b, c=c, d=np.zeros_like(c))  # the GPU's D aside
    keep = excerpt[excerpt.index("--tiles") + 1]
    assert mma_probe.main(["excerpt", str(tmp_path / "mma_probe.npz"), "--tiles", keep,
                           "--out", str(tmp_path / "mma_probe_192.npz")]) == 0
    got, want = np.load(tmp_path / "mma_probe_192.npz"), np.load(DATA / "h200" / "mma_probe_192.npz")
    assert all(np.array_equal(got[x], want[x]) for x in "abc")


def test_the_ldgsts_recording_holds_the_probes_patterns():
    data = json.loads((DATA / "h200" / "ldgsts_probe.json").read_text())
    assert data["patterns"] == ldgsts_probe.patterns() and set(data["ncu"]) == set(data["patterns"])


def test_the_alu_recording_holds_the_probes_leading_forms():
    from fa_sim.calibrate import alu_probe

    gpu, seed = alu_probe.load_recording(DATA / "h200" / "alu_probe.npz")  # refuses another form list
    assert seed == 0 and gpu.shape[0] <= len(alu_probe.FORMS)


# ---- the comparison ----------------------------------------------------------------------------
def test_a_regenerated_copy_compares_equal_and_a_changed_value_does_not(tmp_path):
    for name in ("mufu_binding.npz", "compare_causal_tails.npz", "alu_probe.npz", "ldgsts_probe.json"):
        shutil.copy(DATA / "h200" / name, tmp_path / name)
    for name in ("mufu_binding.npz", "compare_causal_tails.npz", "alu_probe.npz", "ldgsts_probe.json"):
        assert recordings.compare(tmp_path, recordings.BY_NAME[name]).equal, name
    z = dict(np.load(tmp_path / "mufu_binding.npz"))
    z["ex2_ftz__y"] = z["ex2_ftz__y"].copy()
    z["ex2_ftz__y"][7] ^= 1
    np.savez(tmp_path / "mufu_binding.npz", **z)
    verdict = recordings.compare(tmp_path, recordings.BY_NAME["mufu_binding.npz"])
    assert not verdict.equal and "ex2_ftz__y" in verdict.detail
    run = dict(np.load(tmp_path / "compare_causal_tails.npz"))
    run["o"] = run["o"].copy()
    run["o"].flat[5] += np.float16(1)
    np.savez(tmp_path / "compare_causal_tails.npz", **run)
    verdict = recordings.compare(tmp_path, recordings.BY_NAME["compare_causal_tails.npz"])
    assert not verdict.equal and "o" in verdict.detail
    assert not recordings.compare(tmp_path / "nowhere", recordings.BY_NAME["alu_probe.npz"]).equal


def test_paired_speedups_compare_by_the_signs_both_tell(tmp_path):
    """timing_pairs.json: a rerun matches where both files' passes agree on a sign; a sign told the
    other way is a difference, a rerun whose passes disagree (range holding 0) is not."""
    old = DATA / "h200" / "timing_pairs.json"
    doc = json.loads(old.read_text())
    told = next(r for r in doc["pairs"] if r["low"] > 0)
    new = tmp_path / "timing_pairs.json"
    assert recordings.compare_signs(old, old)[0]
    told.update(low=-0.01, high=0.01)  # this rerun cannot tell the sign: not a difference
    new.write_text(json.dumps(doc))
    assert recordings.compare_signs(new, old)[0]
    told.update(low=-0.02, high=-0.01)  # told the other way
    new.write_text(json.dumps(doc))
    ok, detail = recordings.compare_signs(new, old)
    assert not ok and told["key"] in detail


def test_dispatch_traces_compare_by_each_grids_span(tmp_path):
    """timing_dispatch.npz: a rerun matches where every grid's span (median over its launches) is
    within SPAN_TOLERANCE; one grid's CTAs all ending later is a difference."""
    import numpy as np

    old = DATA / "h200" / "timing_dispatch.npz"
    assert recordings.compare_spans(old, old) == (True, "24 cases, spans at most 0.0% apart")
    with np.load(old) as z:
        arrays = dict(z)
    arrays["end_ns"] = np.where(arrays["case"] == 3, arrays["end_ns"] * 1.1, arrays["end_ns"]).astype(np.int64)
    np.savez(tmp_path / "timing_dispatch.npz", **arrays)
    ok, detail = recordings.compare_spans(tmp_path / "timing_dispatch.npz", old)
    keys = json.loads(str(arrays["meta"]))["keys"]
    assert not ok and "1 of 24 spans DIFFER" in detail and keys[3] in detail


def test_ncu_counters_parses_nsight_computes_csv_and_refuses_other_output():
    """experiments/ncu_counters.py's parser on Nsight Compute's --csv layout (thousands separators)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("ncu_counters", ROOT / "experiments" / "ncu_counters.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    head = '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",' \
           '"Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"'
    row = '"0","1","python3","h","fa2_fwd_kernel","1","7","(128, 1, 1)","(16, 64, 1)","0","9.0","",' \
          '"{}","{}","{}"'
    text = "==PROF== noise\n" + "\n".join([head, row.format("gpu__time_duration.sum", "ns", "322,304"),
                                          row.format("launch__registers_per_thread", "", "124")])
    assert mod.parse(text) == {"gpu__time_duration.sum": 322304.0, "launch__registers_per_thread": 124.0}
    with pytest.raises(ValueError, match="no Nsight Compute metric table"):
        mod.parse("==ERR== no kernels were profiled\n")
