"""fa_sim.contract's rules where a plausible simplification gives another answer (issue 36, item 2:
mutants of the newest code that survived a mutation run):

- occupancy: registers are allocated per warp within each of the 4 sub-partitions (16384 registers
  each), so a CTA of 1 or 2 warps holds fewer CTAs per SM than the whole register file (65536)
  divided by its registers would say;
- the patch applier: a hunk without context lines (`diff -U0`, difflib with n=0) inserts after the
  line its header names (`@@ -l,0 +m,n @@`: after line l, 0 before the first), and deletes exactly
  the lines it names.
"""

from __future__ import annotations

import difflib

import pytest

from fa_sim.contract import Limit, apply_patch, resident_ctas

TARGET = "fa2_fwd.cu"
HEADER = "--- a/fa2_fwd.cu\n+++ b/fa2_fwd.cu\n"
SEED = "".join(f"line {i}\n" for i in range(1, 9))


# ---- occupancy: the register file split over the sub-partitions ---------------------------------------
@pytest.mark.parametrize("registers, threads, ctas, whole_sm", [
    # 200 registers a thread: 6400 a warp; a sub-partition's 16384 hold 2 warps (not 2.56): 8 warps per SM,
    # where 65536 // 6400 would be 10
    (200, 64, 4, 5),  # 2 warps a CTA: 8 // 2 = 4 CTAs (whole file: 10 // 2 = 5)
    (200, 32, 8, 10),  # 1 warp a CTA
    # 160 registers: 5120 a warp, 3 per sub-partition (16384 // 5120), 12 per SM (whole file: 12 too)
    (160, 32, 12, 12),
    # 96 registers: 3072 a warp, 5 per sub-partition (20 per SM; whole file 21)
    (96, 32, 20, 21),
    (96, 64, 10, 10),
    (96, 96, 6, 7),  # 3 warps a CTA: 20 // 3 = 6 (whole file: 21 // 3 = 7)
])
def test_registers_are_allocated_per_sub_partition(registers, threads, ctas, whole_sm):
    occ = resident_ctas(registers, 0, threads)
    assert occ.by_limit[Limit.REGISTERS] == ctas
    assert (occ.ctas, occ.limited_by) == (ctas, Limit.REGISTERS)
    per_warp = -(-registers * 32 // 256) * 256
    assert 65536 // per_warp // -(-threads // 32) == whole_sm  # what a whole-SM split would say


# ---- the patch applier: hunks without context ---------------------------------------------------------
def _apply(patch: str, seed: str = SEED) -> str:
    return apply_patch(seed, HEADER + patch, name="my.patch", target=TARGET)


def _lines(*numbers_or_text) -> str:
    return "".join(x if isinstance(x, str) else f"line {x}\n" for x in numbers_or_text)


@pytest.mark.parametrize("patch, want", [
    ("@@ -3,0 +4,2 @@\n+new a\n+new b\n", _lines(1, 2, 3, "new a\n", "new b\n", 4, 5, 6, 7, 8)),  # after line 3
    ("@@ -0,0 +1 @@\n+first\n", _lines("first\n", 1, 2, 3, 4, 5, 6, 7, 8)),  # before the first line
    ("@@ -8,0 +9 @@\n+last\n", _lines(1, 2, 3, 4, 5, 6, 7, 8, "last\n")),  # after the last
    ("@@ -1,0 +2 @@\n+x\n@@ -5,0 +7 @@\n+y\n", _lines(1, "x\n", 2, 3, 4, 5, "y\n", 6, 7, 8)),  # two hunks
    ("@@ -4 +3,0 @@\n-line 4\n", _lines(1, 2, 3, 5, 6, 7, 8)),  # a deletion without context
    ("@@ -2,2 +2 @@\n-line 2\n-line 3\n+two and three\n", _lines(1, "two and three\n", 4, 5, 6, 7, 8)),
], ids=["insert-after-3", "insert-at-start", "insert-at-end", "two-insertions", "delete-4", "replace-2-3"])
def test_a_hunk_without_context_applies_at_the_line_its_header_names(patch, want):
    assert _apply(patch) == want


def test_difflib_zero_context_patches_apply_to_what_they_were_made_from():
    """difflib.unified_diff(n=0) writes the same headers as diff -U0: every edit a hunk of its own."""
    old = SEED.splitlines(keepends=True)
    one = "".join(difflib.unified_diff(old, [*old[:3], "new\n", *old[3:]], "a/fa2_fwd.cu", "b/fa2_fwd.cu", n=0))
    assert one.splitlines()[2] == "@@ -3,0 +4 @@"  # the pure insertion hunk the cases above write by hand
    for new in ([*old[:3], "new\n", *old[3:]], ["new\n", *old], [*old, "new\n"],
                [*old[:1], "x\n", *old[1:5], "y\n", "z\n", *old[5:]], [*old[:2], *old[4:]],
                [*old[:2], "changed\n", *old[3:6], "added\n", *old[6:]]):
        patch = "".join(difflib.unified_diff(old, new, "a/fa2_fwd.cu", "b/fa2_fwd.cu", n=0))
        assert apply_patch(SEED, patch, name="my.patch", target=TARGET) == "".join(new), patch
