"""The PTX engine's ALU handlers against the H200, bit for bit, on the CPU (no GPU needed).

tests/data/h200/alu_probe.npz is `python -m fa_sim.calibrate.alu_probe all` as run on the H200 (sm_90,
driver 580 / CUDA 13.0; issue 9): the GPU's outputs of the first 219 probe forms, 4096 inputs
each, which the probe regenerates from the recorded seed. Each recorded exact form (IEEE
arithmetic in every rounding mode, integer, bit, compare/select, cvt, f16x2/bf16x2, with every
NaN rule of fa_sim.isa.nans) runs again through alu_probe.compare_form, the path of `alu_probe.py
compare`, and must reproduce every recorded output. The MUFU forms are measured, not asserted
(their models are another issue's). Forms added to the probe after the recording are asserted
by tests/test_alu_gpu.py on a GPU.
"""

import re
from pathlib import Path

import numpy as np
import pytest

from fa_sim.calibrate import alu_probe

RECORDING = Path(__file__).parent / "data" / "h200" / "alu_probe.npz"
RECORDED_FORMS = 231  # the forms of the latest device run
EXACT = [k for k in range(RECORDED_FORMS) if alu_probe.FORMS[k].exact]


def _form_id(k: int) -> str:
    return re.sub(r"[^\w.]+", "_", alu_probe.FORMS[k].ptx).strip("_")


@pytest.fixture(scope="module")
def recording():
    return alu_probe.load_recording(RECORDING)


def test_the_recording_holds_the_first_forms_of_the_probe(recording):
    gpu, seed = recording
    assert gpu.shape == (RECORDED_FORMS, alu_probe.N) and gpu.dtype == np.uint64 and seed == 0
    assert len(EXACT) == 223


@pytest.mark.parametrize("k", EXACT, ids=_form_id)
def test_exact_form_reproduces_the_h200(recording, k):
    gpu, seed = recording
    row = alu_probe.compare_form(k, gpu[k], seed)
    assert row["mismatches"] == 0, alu_probe.report([row])


def test_a_wrong_handler_is_caught(recording, monkeypatch):
    # The replay can fail: the old fns (base taken mod 32) disagrees with the H200 on 259 inputs.
    from fa_sim.isa import bits

    k = next(k for k in EXACT if alu_probe.FORMS[k].ptx.startswith("fns.b32"))
    real = bits.fns
    monkeypatch.setattr(bits, "fns", lambda m, base, off: real(m, np.asarray(base) & np.uint32(31), off))
    gpu, seed = recording
    assert alu_probe.compare_form(k, gpu[k], seed)["mismatches"] == 259
