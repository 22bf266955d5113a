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
    (d / "exists.json").write_text("{}")
    (d / "binary.cu").write_bytes(bytes(range(128, 256)))
    (d / "stale.patch").write_text("--- a/fa2_fwd.cu\n+++ b/fa2_fwd.cu\n@@ -2,1 +2,1 @@\n-int not_in_the_seed;\n+x\n")
    (d / "figs").mkdir()
    (d / "figs" / "bank_conflicts_by_class.png").write_bytes(b"old figure")
    return {k: str(d / v) for k, v in {
        "good": "good.npz", "trunc": "truncated.npz", "corrupt": "corrupt.npz", "badcrc": "badcrc.npz",
        "empty": "empty.npz", "npy": "single.npy", "pkl": "pickled.pkl", "obj": "objects.npz",
        "str": "strings.npz", "noq": "noq.npz", "exists": "exists.json", "binary": "binary.cu", "stale": "stale.patch", "figs": "figs", "dir": ".",
        "missing": "missing.npz"}.items()}


# (argv, fragment of the one-line message, exit status); {name} is a path from `files`
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
    (["trace", "--input", "{trunc}"], "--input {trunc}: is truncated or corrupt", 2),
    (["trace", "--input", "{pkl}"], "--input {pkl}: is a pickle file", 2),
    (["compare", "--gpu-npz", "{npy}"], "--gpu-npz {npy}: is a single .npy array", 2),
    (["compare", "--gpu-npz", "{trunc}"], "--gpu-npz {trunc}: is truncated or corrupt", 2),
    (["compare", "--gpu-npz", "{good}"], "--gpu-npz {good}: lacks array(s) o, lse, checkpoints, ctas", 2),
    # output paths: checked before the simulation; existing files refused unless --force
    (["trace", "--perfetto", "/proc/fa_trace.json"], "--perfetto /proc/fa_trace.json: cannot write in /proc", 2),
    (["trace", "--perfetto", "{dir}"], "is a directory; --perfetto takes a file name", 2),
    (["trace", "--perfetto", "{exists}"], "--perfetto {exists}: it exists; pass --force to overwrite", 2),
    (["trace", "--perfetto", "/nonexistent/dir/t.json"], "directory /nonexistent/dir does not exist", 2),
    (["trace", "--save", "{exists}"], "--save {exists}: is a file; --save takes a directory", 2),
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
    (["sim", "--head-dim", "48"], "--head-dim 48: head_dim=48 is not one of (32, 64, 128)", 2),
    (["sim", "--smem", "diagonal"], "--smem diagonal: smem='diagonal' is not one of (swizzled, plain, padded)", 2),
    (["sim", "--block-m", "64", "--warps", "8"], "block_m=64 is not a multiple of 16*n_warps=128", 2),
    (["sim", "--bogus"], "unrecognized arguments: --bogus", 2),
    (["sim", "--seq", "64"], "unrecognized arguments: --seq 64", 2),  # no abbreviations
    (["explain", "--block-n", "0"], "argument --block-n: must be a positive integer, got 0", 2),
    (["sim", "--config", "m64x"], "--config m64x: 'm64x' is not a config tag like", 2),
    (["sim", "--config", "m64n64d64w4-swizzled", "--block-n", "32"],
     "--block-n does not apply with --config m64n64d64w4-swizzled, which names every field", 2),
    (["sim", "--config", "m64n64d64w4-swizzled-s2", "--engine", "program"], "run this config with engine='ptx'", 2),
    (["sim", "--config", "m64n64d32w4-plain", "--seqlen", "64"], None, 0),
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


@pytest.mark.parametrize("argv", [["trace", "--perfetto", "{exists}"], ["trace", "--warp", "99"],
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
    assert "--block-m {64,128}" in out and "query rows per CTA (kBlockM) (default 64; one of 64, 128)" in out


def test_npz_inputs_of_another_rank_are_one_line_errors(tmp_path, capsys):
    for command in (["sim", "--npz"], ["trace", "--input"]):
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
