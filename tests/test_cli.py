"""The `fa` command: every subcommand registers; every bad input, path and combination is one line
naming the option (and file) with exit status 2, checked before any simulation runs; every
option's help states its meaning, default and allowed values (issue 8, "CLI")."""

import argparse
import json
import pickle
from pathlib import Path

import numpy as np
import pytest

from fa_sim.cli import build_parser, main
from fa_sim.commands import UsageError
from fa_sim.errors import KernelFault
from fa_sim.ptx.ops import Unsupported

H200 = Path(__file__).parent / "data" / "h200"
SEED_RUN = str(H200 / "compare_seed_n128.npz")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Bad and good input files, an existing output file and directory, keyed for the table."""
    d = tmp_path_factory.mktemp("inputs")
    x = np.zeros((1, 1, 64, 64), np.float16)
    np.savez(d / "good.npz", q=x, k=x, v=x)
    good = (d / "good.npz").read_bytes()
    (d / "truncated.npz").write_bytes(good[: len(good) // 2])
    (d / "corrupt.npz").write_bytes(b"PK\x03\x04" + b"\0" * 60)
    broken = bytearray(good)
    broken[200:260] = b"x" * 60  # a member's data, zip structure intact: CRC error
    (d / "badcrc.npz").write_bytes(bytes(broken))
    (d / "empty.npz").write_bytes(b"")
    np.save(d / "single.npy", x)
    (d / "pickled.pkl").write_bytes(pickle.dumps({"q": x}))
    np.savez(d / "objects.npz", q=np.array([{"a": 1}], dtype=object), k=x, v=x)
    np.savez(d / "strings.npz", q=np.full((1, 1, 2, 2), "a"), k=x, v=x)
    np.savez(d / "noq.npz", k=x, v=x)
    run = {k: np.asarray(v) for k, v in np.load(H200 / "compare_causal_s200_k333.npz").items()}
    np.savez(d / "causal_no.npz", **{**run, "causal": np.array("no")})
    np.savez(d / "short_o.npz", **{**run, "o": run["o"][:, :, :100]})
    np.savez(d / "tag_json.npz", **{**run, "config": np.array("m128n64d64w4-swizzled")})
    (d / "exists.json").write_text("{}")
    (d / "binary.cu").write_bytes(bytes(range(128, 256)))
    (d / "stale.patch").write_text("--- a/fa2_fwd.cu\n+++ b/fa2_fwd.cu\n@@ -2,1 +2,1 @@\n-int not_in_the_seed;\n+x\n")
    (d / "figs").mkdir()
    source = (Path(__file__).parent.parent / "fa_hw" / "kernels" / "fa2_fwd.cu").read_text()
    (d / "broken.cu").write_text(source + "\nthis is not C++;\n")  # every macro used; NVRTC refuses it
    (d / "old.cu").write_text('extern "C" __global__ void fa2_fwd_kernel() {}\n')  # no FA_* macro
    (d / "figs" / "bank_conflicts_by_class.png").write_bytes(b"old figure")
    return {k: str(d / v) for k, v in {
        "good": "good.npz", "trunc": "truncated.npz", "corrupt": "corrupt.npz", "badcrc": "badcrc.npz",
        "empty": "empty.npz", "npy": "single.npy", "pkl": "pickled.pkl", "obj": "objects.npz",
        "str": "strings.npz", "noq": "noq.npz", "exists": "exists.json", "binary": "binary.cu", "stale": "stale.patch",
        "figs": "figs", "dir": ".", "missing": "missing.npz", "causal_no": "causal_no.npz", "short_o": "short_o.npz",
        "tag_json": "tag_json.npz", "broken": "broken.cu", "old": "old.cu"}.items()}


# (argv, fragment of the one-line message, exit status); {name} is a path from `files`
# 12-16 s of input generation on the development machine
BIG = ["--seqlen", "32768", "--heads", "32", "--head-dim", "128", "--warps", "8", "--block-m", "128"]
TABLE = [
    # --engine and --kernel (the PTX engine; the same file on the GPU)
    (["sim", "--engine", "program", "--kernel", "fa_hw/kernels/fa2_fwd.cu"],
     "--kernel is simulated by the PTX engine; drop --engine program or use --engine ptx", 2),
    (["sim", "--kernel", "{missing}"], "--kernel {missing}: no such file (expected a variant of fa2_fwd.cu)", 2),
    (["banks", "--kernel", "{exists}"], "--kernel {exists}: expected a CUDA source file ending in .cu", 2),
    (["trace", "--kernel", "{missing}"], "--kernel {missing}: no such file", 2),
    (["compare", "--kernel", "{missing}"], "--kernel {missing}: no such file", 2),
    (["hw", "--kernel", "{missing}"], "--kernel {missing}: no such file", 2),
    (["sim", "--kernel", "{binary}"], "--kernel {binary}: binary.cu is not UTF-8 text (byte 0x80 at offset 0)", 2),
    (["hw", "--kernel", "{stale}"], "--kernel {stale}: hunk 1 (@@ -2,1 +2,1 @@) does not apply to fa2_fwd.cu: line 2", 2),
    # --npz, --input, --gpu-npz: every kind of bad file names the option, the file and what is accepted
    (["sim", "--npz", "{trunc}"], "--npz {trunc}: is truncated or corrupt", 2),
    (["sim", "--npz", "{corrupt}"], "--npz {corrupt}: is truncated or corrupt", 2),
    (["sim", "--npz", "{badcrc}"], "--npz {badcrc}: is truncated or corrupt (BadZipFile: Bad CRC-32", 2),
    (["sim", "--npz", "{empty}"], "--npz {empty}: is empty; --npz takes an .npz archive holding arrays q", 2),
    (["sim", "--npz", "{npy}"], "--npz {npy}: is a single .npy array, not an .npz archive", 2),
    (["sim", "--npz", "{pkl}"], "--npz {pkl}: is a pickle file, which is never loaded", 2),
    (["sim", "--npz", "{obj}"], "--npz {obj}: array q holds Python objects, which are never loaded", 2),
    (["sim", "--npz", "{str}"], "--npz {str}: q has dtype <U1, not a number type", 2),
    (["sim", "--npz", "{noq}"], "--npz {noq}: lacks array(s) q", 2),
    (["sim", "--npz", "{missing}"], "--npz {missing}: no such file", 2),
    (["sim", "--npz", "{dir}"], "is a directory; --npz takes an .npz archive", 2),
    (["trace", "--input", "{npy}"], "--input {npy}: is a single .npy array", 2),
    (["trace", "--npz", "{npy}"], "--npz {npy}: is a single .npy array", 2),
    (["banks", "--npz", "{pkl}"], "--npz {pkl}: is a pickle file", 2),
    (["compare", "--npz", "{pkl}"], "--npz {pkl}: is a pickle file", 2),
    (["compare", "--npz", "{good}", "--heads", "2"], "--heads does not apply with --npz", 2),
    (["trace", "--npz", "{good}", "--seqlen", "64"], "--seqlen does not apply with --npz", 2),
    (["banks", "--npz", "{good}", "--seed", "1"], "--seed does not apply with --npz", 2),
    (["trace", "--npz", "{good}", "--config", "m64n64d32w4-plain"],
     "--npz {good} holds inputs of head_dim 64, but --config m64n64d32w4-plain has head_dim 32", 2),
    (["trace", "--npz", "{good}"], None, 0),
    (["trace", "--input", "{good}"], None, 0),  # the former name, kept as a hidden alias
    (["banks", "--npz", "{good}"], None, 0),
    (["trace", "--input", "{trunc}"], "--input {trunc}: is truncated or corrupt", 2),
    (["trace", "--input", "{pkl}"], "--input {pkl}: is a pickle file", 2),
    (["compare", "--gpu-npz", "{npy}"], "--gpu-npz {npy}: is a single .npy array", 2),
    (["compare", "--gpu-npz", "{trunc}"], "--gpu-npz {trunc}: is truncated or corrupt", 2),
    (["compare", "--gpu-npz", "{good}"], "--gpu-npz {good}: lacks array(s) o, lse, checkpoints, ctas", 2),
    (["compare", "--gpu-npz", "{causal_no}"], "--gpu-npz {causal_no}: field causal holds 'no' (<U2); a saved run "
                                              "holds the causal flag, True or False there", 2),
    (["compare", "--gpu-npz", "{short_o}"], "--gpu-npz {short_o}: field o holds an array of shape (1, 2, 100, 64)", 2),
    (["compare", "--gpu-npz", "{tag_json}"], "field config 'm128n64d64w4-swizzled' contradicts field config_json", 2),
    # output paths: checked before the simulation; existing files refused unless --force
    (["trace", "--perfetto", "/proc/fa_trace.json"], "--perfetto /proc/fa_trace.json: cannot write in /proc", 2),
    (["trace", "--perfetto", "{dir}"], "is a directory; --perfetto takes a file name", 2),
    (["trace", "--perfetto", "{exists}"], "--perfetto {exists}: it exists; pass --force to overwrite", 2),
    (["trace", "--perfetto", "/nonexistent/dir/t.json"], "directory /nonexistent/dir does not exist", 2),
    (["trace", "--save", "{exists}"], "--save {exists}: is a file; --save takes a directory", 2),
    (["trace", "--perfetto", "{figs}/p.json", "--save", "{figs}/p.json"],
     "--perfetto {figs}/p.json and --save {figs}/p.json: --perfetto writes a file where --save needs a directory", 2),
    (["trace", "--perfetto", "{figs}/p.json", "--save", "{figs}/p.json/archive"], "where --save needs a directory", 2),
    (["trace", "--perfetto", "{figs}/manifest.json", "--save", "{figs}"], "would both write", 2),
    (["trace", "--perfetto", "{exists}/p.json"], "--perfetto {exists}/p.json: {exists} is a file, not a directory", 2),
    (["trace", "--save", "/proc/fa_archive"], "--save /proc/fa_archive: cannot write in /proc", 2),
    (["banks", "--plot", "{exists}"], "--plot {exists}: is a file; --plot takes a directory", 2),
    (["banks", "--plot", "{figs}"], "--plot {figs}: it holds bank_conflicts_by_class.png; pass --force", 2),
    (["layout", "--plot", "/proc/fa_figs"], "--plot /proc/fa_figs: cannot write in /proc", 2),
    (["compare", "--save", "{exists}"], "--save {exists}: it exists; pass --force to overwrite", 2),
    (["compare", "--save", "{dir}"], "is a directory; --save takes a file name", 2),
    # sizes and seeds name the option and the accepted range
    (["sim", "--seqlen", "3000000000"], "--seqlen 3000000000 is out of range; allowed: 1 .. 2147483647", 2),
    (["sim", "--seqlen", "99999999999999999999"], "--seqlen 99999999999999999999 is out of range", 2),
    (["sim", "--seqlen", "2000000000"], "(B, H, Nq, Nk, d) = (1, 1, 2000000000, 2000000000, 64): q, k, v and O "
                                        "alone need 1,907.3 GiB, more than this machine's", 2),
    (["hw", "--heads", "100000", "--seqlen", "100000"], "lower --batch, --heads, --seqlen or --seqlen-k", 2),
    (["sim", "--seed", "-1"], "--seed -1 is out of range; allowed: 0 or more", 2),
    (["sim", "--seqlen", "0"], "--seqlen 0 is out of range", 2),
    (["sim", "--batch", "0"], "--batch 0 is out of range", 2),
    (["sim", "--seqlen-k", "-5"], "--seqlen-k -5 is out of range", 2),
    (["sim", "--seqlen", "1e3"], "--seqlen takes an integer, got '1e3'", 2),
    (["sim", "--scale", "-1"], "--scale -1 is out of range; allowed: a positive finite number", 2),
    (["sim", "--scale", "inf"], "--scale inf is out of range", 2),
    (["sim", "--scale", "1e308"], "--scale 1e308 is out of range; allowed: a positive number that is finite and "
                                  "nonzero in fp32", 2),
    (["sim", "--scale", "1e-50"], "--scale 1e-50 is out of range", 2),
    (["sim", "--scale", "1e30"], "--scale 1e+30 is out of range at head_dim 64; allowed: at most 4.29e+26", 2),
    (["hw", "--scale", "1e30", "--config", "m64n64d128w4-plain"], "--scale 1e+30 is out of range at head_dim 128", 2),
    (["sim", "--head-dim", "48"], "--head-dim 48: head_dim=48 is not one of (32, 64, 96, 128, 160, 192, 256)", 2),
    (["sim", "--smem", "diagonal"], "--smem diagonal: smem='diagonal' is not one of (swizzled, plain, padded)", 2),
    (["sim", "--block-m", "64", "--warps", "8"], "block_m=64 is not a multiple of 16*n_warps=128", 2),
    (["sim", "--bogus"], "unrecognized arguments: --bogus", 2),
    (["sim", "--seq", "64"], "unrecognized arguments: --seq 64", 2),  # no abbreviations
    (["explain", "--block-n", "0"], "argument --block-n: must be a positive integer, got 0", 2),
    (["explain", "--block-n", "abc"], "fa explain: error: --block-n takes a positive integer, got 'abc'", 2),
    # an option of another subcommand: this subcommand's help, and who takes it
    (["sim", "--cta", "3"], "fa sim: error: unrecognized arguments: --cta 3; --cta is an option of fa trace "
                            "(see fa sim --help)", 2),
    (["layout", "--seqlen=64"], "--seqlen is an option of fa sim, fa trace, fa banks, fa hw, fa compare, "
                                "fa time (see fa layout --help)", 2),
    (["sim", "--config", "m64x"], "--config m64x: 'm64x' is not a config tag like", 2),
    (["sim", "--config", "m64n64d64w4-swizzled-s2-s3"], "suffix 's3' contradicts 's2' (both set kv_stages)", 2),
    (["hw", "--config", "m64n64d64w4-swizzled-ffma-fmul_fsub"], "suffix 'fmul_fsub' contradicts 'ffma'", 2),
    (["sim", "--config", "m64n64d64w4-swizzled", "--block-n", "32"],
     "--block-n does not apply with --config m64n64d64w4-swizzled, which names every field", 2),
    (["sim", "--config", "m64n64d64w4-swizzled-s2", "--engine", "program"], "run this config with engine='ptx'", 2),
    (["sim", "--config", "m64n64d32w4-plain", "--seqlen", "64"], None, 0),
    # a tag names the problem's head_dim in every command; --head-dim may repeat it, not contradict it
    (["banks", "--config", "m128n64d128w4-swizzled-s2", "--seqlen", "64"], None, 0),
    (["banks", "--config", "m128n64d128w4-swizzled-s2", "--head-dim", "128", "--seqlen", "64"], None, 0),
    (["trace", "--config", "m64n64d32w4-plain", "--seqlen", "64"], None, 0),
    (["sim", "--config", "m64n64d128w4-plain", "--head-dim", "64"],
     "--head-dim 64 disagrees with --config m64n64d128w4-plain, whose head_dim is 128", 2),
    (["hw", "--config", "m64n64d32w4-plain", "--head-dim", "128"],
     "--head-dim 128 disagrees with --config m64n64d32w4-plain, whose head_dim is 32", 2),
    (["sim", "--npz", "{good}", "--config", "m64n64d128w4-plain"],
     "--npz {good} holds inputs of head_dim 64, but --config m64n64d128w4-plain has head_dim 128", 2),
    # trace selections speak of what the user named
    (["trace", "--warp", "99"], "--warp 99 is outside the CTA: 4 warps, 0..3", 2),
    (["trace", "--warp", "4", "--warps", "8", "--block-m", "128"], None, 0),
    (["trace", "--lane", "40"], "--lane 40 is outside the warp: lanes 0..31", 2),
    (["trace", "--thread", "128"], "--thread 128 is outside the CTA: 128 threads (4 warps), 0..127", 2),
    (["trace", "--cta", "1000"], "--cta 1000 is outside the grid: 2 CTAs, 0..1", 2),
    (["trace", "--round", "2"], "--round 2 is not a round of CTA 0: it runs rounds 0..1; Nk = 128 keys in blocks "
                                "of block_n = 64", 2),
    (["trace", "--round", "1", "--causal"], "--round 1 is not a round of CTA 0: it runs round 0 only; under "
                                            "--causal its queries 0..63 see keys 0..63 only", 2),
    (["trace", "--round", "1", "--causal", "--cta", "1"], None, 0),
    (["trace", "--ops", "FOO"], "--ops: unknown instruction class(es) FOO", 2),
    (["trace", "--ops", ",,,"], "--ops ',,,' names no instruction class; give a comma-separated list", 2),
    # options that do not apply in a combination are refused, not ignored
    (["sim", "--npz", "{good}", "--seqlen", "64"], "--seqlen does not apply with --npz: the file's q, k, v fix the shape", 2),
    (["sim", "--npz", "{good}", "--heads", "2", "--seed", "3"], "--heads, --seed do not apply with --npz", 2),
    (["sim", "--npz", "{good}", "--head-dim", "64"], "--head-dim does not apply with --npz", 2),
    (["sim", "--npz", "{good}", "--block-n", "32"], None, 0),
    (["trace", "--input", "{good}", "--batch", "2"], "--batch does not apply with --input", 2),
    (["trace", "--thread", "5", "--lane", "3"], "--lane does not apply with --thread", 2),
    (["banks", "--compare", "--smem", "plain"], "--smem does not apply with --compare, which counts all three", 2),
    (["compare", "--gpu-npz", SEED_RUN, "--save", "{exists}"], "--save does not apply with --gpu-npz", 2),
    (["compare", "--gpu-npz", SEED_RUN, "--banks"], "--banks does not apply with --gpu-npz", 2),
    (["compare", "--gpu-npz", SEED_RUN, "--npz", "{good}"], "--npz does not apply with --gpu-npz, whose recording "
                                                            "holds the inputs", 2),
    # --gpu-npz uses what the file recorded and refuses a disagreement
    (["compare", "--gpu-npz", SEED_RUN, "--causal"], f"--causal on disagrees with --gpu-npz {SEED_RUN}, "
                                                     "recorded with --causal off", 2),
    (["compare", "--gpu-npz", SEED_RUN, "--seqlen", "256"], "--seqlen 256 disagrees with --gpu-npz "
                                                            f"{SEED_RUN}, recorded with --seqlen 128", 2),
    (["compare", "--gpu-npz", SEED_RUN, "--smem", "plain"], "recorded with --smem swizzled", 2),
    (["compare", "--gpu-npz", SEED_RUN, "--seed", "1"], "the inputs in --gpu-npz", 2),
    (["compare", "--gpu-npz", SEED_RUN, "--ctas", "5"], "--ctas must be distinct CTA ids in 0..1", 2),
    (["compare", "--gpu-npz", SEED_RUN, "--seqlen", "128", "--seed", "0", "--ctas", "1"], None, 0),
    (["compare", "--gpu-npz", str(H200 / "compare_causal_tails.npz")], None, 0),
    (["compare", "--ctas", "99"], "--ctas must be distinct CTA ids in 0..1", 2),
    # checks after long work (issue 16): every one of these comes before the inputs are made (the
    # table test makes input generation fail), so a large problem is refused at once
    (["sim", *BIG, "--kernel", "{missing}"], "--kernel {missing}: no such file", 2),
    (["sim", *BIG, "--kernel", "{broken}"], "NVRTC could not compile", 2),
    (["sim", *BIG, "--kernel", "{old}"], "does not use FA_BLOCK_M=128", 2),
    (["sim", *BIG, "--engine", "program", "--kv-stages", "2"], "kv_stages=2 changes it: run this config with "
                                                               "engine='ptx'", 2),
    (["trace", *BIG, "--kernel", "{broken}"], "NVRTC could not compile", 2),
    (["banks", *BIG, "--kernel", "{broken}"], "NVRTC could not compile", 2),
    (["compare", *BIG, "--kernel", "{broken}"], "NVRTC could not compile", 2),
    (["sweep", "--shape", "1,32,32768", "--kernel", "{broken}"], "NVRTC could not compile", 2),
    (["sweep", "--shape", "1,32,32768", "--kv-stages", "2", "--engine", "program"], "run this config with "
                                                                                    "engine='ptx'", 2),
    (["sim", "--cluster", "LOCAL"], "--cluster 'LOCAL' is not a Dask scheduler address (write local in lower "
                                    "case); accepted: local, tcp://HOST:PORT or HOST:PORT", 2),
    (["sweep", "--cluster", "not-an-address"], "--cluster 'not-an-address' is not a Dask scheduler address; "
                                               "accepted: local, tcp://HOST:PORT or HOST:PORT", 2),
]


def _run(argv, capsys) -> tuple[int, str]:
    try:
        status = main(argv)
    except SystemExit as exc:  # argparse's own errors (unknown option, a value of the wrong kind)
        status = exc.code
    return status, capsys.readouterr().err


@pytest.mark.parametrize("argv, fragment, status", TABLE, ids=[" ".join(t[0])[:60] for t in TABLE])
def test_bad_input_is_one_line_naming_the_option(argv, fragment, status, files, capsys, monkeypatch):
    if argv[0] == "compare" and status == 2 and "--gpu-npz" not in argv and "--ctas" not in argv:
        monkeypatch.setattr("fa_hw.forward", _no_launch)  # checked before any launch
    if status == 2:
        monkeypatch.setattr("fa_sim.commands.common._random_inputs", _no_inputs)  # checked before any input
    argv = [a.format(**files) for a in argv]
    got, err = _run(argv, capsys)
    assert got == status, err
    if fragment is None:
        return
    fragment = fragment.format(**files)
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"fa {argv[0]}: error: ") or err.startswith("fa: error: "), err
    assert fragment in err, err


def _no_launch(*args, **kwargs):
    raise AssertionError("the GPU was launched before the command line was checked")


def _no_inputs(*args, **kwargs):
    raise AssertionError("the inputs were made before the command line was checked")


@pytest.mark.parametrize("argv", [["trace", "--perfetto", "{exists}"], ["trace", "--warp", "99"],
                                  ["trace", "--perfetto", "{figs}/p.json", "--save", "{figs}/p.json"],
                                  ["trace", "--ops", ",,,"], ["sim", "--scale", "1e30"],
                                  ["sim", "--seqlen", "2000000000"], ["banks", "--plot", "{figs}"]])
def test_checks_come_before_the_simulation(argv, files, capsys, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("simulated before checking the command line")

    monkeypatch.setattr("fa_sim.observers.runs.simulate", boom)
    monkeypatch.setattr("fa_sim.commands.sim.simulate", boom)
    assert _run([a.format(**files) for a in argv], capsys)[0] == 2


def test_every_subcommand_is_registered():
    text = build_parser().format_help()
    for name in ("sim", "trace", "banks", "layout", "explain", "hw", "compare"):
        assert name in text


def _options():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, p in sub.choices.items():
        for action in p._actions:
            if action.option_strings and action.dest != "help":
                yield name, action


@pytest.mark.parametrize("command, action", list(_options()), ids=lambda x: x if isinstance(x, str) else x.dest)
def test_every_option_states_meaning_default_and_allowed_values(command, action):
    text = action.help or ""
    assert len(text) > 15, (command, action.option_strings)
    if action.nargs == 0:  # a flag: what it turns on is the whole story
        return
    assert "default" in text, (command, action.option_strings, text)
    qualname = getattr(action.type, "__qualname__", "")
    if action.choices is not None or "ConfigOption" in qualname:
        assert "one of" in text, text
    if "int_in" in qualname:
        assert ".." in text or "or more" in text, text


def test_help_of_one_option(capsys):
    with pytest.raises(SystemExit):
        main(["trace", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--warp WARP" in out and "warp of the CTA (default 0; 0 .. warps-1)" in out
    assert "--block-m {64,128,256}" in out and "query rows per CTA (kBlockM) (default 64; one of 64, 128, 256)" in out


class Launched(Exception):
    """Raised by a stand-in for the GPU launch, carrying what it was given."""


def _capture_launch(q, k, v, **kwargs):
    raise Launched(q.shape, kwargs["config"])


@pytest.mark.parametrize("command", ["hw", "compare"])
def test_gpu_commands_run_a_config_tag_at_its_head_dim(command, monkeypatch):
    """--config m128n64d128w4-swizzled-s2 reaches the launch with d = 128 inputs (it once met
    "inputs have head_dim 64 but config.head_dim is 128"), with or without a repeated --head-dim."""
    import sys

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    module = sys.modules[sub.choices[command].get_default("func").__module__]
    monkeypatch.setattr("fa_hw.forward", _capture_launch)
    monkeypatch.setattr("fa_hw.runtime.check_launch", lambda *a, **k: None)  # no GPU here: the probe passes
    if hasattr(module, "forward"):
        monkeypatch.setattr(module, "forward", _capture_launch)
    for extra in ([], ["--head-dim", "128"]):
        with pytest.raises(Launched) as info:
            main([command, "--config", "m128n64d128w4-swizzled-s2", "--seqlen", "64", *extra])
        shape, config = info.value.args
        assert shape[-1] == 128 and config.tag == "m128n64d128w4-swizzled-s2"


def test_compare_launches_on_the_inputs_of_an_npz(files, monkeypatch):
    monkeypatch.setattr("fa_hw.forward", _capture_launch)
    monkeypatch.setattr("fa_hw.runtime.check_launch", lambda *a, **k: None)  # no GPU here: the probe passes
    with pytest.raises(Launched) as info:
        main(["compare", "--npz", files["good"]])
    shape, config = info.value.args
    assert shape == (1, 1, 64, 64) and config.head_dim == 64


def test_one_name_for_the_input_file():
    """--npz in every command that reads q, k, v from a file; --input (fa trace's former name) is a
    hidden alias: accepted, not in the help."""
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name in ("sim", "trace", "banks", "compare"):
        parser = sub.choices[name]
        assert parser._option_string_actions["--npz"] is parser._option_string_actions["--input"]
        text = parser.format_help()
        assert "--npz FILE" in text and "--input" not in text, name


def test_npz_inputs_of_another_rank_are_one_line_errors(tmp_path, capsys):
    for command in (["sim", "--npz"], ["trace", "--input"], ["trace", "--npz"], ["banks", "--npz"]):
        for shape in [(), (2, 64, 64)]:
            path = tmp_path / "qkv.npz"
            np.savez(path, q=np.zeros(shape, np.float16), k=np.zeros(shape, np.float16),
                     v=np.zeros(shape, np.float16))
            assert main([*command, str(path)]) == 2
            err = capsys.readouterr().err.strip()
            assert err.count("\n") == 0 and "q must have rank 4" in err


def test_compare_replays_a_recording_with_its_own_inputs_config_and_causal_flag(capsys):
    """The causal, Nq != Nk recording needs no options: the file says what it was."""
    assert main(["compare", "--gpu-npz", str(H200 / "compare_causal_tails.npz"), "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert js["causal"] is True and js["shape"] == [1, 2, 200, 333, 64] and js["ctas"] == [0, 7]
    assert main(["compare", "--gpu-npz", SEED_RUN]) == 0
    out = capsys.readouterr().out
    assert "checkpoints of CTAs [0, 1]" in out and "every checkpoint, O and LSE bit-identical" in out
    assert "np.int64" not in out


def test_compare_picks_a_subset_of_the_recorded_ctas(capsys):
    assert main(["compare", "--gpu-npz", str(H200 / "compare_causal_tails.npz"), "--ctas", "7", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ctas"] == [7]
    assert main(["compare", "--gpu-npz", str(H200 / "compare_causal_tails.npz"), "--ctas", "3"]) == 2
    assert "holds checkpoints of CTAs [0, 7] only" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["hw", "--seqlen", "64"], ["compare"]])
def test_gpu_commands_without_a_gpu_say_so(argv, capsys):
    from fa_hw import has_gpu

    if has_gpu():
        pytest.skip("a GPU is present")
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "GPU" in err


def test_fa_hw_errors_are_recognised_by_class_not_module(monkeypatch, capsys):
    """Any FaHwError subclass, wherever it is defined, is one line and exit 2; other errors are not."""
    from fa_hw.errors import FaHwError

    class Elsewhere(FaHwError):
        __module__ = "somewhere.else"

    def raise_it(args):
        raise Elsewhere("the device went away")

    monkeypatch.setattr("fa_sim.commands.explain.run", raise_it)
    assert main(["explain"]) == 2
    assert capsys.readouterr().err == "fa explain: error: the device went away\n"

    class NotOurs(RuntimeError):
        __module__ = "fa_hw.something"

    def raise_other(args):
        raise NotOurs("a bug")

    monkeypatch.setattr("fa_sim.commands.explain.run", raise_other)
    with pytest.raises(NotOurs):
        main(["explain"])


def test_usage_error_is_not_a_value_error():
    """argparse would swallow a ValueError from a type function into a generic message."""
    assert not issubclass(UsageError, (ValueError, TypeError, argparse.ArgumentTypeError))


def test_running_out_of_memory_is_one_line(monkeypatch, capsys):
    def too_big(*a, **k):
        raise MemoryError("Unable to allocate 512. GiB for an array with shape (1, 16, 65536, 65536)")

    monkeypatch.setattr("fa_sim.commands.explain.run", too_big)
    assert main(["explain"]) == 2
    assert capsys.readouterr().err == ("fa explain: error: out of memory (Unable to allocate 512. GiB for an array "
                                       "with shape (1, 16, 65536, 65536)); choose smaller sizes\n")


@pytest.mark.parametrize("exc, head, status", [
    (KernelFault("illegal global load: 4 bytes at 0x7f0000000100, outside every buffer"), "kernel fault: illegal", 1),
    (Unsupported("opcode match in `match.any.sync.b32 %r3, %r2, -1;` at PTX line 30 (k.cu:2)"),
     "error: opcode match", 2),
])
def test_engine_faults_and_unknown_instructions_are_one_line(exc, head, status, monkeypatch, capsys):
    def fail(*a, **k):
        raise exc

    monkeypatch.setattr("fa_sim.commands.sim.simulate", fail)
    assert main(["sim", "--engine", "ptx"]) == status
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"fa sim: {head}"), err


def test_a_kernel_that_returns_at_once_fails_fa_sim(tmp_path, capsys):
    """Finite but wrong (O = 0, LSE = 0: relative error 1.0) is exit status 1, named, like a
    non-finite result (fa_sim.accuracy's documented bounds; fa hw reports through the same)."""
    source = (Path(__file__).parent.parent / "fa_hw" / "kernels" / "fa2_fwd.cu").read_text()
    entry = "  // phase: setup\n  using namespace fa;\n"
    assert entry in source
    noop = tmp_path / "noop.cu"
    noop.write_text(source.replace(entry, entry + "  if (seqlen_q > 0) return;  // does nothing\n", 1))
    assert main(["sim", "--kernel", str(noop), "--seqlen", "64"]) == 1
    out = capsys.readouterr().out
    assert "ABOVE BOUND: O's relative Frobenius error 1.000e+00 is above its documented bound 1e-03" in out
    assert "ABOVE BOUND: LSE errs by up to" in out
    assert main(["sim", "--kernel", str(noop), "--seqlen", "64", "--json"]) == 1
    js = json.loads(capsys.readouterr().out)
    assert js["rel_err_o"] == 1.0 and js["nonfinite"] == [] and [f["what"] for f in js["above_bound"]] == ["O", "LSE"]


def test_expected_overflow_leaks_no_numpy_warning(tmp_path, capsys):
    """The FFMA form overflows on q = k = 65504 (reported as NOT FINITE with its cause), and
    --scale 1e308 overflows fp32: neither prints a numpy RuntimeWarning."""
    import warnings

    from fa_sim.reference import extreme_inputs

    q, k, v = extreme_inputs("q=k=65504")
    np.savez(tmp_path / "big.npz", q=q, k=k, v=v)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["sim", "--npz", str(tmp_path / "big.npz"), "--softmax", "ffma", "--scale", "0.125"]) == 1
        assert "NOT FINITE: O is nan" in capsys.readouterr().out
        assert main(["sim", "--scale", "1e308"]) == 2
    assert "Warning" not in capsys.readouterr().err



def test_an_unusable_cache_directory_is_no_cache(monkeypatch, capsys):
    """FLASHSIM_CACHE where no directory can be made: the recorded variant kernel is replayed from
    a temporary file, as fa_sim/cache.py promises (the cache is never an error)."""
    monkeypatch.setenv("FLASHSIM_CACHE", "/proc/nocache")
    assert main(["compare", "--gpu-npz", str(H200 / "compare_variant_swizzle_r4.npz")]) == 0
    assert "every checkpoint, O and LSE bit-identical" in capsys.readouterr().out


class _Stop(KeyboardInterrupt):
    """Raised where the inputs would be made, after the test looked at what came before."""


@pytest.mark.parametrize("argv, head", [
    (["sim", "--seqlen", "8192", "--heads", "4"], "fa sim: estimate: about "),
    (["trace", "--seqlen", "8192", "--heads", "4"], "fa trace: estimate: about "),
    (["banks", "--seqlen", "8192", "--heads", "4", "--compare"], "fa banks: estimate: about "),
])
def test_the_estimate_of_a_long_run_comes_before_the_inputs(argv, head, monkeypatch, capsys):
    """(1, 4, 8192, 64) is estimated at about a minute: the estimate is on stderr before any input
    exists (the issue: 170 s of silence for a large run)."""
    seen = []

    def stop(*args, **kwargs):
        seen.append(capsys.readouterr().err)
        raise _Stop

    monkeypatch.setattr("fa_sim.commands.common._random_inputs", stop)
    assert main(argv) == 130
    assert seen and seen[0].startswith(head), seen
    assert ("3 runs" in seen[0]) == ("--compare" in argv) and ("float64 reference" in seen[0]) == (argv[0] == "sim")


@pytest.mark.parametrize("argv", [["hw", "--seqlen", "100000", "--heads", "32"],
                                  ["compare", "--seqlen", "100000", "--heads", "64"]])
def test_gpu_commands_probe_the_gpu_before_the_inputs(argv, capsys, monkeypatch):
    """Without a GPU: 'no usable NVIDIA GPU' at once (the issue: after 38 s and 103 s of inputs)."""
    from fa_hw import has_gpu

    if has_gpu():
        pytest.skip("a GPU is present")
    monkeypatch.setattr("fa_sim.commands.common._random_inputs", _no_inputs)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no usable NVIDIA GPU" in err, err


@pytest.mark.parametrize("argv", [["hw", "--seqlen", "100000", "--heads", "32"],
                                  ["compare", "--seqlen", "100000", "--heads", "64"]])
def test_gpu_commands_compile_the_kernel_before_the_inputs(argv, capsys, monkeypatch):
    """With a GPU (stood in for): the cubin is built before the inputs, so a kernel NVRTC refuses
    is one line at once; then, for fa hw, the float64 reference's estimate (hours here)."""
    from fa_hw import runtime
    from fa_hw.errors import CompileError

    builds = []

    def refuse(build):
        builds.append(build)
        raise CompileError(f"NVRTC failed to compile {build.describe()}: error: stand-in")

    monkeypatch.setattr(runtime, "device", lambda ordinal=0: None)
    monkeypatch.setattr(runtime, "device_arch", lambda ordinal=0: "sm_90")
    monkeypatch.setattr(runtime, "load_kernel", refuse)
    monkeypatch.setattr("fa_sim.commands.common._random_inputs", _no_inputs)
    assert main(argv) == 2
    assert "error: stand-in" in capsys.readouterr().err
    assert builds[0].arch == "sm_90" and builds[0].checkpoints == (argv[0] == "compare")
    monkeypatch.setattr(runtime, "load_kernel", lambda build: None)

    def stop(*args, **kwargs):
        raise _Stop

    monkeypatch.setattr("fa_sim.commands.common._random_inputs", stop)
    assert main(argv) == 130
    err = capsys.readouterr().err
    if argv[0] == "hw":
        assert err.startswith("fa hw: estimate: about ") and " h and " in err and "for the simulation" not in err
    else:
        assert err.startswith("fa compare: estimate: about ") and "for the simulation" in err


def test_sweep_prints_its_estimate_before_and_a_line_per_case_while_it_runs(monkeypatch, capsys):
    import fa_sim.sweep

    def stop(*args, **kwargs):
        raise _Stop

    monkeypatch.setattr(fa_sim.sweep, "run_sweep", stop)
    assert main(["sweep", "--shape", "1,2,4096", "--smem", "swizzled,plain", "--workers", "2"]) == 130
    err = capsys.readouterr().err
    assert err.startswith("fa sweep: 4 cases; estimate: about ") and "on one core, about " in err, err
    assert "on 2 workers; the largest case needs about " in err
    monkeypatch.undo()
    results = fa_sim.sweep.run_sweep(fa_sim.sweep.make_cases([fa_sim.KernelConfig()], [(1, 1, 64, 64)], (False, True)),
                                     workers=1, progress=True)
    lines = capsys.readouterr().err.splitlines()
    assert len(results) == 2 and len(lines) == 2
    assert lines[0].startswith("fa sweep: case 1/2 done (m64n64d64w4-swizzled 1x1x64x64, ")
    assert lines[1].startswith("fa sweep: case 2/2 done (m64n64d64w4-swizzled 1x1x64x64 causal, ")
    assert lines[1].endswith("about 0 s left")
