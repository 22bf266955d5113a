"""The documented example of fa_sim.ptx.launch (experiments/ptx_gemm_example.py) runs as shown."""

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("cuda.bindings.nvrtc", reason="the PTX engine compiles with NVRTC (the hw extra)")


def test_gemm_example_runs_and_prints_its_findings(capsys):
    path = Path(__file__).resolve().parent.parent / "experiments" / "ptx_gemm_example.py"
    spec = importlib.util.spec_from_file_location("ptx_gemm_example", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    assert example.main() == 0  # asserts C == A B inside
    out = capsys.readouterr().out
    assert "equal to numpy's" in out and "HMMA" in out and "LDSM 16 (conflicts 8)" in out and "hazards: none" in out
