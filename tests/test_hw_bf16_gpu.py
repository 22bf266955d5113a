"""bf16 on a real GPU (issue 38, item 1; marked `gpu`, skipped cleanly without one).

- fa_hw.forward with bf16 inputs (FA_BF16: mma.sync .bf16, cvt.rn.bf16x2.f32) bit-identical to the
  PTX engine and to the hand-written program with the H200 tensor-core model applied to bf16
  (fa_sim.tensorcore: fitted on f16 MMAs; these tests are what says it holds for bf16), O and LSE,
  on shapes with tails, causal and not, several configs;
- within the bf16 bounds of float64 (fa_sim.accuracy.O_BOUND_BF16, lse_error_bound);
- numpy and torch inputs (bit patterns / torch.bfloat16) give the same bits;
- `fa compare --dtype bf16`: every checkpoint, O and LSE identical.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import fa_hw
import fa_sim
from fa_sim import validate
from fa_sim.accuracy import O_BOUND_BF16, measure
from fa_sim.config import KernelConfig

pytestmark = pytest.mark.gpu
CONFIGS = [KernelConfig(dtype="bf16"), KernelConfig(block_m=128, head_dim=128, block_n=32, dtype="bf16"),
           KernelConfig(block_m=128, block_n=64, head_dim=32, n_warps=8, smem="padded", dtype="bf16"),
           KernelConfig(block_m=128, kv_stages=2, q_in_regs=True, dtype="bf16")]


@pytest.fixture(scope="module")
def gpu():
    if not fa_hw.has_gpu():
        pytest.skip("no NVIDIA GPU / driver here")
    return fa_hw.device_arch()


def _inputs(shape_q, nk, seed, sigma=1.0):
    rng = np.random.default_rng(seed)
    b, h, nq, d = shape_q
    return tuple(validate.round_to_bf16((sigma * rng.standard_normal((b, h, n, d))).astype(np.float32))
                 for n in (nq, nk, nk))


def _bits(x) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(x, np.float32)).view(np.uint32)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("i", range(len(CONFIGS)), ids=[c.tag for c in CONFIGS])
def test_gpu_bit_identical_to_the_ptx_engine(gpu, i, causal):
    cfg = CONFIGS[i]
    q, k, v = _inputs((2, 2, cfg.block_m + 37, cfg.head_dim), 2 * cfg.block_n + 11, seed=i, sigma=2.0)
    hw = fa_hw.forward(q, k, v, causal=causal, config=cfg)
    assert hw.config.dtype == "bf16" and np.asarray(hw.o).dtype == np.float32
    sim = fa_sim.simulate(q, k, v, causal=causal, config=cfg, engine="ptx", mma_model="h200")
    assert np.array_equal(_bits(hw.o), _bits(sim.o)), "O differs from the PTX engine (h200 model on bf16)"
    assert np.array_equal(_bits(hw.lse), _bits(sim.lse))
    acc = measure(hw.o, hw.lse, q, k, v, causal, hw.scale, hw.config)
    assert acc.ok and acc.rel_err_o < O_BOUND_BF16, acc.failures()
    if cfg.spec_schedule:  # the program runs the spec's schedule: the same bits
        prog = fa_sim.simulate(q, k, v, causal=causal, config=cfg, engine="program", mma_model="h200")
        assert np.array_equal(_bits(prog.o), _bits(hw.o)) and np.array_equal(_bits(prog.lse), _bits(hw.lse))


def test_torch_bf16_tensors_run_the_bf16_kernel(gpu):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    q, k, v = _inputs((1, 2, 100, 64), 77, seed=3)
    out = fa_hw.forward(*(torch.from_numpy(x).to(torch.bfloat16).cuda() for x in (q, k, v)), causal=True)
    ref = fa_hw.forward(q, k, v, causal=True, dtype="bf16")
    assert out.o.dtype == torch.bfloat16 and out.config.dtype == "bf16"
    assert np.array_equal(_bits(out.o.float().cpu().numpy()), _bits(ref.o))
    with pytest.raises(ValueError, match="mix fp16 and bf16"):
        fa_hw.forward(torch.from_numpy(q).half().cuda(), torch.from_numpy(k).to(torch.bfloat16).cuda(),
                      torch.from_numpy(v).to(torch.bfloat16).cuda())


def test_fa_compare_dtype_bf16(gpu, capsys):
    from fa_sim import cli

    assert cli.main(["compare", "--dtype", "bf16", "--seqlen", "200", "--seqlen-k", "150", "--causal", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["o"]["dtype"] == "bf16" and report["o"]["fraction_identical"] == 1.0


def test_the_h200_model_holds_for_bf16_mmas(gpu):
    """The GPU's bf16 MMA against the tensor-core models applied to bf16 (fa_sim.calibrate.mma_probe
    --dtype bf16): the H200 model, fitted on f16 MMAs, must reproduce every output for the tests
    above to hold; if it does not, `python -m fa_sim.calibrate.mma_probe run --dtype bf16` and `fit`
    find the member that does."""
    pytest.importorskip("cupy")
    from fa_sim.calibrate import mma_probe
    from fa_sim.tensorcore import H200

    a, b, c = mma_probe.make_inputs(2048, 0, "bf16")
    d = mma_probe.run_on_gpu(a, b, c, "bf16")
    want = H200.for_operand("bf16").dot_add(*mma_probe.dot_operands(a, b, c))
    assert np.count_nonzero(want.view(np.uint32) != d.view(np.uint32)) == 0
