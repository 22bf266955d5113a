"""The simulator against recordings of the H200 (CPU-only: the GPU side is stored in tests/data/h200).

- mma_probe_192.npz: 192 random m16n8k16 MMAs (wide exponent spread; 64 with C = 0) run by
  fa_sim/calibrate/mma_probe.py on the H200. fa_sim.tensorcore.H200 must reproduce all 24,576 outputs
  bit for bit, and be the best member of the model family.
- compare_*.npz: `fa compare --save` runs on the H200 (inputs, O, LSE, checkpoint buffers of two
  CTAs), made with the FFMA softmax form (saved-run format 1), and the swizzle variant's run
  (format 3, with its source). The simulator, in the recorded form, must reproduce every
  checkpoint, O and LSE bit for bit: the tensor core and MUFU.EX2 are modelled as the H200 does
  them.
"""

from pathlib import Path

import numpy as np
import pytest

from fa_sim import KernelConfig
from fa_sim.crosscheck import SavedRun, build_report, simulate_with_checkpoints
from fa_sim.tensorcore import EXACT, H200, fit

DATA = Path(__file__).parent / "data" / "h200"


def _probe():
    d = np.load(DATA / "mma_probe_192.npz")
    av = np.broadcast_to(d["a"][:, :, None, :], (len(d["a"]), 16, 8, 16))
    bv = np.broadcast_to(d["b"][:, None, :, :], (len(d["b"]), 16, 8, 16))
    return av, bv, d["c"], d["d"]


def test_h200_model_reproduces_every_recorded_mma():
    a, b, c, d = _probe()
    got = H200.dot_add(a, b, c)
    assert np.array_equal(got.view(np.uint32), d.view(np.uint32))
    # the exact-sum model does not: the recording can tell them apart
    assert np.count_nonzero(EXACT.dot_add(a, b, c).view(np.uint32) != d.view(np.uint32)) > 1000


def test_fit_selects_the_h200_model_from_the_recording():
    a, b, c, d = _probe()
    best = fit(a[:64], b[:64], c[:64], d[:64])
    assert best[0].mismatches == 0 and best[0].model == H200
    assert best[1].mismatches > 0


def test_matrix_form_equals_the_recorded_tiles():
    raw = np.load(DATA / "mma_probe_192.npz")
    got = H200.matmul_add(raw["c"], raw["a"], np.swapaxes(raw["b"], -1, -2))
    assert np.array_equal(got.view(np.uint32), raw["d"].view(np.uint32))


@pytest.mark.parametrize("name", ["compare_seed_n128", "compare_causal_tails"])
@pytest.mark.parametrize("engine", ["program", "ptx"])
def test_simulator_reproduces_the_recorded_h200_run_bit_for_bit(name, engine):
    d = SavedRun.load(DATA / f"{name}.npz")  # recorded before the format was versioned: FFMA form
    config = d.config
    assert config == KernelConfig(softmax="ffma")
    ctas = list(d.ctas)
    res, buf = simulate_with_checkpoints(d.q, d.k, d.v, d.causal, d.scale, config, ctas, engine=engine)
    rep = build_report(d.q, d.k, d.v, d.causal, config, ctas, res, buf, d.o, d.lse, d.checkpoints)
    for s in rep.checkpoints:
        assert s.fraction_identical == 1.0, (s.checkpoint, s.first)
    assert rep.outputs.o_identical == 1.0 and rep.outputs.lse_identical == 1.0
    assert rep.ok


def test_the_recorded_variant_replays_from_its_own_source(tmp_path):
    """compare_variant_swizzle_r4.npz holds the source the GPU compiled; the replay simulates that
    source, not today's file, and reproduces the run bit for bit."""
    d = SavedRun.load(DATA / "compare_variant_swizzle_r4.npz")
    assert d.kernel_name == "fa2_fwd_swizzle_r4.patch" and "Swizzle<2,3,3>" in d.kernel_source
    src = tmp_path / f"{Path(d.kernel_name).stem}.cu"  # the source as compiled (a patch's, applied)
    src.write_text(d.kernel_source)
    ctas = list(d.ctas)
    res, buf = simulate_with_checkpoints(d.q, d.k, d.v, d.causal, d.scale, d.config, ctas, kernel=src)
    rep = build_report(d.q, d.k, d.v, d.causal, d.config, ctas, res, buf, d.o, d.lse, d.checkpoints)
    assert rep.ok and all(s.fraction_identical == 1.0 for s in rep.checkpoints)
