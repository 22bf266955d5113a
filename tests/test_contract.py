"""fa_sim.contract: kernel variants as patches (a strict unified-diff applier), the kernel source
value both backends take, the occupancy arithmetic, and the one-line errors of a bad --kernel
file or a missing `hw` extra."""

from __future__ import annotations

import difflib
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fa_sim.config import KernelConfig
from fa_sim.contract import (
    HW_EXTRA_INSTALL,
    SEED_PATH,
    HwExtraMissing,
    KernelBuild,
    KernelSourceError,
    Limit,
    PatchError,
    apply_patch,
    kernel_source,
    min_blocks_per_sm,
    resident_ctas,
    seed_source,
)

ROOT = Path(__file__).parent.parent
VARIANT = ROOT / "experiments" / "variants" / "fa2_fwd_swizzle_r4.patch"
SEED = SEED_PATH.read_text()
TARGET = "fa2_fwd.cu"


def _diff(old: str, new: str) -> str:
    return "".join(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                        "a/fa_hw/kernels/fa2_fwd.cu", "b/fa_hw/kernels/fa2_fwd.cu"))


def _apply(patch: str, seed: str = SEED) -> str:
    return apply_patch(seed, patch, name="my.patch", target=TARGET)


# ---- the shipped variant ----------------------------------------------------------------------
def test_the_shipped_variant_is_a_small_patch_of_the_seed():
    source = kernel_source(VARIANT)
    assert source.name == "fa2_fwd_swizzle_r4.patch" and source.origin == VARIANT and not source.is_seed
    added = set(source.text.splitlines()) - set(SEED.splitlines())
    assert "#define FA_SWZ_B 2" in added and len(added) <= 16
    assert set(SEED.splitlines()) <= set(source.text.splitlines())  # it only adds lines
    assert len(VARIANT.read_text().splitlines()) < 40


def test_a_seed_path_is_the_seed():
    assert kernel_source(None) == seed_source() == kernel_source(str(SEED_PATH))
    assert kernel_source(None).is_seed and kernel_source(None).program_name == str(SEED_PATH)


# ---- the applier: what applies, exactly ----------------------------------------------------------
EDITS = st.lists(st.tuples(st.integers(0, 799), st.sampled_from(["delete", "insert", "change"])),
                 min_size=1, max_size=6, unique_by=lambda e: e[0])


@settings(max_examples=40, deadline=None)
@given(EDITS)
def test_any_difflib_patch_applies_to_what_it_was_made_from(edits):
    lines = SEED.splitlines(keepends=True)
    for at, kind in sorted(edits, reverse=True):
        at %= len(lines)
        if kind == "delete":
            del lines[at]
        elif kind == "insert":
            lines.insert(at, f"// inserted at {at}\n")
        else:
            lines[at] = f"// changed {at}\n"
    edited = "".join(lines)
    assert _apply(_diff(SEED, edited)) == edited


def test_preamble_blank_context_and_no_newline_marker():
    seed = "a\nb\n\nc"
    patch = ("diff --git a/fa2_fwd.cu b/fa2_fwd.cu\nindex 1..2 100644\n--- a/fa2_fwd.cu\n+++ b/fa2_fwd.cu\n"
             "@@ -1,4 +1,4 @@\n a\n-b\n+B\n\n c\n\\ No newline at end of file\n")
    assert _apply(patch, seed) == "a\nB\n\nc"
    to_newline = "--- fa2_fwd.cu\n+++ fa2_fwd.cu\n@@ -4 +4 @@\n-c\n\\ No newline at end of file\n+c\n"
    assert _apply(to_newline, seed) == "a\nb\n\nc\n"


def _one_hunk(old_line: str, new_line: str, at: int) -> str:
    return f"--- a/fa2_fwd.cu\n+++ b/fa2_fwd.cu\n@@ -{at},1 +{at},1 @@\n-{old_line}\n+{new_line}\n"


BAD = {
    "context differs": (_one_hunk("not a line of the seed", "x", 5), r"my\.patch: hunk 1 \(@@ -5,1 \+5,1 @@\) does not apply "
                        r"to fa2_fwd\.cu: line 5 is .*, the patch expects 'not a line of the seed'"),
    "past the end": (_one_hunk("x", "y", 100000), r"hunk 1 .* reaches past the end of fa2_fwd\.cu"),
    "another file": ("--- a/other.cu\n+++ b/other.cu\n@@ -1 +1 @@\n-a\n+b\n", r"patches 'a/other\.cu'"),
    "not a diff": ("#define FA_SWZ_B 2\n", r"not a unified diff"),
    "no hunk": ("--- a/fa2_fwd.cu\n+++ b/fa2_fwd.cu\n", r"no hunk"),
    "counts": ("--- a/fa2_fwd.cu\n+++ b/fa2_fwd.cu\n@@ -1,3 +1,3 @@\n-x\n+y\n", r"announces 3 old and 3 new lines but "
               r"its body has 1 and 1"),
    "two files": (_one_hunk("x", "y", 1) + "--- a/fa2_fwd.cu\n+++ b/fa2_fwd.cu\n", r"more than one file"),
    "garbage": (_one_hunk("x", "y", 1) + "some words\n", r"line 6 is neither a hunk header"),
    "overlap": (_diff(SEED, SEED.replace("FA_BLOCK_M", "FA_BLOCK_MM", 1)) * 1
                + "@@ -1,1 +1,1 @@\n-x\n+y\n", r"hunk 2 .* starts before the end of the hunk above it"),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_a_patch_that_does_not_apply_exactly_is_one_line_naming_it(case):
    patch, message = BAD[case]
    with pytest.raises(PatchError, match=message) as info:
        _apply(patch)
    assert "\n" not in str(info.value) and str(info.value).startswith("my.patch: ")


def test_a_whitespace_change_is_a_mismatch():
    first = SEED.splitlines()[0]
    with pytest.raises(PatchError, match="hunk 1"):
        _apply(_one_hunk(first + " ", "x", 1))


# ---- the --kernel value -----------------------------------------------------------------------------
def test_bad_kernel_files_are_one_line_naming_the_file(tmp_path):
    binary = tmp_path / "blob.cu"
    binary.write_bytes(b"\x80\x81\x00binary")
    nul = tmp_path / "nul.cu"
    nul.write_bytes(b"__global__ void f() {}\x00")
    cases = {tmp_path / "missing.cu": "no such file", tmp_path / "k.cuh": "ending in .cu, or a unified diff",
             binary: r"blob\.cu is not UTF-8 text \(byte 0x80 at offset 0\)", nul: "nul.cu is a binary file"}
    (tmp_path / "k.cuh").write_text("x")
    for path, message in cases.items():
        with pytest.raises(KernelSourceError, match=message) as info:
            kernel_source(path, option="--kernel")
        assert str(info.value).startswith(f"--kernel {path}: ") and "\n" not in str(info.value)
    with pytest.raises(KernelSourceError, match="not int"):
        kernel_source(123)
    with pytest.raises(KernelSourceError, match="takes a KernelSource"):
        KernelBuild(kernel="some.cu")


@pytest.mark.parametrize("command", ["sim", "banks", "trace", "hw", "compare", "sweep"])
def test_the_cli_refuses_a_binary_or_unapplicable_kernel_in_one_line(command, tmp_path, capsys):
    from fa_sim.cli import main

    binary = tmp_path / "variant.cu"
    binary.write_bytes(bytes(range(256)))
    stale = tmp_path / "stale.patch"
    stale.write_text(_one_hunk("int this_line_is_not_in_the_seed;", "x", 3))
    for path, message in ((binary, "variant.cu is not UTF-8 text"), (stale, "stale.patch: hunk 1 (@@ -3,1 +3,1 @@) does not apply to fa2_fwd.cu: line 3 is")):
        assert main([command, "--kernel", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err and err.startswith(f"fa {command}: error: --kernel {path}"), err


def test_both_backends_build_the_patched_text():
    from fa_sim.contract.nvrtc import kernel_ptx

    build = KernelBuild(KernelConfig(), arch="sm_80", kernel=kernel_source(VARIANT))
    assert build.source().text == kernel_source(VARIANT).text
    pytest.importorskip("cuda.bindings.nvrtc", reason="NVRTC is the hw extra")
    ptx = kernel_ptx(build)
    assert f'"{VARIANT}"' in ptx and ptx != kernel_ptx(KernelBuild(KernelConfig(), arch="sm_80"))


# ---- without the hw extra ---------------------------------------------------------------------------
@pytest.fixture
def no_cuda(monkeypatch):
    """A Python without the cuda packages: importing them fails as it would there."""
    from fa_hw import device
    from fa_sim.contract import nvrtc
    from fa_sim.ptx import fa2, load

    for name in [m for m in sys.modules if m == "cuda" or m.startswith("cuda.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "cuda", None)
    caches = (nvrtc.nvrtc_version, device.device, fa2._program)
    for cached in caches:
        cached.cache_clear()
    load.clear_memo()
    yield
    for cached in caches:
        cached.cache_clear()


def test_compiling_without_the_hw_extra_says_what_to_install(no_cuda):
    from fa_sim.contract.nvrtc import compile_ptx

    with pytest.raises(HwExtraMissing, match=r"needs the 'hw' extra, which is not installed \(No module named "
                                             r"'cuda[.a-z]*'\): pip install -e \"\.\[hw\]\" in a checkout, or pip install "
                                             r"\"flashsim\[hw\]\"") as info:
        compile_ptx("__global__ void f() {}")
    assert isinstance(info.value, ImportError) and HW_EXTRA_INSTALL in str(info.value)


@pytest.mark.parametrize("argv", [["sim", "--engine", "ptx", "--seqlen", "64"],
                                  ["sim", "--kernel", str(VARIANT), "--seqlen", "64"],
                                  ["hw", "--seqlen", "16"], ["compare", "--seqlen", "16"]])
def test_commands_without_the_hw_extra_are_one_line(no_cuda, argv, capsys):
    from fa_sim.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"fa {argv[0]}: error: ") and 'pip install -e ".[hw]"' in err
    assert 'pip install "flashsim[hw]"' in err


# ---- occupancy -----------------------------------------------------------------------------------
@pytest.mark.parametrize("registers, smem, threads, ctas, limit", [
    (128, 24 * 1024, 128, 4, Limit.REGISTERS),  # 4096 registers a warp: 4 warps per sub-partition
    (124, 24 * 1024, 128, 4, Limit.REGISTERS),  # 3968 rounds up to 4096
    (255, 0, 128, 2, Limit.REGISTERS),  # 8192 a warp: 2 per sub-partition, 8 warps
    (64, 48 * 1024, 256, 3, Limit.SHARED_MEMORY),  # 49 KB of 164 KB
    (32, 0, 1024, 2, Limit.THREADS),  # 2048 threads
    (16, 0, 32, 32, Limit.CTAS),  # 64 warps would fit; 32 CTAs is the limit
    (0, 0, 32, 32, Limit.CTAS),  # no registers at all
    (72, 0, 1024, 0, Limit.REGISTERS),  # 72 * 1024 > 65536: the launch fails
])
def test_resident_ctas_follows_the_occupancy_rules(registers, smem, threads, ctas, limit):
    occ = resident_ctas(registers, smem, threads)
    assert (occ.ctas, occ.limited_by) == (ctas, limit)
    assert occ.warps(threads) == ctas * -(-threads // 32)
    assert resident_ctas(np.int64(registers), np.int32(smem), threads) == occ  # numpy integers too


def test_the_heuristic_target_is_resident_with_the_registers_it_leaves():
    for cfg in KernelConfig.family():
        target = min_blocks_per_sm(cfg)
        per_thread = min(255, 65536 // (target * cfg.n_threads)) // 8 * 8  # what __launch_bounds__ leaves
        assert resident_ctas(per_thread, cfg.smem_bytes, cfg.n_threads).ctas >= target, cfg.tag
    assert min_blocks_per_sm(KernelConfig()) == 4


@pytest.mark.parametrize("args", [(256, 0, 128), (-1, 0, 128), (32, 10**6, 128), (32, 0, 0), (32, 0, 2048),
                                  (1.5, 0, 128), (True, 0, 128), ("32", 0, 128)])
def test_resident_ctas_refuses_what_sm80_cannot_launch(args):
    with pytest.raises(ValueError, match="must be an integer in"):
        resident_ctas(*args)
