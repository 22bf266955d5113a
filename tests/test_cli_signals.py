"""`fa` under a closed pipe, Ctrl-C and an unwritable standard output, as real processes: a closed
pipe is silent (exit 141), Ctrl-C is one line and exit 130, and neither leaves partial output
files (issue 8, "CLI"); stdout on a full device or closed is one line and exit 2 (issue 16)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from interrupt import sigint_default  # tests/interrupt.py

from fa_sim.cli import EXIT_BROKEN_PIPE, EXIT_INTERRUPTED, main
from fa_sim.commands.outputs import TMP_PREFIX

ROOT = Path(__file__).resolve().parent.parent
FA = [sys.executable, "-m", "fa_sim.cli"]
linux_only = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads CPU time from /proc")


def _env():
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def test_closed_pipe_is_silent():
    """The reader is gone before the command writes: EPIPE, no traceback, exit 128 + SIGPIPE."""
    proc = subprocess.Popen([*FA, "explain"], cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == EXIT_BROKEN_PIPE
    assert err == b""


def test_pipe_into_head_prints_only_what_head_keeps():
    out = subprocess.run(["bash", "-c", f"{' '.join(FA)} explain | head -1; {' '.join(FA)} layout --json | head -c 20"],
                         cwd=ROOT, env=_env(), capture_output=True, timeout=120)
    assert out.returncode == 0
    assert out.stderr == b"", out.stderr.decode()
    assert out.stdout.decode().startswith("The spec's worked example")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize("argv", [["sim", "--seqlen", "64"], ["explain"], ["explain", "--json"], ["sim", "--help"]])
def test_stdout_on_a_full_device_is_one_line_exit_2(argv):
    with open("/dev/full", "w") as full:
        out = subprocess.run([*FA, *argv], cwd=ROOT, env=_env(), stdout=full, stderr=subprocess.PIPE, timeout=120)
    assert out.returncode == 2
    assert out.stderr.decode() == f"fa {argv[0]}: error: cannot write the output: No space left on device\n"


@pytest.mark.parametrize("argv", [["sim", "--seqlen", "64"], ["explain"]])
def test_closed_stdout_is_one_line_exit_2_before_any_work(argv):
    def fail_if_simulated(argv):  # runs in the child: `fa` must stop before the command runs
        return [sys.executable, "-c", "import sys, fa_sim.commands.sim as s, fa_sim.commands.explain as e; "
                "s.run = e.run = lambda a: sys.exit(99); from fa_sim.cli import main; sys.exit(main(sys.argv[1:]))",
                *argv]

    for cmd in ([*FA, *argv], fail_if_simulated(argv)):
        out = subprocess.run(cmd, cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             timeout=120, preexec_fn=lambda: os.close(1))
        assert out.returncode == 2
        assert out.stderr.decode() == f"fa {argv[0]}: error: cannot write the output: standard output is closed\n"


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


@linux_only
def test_ctrl_c_is_one_line_exit_130_and_leaves_no_files(tmp_path):
    """SIGINT in the middle of a long simulation, once the process is past its imports (it has
    spent well over the ~0.3 s of CPU they take)."""
    archive, perfetto = tmp_path / "archive", tmp_path / "trace.json"
    proc = subprocess.Popen([*FA, "trace", "--seqlen", "16384", "--heads", "8", "--save", str(archive),
                             "--perfetto", str(perfetto)], cwd=ROOT, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=sigint_default)
    deadline = time.monotonic() + 120
    while _cpu_seconds(proc.pid) < 2.0 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_INTERRUPTED
    assert err.decode().splitlines()[-1:] == ["fa trace: interrupted"]  # after any progress lines
    assert "Traceback" not in err.decode() and out == b""
    assert list(tmp_path.iterdir()) == []  # no archive, no trace file, no temporary


def test_interrupt_while_writing_leaves_neither_partial_nor_temporary_files(tmp_path, monkeypatch, capsys):
    """Outputs are written to a temporary beside the target and renamed: an interrupt in the
    middle of writing removes the temporary and leaves any old file untouched."""
    from fa_sim.observers import trace_io

    old = tmp_path / "trace.json"
    old.write_text("the old trace")

    def half_written(trace):
        raise KeyboardInterrupt

    monkeypatch.setattr(trace_io, "to_perfetto", half_written)
    real_save = trace_io.save_trace

    def save_then_interrupt(trace, path):
        real_save(trace, path)  # the archive's files exist in the temporary directory ...
        raise KeyboardInterrupt  # ... when Ctrl-C arrives

    monkeypatch.setattr(trace_io, "save_trace", save_then_interrupt)
    assert main(["trace", "--seqlen", "64", "--save", str(tmp_path / "archive")]) == EXIT_INTERRUPTED
    assert capsys.readouterr().err == "fa trace: interrupted\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.json"]
    monkeypatch.setattr(trace_io, "save_trace", real_save)
    assert main(["trace", "--seqlen", "64", "--perfetto", str(old), "--force"]) == EXIT_INTERRUPTED
    assert old.read_text() == "the old trace"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(TMP_PREFIX)]


def test_outputs_are_written_and_force_replaces_them(tmp_path, capsys):
    archive, perfetto = tmp_path / "a" / "archive", tmp_path / "t.json"
    argv = ["trace", "--seqlen", "64", "--save", str(archive), "--perfetto", str(perfetto), "--json"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert out.lstrip().startswith("{") and f"wrote {archive}" in err and f"wrote {perfetto}" in err
    assert sorted(p.name for p in archive.iterdir()) == ["arrays.npz", "manifest.json"]
    first = perfetto.read_bytes()
    assert main(argv) == 2  # both exist now
    assert "it holds manifest.json, arrays.npz; pass --force" in capsys.readouterr().err
    assert main([*argv, "--force"]) == 0
    assert perfetto.read_bytes() == first
    from fa_sim.observers.trace_io import load_trace

    assert load_trace(archive).records
    assert not [p for p in tmp_path.rglob(TMP_PREFIX + "*")]


def test_compare_save_is_written_atomically_and_replays(tmp_path, monkeypatch, capsys):
    """`fa compare --save` on a machine with a GPU, stood in for by the recorded H200 run (made with
    the FFMA softmax form, so the command asks for that form)."""
    import fa_hw

    rec = np.load(Path(__file__).parent / "data" / "h200" / "compare_seed_n128.npz")

    class Out:
        o, lse, checkpoints, scale = rec["o"], rec["lse"], rec["checkpoints"], float(rec["scale"])

    monkeypatch.setattr(fa_hw, "forward", lambda *a, **k: Out)
    monkeypatch.setattr("fa_hw.runtime.check_launch", lambda *a, **k: None)  # the GPU and its cubin
    path = tmp_path / "run.npz"
    assert main(["compare", "--softmax", "ffma", "--save", str(path)]) == 0
    assert f"wrote {path}" in capsys.readouterr().err
    saved = np.load(path)
    assert str(saved["config"]) == "m64n64d64w4-swizzled-ffma"  # the tag older readers use
    from fa_sim.contract import SEED_PATH
    from fa_sim.config import KernelConfig

    assert KernelConfig.from_json(str(saved["config_json"])) == KernelConfig(softmax="ffma")
    assert str(saved["kernel_source"]) == SEED_PATH.read_text() and str(saved["kernel_name"]) == "fa2_fwd.cu"
    assert main(["compare", "--gpu-npz", str(path)]) == 0
    assert "every checkpoint, O and LSE bit-identical" in capsys.readouterr().out
    assert main(["compare", "--softmax", "ffma", "--save", str(path)]) == 2
    assert [p.name for p in tmp_path.iterdir()] == ["run.npz"]
