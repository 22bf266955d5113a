"""fa_sim/calibrate/sfu_probe.py on the CPU: the program compiles for sm_90 to the SASS it documents,
the dump codec round-trips, and run 1 / run 2 write and read back their files end to end against
a numpy stand-in for the device (the GPU runs themselves happen on the H200, issue 10)."""

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fa_sim.calibrate import sfu_device, sfu_probe
from fa_sim.calibrate.sfu_device import Check, Sweep
from fa_sim.calibrate.sfu_ops import (BY_NAME, FAMILIES, FAMILY_BUDGET, HALF_BY_NAME, HALF_OPS, KERNEL_SOURCE, OPS,
                                      SPECIALS, TOTAL_BUDGET, band, neighbours, program_source, sample_inputs)
from fa_sim.calibrate.sfu_results import (DCLIP, band_inputs, decode_blobs, dump_stride_log2, encode_band, fit_budget,
                                          load_family, read_dumps, round_bf16, ulp_bins)

FUNCS = {"ex2": np.exp2, "lg2": np.log2, "rcp": np.reciprocal, "rsqrt": lambda v: 1 / np.sqrt(v), "sqrt": np.sqrt,
         "sin": np.sin, "cos": np.cos, "tanh": np.tanh}


def _f32(v) -> np.ndarray:
    y = np.asarray(v, dtype=np.float64).astype(np.float32)
    y = np.where(np.abs(y) < 2.0**-126, np.float32(0), y).astype(np.float32)
    return np.where(np.isnan(y), np.uint32(0x7FFFFFFF), y.view(np.uint32)).astype(np.uint32)


def fake_unit(name: str, bits: np.ndarray, grid: bool) -> np.ndarray:
    """A stand-in unit: flush-to-zero, correctly rounded; with `grid`, ex2 reads x on a 2^-20 grid."""
    with np.errstate(all="ignore"):
        x = np.asarray(bits, dtype=np.uint32).view(np.float32).astype(np.float64)
        x = np.where(np.abs(x) < 2.0**-126, 0.0, x)
        base = name.removesuffix("_ftz")
        if grid and base == "ex2":
            x = np.trunc(x * 2.0**20) / 2.0**20
        return _f32(FUNCS[base](x))


class FakeBackend:
    """The methods of sfu_device.CudaBackend on a 257-input window per band, in numpy. The unit reads
    ex2's argument on a grid; the reference and the candidate model do not."""
    device_name, arch, cubin = "numpy stand-in", "cpu", b""
    window = 256

    def __init__(self, failing=(), failing_checks=()):
        self.failing, self.failing_checks = set(failing), set(failing_checks)

    def sweep(self, op, model=False):
        if op in self.failing:
            raise RuntimeError(f"injected failure in {op}")
        hist, chg = np.zeros((512, 40), np.uint64), np.zeros((512, 23), np.uint64)
        lo, hi = np.full(512, 2**31 - 1, np.int32), np.full(512, -2**31, np.int32)
        first = np.full(512, 0xFFFFFFFF, np.uint32)
        for b in range(512):
            u = ((b << 23) + np.arange(self.window + 1)).astype(np.uint32)
            y, r = fake_unit(op, u, True), fake_unit(op, u, False)  # reference and candidate: no grid
            bins = ulp_bins(y[:-1], r[:-1])
            hist[b] = np.bincount(bins, minlength=40)
            steps = np.flatnonzero(y[:-1] != y[1:])
            m1 = (u[steps] & 0x7FFFFF).astype(np.int64) + 1
            m1 = m1[m1 < 0x800000]  # the step out of the band is not counted
            np.add.at(chg[b], np.log2(m1 & -m1).astype(np.int64), 1)  # ctz(m + 1)
            bad = np.flatnonzero((bins != DCLIP) & (bins != 35))
            first[b] = u[bad].min() if bad.size else 0xFFFFFFFF
        return Sweep(hist, chg, lo, hi, first)

    def check(self, op):
        if op in self.failing_checks:
            raise RuntimeError(f"injected check failure in {op}")
        appl = np.zeros((512, 4), np.uint64)
        appl[:, 0] = 1
        return Check(np.zeros((512, 4), np.uint64), appl, np.full((512, 4), 0xFFFFFFFF, np.uint32))

    def eval(self, op, inputs, model=False, expected=True):
        return fake_unit(op, inputs, True), (fake_unit(op, inputs, False) if expected else None)

    def half_all(self, name):
        x = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float64)
        with np.errstate(all="ignore"):
            return (np.exp2(x) if name.startswith("ex2") else np.tanh(x)).astype(np.float16).view(np.uint16)

    def half_x2(self, name, table):
        return 0, 0xFFFFFFFF


# ---- the compiled program ----

def test_every_op_compiles_for_sm90_to_the_documented_sass():
    pytest.importorskip("cuda.core")
    from fa_sim.calibrate.sfu_device import compile_cubin, op_sass, sass_by_kernel

    try:
        kernels = sass_by_kernel(compile_cubin(program_source(), "sm_90"))
    except Exception as exc:  # nvdisasm missing: the hw extra is not installed
        pytest.skip(f"no nvdisasm: {exc}")
    for op in OPS:
        assert op_sass(kernels["sass_" + op.name]) == op.sass, op.name
        assert op.mufu in op_sass(kernels["sweep_" + op.name]) and "check_" + op.name in kernels
    for h in HALF_OPS:
        assert op_sass(kernels["half_all_" + h.name]) == (h.sass,)
        assert op_sass(kernels["half_x2_" + h.name]).count(h.sass) >= 2


def test_the_verify_build_compiles_with_a_candidate_model():
    pytest.importorskip("cuda.core")
    from fa_sim.calibrate.sfu_device import compile_cubin

    model = "__device__ float model_ex2_ftz(float x) { return exp2f(x); }\n"
    assert sfu_probe.MODEL_FN.findall(model) == ["ex2_ftz"]
    cubin = compile_cubin(program_source(model_source=model, model_ops=[BY_NAME["ex2_ftz"]]), "sm_90")
    assert b"vsweep_ex2_ftz" in cubin and b"veval_ex2_ftz" in cubin


# ---- dumps ----

@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=300), st.booleans())
def test_dump_codec_round_trips(values, monotone):
    bits = np.array(sorted(values) if monotone else values, dtype=np.uint32)
    enc = encode_band(7, 0, bits)
    assert np.array_equal(decode_blobs(*enc.blobs), bits)
    assert enc.count == bits.size and enc.n_escapes >= 1


def test_stride_keeps_one_input_per_block_of_constant_output():
    changes = np.zeros(23, np.uint64)
    assert dump_stride_log2(changes) == 23 and band_inputs(band(0, -30), 23).size == 1
    changes[[5, 9]] = 3
    u = band_inputs(band(1, 0), dump_stride_log2(changes))
    assert u.size == 2**18 and u[0] == band(1, 0) << 23 and np.all(np.diff(u) == 32)


def test_family_budgets_fit_what_a_device_run_returns():
    assert set(FAMILY_BUDGET) == set(FAMILIES) and len(FAMILIES) + 1 <= 8  # + sfu_summary.json
    assert max(FAMILY_BUDGET.values()) < 16_000_000 and sum(FAMILY_BUDGET.values()) <= TOTAL_BUDGET <= 63_000_000


def test_fit_budget_keeps_the_priority_prefix():
    enc = [encode_band(b, 0, np.arange(1000, dtype=np.uint32) * (b + 1)) for b in range(4)]
    consumed = []
    kept = fit_budget((consumed.append(e.band) or e for e in enc), enc[0].nbytes + enc[1].nbytes)
    assert [e.band for e in kept] == [0, 1] and consumed == [0, 1, 2]  # stops at the first misfit


def test_ulp_bins_matches_the_documented_bins():
    y = np.array([0x3F800000, 0x3F800001, 0x3F7FFFFF, 0x3F800020, 0x7FFFFFFF, 0x7FC00000, 0x7FC00000, 0x3F800000,
                  0x80000000], np.uint32)
    r = np.array([0x3F800000, 0x3F800000, 0x3F800000, 0x3F800000, 0x7FFFFFFF, 0x7FFFFFFF, 0x3F800000, 0x7FFFFFFF,
                  0x00000000], np.uint32)
    assert ulp_bins(y, r).tolist() == [16, 17, 15, 34, 35, 36, 37, 38, 39]


# ---- recorded samples ----

def test_samples_hold_every_edge():
    for op in OPS:
        x = sample_inputs(op)
        assert np.all(np.diff(x.astype(np.int64)) > 0) and np.array_equal(x, sample_inputs(op))
        assert np.isin(SPECIALS, x).all()
        powers = np.arange(1, 255, dtype=np.uint32) << 23
        assert np.isin(neighbours(powers, 1), x).all() and np.isin(powers | 0x80000000, x).all()
        assert 15_000 < x.size < 60_000, (op.name, x.size)
    ex2 = sample_inputs(BY_NAME["ex2_ftz"])
    assert np.isin(neighbours(np.float32([-126.0, -150.0, 128.0]).view(np.uint32), 64), ex2).all()
    assert np.isin(neighbours(np.float32([1.0]).view(np.uint32), 2048), sample_inputs(BY_NAME["lg2_ftz"])).all()


def test_neighbours_step_through_zero_and_stop_before_infinity():
    assert neighbours(np.array([0], np.uint32), 2).tolist() == [0x80000002, 0x80000001, 0, 1, 2]
    assert neighbours(np.array([0x7F7FFFFF], np.uint32), 1).tolist() == [0x7F7FFFFE, 0x7F7FFFFF, 0x7F7FFFFF]


def test_bf16_reference_rounds_to_nearest_even():
    v = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, -2.5, 2.0**-133, 3 * 2.0**-134, np.inf, np.nan, 2.0**128])
    assert round_bf16(v).tolist() == [0x3F80, 0x3F80, 0x3F82, 0xC020, 0x0001, 0x0002, 0x7F80, 0x7FC0,
                                                  0x7F80]


# ---- run 1 and run 2 end to end on the stand-in ----

def _small_ops():
    ex2 = dataclasses.replace(BY_NAME["ex2_ftz"], dump=(band(0, 0), band(1, 0), band(0, -1), band(0, -20)))
    return [ex2, BY_NAME["ex2"], dataclasses.replace(BY_NAME["rcp_ftz"], dump=(band(0, 0),))]


def test_run_writes_every_part_and_show_decodes_it(tmp_path, capsys):
    ops = _small_ops()
    rows = sfu_probe.run_probe(FakeBackend(), tmp_path, ops, [HALF_BY_NAME["ex2_f16"]], log=lambda s: None)
    assert [r["op"] for r in rows] == ["ex2_ftz", "ex2", "rcp_ftz", "ex2_f16"]
    assert all("error" not in r for r in rows)
    ex2 = load_family(tmp_path / "sfu_ex2.npz")
    dumps = read_dumps(ex2["ex2_ftz"])
    assert sorted(dumps) == sorted(ops[0].dump)
    for b, (u, y) in dumps.items():
        assert np.array_equal(y, fake_unit("ex2_ftz", u, True))
    assert dumps[band(0, 0)][0].size == 2**20 and dumps[band(0, -20)][0].size < 2**10
    s = ex2["ex2_ftz"]
    assert np.array_equal(s["samples_y"], fake_unit("ex2_ftz", s["samples_x"], True))
    assert ex2["ex2_f16"]["table"].shape == (65536,) and ex2["ex2_f16"]["f32_outputs"].shape == (65536,)
    half = next(r for r in rows if r["op"] == "ex2_f16")
    assert half["vs_correctly_rounded"]["exact"] > 60_000 and half["x2_mismatches"] == 0
    summary = json.loads((tmp_path / "sfu_summary.json").read_text())
    assert summary["ops"][0]["sweep"]["total"] == 512 * FakeBackend.window
    assert sfu_probe.main(["show", str(tmp_path)]) == 0
    assert "ex2_ftz" in capsys.readouterr().out


def test_one_failing_op_loses_nothing_else(tmp_path):
    ops = _small_ops()
    rows = sfu_probe.run_probe(FakeBackend(failing={"ex2"}), tmp_path, ops, [], log=lambda s: None)
    assert "injected failure" in rows[1]["error"] and "error" not in rows[0] and "error" not in rows[2]
    assert set(load_family(tmp_path / "sfu_ex2.npz")) == {"ex2_ftz"}
    assert "rcp_ftz" in load_family(tmp_path / "sfu_rcp.npz")


def test_a_failing_stage_keeps_the_op_and_its_other_stages(tmp_path):
    ops = _small_ops()[2:]
    row = sfu_probe.run_probe(FakeBackend(failing_checks={"rcp_ftz"}), tmp_path, ops, [], log=lambda s: None)[0]
    assert "injected check failure" in row["stage_errors"]["check"] and row["sweep"]["total"] > 0
    saved = load_family(tmp_path / "sfu_rcp.npz")["rcp_ftz"]
    assert "samples_y" in saved and "dump_meta" in saved and "check_mism" not in saved


def test_verify_counts_model_mismatches(tmp_path):
    rows = sfu_probe.verify_model(FakeBackend(), tmp_path, [BY_NAME["ex2_ftz"], BY_NAME["rcp_ftz"]], log=lambda s: None)
    assert rows[0]["mismatches"] > 0 and rows[0]["examples"]  # the grid reading differs from exp2 below 1
    assert rows[1]["mismatches"] == 0
    assert json.loads((tmp_path / "sfu_verify.json").read_text())["ops"][1]["op"] == "rcp_ftz"


@pytest.mark.parametrize("argv, message", [
    (["run", "--out", "{file}"], "is a file"),
    (["run", "--out", "{dir}", "--ops", "ex2_ftz,exp"], "unknown op(s) exp"),
    (["verify", "--model", "{dir}/none.cu", "--out", "{dir}"], "no such file"),
    (["show", "{dir}"], "not found"),
])
def test_bad_arguments_get_one_line(tmp_path, argv, message):
    (tmp_path / "f").write_text("")
    argv = [a.format(file=tmp_path / "f", dir=tmp_path) for a in argv]
    with pytest.raises(SystemExit) as exc:
        sfu_probe.main(argv)
    assert message in str(exc.value)


# ---- the launch layer against the kernel signatures (cupy and the launch replaced by recorders) ----

class _Array(np.ndarray):
    """A numpy array with cupy's .data.ptr and .get()."""

    @property
    def data(self):
        return type("Ptr", (), {"ptr": 0x1000 + id(self) % 4096 * 16})()

    def get(self):
        return np.asarray(self)


class _FakeCupy:
    uint16, uint32, uint64, int32 = np.uint16, np.uint32, np.uint64, np.int32
    cuda = type("cuda", (), {"runtime": type("rt", (), {"deviceSynchronize": staticmethod(lambda: None)})})

    def zeros(self, shape, dtype):
        return np.zeros(shape, dtype).view(_Array)

    def full(self, shape, value, dtype):
        return np.full(shape, value, dtype).view(_Array)

    def empty(self, shape, dtype):
        return np.zeros(shape, dtype).view(_Array)

    def asarray(self, a):
        return np.asarray(a).view(_Array)

    def asnumpy(self, a):
        return np.asarray(a)


def _signatures() -> dict[str, list[str]]:
    """Kernel name prefix -> parameter kinds ('ptr' or the scalar type) from sfu_probe.cu's macros."""
    import re

    src = KERNEL_SOURCE.read_text()
    out = {}
    for prefix, params in re.findall(r'extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?(\w+)_##NAME\(([^)]*)\)', src):
        out[prefix] = ["ptr" if "*" in p else p.split()[0] for p in params.split(",")]
    return out


def test_the_launch_layer_passes_what_each_kernel_declares(monkeypatch):
    pytest.importorskip("cuda.core")
    import cuda.core

    calls = []
    monkeypatch.setattr(cuda.core, "launch", lambda stream, cfg, kernel, *args: calls.append((kernel, args)))
    dev = object.__new__(sfu_device.CudaBackend)
    dev.cp = _FakeCupy()
    dev.module = type("M", (), {"get_kernel": staticmethod(lambda name: name)})()
    dev.stream = type("S", (), {"sync": staticmethod(lambda: None)})()
    dev.sweep("ex2_ftz")
    dev.sweep("ex2_ftz", model=True)
    dev.check("rcp_ftz")
    dev.eval("tanh", np.arange(300, dtype=np.uint32))
    dev.eval("tanh", np.arange(3, dtype=np.uint32), model=True, expected=False)
    dev.half_x2("ex2_f16", dev.half_all("ex2_f16"))
    sigs = _signatures()
    kinds = {"ptr": int, "u32": np.uint32}
    assert [k.rsplit("_", 2)[0] if k.startswith("half") else k.split("_")[0] for k, _ in calls] == \
        ["sweep", "vsweep", "check", "eval", "veval", "half_all", "half_x2"]
    for kernel, args in calls:
        prefix = next(p for p in sorted(sigs, key=len, reverse=True) if kernel.startswith(p + "_"))
        assert [type(a) for a in args] == [kinds[k] for k in sigs[prefix]], kernel
