"""LDGSTS as Nsight Compute counts it in the GQA and K/V-tail launches (CPU only: NVRTC, nvdisasm,
the PTX engine). The H100 measured (fa compare --banks, m64n64d64w4-swizzled, fp16, B = 1, H = 4,
Nq = 200; smsp__inst_executed_op_ldgsts.sum / ..._wavefronts_mem_shared_op_ldgsts_cache_bypass.sum):

    Nk = 150, H_k = 2      1,856 instructions   7,232 wavefronts
    Nk = 150               1,792                7,232
    Nk = 200               2,304                9,216
    Nk = 200, H_k = 2      2,368                9,216
    Nk = 150, H_k = 2, window 40,8   1,344      5,168

(a) instructions: the GQA build's SASS issues the Q copy's interior arm with a guard
(fa_sim.timing.issued); (b) wavefronts: a cp.async whose lanes mix copies and zero fills costs
more (fa_sim.observers.banks.mixed_zero_fill_wavefronts)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from fa_sim.config import KernelConfig
from fa_sim.contract import KernelBuild
from fa_sim.contract.cubins import compile_build
from fa_sim.observers.banks import BankCounter, SmemClass, ldgsts_wavefronts, mixed_zero_fill_wavefronts
from fa_sim.simulate import simulate
from fa_sim.timing.issued import issued_counts
from fa_sim.timing.paths import analyze, off_classes, on_classes

CFG = KernelConfig.from_tag("m64n64d64w4-swizzled")
H100 = {  # (Nk, H_k, window): (instructions, wavefronts) Nsight Compute counted
    (150, 2, None): (1856, 7232), (150, 4, None): (1792, 7232), (200, 4, None): (2304, 9216),
    (200, 2, None): (2368, 9216), (150, 2, (40, 8)): (1344, 5168)}


def _sass(kv_group: int) -> str:
    return compile_build(KernelBuild(CFG, False, "sm_90", kv_group=kv_group)).sass()


def _ldgsts(text: str) -> list[str]:
    """The LDGSTS of a listing in address order, each as '[guard ]opcode operands'."""
    return [m.group(1).strip() for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+([^;]*LDGSTS[^;]*);", text)]


def test_gqa_build_guards_the_q_copys_interior_arm():
    """Both builds hold 32 LDGSTS (8 copy arms of 4: Q, K, V, K[t+1], interior and boundary); the
    plain build issues none with a guard, the GQA build the first four (Q's interior arm, `@!P1`,
    followed by `@!P1 BRA` over the boundary arm), so its prologue has a path issuing 4 off."""
    plain, gqa = _sass(1), _sass(2)
    assert len(_ldgsts(plain)) == len(_ldgsts(gqa)) == 32
    assert not [i for i in _ldgsts(plain) if i.startswith("@")]
    guarded = [i for i in _ldgsts(gqa) if i.startswith("@")]
    assert len(guarded) == 4 and all(i.startswith("@!P1 LDGSTS") for i in guarded)
    assert _ldgsts(gqa).index(guarded[0]) == 0
    for text, offs in ((plain, {(8, 0)}), (gqa, {(8, 0), (8, 4)})):
        ks = analyze(text)
        assert {(on_classes(w)["LDGSTS"], off_classes(w).get("LDGSTS", 0)) for w in ks.prologue} == offs
        for region in (ks.trip, ks.last_trip):  # K/V copies: branches, never guarded
            assert all(not off_classes(w).get("LDGSTS") for w in region)


def _inputs(nk: int, heads_k: int):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 4, 200, 64)).astype(np.float16)
    k, v = (rng.standard_normal((1, heads_k, nk, 64)).astype(np.float16) for _ in range(2))
    return q, k, v


@pytest.mark.parametrize("nk,heads_k,window", list(H100))
def test_sass_walk_issues_the_ldgsts_nsight_compute_counted(nk, heads_k, window):
    """The PTX run walked through the sm_90 SASS issues what the H100 executed; the run itself, the
    PTX's cp.async, 64 fewer in a GQA build (4 Q-tail CTAs x 4 warps x 4 guard-off LDGSTS)."""
    issued, ran = issued_counts(*_inputs(nk, heads_k), False, None, CFG, window=window, arch="sm_90")
    assert issued["LDGSTS"] == H100[nk, heads_k, window][0]
    assert ran["LDGSTS"] == issued["LDGSTS"] - (64 if heads_k == 2 else 0)
    assert all(issued[c] == ran[c] for c in ("LDSM", "LDS", "STS"))  # the classes that matched


@pytest.mark.parametrize("nk,heads_k,window", list(H100))
@pytest.mark.parametrize("engine", ["program", "ptx"])
def test_ldgsts_wavefronts_of_tail_tiles_match_nsight_compute(nk, heads_k, window, engine):
    """Nk = 150: the tail tile's 22 rows leave one warp instruction per K/V tail copy half copied,
    half zero-filled (rows 20-23 of warp 1's second pass): 2 wavefronts more each."""
    counter = BankCounter()
    simulate(*_inputs(nk, heads_k), config=CFG, observers=[counter], window=window, engine=engine, progress=False)
    got = counter.report().by_class()[SmemClass.LDGSTS]
    assert got.wavefronts == H100[nk, heads_k, window][1]
    assert got.wavefronts - got.ideal == (H100[nk, heads_k, window][1] - 4 * got.instructions)


def _rows(n_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """A warp copying 4 whole 128-byte rows (8 lanes each), rows r of shared and global alike."""
    lane = np.arange(32)
    addr = 128 * (lane // 8) + 16 * (lane % 8)
    return addr[None], (1 << 20) + addr[None]


def test_mixed_zero_fill_rule():
    dst, src = _rows(4)
    mask = np.ones((1, 32), bool)
    assert ldgsts_wavefronts(dst, src, mask).sum() == 4
    for fetched_lanes, extra in ((32, 0), (0, 0), (16, 2), (8, 1), (24, 3)):  # the copied lanes once more
        fetched = np.arange(32)[None] < fetched_lanes
        assert mixed_zero_fill_wavefronts(dst, src, mask, fetched)[0] == extra, fetched_lanes
    # an inactive lane is neither: a warp whose other lanes all copy is not mixed
    assert mixed_zero_fill_wavefronts(dst, src, np.arange(32)[None] < 16, np.arange(32)[None] < 16)[0] == 0


#: LDGSTS wavefronts Nsight Compute counted on the H100 (fa compare --banks, m64n64d64w4-swizzled,
#: fp16, d = 64) in launches whose tail copies split 1 + 3 and 3 + 1 rows, not only 2 + 2: what
#: tells the copied-lanes reading of mixed_zero_fill_wavefronts from the zero-filled one (4418,
#: 5452, 1162 by the latter).
MIXED_TAILS = {
    "packed 70,130,5 H=2": (dict(seqlens=(70, 130, 5), heads=2), 4406),
    "split 3, cache 300,170": (dict(batch=2, heads=4, nk=300, cache=(300, 170), splits=3), 5412),
    "split 1, cache 199": (dict(batch=1, heads=2, nk=200, cache=(199,), splits=1), 1166),
}


@pytest.mark.parametrize("case", list(MIXED_TAILS))
def test_ldgsts_wavefronts_of_packed_and_split_tails_match_nsight_compute(case):
    from packed_inputs import packed_inputs

    spec, want = MIXED_TAILS[case]
    counter = BankCounter()
    if "seqlens" in spec:
        q, k, v, cq, ck = packed_inputs(spec["seqlens"], spec["seqlens"], spec["heads"], spec["heads"], 64)
        simulate(q, k, v, config=CFG, observers=[counter], engine="ptx", cu_seqlens_q=cq, cu_seqlens_k=ck,
                 progress=False)
    else:
        rng = np.random.default_rng(0)
        b, h = spec["batch"], spec["heads"]
        q = rng.standard_normal((b, h, 1, 64)).astype(np.float16)
        k, v = (rng.standard_normal((b, h, spec["nk"], 64)).astype(np.float16) for _ in range(2))
        simulate(q, k, v, config=CFG, observers=[counter], engine="ptx", splits=spec["splits"],
                 cache_seqlens=np.array(spec["cache"], np.int32), progress=False)
    assert counter.report().by_class()[SmemClass.LDGSTS].wavefronts == want
