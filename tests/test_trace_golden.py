"""The simulator still produces the golden traces of traces/golden/ (traces/README.md).

Everything must match exactly: data movement and schedule (instructions, pcs, labels, addresses,
coordinates, masks, shuffle sources) and every register value, bit for bit. The simulator's
arithmetic is the hardware's (fa_sim.isa, fa_sim.tensorcore: bit-exact fp32 and tensor-core
rounding, table-driven MUFU), not numpy's expf/logf, so no value may move between numpy builds."""

from pathlib import Path

import numpy as np
import pytest

from fa_sim.calibrate import golden_traces as regenerate
from fa_sim.observers.trace_io import load_trace, reg_values

ROOT = Path(__file__).resolve().parent.parent / "traces"

EXACT = ("seq", "op", "phase", "round", "pc", "ptx", "label", "repeat", "wait_n", "src", "ptx_line")


def assert_values(a, b, where):
    """Register words bit for bit (a -0.0 for 0.0 or another NaN payload is a difference)."""
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype, where
    bits = np.dtype(f"u{a.dtype.itemsize}")
    differ = np.flatnonzero(a.view(bits) != b.view(bits))
    assert differ.size == 0, (f"{where}: {differ.size} words differ, first at flat index {differ[0]}: "
                              f"{reg_values(a).ravel()[:8]} vs {reg_values(b).ravel()[:8]}")


@pytest.mark.parametrize("golden", regenerate.GOLDENS, ids=lambda g: g.name)
def test_golden_trace_reproduced(golden):
    want = load_trace(ROOT / "golden" / golden.name)
    got = golden.trace()
    assert got.launch == want.launch and got.filter == want.filter
    assert len(got.records) == len(want.records)
    for x, y in zip(got.records, want.records):
        where = f"record {x.seq} ({x.label})"
        assert [getattr(x, f) for f in EXACT] == [getattr(y, f) for f in EXACT], where
        assert np.array_equal(x.active, y.active) and np.array_equal(x.cta, y.cta), where
        for side in ("smem", "gmem"):
            sx, sy = getattr(x, side), getattr(y, side)
            assert (sx is None) == (sy is None), where
            for k, v in ({} if sx is None else sx.__dict__).items():
                assert np.array_equal(v, getattr(sy, k)), f"{where} {side}.{k}"
        for regs in ("regs_in", "regs_out"):
            rx, ry = getattr(x, regs), getattr(y, regs)
            assert list(rx) == list(ry), where
            for k in rx:
                assert_values(rx[k], ry[k], f"{where} {regs}[{k}]")
        assert (x.shfl_src is None) == (y.shfl_src is None) and (x.shfl_src is None or np.array_equal(x.shfl_src, y.shfl_src))
    assert [(c.checkpoint, c.round) for c in got.checkpoints] == [(c.checkpoint, c.round) for c in want.checkpoints]


def test_golden_story_text():
    """The `fa trace` table of the goldens, character for character (6 significant digits)."""
    for g in regenerate.GOLDENS:
        assert g.story_text(g.trace()) == (ROOT / "golden" / f"{g.name}.txt").read_text(), g.name
