"""The PTX engine runs kernels that are not attention: the two probes that measured the H200
(fa_sim/calibrate/mma_probe.py, fa_sim/calibrate/ldgsts_probe.py) reproduce their recordings.

- mma_probe: 192 random m16n8k16 MMAs; with the fitted tensor-core model (fa_sim.tensorcore.H200)
  the engine's D equals the H200's bit for bit (tests/data/h200/mma_probe_192.npz).
- ldgsts_probe: one warp per shared-memory pattern of cp.async.cg; the engine's bank counter gives
  the wavefronts Nsight Compute counted on the H200 (tests/data/h200/ldgsts_probe.json) for every
  pattern the rule covers, and the copied bytes land where the pattern says.
"""

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("cuda.bindings.nvrtc", reason="the PTX engine compiles with NVRTC (the hw extra)")

from fa_sim.calibrate import ldgsts_probe, mma_probe  # noqa: E402
from fa_sim.observers import BankCounter, SmemClass  # noqa: E402
from fa_sim.ptx import launch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
H200 = ROOT / "tests" / "data" / "h200"
WAVEFRONTS = "smsp__sass_l1tex_data_pipe_lsu_wavefronts_mem_shared_op_ldgsts_cache_bypass.sum"
RULE_EXCEPTION = "stride 32B"  # never issued by the kernel; fa_sim.observers.banks.ldgsts_wavefronts says why


def test_mma_probe_reproduces_the_h200_recording():
    probe = mma_probe
    rec = np.load(H200 / "mma_probe_192.npz")
    a, b, c, d = rec["a"], rec["b"], rec["c"], rec["d"]
    n = a.shape[0]
    out = np.zeros((n, 16, 8), np.float32)
    launch(probe.PROBE_SRC, grid=(n + 3) // 4, block=128, mma_model="h200",
           args=[a.view(np.uint16), b.view(np.uint16), c, out, np.int32(n)])
    np.testing.assert_array_equal(out.view(np.uint32), d.view(np.uint32))
    exact = np.zeros_like(out)
    launch(probe.PROBE_SRC, grid=(n + 3) // 4, block=128, args=[a.view(np.uint16), b.view(np.uint16), c, exact,
                                                               np.int32(n)])
    assert not np.array_equal(exact.view(np.uint32), d.view(np.uint32))  # the model is what makes it exact


def test_ldgsts_probe_reproduces_ncu_on_the_h200():
    probe = ldgsts_probe
    data = json.loads((H200 / "ldgsts_probe.json").read_text())
    src = (np.arange(4 * 32, dtype=np.uint64) * 2654435761 % (1 << 32)).astype(np.uint32)  # lane l: words 4l..4l+3
    checked = 0
    for name, offsets in data["patterns"].items():
        off = np.asarray(offsets, np.int32)
        sink = np.zeros(32, np.uint32)
        banks = BankCounter()
        launch(probe.SRC, grid=1, block=32, smem_bytes=8192, args=[src, off, sink], observers=[banks])
        on = off >= 0
        owner = {o: lane for lane, o in enumerate(offsets) if o >= 0}  # the last lane to copy there wins
        want = np.array([src[4 * owner[o]] for o in off[on]], np.uint32)
        np.testing.assert_array_equal(sink[on], want, err_msg=name)
        got = sum(w * n for w, n in banks.report().per_instruction[SmemClass.LDGSTS].items())
        if name != RULE_EXCEPTION:
            assert got == data["ncu"][name][WAVEFRONTS], name
            checked += 1
    assert checked == len(data["patterns"]) - 1
