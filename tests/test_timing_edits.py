"""The user edits of fa2_fwd.cu in experiments/variants/edits/ (experiments/timing_edits.py): every
edit applies to the current seed, compiles for sm_80 (PTX and cubin) and sm_90 (cubin) and changes
the SASS; a few run on the PTX engine with the bits and hazards EDITS records (slow)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("cuda.bindings.nvrtc", reason="the edits compile with NVRTC (the hw extra)")

from fa_sim.config import KernelConfig  # noqa: E402
from fa_sim.contract import KernelBuild, kernel_source  # noqa: E402
from fa_sim.contract.cubins import compile_build  # noqa: E402
from fa_sim.contract.nvrtc import kernel_ptx  # noqa: E402
from fa_sim.contract.sass import opcode_counts  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _script():
    spec = importlib.util.spec_from_file_location("timing_edits", ROOT / "experiments" / "timing_edits.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


te = _script()


def test_the_edits_are_the_directory_s_patches_and_at_least_twelve():
    on_disk = {p.stem for p in te.EDIT_DIR.glob("*.patch")}
    assert on_disk == set(te.EDITS) and len(on_disk) >= 12
    assert all(te.description(n).startswith(f"Edit of fa_hw/kernels/fa2_fwd.cu ({n}): ") for n in te.EDITS)
    assert any(hazards for _, _, hazards in te.EDITS.values())  # a missing barrier the checker must catch
    assert any(not o_eq for o_eq, _, _ in te.EDITS.values())  # another softmax


def test_the_fuzz_set_is_edits_fuzz_s_patches_of_fa2_fwd():
    fwd = {p.stem for p in te.FUZZ_DIR.glob("*.patch")
           if p.read_text().startswith(f"Edit of fa_hw/kernels/fa2_fwd.cu ({p.stem}): ")}
    assert fwd == set(te.FUZZ) and len(fwd) >= 12 and not set(te.FUZZ) & set(te.EDITS)
    assert all(te.patch_path(n).parent == te.FUZZ_DIR for n in te.FUZZ)
    assert te.main(["--list", "--set", "fuzz"]) == 0
    with pytest.raises(SystemExit):  # an edit of the other set is one argparse line, not a KeyError
        te.main(["--check", "--set", "fuzz", "--edit", "qk_twice"])


@pytest.fixture(scope="module")
def seed_sass():
    return opcode_counts(compile_build(KernelBuild(KernelConfig(), False, "sm_90")).sass())


@pytest.mark.parametrize("name", list(te.EDITS))
def test_edit_applies_and_compiles_for_sm80_and_sm90(name, seed_sass):
    source = kernel_source(str(te.patch_path(name)))
    assert source.text != kernel_source().text
    ptx = kernel_ptx(KernelBuild(KernelConfig(), False, "sm_80", False, source))
    assert ".entry fa2_fwd_kernel(" in ptx
    compile_build(KernelBuild(KernelConfig(), False, "sm_80", False, source))
    sass = opcode_counts(compile_build(KernelBuild(KernelConfig(), False, "sm_90", False, source)).sass())
    assert sass != seed_sass, f"{name}: the same SASS opcode counts as the seed kernel (the compiler undid the edit)"


def test_rolled_loops_and_doubled_work_reach_the_sass(seed_sass):
    """What each edit is for survives ptxas: a loop kept rolled, the QK GEMM's HMMAs doubled, the
    extra barrier and shuffles, a barrier gone."""
    def sass(name):
        return opcode_counts(compile_build(KernelBuild(KernelConfig(), False, "sm_90", False,
                                                       kernel_source(str(te.patch_path(name))))).sass())

    hmma = "HMMA.16816.F32"
    bar = "BAR.SYNC.DEFER_BLOCKING"
    seed = seed_sass
    assert sass("qk_twice")[hmma] == seed[hmma] + seed[hmma] // 2  # QK is half of the HMMAs
    assert sass("pv_rolled")[hmma] < seed[hmma] and sass("qk_rolled")[hmma] < seed[hmma]
    assert sass("extra_barrier")[bar] == seed[bar] + 1 and sass("missing_bar_pv")[bar] == seed[bar] - 1
    assert sass("extra_shuffles").get("SHFL.IDX", 0) > seed.get("SHFL.IDX", 0)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["missing_bar_pv", "missing_bar_epilogue", "qk_twice", "pv_rolled",
                                  "warp0_copies_k", "epilogue_early_exit", "softmax_expf"])
def test_edit_on_the_ptx_engine_gives_the_recorded_bits_and_hazards(name):
    assert te.check([name])[name] == te.EDITS[name]


@pytest.mark.slow
def test_a_fuzz_edit_on_the_ptx_engine_gives_the_recorded_bits():
    """warp_early_return's bug (rows past the returned warps' go unstored) changes O, not LSE."""
    assert te.check(["warp_early_return"])["warp_early_return"] == te.FUZZ["warp_early_return"]


def test_fuzz2_edits_on_the_ptx_engine_give_the_recorded_bits_and_hazards():
    """two_pass_max (no online rescaling) changes O and LSE; o_buffer_no_sync's race is on its own buffer."""
    got = te.check(["two_pass_max", "o_buffer_no_sync"])
    assert got == {n: te.FUZZ2[n] for n in got}


@pytest.mark.parametrize("which", sorted(te.SETS))
def test_recorded_measurements_match_the_edits(which):
    table, path = te.SETS[which]
    if not path.exists():
        pytest.skip(f"{path.relative_to(ROOT)} not recorded yet (experiments/timing_edits.py --measure --set {which} "
                    "on a GPU)")
    data = json.loads(path.read_text())
    got = {(r["edit"], tuple(r["shape"]), r["causal"]) for r in data["rows"]}
    want = {(n, tuple(s[:4]), s[4]) for s in te.SHAPES for n in ["seed", *table]}
    assert got == want and all(r["ms"] > 0 and len(r["batch_ms"]) == data["batches"] for r in data["rows"])
