"""The observers' figures render (PNG and SVG) from real reports and maps."""

import numpy as np
import pytest

from fa_sim.config import KernelConfig
from fa_sim.events import Op
from fa_sim.observers import figures, lanemaps

import synthetic  # tests/synthetic.py
from fa_sim.observers.runs import Problem, run_banks


def _ok(paths):
    for p in paths:
        data = p.read_bytes()
        assert len(data) > 1000
        assert data[:4] == b"\x89PNG" if p.suffix == ".png" else b"<svg" in data[:400]


def test_conflict_bars_and_swizzle_map(tmp_path):
    reports = {s: run_banks(KernelConfig(smem=s), Problem(seqlen=64)) for s in ("swizzled", "plain")}
    _ok(figures.save(figures.conflicts_by_class(reports), tmp_path / "bars", ("png", "svg")))
    cfgs = [KernelConfig(smem=s) for s in ("swizzled", "plain", "padded")]
    _ok(figures.save(figures.swizzle_maps(cfgs), tmp_path / "swz", ("png",)))


def test_bank_picture_counts_wavefronts():
    import matplotlib.pyplot as plt

    for smem, expect in (("plain", 32), ("swizzled", 4)):
        ev = synthetic.ldsm_k(KernelConfig(smem=smem), 0)
        fig, axes = plt.subplots(1, 4)
        total = figures.bank_picture(axes, ev.smem.addr[0, 0, 0], np.ones(32, bool), Op.LDSM, 16, smem)
        plt.close(fig)
        assert total == expect


@pytest.mark.parametrize("name", ["s_ownership", "q_ownership", "copy_ownership"])
def test_ownership_grid(tmp_path, name):
    cfg = KernelConfig()
    args = (cfg, 64) if name == "copy_ownership" else (cfg,)
    owner, value = getattr(lanemaps, name)(*args)
    _ok(figures.save(figures.ownership(owner[:8, :8], value[:8, :8], name), tmp_path / name, ("png", "svg")))
