"""The PTX engine's ALU handlers against the GPU, bit for bit (fa_sim/calibrate/alu_probe.py).

Marked `gpu`: skipped cleanly without an NVIDIA GPU. Every exact form (IEEE arithmetic in all
rounding modes, integer, bit, compare/select and cvt forms, and the MUFU forms of
alu_probe.MUFU_EXACT) must match; the other MUFU forms are measured, not asserted (fa_sim.isa.sfu).
"""

import pytest

import fa_hw
from fa_sim.calibrate import alu_probe

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def rows():
    if not fa_hw.has_gpu():
        pytest.skip("no NVIDIA GPU / driver here")
    pytest.importorskip("cupy")
    return alu_probe.compare(alu_probe.run_on_gpu())


def test_exact_forms_match_the_gpu_bit_for_bit(rows):
    bad = [r for r in rows if r["exact"] and r["mismatches"]]
    assert not bad, alu_probe.report(bad)


def test_every_form_ran(rows):
    assert len(rows) == len(alu_probe.FORMS)
