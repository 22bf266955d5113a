"""The attention kernel on the PTX engine: fa2_fwd.cu itself, bit for bit against the
hand-written program, and the mutations that used to pass unseen without a GPU.

Agreement: for all 78 configurations x causal, on shapes with tails (Nq, Nk not multiples of the
tiles, Nk != Nq, N = 1), O, LSE, warp-instruction counts per (class, phase, round), bank counts
and every checkpoint are equal bit for bit. Mutations of the .cu - a user's edit - are simulated
by compiling the edited file (`kernel=`): a dropped barrier or wait is a hazard report with the
CUDA source line, a changed shuffle or constant shows in the results.
"""

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

pytest.importorskip("cuda.bindings.nvrtc", reason="the PTX engine compiles with NVRTC (the hw extra)")

import fa_sim  # noqa: E402
from fa_sim.checkpoints import CHECKPOINTS  # noqa: E402
from fa_sim.crosscheck import CheckpointRecorder  # noqa: E402
from fa_sim.observers import BankCounter, HazardChecker, HazardKind, SmemClass  # noqa: E402
from fa_sim.contract import SEED_PATH  # noqa: E402

FAMILY = fa_sim.KernelConfig.family()
SHAPES = ((70, 130), (128, 128), (1, 50), (200, 33))  # (Nq, Nk): tails, Nk > Nq, N = 1, Nk < Nq


def _inputs(cfg, nq, nk, seed=0, heads=2):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, heads, nq, cfg.head_dim)).astype(np.float16)
    k, v = (rng.standard_normal((1, heads, nk, cfg.head_dim)).astype(np.float16) for _ in range(2))
    return q, k, v


def _run(engine, q, k, v, cfg, causal, kernel=None, ctas=(0,)):
    banks, ck = BankCounter(), CheckpointRecorder(ctas)
    res = fa_sim.simulate(q, k, v, causal=causal, config=cfg, engine=engine, kernel=kernel, observers=[banks])
    res_ck = fa_sim.simulate(q, k, v, causal=causal, config=cfg, engine=engine, kernel=kernel, observers=[ck])
    return res, banks.report().to_json(), ck.buffer, res_ck


def assert_same(a, b):
    (ra, ba, ca, _), (rb, bb, cb, _) = a, b
    assert np.array_equal(ra.o.view(np.uint16), rb.o.view(np.uint16)), "O differs"
    assert np.array_equal(ra.lse.view(np.uint32), rb.lse.view(np.uint32)), "LSE differs"
    assert dict(ra.counts) == dict(rb.counts), "instruction counts differ"
    assert ba == bb, "bank counts differ"
    for i, ck in enumerate(CHECKPOINTS):
        assert np.array_equal(ca[:, i], cb[:, i]), f"checkpoint {ck.value} differs"


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("cfg", FAMILY, ids=lambda c: c.tag)
def test_ptx_engine_equals_the_program(cfg, causal):
    i = FAMILY.index(cfg)
    nq, nk = SHAPES[(i + causal) % len(SHAPES)]
    q, k, v = _inputs(cfg, nq, nk, seed=i)
    n_ctas = -(-nq // cfg.block_m) * 2
    ctas = sorted({0, n_ctas - 1})
    assert_same(_run("program", q, k, v, cfg, causal, ctas=ctas), _run("ptx", q, k, v, cfg, causal, ctas=ctas))


@settings(max_examples=12, deadline=None, derandomize=True, database=None)
@given(nq=st.integers(1, 300), nk=st.integers(1, 300), causal=st.booleans(),
       cfg=st.sampled_from([FAMILY[0], fa_sim.KernelConfig(block_m=128, n_warps=8, smem="padded"),
                            fa_sim.KernelConfig(head_dim=32, block_n=32, smem="plain")]))
def test_ptx_engine_equals_the_program_on_any_shape(nq, nk, causal, cfg):
    q, k, v = _inputs(cfg, nq, nk, seed=nq * 1000 + nk, heads=1)
    a = fa_sim.simulate(q, k, v, causal=causal, config=cfg)
    b = fa_sim.simulate(q, k, v, causal=causal, config=cfg, engine="ptx")
    assert np.array_equal(a.o.view(np.uint16), b.o.view(np.uint16))
    assert np.array_equal(a.lse.view(np.uint32), b.lse.view(np.uint32))
    assert dict(a.counts) == dict(b.counts)


def _edited(tmp_path: Path, old: str, new: str, count: int = 1) -> Path:
    """fa2_fwd.cu with one edit, as a user would make it."""
    text = SEED_PATH.read_text()
    assert text.count(old) >= 1, old
    path = tmp_path / "fa2_fwd_edited.cu"
    path.write_text(text.replace(old, new, count))
    return path


def _source_line(path: Path, needle: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


# Each synchronisation site of the kernel, the edit that removes (or moves) it, and the hazard
# it must produce (SCHEDULE.md; the program's fa_sim.kernels.Mutation has the same sites).
SYNC_MUTATIONS = {
    "drop BAR_QK": ("#define FA_DROP_BAR_QK 1\n", HazardKind.RAW_NO_BARRIER, "ldsm_x4(tCrQ[mi]"),
    "drop BAR_PV": ("#define FA_DROP_BAR_PV 1\n", HazardKind.RAW_NO_BARRIER, "ldsm_x4_trans(r,"),
    "drop BAR_EPILOGUE": ("#define FA_DROP_BAR_EPILOGUE 1\n", HazardKind.RAW_NO_BARRIER, "lds128(x,"),
    "late WAIT_QK": ("#define FA_LATE_WAIT_QK 1\n", HazardKind.RAW_ASYNC, "ldsm_x4(tCrQ[mi]"),
    "late WAIT_PV": ("#define FA_LATE_WAIT_PV 1\n", HazardKind.RAW_ASYNC, "ldsm_x4_trans(r,"),
}


@pytest.mark.parametrize("name", list(SYNC_MUTATIONS))
def test_a_missing_barrier_or_wait_in_the_cu_is_a_hazard_at_its_source_line(name, tmp_path):
    define, kind, reader = SYNC_MUTATIONS[name]
    path = tmp_path / "fa2_fwd_mutated.cu"
    path.write_text(define + SEED_PATH.read_text())
    cfg = FAMILY[0]
    q, k, v = _inputs(cfg, 128, 192)
    clean = HazardChecker()
    fa_sim.simulate(q, k, v, config=cfg, engine="ptx", observers=[clean])
    assert clean.report().ok
    hz = HazardChecker(limit=10**6)  # every hazard kept: the first ones may be of another kind
    fa_sim.simulate(q, k, v, config=cfg, engine="ptx", kernel=path, observers=[hz])
    rep = hz.report()
    hits = [h for h in rep.hazards if h.kind is kind]
    assert hits, f"{name}: no {kind.name} reported"
    h = hits[0]
    assert h.src is not None and h.src.file.endswith(path.name)
    lines = {h.src.line} | {line for _, line, _ in h.src.inlined_at}  # the asm helper, and its callers
    assert _source_line(path, reader) in lines, (name, h.src, h.ptx)
    assert 0 <= h.warp < cfg.n_warps and 0 <= h.lane < 32 and h.region in ("sQ", "sK", "sV", "sO")


# Edits of the arithmetic or data movement that every CPU test used to miss: each makes the PTX
# engine disagree with the hand-written program (the readable model of the spec). (An XOR 3 in
# the second sum shuffle would not: it adds the same quad in the same order - an equivalent edit.)
VALUE_MUTATIONS = {
    "first quad shuffle XOR 2 -> 4": ("x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));",
                                      "x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 4));"),
    "second sum shuffle XOR 1 -> 2": ("return __fadd_rn(x, __shfl_xor_sync(0xffffffffu, x, 1));",
                                      "return __fadd_rn(x, __shfl_xor_sync(0xffffffffu, x, 2));"),
    "log2(e) one ulp off": ("1.4426950408889634f", "1.4426951f"),
    "K fragment halves swapped": ("tCrK[2 * jj][0] = r[0], tCrK[2 * jj][1] = r[1]",
                                  "tCrK[2 * jj][0] = r[1], tCrK[2 * jj][1] = r[0]"),
}


@pytest.mark.parametrize("name", list(VALUE_MUTATIONS))
def test_a_changed_cu_no_longer_agrees_with_the_program(name, tmp_path):
    path = _edited(tmp_path, *VALUE_MUTATIONS[name])
    cfg = FAMILY[0]
    q, k, v = _inputs(cfg, 128, 128)
    a = fa_sim.simulate(q, k, v, config=cfg)
    b = fa_sim.simulate(q, k, v, config=cfg, engine="ptx", kernel=path)
    assert not (np.array_equal(a.o.view(np.uint16), b.o.view(np.uint16))
                and np.array_equal(a.lse.view(np.uint32), b.lse.view(np.uint32))), name


def test_a_weaker_swizzle_variant_costs_two_wavefronts_per_matrix():
    """experiments/variants/fa2_fwd_swizzle_r4.patch XORs the chunk with r % 4: rows r and r + 4 of an
    8x8 matrix share banks, so ldmatrix.x4 costs 8 wavefronts (not 4) and the sO stores 2 (not 1);
    the results are those of the seed kernel, which computes the same thing."""
    variant = Path(__file__).parent.parent / "experiments" / "variants" / "fa2_fwd_swizzle_r4.patch"
    cfg = FAMILY[0]
    q, k, v = _inputs(cfg, 128, 128)
    counts = {}
    for name, kernel in (("seed", None), ("variant", variant)):
        banks = BankCounter()
        res = fa_sim.simulate(q, k, v, config=cfg, engine="ptx", kernel=kernel, observers=[banks])
        per = banks.report().per_instruction
        counts[name] = (dict(per[SmemClass.LDSM]), dict(per[SmemClass.STS]), res)
    assert counts["seed"][0] == {4: 1152} and counts["seed"][1] == {1: 256}  # 2 heads x 2 CTAs
    assert counts["variant"][0] == {8: 1152} and counts["variant"][1] == {2: 256}
    assert np.array_equal(counts["seed"][2].o, counts["variant"][2].o)


def test_the_variant_run_on_the_h200_replays_on_the_ptx_engine():
    """tests/data/h200/compare_variant_swizzle_r4.npz: `fa compare --kernel
    experiments/variants/fa2_fwd_swizzle_r4.patch --seqlen 256 --heads 2 --save ...` on the H200
    (its Nsight Compute counts: LDSM 36,864 wavefronts for 4,608 instructions, STS 1,024 for 512,
    equal to the simulator's). Replayed here from the source the GPU compiled (stored in the run):
    every checkpoint, O and LSE bit-identical; --kernel with the patch is accepted because it gives
    the recorded text, and a kernel of another text is refused."""
    import tempfile

    import numpy as np

    from fa_sim.cli import main
    from fa_sim.contract import kernel_source

    root = Path(__file__).parent.parent
    run = root / "tests" / "data" / "h200" / "compare_variant_swizzle_r4.npz"
    variant = root / "experiments" / "variants" / "fa2_fwd_swizzle_r4.patch"
    assert main(["compare", "--gpu-npz", str(run), "--json"]) == 0
    recorded = str(np.load(run)["kernel_source"])
    with tempfile.TemporaryDirectory() as d:  # the recorded text as a file of its own: accepted
        same = Path(d) / "fa2_fwd_swizzle_r4.cu"
        same.write_text(recorded)
        assert main(["compare", "--gpu-npz", str(run), "--kernel", str(same)]) == 0
    # the patch is accepted exactly when it gives the recorded text (an edit of fa2_fwd.cu since the
    # recording moves what it applies to: then it is refused, until the run is recorded again)
    assert main(["compare", "--gpu-npz", str(run), "--kernel", str(variant)]) == (
        0 if kernel_source(str(variant)).text == recorded else 2)
    assert main(["compare", "--gpu-npz", str(run), "--kernel", str(SEED_PATH)]) == 2


def test_a_variant_that_ignores_an_option_its_config_sets_is_refused(tmp_path):
    """A copy of fa2_fwd.cu from before an option existed would build the spec's schedule under a
    config that says otherwise: both backends refuse it, naming the macro."""
    from fa_sim.contract.cubins import compile_build
    from fa_sim.contract import KernelBuild, kernel_source

    old = tmp_path / "old_copy.cu"
    old.write_text(SEED_PATH.read_text().replace("FA_KV_STAGES", "FA_STAGES_RENAMED"))
    cfg = fa_sim.KernelConfig(block_m=128, kv_stages=2)
    q, k, v = _inputs(cfg, 64, 64)
    with pytest.raises(ValueError, match=r"old_copy.cu does not use FA_KV_STAGES=2"):
        fa_sim.simulate(q, k, v, config=cfg, kernel=old)
    with pytest.raises(ValueError, match=r"does not use FA_KV_STAGES=2"):
        compile_build(KernelBuild(cfg, False, "sm_90", kernel=kernel_source(old)), use_cache=False)
    spec = fa_sim.KernelConfig(block_m=128)  # kv_stages=1: the macro may be ignored
    assert fa_sim.simulate(q, k, v, config=spec, kernel=old).o.shape == q.shape


def test_a_variant_may_read_its_own_device_variables(tmp_path):
    """A __device__ / __constant__ variable of a variant is a global buffer with its initial bytes,
    as fa_sim.ptx.launch gives any kernel (it used to be 'symbol ... has no address')."""
    text = SEED_PATH.read_text()
    head = 'extern "C" __global__ void __launch_bounds__'
    assert text.count(head) == 1 and text.count("  // phase: setup\n") == 1
    text = text.replace(head, "__device__ int fa_skip_flag = 0;\n__constant__ float fa_one[1] = {1.f};\n" + head)
    text = text.replace("  // phase: setup\n", "  // phase: setup\n  if (fa_skip_flag || fa_one[0] != 1.f) return;\n")
    path = tmp_path / "fa2_fwd_globals.cu"
    path.write_text(text)
    cfg = FAMILY[0]
    q, k, v = _inputs(cfg, 70, 70)
    a = fa_sim.simulate(q, k, v, config=cfg, engine="ptx")
    b = fa_sim.simulate(q, k, v, config=cfg, kernel=path)
    assert np.array_equal(a.o.view(np.uint16), b.o.view(np.uint16))
    assert np.array_equal(a.lse.view(np.uint32), b.lse.view(np.uint32))
