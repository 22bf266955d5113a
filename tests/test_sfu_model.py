"""fa_sim/calibrate/sfu_model.cu, the CUDA twin of fa_sim/isa/mufu.py that run 2 compares with the H200 on all
2^32 inputs: it is generated from the shipped tables, compiled for the host it agrees with the numpy
model bit for bit, it builds into the probe's verify program for sm_90, and `verify` run against a
stand-in device (numpy model as the unit, host-compiled C as the candidate) reports 0 mismatches,
while a corrupted table is caught."""

import json
import shutil

import numpy as np
import pytest

from fa_sim.calibrate import sfu_model_gen as gen
from fa_sim.calibrate import sfu_probe
from fa_sim.calibrate.sfu_device import Sweep
from fa_sim.calibrate.sfu_ops import BY_NAME, program_source
from fa_sim.calibrate.sfu_results import ulp_bins
from fa_sim.isa import mufu_table as mt

needs_cxx = pytest.mark.skipif(shutil.which("g++") is None, reason="no host C++ compiler (g++)")


def test_the_cuda_model_is_generated_from_the_shipped_tables():
    assert gen.MODEL_CU.read_text() == gen.source()
    defined = [n for n in sfu_probe.MODEL_FN.findall(gen.MODEL_CU.read_text()) if n in BY_NAME]
    assert sorted(defined) == sorted(gen.OPS) and "tanh" not in defined


@needs_cxx
def test_host_compiled_model_equals_the_numpy_model():
    x = gen.edge_inputs(150_000, seed=11)
    host = gen.HostModel()
    try:
        got = host(x)
    finally:
        host.close()
    ref = gen.numpy_outputs(x)
    for k, op in enumerate(gen.OPS):
        bad = np.flatnonzero(got[k] != ref[k])
        assert bad.size == 0, f"{op}: x=0x{x[bad[0]]:08x} C 0x{got[k, bad[0]]:08x} numpy 0x{ref[k, bad[0]]:08x}"


def test_verify_build_compiles_for_sm90_with_the_model():
    pytest.importorskip("cuda.core")
    from fa_sim.calibrate.sfu_device import compile_cubin

    src = gen.MODEL_CU.read_text()
    cubin = compile_cubin(program_source(model_source=src, model_ops=[BY_NAME[op] for op in gen.OPS]), "sm_90")
    assert all(f"vsweep_{op}".encode() in cubin and f"veval_{op}".encode() in cubin for op in gen.OPS)


class StandIn:
    """sfu_device.CudaBackend's methods on a window of every band: the numpy model plays the unit,
    the host-compiled C model the candidate."""
    device_name, arch, cubin = "numpy stand-in", "cpu", b""
    window = 96

    def __init__(self, host: "gen.HostModel"):
        self.host = host

    def _unit(self, op, u):
        return gen.numpy_outputs(u)[gen.OPS.index(op)]

    def sweep(self, op, model=False):
        u = ((np.arange(512, dtype=np.int64)[:, None] << 23) + np.arange(self.window)).astype(np.uint32).ravel()
        y = self._unit(op, u)
        r = self.host(u, op) if model else y
        bins = ulp_bins(y, r).reshape(512, -1)
        hist = np.stack([np.bincount(b, minlength=40) for b in bins]).astype(np.uint64)
        bad = np.where((bins != 16) & (bins != 35), u.reshape(512, -1), 0xFFFFFFFF).min(axis=1).astype(np.uint32)
        return Sweep(hist, np.zeros((512, 23), np.uint64), np.zeros(512, np.int32), np.zeros(512, np.int32), bad)

    def eval(self, op, inputs, model=False, expected=True):
        y = self._unit(op, inputs)
        return y, (self.host(inputs, op) if expected else None)


@needs_cxx
def test_run2_verify_against_the_stand_in(tmp_path):
    ops = [BY_NAME[op] for op in gen.OPS]
    host = gen.HostModel()
    try:
        rows = sfu_probe.verify_model(StandIn(host), tmp_path, ops, log=lambda s: None)
    finally:
        host.close()
    assert [r["mismatches"] for r in rows] == [0] * len(ops)
    assert json.loads((tmp_path / "sfu_verify.json").read_text())["ops"][0]["op"] == "ex2_ftz"

    # a table off by one unit of C0 in every ex2 segment must show
    t = dict(mt.tables())
    e = t["ex2"]
    t["ex2"] = mt.Table("ex2", e.xl_bits, e.sum_bits, e.c0 + (1 << 15), e.c1, e.c2)
    bad = gen.HostModel(gen.source(t))
    try:
        rows = sfu_probe.verify_model(StandIn(bad), tmp_path, [BY_NAME["ex2_ftz"]], log=lambda s: None)
    finally:
        bad.close()
    assert rows[0]["mismatches"] > 0 and rows[0]["examples"]
