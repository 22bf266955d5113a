"""fa_sim.simulate: accuracy over the whole config family (causal or not, tails, Nk != Nq),
input validation, waves, and the `fa sim` command. Reference: fa_sim.reference.attention."""

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import fa_sim
from fa_sim.cli import main
from fa_sim.config import KernelConfig
from fa_sim.events import COUNTED_OPS, Op
from fa_sim.reference import attention

FAMILY = KernelConfig.family()
FIXED = settings(derandomize=True, database=None, max_examples=24, deadline=None)
O_TOL, LSE_TOL = 1e-3, 1e-4


def _inputs(b, h, nq, nk, d, seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((b, h, nq, d)).astype(np.float16),
            rng.standard_normal((b, h, nk, d)).astype(np.float16),
            rng.standard_normal((b, h, nk, d)).astype(np.float16))


def _check(q, k, v, causal, config, scale=None):
    res = fa_sim.simulate(q, k, v, causal=causal, config=config, scale=scale)
    o_ref, lse_ref = attention(q, k, v, causal=causal, scale=scale)
    rel = np.linalg.norm(res.o.astype(np.float64) - o_ref) / np.linalg.norm(o_ref)
    assert rel <= O_TOL, (config.tag, causal, q.shape, k.shape, rel)
    assert np.max(np.abs(res.lse - lse_ref)) <= LSE_TOL, (config.tag, causal, q.shape, k.shape)
    return res


def test_the_family_has_78_configs():
    assert len(FAMILY) == 78 and FAMILY[0] == KernelConfig()


@pytest.mark.parametrize("config", FAMILY, ids=lambda c: c.tag)
def test_accuracy_over_the_family_with_tails(config):
    nq = config.block_m + 13  # two Q blocks, the second a tail
    for causal, nk in ((False, 2 * config.block_n + 5), (True, nq + 7), (True, config.block_n // 2 + 3)):
        q, k, v = _inputs(1, 2, nq, nk, config.head_dim, seed=nk + config.block_m)
        res = _check(q, k, v, causal, config)
    # HMMA count of the last (causal) run: per warp and round, MI * (block_n/8 * d/16 + d/8 * block_n/16)
    per = config.m_repeats * (config.s_n_tiles * config.qk_k_segments + config.o_n_tiles * config.pv_k_segments)
    n_rounds = -(-nk // config.block_n)
    m_blocks = -(-nq // config.block_m)
    nbm = [min(n_rounds, -(-min(nk, (mb + 1) * config.block_m) // config.block_n)) for mb in range(m_blocks)]
    assert res.instructions[Op.HMMA] == 2 * sum(nbm) * config.n_warps * per


@FIXED
@given(b=st.integers(1, 2), h=st.integers(1, 2), nq=st.integers(1, 150), nk=st.integers(1, 150),
       causal=st.booleans(), pick=st.integers(0, len(FAMILY) - 1), seed=st.integers(0, 2**16))
def test_accuracy_over_random_shapes(b, h, nq, nk, causal, pick, seed):
    config = FAMILY[pick]
    q, k, v = _inputs(b, h, nq, nk, config.head_dim, seed)
    _check(q, k, v, causal, config)


def test_explicit_scale_and_default_config_from_head_dim():
    q, k, v = _inputs(1, 1, 70, 40, 32, seed=1)
    res = _check(q, k, v, False, None, scale=0.3)
    assert res.config == KernelConfig(head_dim=32) and res.scale == 0.3
    assert fa_sim.simulate(q, k, v).scale == pytest.approx(32 ** -0.5)


def test_result_fields():
    q, k, v = _inputs(2, 3, 65, 30, 64, seed=2)
    res = fa_sim.simulate(q, k, v, causal=True)
    assert res.o.shape == (2, 3, 65, 64) and res.o.dtype == np.float16
    assert res.lse.shape == (2, 3, 65) and res.lse.dtype == np.float32
    assert set(res.instructions) == set(COUNTED_OPS) and res.seconds > 0 and res.causal
    assert sum(n for (op, _, _), n in res.counts.items() if op is Op.LDSM) == res.instructions[Op.LDSM]
    with pytest.raises(dataclasses.FrozenInstanceError):
        res.causal = False


def test_waves_do_not_change_anything():
    q, k, v = _inputs(2, 2, 200, 150, 64, seed=3)
    one = fa_sim.simulate(q, k, v, causal=True)
    many = fa_sim.simulate(q, k, v, causal=True, wave_ctas=3)
    np.testing.assert_array_equal(one.o, many.o)
    np.testing.assert_array_equal(one.lse, many.lse)
    assert one.counts == many.counts


class _DLPackOnly:
    def __init__(self, a):
        self._a = a

    def __dlpack__(self, **kw):
        return self._a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def test_inputs_through_dlpack_and_other_dtypes():
    q, k, v = _inputs(1, 1, 50, 50, 64, seed=4)
    ref = fa_sim.simulate(q, k, v)
    res = fa_sim.simulate(_DLPackOnly(q), k.astype(np.float32), v.astype(np.float64))
    np.testing.assert_array_equal(ref.o, res.o)
    ints = fa_sim.simulate(np.ones((1, 1, 3, 32), np.int32), np.ones((1, 1, 2, 32), np.int8),
                           np.arange(64, dtype=np.uint8).reshape(1, 1, 2, 32))
    np.testing.assert_array_equal(ints.o[0, 0, 0], np.arange(64).reshape(2, 32).mean(0).astype(np.float16))


GOOD = _inputs(1, 1, 8, 8, 64, seed=5)


@pytest.mark.parametrize("change, message", [
    (lambda q, k, v: (q[0], k, v), "rank 4"),
    (lambda q, k, v: (q, k, v[:, :, :5]), "same shape"),
    (lambda q, k, v: (q[:, :, :, :32], k, v), "head_dim"),
    (lambda q, k, v: (q, np.concatenate([k, k], 1), np.concatenate([v, v], 1)), "2 heads, which does not divide q's 1"),
    (lambda q, k, v: (q.astype(np.complex64), k, v), "dtype complex64"),
    (lambda q, k, v: (q.astype(str), k, v), "does not convert to fp16"),
    (lambda q, k, v: (np.where(np.arange(64) == 3, np.nan, q.astype(np.float32)), k, v), "NaN or Inf"),
    (lambda q, k, v: (q, np.where(np.arange(64) == 3, np.inf, k.astype(np.float32)), v), "NaN or Inf"),
    (lambda q, k, v: (q, k, v.astype(np.float32) * 1e5), "fp16 range"),
    (lambda q, k, v: (q[:, :, :0], k, v), "empty"),
    (lambda q, k, v: (q[..., :48], k[..., :48], v[..., :48]), "head_dim 48 is not supported"),
    (lambda q, k, v: ("abc", k, v), "numpy array"),
    (lambda q, k, v: (object(), k, v), "numpy array"),
])
def test_bad_inputs_name_the_problem(change, message):
    with pytest.raises(ValueError, match=message):
        fa_sim.simulate(*change(*GOOD))


@pytest.mark.parametrize("kw, message", [
    (dict(scale=0.0), "scale"), (dict(scale=-1.0), "scale"), (dict(scale=float("nan")), "scale"),
    (dict(scale=float("inf")), "scale"), (dict(scale=True), "scale"), (dict(scale="1"), "scale"),
    (dict(scale=1e-60), "scale"), (dict(causal="yes"), "causal"),
    (dict(config=KernelConfig(head_dim=32)), "head_dim"), (dict(config="seed"), "KernelConfig"),
    (dict(observers=5), "observers"), (dict(mutation="drop"), "Mutation"), (dict(wave_ctas=0), "wave_ctas"),
])
def test_bad_arguments_name_the_problem(kw, message):
    with pytest.raises(ValueError, match=message):
        fa_sim.simulate(*GOOD, **kw)


def test_cli_json(capsys):
    assert main(["sim", "--json", "--seqlen", "70", "--seqlen-k", "33", "--causal", "--head-dim", "32",
                 "--block-n", "32", "--heads", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"rel_err_o", "max_abs_err_lse", "max_rel_err_lse", "nonfinite", "above_bound", "seconds",
                        "instructions", "engine", "kernel"}
    assert out["engine"] == "program" and out["kernel"] is None
    assert out["nonfinite"] == [] and out["above_bound"] == []
    assert out["rel_err_o"] <= O_TOL and out["max_abs_err_lse"] <= LSE_TOL
    assert set(out["instructions"]) == {"LDGSTS", "LDSM", "HMMA", "SHFL", "BAR", "LDS", "STS"}


def test_cli_table_and_npz(tmp_path, capsys):
    q, k, v = _inputs(1, 1, 20, 90, 128, seed=6)
    np.savez(tmp_path / "in.npz", q=q, k=k, v=v)
    assert main(["sim", "--npz", str(tmp_path / "in.npz"), "--block-m", "128", "--warps", "8",
                 "--smem", "padded"]) == 0
    text = capsys.readouterr().out
    assert "relative Frobenius error of O" in text and "HMMA" in text and "m128n64d128w8-padded" in text


@pytest.mark.parametrize("argv", [["sim", "--head-dim", "48"], ["sim", "--seqlen", "0"],
                                  ["sim", "--scale", "-1"], ["sim", "--npz", "/nonexistent.npz"]])
def test_cli_bad_input_is_one_line_and_status_2(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("fa sim: error:") and err.count("\n") == 1


def test_cli_check_hazards(capsys):
    assert main(["sim", "--check-hazards", "--seqlen", "70", "--causal"]) == 0
    assert "hazards: none" in capsys.readouterr().out
    assert main(["sim", "--check-hazards", "--json", "--seqlen", "64"]) == 0
    assert json.loads(capsys.readouterr().out)["hazards"]["total"] == 0


@pytest.mark.parametrize("causal", [False, True])
def test_progress_bar_total_is_the_cta_rounds_it_counts(monkeypatch, causal):
    """The bar ends exactly full, also when the last wave is partial (5 CTAs in waves of 2)."""
    import contextlib
    import sys

    sim_module = sys.modules["fa_sim.simulate"]  # the module (fa_sim.simulate is the function)
    bars = []

    class Bar(contextlib.nullcontext):
        def __init__(self, total):
            super().__init__(self)
            self.total, self.n = total, 0

        def update(self, n):
            self.n += n

    monkeypatch.setattr(sim_module, "_progress_bar", lambda progress, total, seconds: bars.append(Bar(total)) or bars[-1])
    q, k, v = _inputs(1, 1, 5 * 64 - 3, 150, 64, 0)
    fa_sim.simulate(q, k, v, causal=causal, wave_ctas=2)
    assert bars[0].n == bars[0].total > 0


# ---- progress off a terminal ------------------------------------------------------------------------
def _sim_module():
    import sys

    return sys.modules["fa_sim.simulate"]  # the module (fa_sim.simulate is the function)


def test_progress_prints_lines_when_stderr_is_not_a_terminal(monkeypatch, capsys):
    monkeypatch.setattr(_sim_module(), "PROGRESS_INTERVAL_S", 0.0)  # a line at every update
    q, k, v = _inputs(1, 1, 3 * 64, 150, 64, 0)
    fa_sim.simulate(q, k, v, wave_ctas=1, progress=True)
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert "\r" not in err and len(lines) == 3 * 3 + 1  # 3 CTAs x 3 rounds, and the closing line
    assert all(line.startswith("fa_sim: ") and "CTA-rounds" in line and "elapsed" in line for line in lines)
    assert lines[0].startswith("fa_sim: 1/9 CTA-rounds (11.1%)") and lines[-1].startswith("fa_sim: 9/9 CTA-rounds (100.0%)")


def test_progress_lines_are_spaced_by_the_interval(monkeypatch, capsys):
    clock = iter(range(0, 1000, 2))  # every call to the clock advances 2 s
    monkeypatch.setattr(_sim_module().time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(_sim_module(), "PROGRESS_INTERVAL_S", 5.0)
    q, k, v = _inputs(1, 1, 3 * 64, 150, 64, 0)
    fa_sim.simulate(q, k, v, wave_ctas=1, progress=True)
    lines = capsys.readouterr().err.splitlines()
    assert 2 <= len(lines) <= 5  # 9 updates 2 s apart: one line per >= 5 s, and the closing one


def test_progress_none_follows_the_estimate(monkeypatch, capsys):
    q, k, v = _inputs(1, 1, 64, 64, 64, 0)
    fa_sim.simulate(q, k, v)  # estimated far below PROGRESS_MIN_SECONDS: silent
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(_sim_module(), "PROGRESS_MIN_SECONDS", 0.0)
    monkeypatch.setattr(_sim_module(), "PROGRESS_INTERVAL_S", 0.0)
    fa_sim.simulate(q, k, v)
    assert capsys.readouterr().err.startswith("fa_sim: 1/1 CTA-rounds")


def test_a_terminal_gets_a_tqdm_bar(monkeypatch):
    from tqdm import tqdm

    monkeypatch.setattr(_sim_module().sys.stderr, "isatty", lambda: True, raising=False)
    with _sim_module()._progress_bar(True, 10) as bar:
        assert isinstance(bar, tqdm) and not bar.disable
    with _sim_module()._progress_bar(None, 10, seconds=0.1) as bar:
        assert bar.disable


# ---- memory and time up front -----------------------------------------------------------------------
def test_a_run_past_the_available_memory_is_refused_before_it_starts(monkeypatch):
    import fa_sim.estimate as est

    monkeypatch.setattr(est, "machine_bytes", lambda: 1 << 20)
    q, k, v = _inputs(1, 2, 300, 300, 64, 0)
    with pytest.raises(ValueError, match=r"need about .* more than the 1 MiB of memory this machine has"):
        fa_sim.simulate(q, k, v)


def test_broadcast_inputs_are_sized_before_any_value_is_read_or_copied():
    """Three broadcast views of a small array describe a (1, 64, 4e6, 128) run: the estimate refuses
    it at once, before the value checks would materialise tens of GiB (a numpy MemoryError)."""
    import time

    for dtype in (np.float16, np.float32):
        x = np.broadcast_to(np.ones((1, 1, 1, 128), dtype), (1, 64, 4_000_000, 128))
        start = time.process_time()  # this process's CPU: the same under a parallel test session
        with pytest.raises(ValueError, match=r"B=1 H=64 Nq=4000000 .* need about .* GiB, more than the .* of memory "
                                             r"this machine has; choose a smaller problem"):
            fa_sim.simulate(x, x, x)
        assert time.process_time() - start < 1.0  # nothing of the run's size was touched


# ---- the front end, chosen once (fa_sim.run) ---------------------------------------------------------
KERNEL = "fa_hw/kernels/fa2_fwd.cu"


@pytest.mark.parametrize("kw, message", [
    (dict(kernel=123), "kernel= takes the path of a .cu file or of a .patch/.diff against fa2_fwd.cu (or a "
                       "fa_sim.contract.KernelSource), not int 123"),
    (dict(kernel=b"x.cu"), "kernel= takes the path of a .cu file"),
    (dict(kernel="no/such/variant.cu"), "kernel= no/such/variant.cu: no such file (expected a variant of fa2_fwd.cu)"),
    (dict(kernel="README.md"), "kernel= README.md: expected a CUDA source file ending in .cu"),
    (dict(engine="program", kernel=KERNEL), "kernel is simulated by the PTX engine; drop engine='program' or use "
                                            "engine='ptx'"),
    (dict(engine="gpu"), "engine must be one of ('program', 'ptx'), got 'gpu'"),
    (dict(engine="ptx", mutation=fa_sim.Mutation()), "mutation= changes the hand-written program"),
    (dict(engine="program", config=KernelConfig(kv_stages=2)), "engine='program' runs the spec's schedule only"),
    (dict(observers=[object()]), r"observers\[0\] \(object\) is not an observer: it has none of the hooks on_instr, "
                                 "on_checkpoint, on_branch, on_launch, on_finish"),
    (dict(observers=[None, object()]), r"observers\[0\] \(NoneType\) is not an observer"),
    (dict(wave_ctas=True), "wave_ctas must be a positive integer"),
])
def test_bad_front_end_and_observer_arguments_say_what_is_accepted(kw, message):
    import re

    with pytest.raises(ValueError, match=message if "\\" in message else re.escape(message)):
        fa_sim.simulate(*GOOD, **kw)


def test_the_front_end_is_chosen_once_and_can_be_passed_chosen():
    from fa_sim.contract import kernel_source
    from fa_sim.run import CLI, ProgramFrontEnd, PtxFrontEnd, choose_front_end

    seed, staged = KernelConfig(), KernelConfig(kv_stages=2)
    assert choose_front_end(None, None, seed) == ProgramFrontEnd()
    assert choose_front_end(None, None, staged) == PtxFrontEnd()
    assert choose_front_end(None, KERNEL, seed) == PtxFrontEnd(kernel_source(KERNEL))
    assert choose_front_end("ptx", None, seed) == PtxFrontEnd()
    with pytest.raises(ValueError, match="^--kernel is simulated by the PTX engine; drop --engine program or use "
                                         "--engine ptx$"):
        choose_front_end("program", KERNEL, seed, names=CLI)
    with pytest.raises(ValueError, match="^--kernel x.cu: no such file"):
        choose_front_end(None, "x.cu", seed, names=CLI)
    with pytest.raises(ValueError, match="give its kernel and mutation inside it"):
        choose_front_end(PtxFrontEnd(), KERNEL, seed)
    with pytest.raises(ValueError, match="spec's schedule only"):
        choose_front_end(ProgramFrontEnd(), None, staged)
    # a chosen value runs exactly what its names run
    by_name = fa_sim.simulate(*GOOD, engine="program")
    by_value = fa_sim.simulate(*GOOD, engine=ProgramFrontEnd())
    np.testing.assert_array_equal(by_name.o, by_value.o)
    assert by_name.counts == by_value.counts
