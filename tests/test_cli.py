"""The `fa` command: every subcommand registers; bad input is one line on stderr and exit 2."""

from pathlib import Path

import pytest

from fa_sim.cli import build_parser, main

H200 = Path(__file__).parent / "data" / "h200"


def test_every_subcommand_is_registered():
    text = build_parser().format_help()
    for name in ("sim", "trace", "banks", "explain", "hw", "compare"):
        assert name in text


@pytest.mark.parametrize("argv, message", [
    (["sim", "--head-dim", "48"], "head_dim=48 is not one of"),
    (["sim", "--seqlen", "0"], "--seqlen must be >= 1"),
    (["sim", "--scale", "-1"], "scale must be a positive finite number"),
    (["sim", "--npz", "/nonexistent.npz"], "cannot read /nonexistent.npz"),
    (["sim", "--block-m", "64", "--warps", "8"], "block_m=64 is not a multiple of 16*n_warps=128"),
    (["trace", "--lane", "40"], "lanes [40] are outside 0..31"),
    (["trace", "--cta", "1000"], "--cta 1000 is outside the grid of 2 CTAs"),
    (["trace", "--ops", "FOO"], "unknown instruction class(es) FOO"),
    (["trace", "--input", "/nonexistent.npz"], "cannot read /nonexistent.npz"),
    (["banks", "--head-dim", "48"], "head_dim=48 is not one of"),
    (["compare", "--ctas", "99"], "--ctas must be distinct CTA ids in 0..1"),
    (["compare", "--gpu-npz", "/nonexistent.npz"], "cannot read /nonexistent.npz"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err and "Traceback" not in err


@pytest.mark.parametrize("command", [["sim", "--npz"], ["trace", "--input"]])
@pytest.mark.parametrize("shape", [(), (2, 64, 64)])
def test_npz_inputs_of_another_rank_are_one_line_errors(command, shape, tmp_path, capsys):
    import numpy as np

    path = tmp_path / "qkv.npz"
    np.savez(path, q=np.zeros(shape, np.float16), k=np.zeros(shape, np.float16), v=np.zeros(shape, np.float16))
    assert main([*command, str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "q must have rank 4" in err


def test_compare_against_a_recorded_h200_run_passes(capsys):
    assert main(["compare", "--gpu-npz", str(H200 / "compare_seed_n128.npz")]) == 0
    out = capsys.readouterr().out
    assert "all checkpoints within their bounds" in out and "s_acc" in out


def test_compare_refuses_a_recording_of_other_inputs():
    with pytest.raises(SystemExit):  # argparse: --seed needs a value
        main(["compare", "--seed"])
    assert main(["compare", "--seed", "1", "--gpu-npz", str(H200 / "compare_seed_n128.npz")]) == 2


@pytest.mark.parametrize("argv", [["hw", "--seqlen", "64"], ["compare"]])
def test_gpu_commands_without_a_gpu_say_so(argv, capsys):
    from fa_hw import has_gpu

    if has_gpu():
        pytest.skip("a GPU is present")
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "GPU" in err
