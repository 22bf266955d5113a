"""fa_hw where there is no GPU (CI): input validation speaks the simulator's words, a missing
GPU/driver is one clear fa_hw error, and `fa hw` exits 2 with one line."""

from __future__ import annotations

import numpy as np
import pytest

import fa_hw
import fa_sim
from fa_sim import cli

RNG = np.random.default_rng(0)
Q = RNG.standard_normal((1, 2, 40, 64)).astype(np.float16)

BAD = {
    "rank": ((Q[0], Q, Q), {}),
    "kv shapes": ((Q, Q, Q[:, :, :7]), {}),
    "heads": ((Q[:, :1], Q, Q), {}),  # k, v with 2 heads, q with 1: 2 does not divide 1
    "window": ((Q, Q, Q), {"window": (-3, 0)}),
    "softcap": ((Q, Q, Q), {"softcap": -1.0}),
    "dtype": ((Q.astype(np.complex64), Q, Q), {}),
    "nan": ((np.where(Q > 2, np.nan, Q), Q, Q), {}),
    "range": ((Q.astype(np.float32) * 1e6, Q, Q), {}),
    "empty": ((Q[:, :, :0], Q, Q), {}),
    "head_dim": ((Q[..., :48], Q[..., :48], Q[..., :48]), {}),
    "scale": ((Q, Q, Q), {"scale": -0.5}),
    "scale inf": ((Q, Q, Q), {"scale": float("inf")}),
    "causal": ((Q, Q, Q), {"causal": "yes"}),
    "config": ((Q, Q, Q), {"config": fa_sim.KernelConfig(head_dim=32)}),
}


def _message(fn, args, kwargs) -> str:
    with pytest.raises(ValueError) as info:
        fn(*args, **kwargs)
    return str(info.value)


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_input_messages_match_the_simulator(case):
    args, kwargs = BAD[case]
    assert _message(fa_hw.forward, args, kwargs) == _message(fa_sim.simulate, args, kwargs)


def test_unsupported_type_is_a_value_error():
    with pytest.raises(ValueError, match="q must be a numpy array, a torch tensor, a cupy array or an object with"):
        fa_hw.forward(Q.tolist(), Q, Q)


@pytest.fixture
def no_gpu():
    """A machine with the hw extra (cuda.core) but no GPU/driver: the case these tests describe."""
    pytest.importorskip("cuda.core", reason="the hw extra (cuda-core) is not installed")
    if fa_hw.has_gpu():
        pytest.skip("a GPU is present here")


def test_without_the_hw_extra_the_error_says_what_to_install(monkeypatch):
    import builtins

    from fa_hw import runtime

    real_import = builtins.__import__

    def no_cuda_core(name, *args, **kwargs):
        if name.startswith("cuda.core"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_cuda_core)
    runtime.device.cache_clear()
    try:
        with pytest.raises(fa_hw.NoGPUError, match=r"cuda.core is not installed; install flashsim\[hw\]"):
            fa_hw.forward(Q, Q, Q)
    finally:
        runtime.device.cache_clear()


def test_no_gpu_is_one_clear_error(no_gpu):
    with pytest.raises(fa_hw.NoGPUError, match="no usable NVIDIA GPU"):
        fa_hw.forward(Q, Q, Q)


def test_fa_hw_exits_2_with_one_line(no_gpu, capsys):
    assert cli.main(["hw", "--seqlen", "16"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fa hw: error: no usable NVIDIA GPU") and err.count("\n") == 1


def test_fa_hw_rejects_bad_config_with_status_2(capsys):
    assert cli.main(["hw", "--block-m", "96"]) == 2
    assert "block_m=96 is not one of" in capsys.readouterr().err
