"""experiments/bench_sim.py runs as the README shows it where torch or triton is missing: the
Triton column is skipped with a note, decided before any timing (issue 8, "Docs and tests")."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "experiments" / "bench_sim.py"


@pytest.fixture
def bench(monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_sim", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_sim", module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_missing_torch_and_triton_skip_the_triton_part_with_a_note(bench, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("torch", "triton") else real(name, *a))
    monkeypatch.setattr(bench, "bench_triton", lambda *a: pytest.fail("the Triton part ran"))
    assert bench.main(["--shapes", "1,1,64,64"]) == 0
    out, err = capsys.readouterr()
    assert "fa_sim" in out and "(Triton interpreter: skipped, torch and triton not installed; pip install" in out
    assert "the Triton interpreter part is skipped (torch and triton not installed" in err


def test_an_interpreter_that_fails_on_a_tiny_problem_is_skipped_with_its_error(bench, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name in ("torch", "triton") else real(name, *a))
    err = "triton.runtime.errors.InterpreterError: TypeError('only 0-dimensional arrays can be converted')"
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 1, "", "Traceback\n" + err))
    why = bench.triton_missing()
    assert why.startswith("the Triton interpreter fails on a (1, 1, 64, 64) problem here: " + err)
    assert "numpy<2.4" in why
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, "", ""))
    assert bench.triton_missing() is None


def test_skip_triton_needs_no_note(bench, capsys):
    assert bench.main(["--shapes", "1,1,64,64", "--skip-triton", "--json"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("[") and err == ""


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None and importlib.util.find_spec("triton") is not None,
                    reason="torch and triton are installed: the full benchmark would run")
def test_the_readme_command_runs_here():
    """`python experiments/bench_sim.py` itself, shapes narrowed so the test stays short."""
    run = subprocess.run([sys.executable, str(SCRIPT), "--shapes", "1,1,128,64"], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert "Triton interpreter: skipped" in run.stdout and "Traceback" not in run.stderr


def test_wave_ctas_reaches_both_front_ends_and_is_checked(bench, monkeypatch, capsys):
    """`--wave-ctas N` runs fa_sim's grid in waves of N CTAs (the rows say so); a bad N is a usage error."""
    calls, real = [], bench.fa_sim.simulate
    monkeypatch.setattr(bench.fa_sim, "simulate", lambda *a, **k: calls.append(k) or real(*a, **k))
    assert bench.main(["--shapes", "1,2,128,64", "--skip-triton", "--json", "--wave-ctas", "3"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["backend"] for r in rows} == {"fa_sim program", "fa_sim ptx"}
    assert all(r["wave_ctas"] == 3 and r["cold_seconds"] is None for r in rows)
    assert {(k["engine"], k["wave_ctas"]) for k in calls} == {("program", 3), ("ptx", 3)}
    for bad in (["--wave-ctas", "0"], ["--wave-ctas", "2", "--parallel"]):
        with pytest.raises(SystemExit) as exc:
            bench.main(["--skip-triton", *bad])
        assert exc.value.code == 2
    assert "--wave-ctas" in capsys.readouterr().err
