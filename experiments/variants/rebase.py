"""Rebase every patch of experiments/variants/ (and edits/) onto the current fa_hw/kernels/fa2_fwd.cu.

    python experiments/variants/rebase.py OLD_REV

The patches apply strictly (fa_sim/contract/patch.py: every hunk at its line number), so an edit of
the seed that adds or removes lines moves them. For each patch that no longer applies, this applies
it to the seed as of git revision OLD_REV (where it did apply), merges that with the current seed
(`git merge-file`, a 3-way merge: the patch's change on top of the seed's own edits) and writes the
patch again as the diff of the current seed to the merged file, keeping the patch's description.
A conflict (the seed's edit touches the patch's lines) is reported and that patch left alone.
"""

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from fa_sim.contract.patch import PatchError, apply_patch  # noqa: E402

CU = "fa_hw/kernels/fa2_fwd.cu"
TARGET = "fa2_fwd.cu"


def rebase(patch: Path, old: str, new: str) -> str:
    """'applies', 'rebased' or 'conflict' for one patch file (rewritten when rebased)."""
    text = patch.read_text()
    try:
        apply_patch(new, text, name=str(patch), target=TARGET)
        return "applies"
    except PatchError:
        pass
    theirs = apply_patch(old, text, name=str(patch), target=TARGET)
    with tempfile.TemporaryDirectory() as d:
        ours, base, mine = (Path(d) / n for n in ("current", "old", "patched"))
        ours.write_text(new)
        base.write_text(old)
        mine.write_text(theirs)
        merged = subprocess.run(["git", "merge-file", "-p", str(ours), str(base), str(mine)],
                                capture_output=True, text=True)
        if merged.returncode != 0:
            return "conflict"
        out = Path(d) / "merged"
        out.write_text(merged.stdout)
        diff = subprocess.run(["diff", "-u", str(ours), str(out)], capture_output=True, text=True).stdout
    body = diff.split("\n", 2)[2]  # diff's own ---/+++ lines name the temporary files
    patch.write_text(text[: text.index("--- a/")] + f"--- a/{CU}\n+++ b/{CU}\n" + body)
    apply_patch(new, patch.read_text(), name=str(patch), target=TARGET)  # it applies now
    return "rebased"


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    old = subprocess.run(["git", "show", f"{args[0]}:{CU}"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    new = (ROOT / CU).read_text()
    status = 0
    for patch in sorted((ROOT / "experiments" / "variants").rglob("*.patch")):
        result = rebase(patch, old, new)
        print(f"{result:9} {patch.relative_to(ROOT)}")
        status |= result == "conflict"
    return status


if __name__ == "__main__":
    sys.exit(main())
