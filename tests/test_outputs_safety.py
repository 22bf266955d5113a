"""Outputs of the `fa` commands are written only to new paths or over regular files (issue 36):
never over a FIFO, a device node, a directory or a dangling link (with or without --force), never
over one of the command's inputs (--kernel, --npz, the shipped kernel source, under any name),
and over an existing regular file only with --force (fa_sim/commands/outputs.py)."""

import os
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest

from fa_sim.cli import build_parser, main
from fa_sim.commands import UsageError
from fa_sim.commands.outputs import INPUT_OPTIONS, atomic_path, save_directory
from fa_sim.contract import SEED_PATH

# every output option of every command: (command, option, file or directory, a file it writes
# in a directory, the command's cheapest arguments)
OUTPUTS = [
    ("time", "--perfetto", "file", None, ["--seqlen", "64", "--heads", "1"]),
    ("trace", "--perfetto", "file", None, []),
    ("trace", "--save", "dir", "manifest.json", []),
    ("compare", "--save", "file", None, []),
    ("banks", "--plot", "dir", "bank_conflicts_by_class.png", []),
    ("layout", "--plot", "dir", "smem_bank_groups.png", []),
    ("sweep", "--plot", "dir", "sweep.png", []),
]
PATH_METAVARS = ("FILE", "DIR", "FILE.json")
TAKES_KERNEL = {"time", "trace", "compare", "banks", "sweep"}
TAKES_NPZ = {"trace", "compare", "banks"}
IDS = [f"{c} {o}" for c, o, *_ in OUTPUTS]


def _run(argv, capsys) -> tuple[int, str]:
    try:
        status = main(argv)
    except SystemExit as exc:
        status = exc.code
    return status, capsys.readouterr().err


@pytest.fixture
def no_work(monkeypatch):
    """Every command's long work fails the test: the refusals come before it."""
    def boom(*a, **k):
        raise AssertionError("the command's work ran before its outputs were checked")

    for target in ("fa_sim.observers.runs.simulate", "fa_sim.observers.runs.run_trace", "fa_sim.commands.time.predict",
                   "fa_sim.sweep.run_sweep", "fa_sim.layout_checks.run_checks", "fa_sim.commands.common._random_inputs",
                   "fa_hw.forward"):
        monkeypatch.setattr(target, boom)


def test_every_path_option_is_an_input_or_a_covered_output():
    """A new option that names a file must be added to OUTPUTS (and so to these tests) or be an
    input (outputs.INPUT_OPTIONS, which check_outputs compares outputs with)."""
    covered = {(c, o) for c, o, *_ in OUTPUTS}
    inputs = set(INPUT_OPTIONS.values())
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, p in sub.choices.items():
        for action in p._actions:
            if action.metavar in PATH_METAVARS:
                option = action.option_strings[0]
                assert option in inputs or (name, option) in covered, f"fa {name} {option} is not covered"


def _target(tmp_path, kind, inner):
    """(the option's value, the file it would write)."""
    if kind == "file":
        return tmp_path / "out", tmp_path / "out"
    (tmp_path / "out").mkdir()
    return tmp_path / "out", tmp_path / "out" / inner


@pytest.mark.parametrize("command, option, kind, inner, extra", OUTPUTS, ids=IDS)
@pytest.mark.parametrize("force", [False, True])
def test_a_fifo_is_never_replaced(command, option, kind, inner, extra, force, tmp_path, capsys, no_work):
    value, target = _target(tmp_path, kind, inner)
    os.mkfifo(target)
    status, err = _run([command, option, str(value), *(["--force"] if force else []), *extra], capsys)
    assert status == 2 and "FIFO" in err and "not a regular file" in err and err.count("\n") == 1, err
    assert err.startswith(f"fa {command}: error: {option} {value}: "), err
    assert stat.S_ISFIFO(os.lstat(target).st_mode)


@pytest.mark.parametrize("command, option, kind, inner, extra", OUTPUTS, ids=IDS)
def test_a_directory_or_a_link_to_a_fifo_is_never_replaced(command, option, kind, inner, extra, tmp_path, capsys,
                                                           no_work):
    value, target = _target(tmp_path, kind, inner)
    target.mkdir()
    status, err = _run([command, option, str(value), "--force", *extra], capsys)
    assert status == 2 and "is a directory" in err, err
    assert target.is_dir()
    target.rmdir()
    os.mkfifo(tmp_path / "fifo")
    target.symlink_to(tmp_path / "fifo")
    status, err = _run([command, option, str(value), "--force", *extra], capsys)
    assert status == 2 and "a symbolic link to a FIFO" in err, err
    target.unlink()
    target.symlink_to(tmp_path / "nowhere")
    status, err = _run([command, option, str(value), "--force", *extra], capsys)
    assert status == 2 and "a dangling symbolic link" in err, err
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("command, option, kind, inner, extra", OUTPUTS, ids=IDS)
def test_a_device_node_is_never_replaced(command, option, kind, inner, extra, capsys, no_work):
    if kind == "dir":  # a directory's files: the FIFO above; /dev itself is a directory of nodes
        pytest.skip("a directory output writes its own file names")
    status, err = _run([command, option, os.devnull, "--force", *extra], capsys)
    assert status == 2 and "a character device" in err, err
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)


@pytest.mark.parametrize("command, option, kind, inner, extra", [o for o in OUTPUTS if o[0] in TAKES_KERNEL],
                         ids=[i for i, o in zip(IDS, OUTPUTS) if o[0] in TAKES_KERNEL])
@pytest.mark.parametrize("alias", ["same", "hard link", "symlink"])
def test_the_kernel_input_is_never_replaced(command, option, kind, inner, extra, alias, tmp_path, capsys, no_work):
    value, target = _target(tmp_path, kind, inner)
    kernel = tmp_path / "variant.cu"
    shutil.copy(SEED_PATH, kernel)
    if alias == "hard link":
        os.link(kernel, target)
    elif alias == "symlink":
        target.symlink_to(kernel)
    else:
        if kind == "dir":
            pytest.skip("a directory's file cannot be given as --kernel and output both")
        value = kernel  # the output is the --kernel file itself
    before = kernel.read_bytes()
    status, err = _run([command, option, str(value), "--force", "--kernel", str(kernel), *extra], capsys)
    assert status == 2 and "is the --kernel file" in err and "an input of this command" in err, err
    assert err.count("\n") == 1, err
    assert kernel.read_bytes() == before


@pytest.mark.parametrize("command, option, kind, inner, extra", [o for o in OUTPUTS if o[0] in TAKES_NPZ],
                         ids=[i for i, o in zip(IDS, OUTPUTS) if o[0] in TAKES_NPZ])
def test_the_npz_input_is_never_replaced(command, option, kind, inner, extra, tmp_path, capsys, no_work):
    value, target = _target(tmp_path, kind, inner)
    x = np.zeros((1, 1, 64, 64), np.float16)
    np.savez(target, q=x, k=x, v=x)
    if target.suffix != ".npz":  # numpy.savez adds .npz to a name without it
        Path(str(target) + ".npz").rename(target)
    before = target.read_bytes()
    for spelling in ("--npz", "--input"):
        status, err = _run([command, option, str(value), "--force", spelling, str(target), *extra], capsys)
        assert status == 2 and f"is the {spelling} file" in err, err
    assert target.read_bytes() == before


def test_the_shipped_kernel_source_is_never_replaced(capsys, no_work):
    before = SEED_PATH.read_bytes()
    status, err = _run(["time", "--perfetto", str(SEED_PATH), "--force"], capsys)
    assert status == 2 and "is the shipped kernel source" in err, err
    assert SEED_PATH.read_bytes() == before


@pytest.mark.parametrize("command, option, kind, inner, extra", OUTPUTS, ids=IDS)
def test_a_regular_file_is_refused_without_force(command, option, kind, inner, extra, tmp_path, capsys, no_work):
    value, target = _target(tmp_path, kind, inner)
    target.write_text("keep me")
    status, err = _run([command, option, str(value), *extra], capsys)
    assert status == 2 and "pass --force to overwrite" in err, err
    assert target.read_text() == "keep me"


def test_a_regular_file_is_replaced_with_force_keeping_its_mode(tmp_path, capsys):
    """End to end: fa time --perfetto over a regular file with --force; through a symbolic link the
    file it points to is replaced and the link stays."""
    out = tmp_path / "p.json"
    out.write_text("old")
    out.chmod(0o640)
    link = tmp_path / "link.json"
    link.symlink_to(out)
    argv = ["time", "--seqlen", "64", "--heads", "1"]
    status, err = _run([*argv, "--perfetto", str(out), "--force"], capsys)
    assert status == 0, err
    assert out.read_text().startswith('{"traceEvents"') and stat.S_IMODE(out.stat().st_mode) == 0o640
    out.write_text("old")
    status, err = _run([*argv, "--perfetto", str(link), "--force"], capsys)
    assert status == 0, err
    assert link.is_symlink() and out.read_text().startswith('{"traceEvents"')
    new = tmp_path / "new.json"
    status, err = _run([*argv, "--perfetto", str(new)], capsys)
    mask = os.umask(0)
    os.umask(mask)
    assert status == 0 and stat.S_IMODE(new.stat().st_mode) == 0o666 & ~mask, err


def test_what_appears_while_the_command_runs_is_not_replaced(tmp_path):
    """The write itself checks again: a FIFO made after the up-front check is not replaced, and the
    temporary file does not survive."""
    out = tmp_path / "p.json"
    with pytest.raises(UsageError, match="is a FIFO .* now, not a regular file"):
        with atomic_path(out) as tmp:
            tmp.write_text("result")
            os.mkfifo(out)
    assert stat.S_ISFIFO(os.lstat(out).st_mode) and os.listdir(tmp_path) == ["p.json"]
    (tmp_path / "d").mkdir()
    os.mkfifo(tmp_path / "d" / "manifest.json")
    with pytest.raises(UsageError, match="FIFO"):
        save_directory(tmp_path / "d", lambda tmp: (tmp / "manifest.json").write_text("{}"))
    assert stat.S_ISFIFO(os.lstat(tmp_path / "d" / "manifest.json").st_mode)
    assert sorted(os.listdir(tmp_path)) == ["d", "p.json"]
