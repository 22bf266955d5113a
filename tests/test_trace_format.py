"""Trace recording, archive round trip and Perfetto export on hand-built events."""

import dataclasses
import json

import numpy as np
import pytest

from fa_sim.config import KernelConfig
from fa_sim.checkpoints import Checkpoint
from fa_sim.events import ROUND_PROLOGUE, CheckpointEvent, GmemAccess, InstrEvent, Op, SmemAccess, encode_f16x2
from fa_sim.kernels import Problem, launch_info
from fa_sim.kernels.labels import Phase
import synthetic  # tests/synthetic.py: the memory instructions from the spec's closed forms
from fa_sim.observers.trace import LANE_FIELDS, TraceFilter, TraceRecorder, ldsm_received
from fa_sim.observers.trace_io import load_trace, save_trace, to_perfetto

CFG = KernelConfig()
LAUNCH = launch_info(Problem(1, 1, 128, 128, False, 0.125, CFG))


def with_values(ev):
    """Give an ldmatrix event register values: the received halves encode their tile coordinate
    (64*row + col), as an fp16 integer."""
    rows, cols = ldsm_received(ev.smem)
    halves = (64 * rows + cols).astype(np.float16)  # exact below 2048
    return type(ev)(**{**ev.__dict__, "regs_out": {"tCrX": encode_f16x2(halves)}})


def record(filt, events=None):
    rec = TraceRecorder(filt)
    rec.on_launch(LAUNCH)
    for ev in events if events is not None else synthetic.memory_program(CFG, 128):
        if rec.wants(ev.op, ev.phase, ev.round):
            rec.on_instr(ev)
    return rec


def test_ldmatrix_events_carry_their_form():
    assert synthetic.ldsm_q(CFG, 0).smem.ldsm == (4, False)
    assert synthetic.ldsm_v(CFG, 0).smem.ldsm == (4, True)
    assert synthetic.sts_o(CFG).smem.ldsm is None


def test_lane0_receives_q_rows_0_8_at_d_0_1_8_9():
    """Spec section 5, "32 lanes feed one MMA": lane 0 holds query 0, 8 at d = 0, 1, 8, 9."""
    rows, cols = ldsm_received(synthetic.ldsm_q(CFG, 0).smem)
    got = set(zip(rows[0, 0, 0, 0].tolist(), cols[0, 0, 0, 0].tolist()))
    assert got == {(q, d) for q in (0, 8) for d in (0, 1, 8, 9)}
    # K: lane 0 gets key 0 at d 0, 1, 8, 9 (first n8 atom) and key 8 (second atom)
    rows, cols = ldsm_received(synthetic.ldsm_k(CFG, 0).smem)
    assert list(zip(rows[0, 0, 0, 0].tolist(), cols[0, 0, 0, 0].tolist())) == [
        (0, 0), (0, 1), (0, 8), (0, 9), (8, 0), (8, 1), (8, 8), (8, 9)]
    # V.trans: lane 0 gets keys 0, 1 (b0, b1) and 8, 9 (b2, b3) of d column 0, then column 8
    rows, cols = ldsm_received(synthetic.ldsm_v(CFG, 0).smem)
    assert list(zip(rows[0, 0, 0, 0].tolist(), cols[0, 0, 0, 0].tolist())) == [
        (0, 0), (1, 0), (8, 0), (9, 0), (0, 8), (1, 8), (8, 8), (9, 8)]


def test_filter_wants_and_selection():
    f = TraceFilter(rounds=(1,), ops=frozenset({Op.LDSM}))
    assert f.wants(Op.LDSM, Phase.QK, 1) and not f.wants(Op.LDSM, Phase.QK, 0)
    assert f.wants(Op.LDSM, Phase.QK, ROUND_PROLOGUE) and not f.wants(Op.HMMA, Phase.QK, 1)
    assert TraceFilter(warps=(1,), lanes=(0, 2)).select_threads(4).tolist() == [32, 34]
    assert TraceFilter(threads=(70, 3)).select_threads(4).tolist() == [3, 70]
    with pytest.raises(ValueError):
        TraceFilter(threads=(128,)).select_threads(4)
    with pytest.raises(ValueError, match="lanes"):
        TraceFilter(lanes=(40,)).select_threads(4)
    with pytest.raises(ValueError):
        TraceFilter(warps=(4,)).select_threads(4)
    assert TraceFilter.from_json(json.loads(json.dumps(f.to_json()))) == f


def test_recorder_slices_the_selected_lanes():
    ev = with_values(synthetic.ldsm_q(CFG, 0, round=0))
    rec = record(TraceFilter(warps=(1,), lanes=(0, 5)), [ev])
    (r,) = rec.trace.records
    full = np.asarray(ev.regs_out["tCrX"])
    assert r.regs_out["tCrX"].shape == (1, 1, 2, 4)
    assert (r.regs_out["tCrX"][:, :, 1] == full[:, :, 1, 5]).all()
    assert (r.smem.addr[0, 0] == ev.smem.addr[0, 0, 1, [0, 5]]).all()
    # warp 1 lane 0: query rows 16 and 24
    assert set(r.smem.elem_row[0, 0, 0].tolist()) == {16, 24}


def test_a_record_is_the_machines_event_on_the_selected_lanes():
    """One event type: a record is an InstrEvent (its smem a SmemAccess, its gmem a GmemAccess);
    every field that is not a lane array is the event's own, the lane arrays are sliced."""
    events = [with_values(synthetic.ldsm_q(CFG, 0, round=0)), *(
        ev for ev in synthetic.memory_program(CFG, 128) if ev.gmem is not None)][:3]
    rec = record(TraceFilter(warps=(1,), lanes=(0, 5)), events)
    assert len(rec.trace.records) == 3
    for seq, (r, ev) in enumerate(zip(rec.trace.records, events)):
        assert isinstance(r, InstrEvent) and r.seq == seq
        assert r.smem is None or isinstance(r.smem, SmemAccess)
        assert r.gmem is None or isinstance(r.gmem, GmemAccess)
        kept = [f.name for f in dataclasses.fields(InstrEvent) if f.name not in LANE_FIELDS]
        assert [getattr(r, f) for f in kept] == [getattr(ev, f) for f in kept]
        assert r.active.shape == (1, 2) and (r.active == np.asarray(ev.active)[:, 1, [0, 5]]).all()
    assert rec.trace.records[1].gmem.addr.shape[-1] == 2


def test_checkpoints_follow_rounds():
    rec = TraceRecorder(TraceFilter(ctas=(1,), threads=(0, 1), rounds=(0,)))
    rec.on_launch(LAUNCH)
    vals = np.arange(2 * 128 * 3, dtype=np.uint32).reshape(2, 128, 3)
    for ck, rnd in ((Checkpoint.ROW_MAX, 0), (Checkpoint.ROW_MAX, 1), (Checkpoint.O_FINAL, 0)):
        if rec.wants_checkpoint(ck, rnd):
            rec.on_checkpoint(CheckpointEvent(ck, rnd, np.array([0, 1]), vals))
    got = rec.trace.checkpoints
    assert [(c.checkpoint, c.round) for c in got] == [(Checkpoint.ROW_MAX, 0), (Checkpoint.O_FINAL, 0)]
    assert got[0].values.tolist() == [vals[1, :2].tolist()]


def assert_same(a, b):
    assert a.launch == b.launch and a.filter == b.filter and (a.threads == b.threads).all()
    assert len(a.records) == len(b.records)
    for x, y in zip(a.records, b.records):
        for f in ("seq", "op", "phase", "round", "pc", "ptx", "label", "repeat", "wait_n", "src", "ptx_line"):
            assert getattr(x, f) == getattr(y, f), f
        assert (x.cta == y.cta).all() and (x.active == y.active).all()
        for side in ("smem", "gmem"):
            sx, sy = getattr(x, side), getattr(y, side)
            assert (sx is None) == (sy is None)
            if sx is not None:
                for k, v in sx.__dict__.items():
                    assert (v == getattr(sy, k)) if not isinstance(v, np.ndarray) else np.array_equal(v, getattr(sy, k)), (side, k)
        for regs in ("regs_in", "regs_out"):
            rx, ry = getattr(x, regs), getattr(y, regs)
            assert list(rx) == list(ry)
            assert all(np.array_equal(rx[k], ry[k]) and rx[k].dtype == ry[k].dtype for k in rx)
    for x, y in zip(a.checkpoints, b.checkpoints):
        assert x.checkpoint == y.checkpoint and x.round == y.round and np.array_equal(x.values, y.values)


def test_archive_round_trip(tmp_path):
    events = [with_values(ev) if ev.op is Op.LDSM else ev for ev in synthetic.memory_program(CFG, 128)]
    rec = record(TraceFilter(ctas=(0,), warps=(0, 3), lanes=(0, 31)), events)
    rec.on_checkpoint(CheckpointEvent(Checkpoint.S_ACC, 0, np.array([0]), np.ones((1, 128, 32), np.uint32)))
    tr = rec.trace
    assert_same(tr, load_trace(save_trace(tr, tmp_path / "t")))
    manifest = json.loads((tmp_path / "t" / "manifest.json").read_text())
    assert manifest["format"] == "flashsim-trace" and manifest["version"] == 2
    manifest["version"] = 99
    (tmp_path / "t" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="v99"):
        load_trace(tmp_path / "t")


def test_perfetto_export_one_track_per_warp_in_program_order():
    events = [with_values(ev) if ev.op is Op.LDSM else ev for ev in synthetic.memory_program(CFG, 128)]
    tr = record(TraceFilter(ctas=(0,), warps=(0, 2), lanes=(0,)), events).trace
    doc = json.loads(json.dumps(to_perfetto(tr), allow_nan=False))
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    names = {(e["pid"], e["tid"], e["args"]["name"]) for e in doc["traceEvents"] if e["ph"] == "M" and "tid" in e}
    assert names == {(0, 0, "warp 0"), (0, 2, "warp 2")}
    for tid in (0, 2):
        ts = [e["ts"] for e in slices if e["tid"] == tid]
        assert ts == sorted(ts) and len(ts) == sum(r.repeat for r in tr.records)
    q0 = next(e for e in slices if e["tid"] == 0 and e["name"].startswith("tCrQ"))
    lane = q0["args"]["lanes"]["lane 0"]
    assert lane["out"]["tCrX"] == [0.0, 1.0, 512.0, 513.0, 8.0, 9.0, 520.0, 521.0]  # 64*row + col
    assert lane["smem"]["bank"] == 0 and lane["smem"]["elements"][2] == [8, 0]
