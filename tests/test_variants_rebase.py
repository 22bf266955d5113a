"""experiments/variants/rebase.py moves a patch whose seed lines moved: a backward edit (fa2_bwd.cu) as
a forward one (before, the first fa2_bwd.cu patch under experiments/variants/ stopped the run)."""

from __future__ import annotations

import difflib
import importlib.util
from pathlib import Path

from fa_sim.contract.patch import apply_patch

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("rebase", ROOT / "experiments" / "variants" / "rebase.py")
rebase = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rebase)


def test_a_backward_patch_is_rebased_onto_its_own_kernel(tmp_path):
    new = (ROOT / "fa_hw" / "kernels" / "fa2_bwd.cu").read_text()
    old = "".join(new.splitlines(keepends=True)[1:])  # the seed one line shorter: every hunk one line up
    line = "      for (int e = 0; e < 4; ++e) tSrS[nj][e] = ex2_approx("
    assert old.count(line) == 1
    edited = old.replace(line, "#pragma unroll 1  // EDIT\n" + line)
    diff = difflib.unified_diff(old.splitlines(True), edited.splitlines(True), "a/fa_hw/kernels/fa2_bwd.cu",
                                "b/fa_hw/kernels/fa2_bwd.cu")
    patch = tmp_path / "bwd_edit.patch"
    patch.write_text("Edit of fa_hw/kernels/fa2_bwd.cu (bwd_edit): a test.\n\n" + "".join(diff))
    assert rebase.target_of(patch.read_text()) == "fa2_bwd.cu"
    assert rebase.rebase(patch, old, new, "fa2_bwd.cu") == "rebased"
    text = patch.read_text()
    assert text.startswith("Edit of fa_hw/kernels/fa2_bwd.cu (bwd_edit)") and "--- a/fa_hw/kernels/fa2_bwd.cu" in text
    assert apply_patch(new, text, name="bwd_edit.patch", target="fa2_bwd.cu") == \
        new.replace(line, "#pragma unroll 1  // EDIT\n" + line)
    assert rebase.rebase(patch, old, new, "fa2_bwd.cu") == "applies"
