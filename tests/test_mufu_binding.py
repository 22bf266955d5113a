"""The MUFU model at the inputs that bind each table coefficient (fa_sim/calibrate/sfu_binding.py).

tests/data/h200/mufu_binding.npz holds the unit's outputs at each segment's binding inputs (the
arg-max and arg-min of the fit's C0 interval, for the stored (C1, C2) and its neighbours). The
model must reproduce them bit for bit, and a change of any one coefficient of any row must change
at least one of them: C0 one below its interval (it is stored as the lowest) or just above it,
C1 +-1, C2 +-its unit. The random replay set of test_mufu.py misses most such changes (one unit
of ex2's C0[16] changes 4 of the segment's 131,072 outputs in [1, 2)).

The file's `origin` says where its outputs come from: the GPU's name for a device recording
(`python -m fa_sim.calibrate.sfu_binding record`), "model" for the stand-in generated from the
model before the recording (`... sfu_binding model`). The mutation tests hold for either.
"""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from fa_sim.calibrate import sfu_binding
from fa_sim.calibrate.sfu_fit import DESIGNS, load_replay
from fa_sim.isa import mufu
from fa_sim.isa import mufu_table as mt

RECORDING = Path(__file__).parent / "data" / "h200" / "mufu_binding.npz"
REPLAY = Path(__file__).parent / "data" / "h200" / "mufu_replay.npz"
RUN, ORIGIN = sfu_binding.load(RECORDING)
FIT = json.loads(mt.DATA.read_text())["tables"]  # c2_unit and the C0 interval widths of the fit
BY_OP = {d.op: d for d in DESIGNS}


def test_the_file_says_where_its_outputs_come_from():
    assert ORIGIN == "model" or "H200" in ORIGIN, ORIGIN
    assert set(RUN) == set(sfu_binding.UNIT_OP.values())


@pytest.mark.parametrize("op", sorted(sfu_binding.UNIT_OP.values()))
def test_the_model_reproduces_every_recorded_output(op):
    x, y = RUN[op]
    got = sfu_binding.unit(op, x)
    bad = np.flatnonzero(got != y)
    assert bad.size == 0, (f"{op}: {bad.size} of {x.size} differ, first x=0x{x[bad[0]]:08x}: "
                           f"recorded 0x{y[bad[0]]:08x}, model 0x{got[bad[0]]:08x}")


def _by_segment(table: str) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    x, y = RUN[sfu_binding.UNIT_OP[table]]
    seg = sfu_binding.segments(BY_OP[table], x)
    return {int(s): (x[seg == s], y[seg == s]) for s in np.unique(seg)}


@pytest.mark.parametrize("table", [d.op for d in DESIGNS])
def test_every_row_has_binding_inputs(table):
    rows = len(mt.tables()[table].c0)
    counts = {s: xy[0].size for s, xy in _by_segment(table).items()}
    assert sorted(counts) == list(range(rows))
    assert min(counts.values()) >= 2  # at least the two ends of C0's interval


def _changes(table: str, s: int) -> list[tuple[str, int]]:
    """(coefficient, change) pairs that change some output of row s (see the module docstring)."""
    unit = FIT[table]["c2_unit"]
    width = FIT[table]["c0_interval_width"][s]
    return [("c0", -1), ("c0", width), ("c1", 1), ("c1", -1), ("c2", unit), ("c2", -unit)]


@pytest.mark.parametrize("table", [d.op for d in DESIGNS])
def test_a_change_of_any_one_coefficient_changes_a_recorded_output(table, monkeypatch):
    op = sfu_binding.UNIT_OP[table]
    shipped = mt.tables()
    missed = []
    try:
        for s, (x, y) in _by_segment(table).items():
            for coef, change in _changes(table, s):
                values = getattr(shipped[table], coef).copy()
                values[s] += change
                mutated = dict(shipped) | {table: dataclasses.replace(shipped[table], **{coef: values})}
                monkeypatch.setattr(mt, "tables", lambda m=mutated: m)
                mufu._ex2_kernel_tables.cache_clear()  # ex2's fast path keeps derived tables
                if np.array_equal(sfu_binding.unit(op, x), y):
                    missed.append(f"{coef}[{s}] {change:+d}")
    finally:
        monkeypatch.undo()
        mufu._ex2_kernel_tables.cache_clear()
    assert not missed, f"{table}: no recorded output changes under " + ", ".join(missed[:10])


def test_the_random_replay_alone_misses_what_the_binding_inputs_catch(monkeypatch):
    """ex2's C0[16] + 1 (one unit) changes none of the outputs of tests/data/h200/mufu_replay.npz,
    but some of the binding ones."""
    x = load_replay(REPLAY)["ex2_ftz"][0]
    before = sfu_binding.unit("ex2_ftz", x)
    shipped = mt.tables()
    c0 = shipped["ex2"].c0.copy()
    c0[16] += 1
    monkeypatch.setattr(mt, "tables", lambda: dict(shipped) | {"ex2": dataclasses.replace(shipped["ex2"], c0=c0)})
    mufu._ex2_kernel_tables.cache_clear()
    try:
        after_replay = sfu_binding.unit("ex2_ftz", x)
        bx, by = RUN["ex2_ftz"]
        after_binding = sfu_binding.unit("ex2_ftz", bx)
    finally:
        monkeypatch.undo()
        mufu._ex2_kernel_tables.cache_clear()
    assert np.array_equal(before, after_replay)
    assert not np.array_equal(after_binding, by)
