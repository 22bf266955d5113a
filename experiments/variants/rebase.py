"""Rebase every patch of experiments/variants/ (and its edits*/ folders) onto the current kernel it patches
(fa_hw/kernels/fa2_fwd.cu, or fa2_bwd.cu for the backward's edits: the file its `--- a/` header names).

    python experiments/variants/rebase.py OLD_REV

The patches apply strictly (fa_sim/contract/patch.py: every hunk at its line number), so an edit of
the seed that adds or removes lines moves them. For each patch that no longer applies, this applies
it to the seed as of git revision OLD_REV (where it did apply), merges that with the current seed
(`git merge-file`, a 3-way merge: the patch's change on top of the seed's own edits) and writes the
patch again as the diff of the current seed to the merged file, keeping the patch's description.
A conflict (the seed's edit touches the patch's lines) is reported and that patch left alone.
"""

import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from fa_sim.contract.patch import PatchError, apply_patch  # noqa: E402

CU = "fa_hw/kernels/fa2_fwd.cu"
TARGET = "fa2_fwd.cu"


def target_of(text: str) -> str:
    """The kernel file a patch's `--- a/fa_hw/kernels/NAME` header names (fa2_fwd.cu without one)."""
    m = re.search(r"^--- (?:a/)?fa_hw/kernels/(\S+)", text, re.M)
    return m[1] if m else TARGET


def rebase(patch: Path, old: str, new: str, target: str = TARGET) -> str:
    """'applies', 'rebased' or 'conflict' for one patch file (rewritten when rebased)."""
    text = patch.read_text()
    cu = f"fa_hw/kernels/{target}"  # the patched file, as its header names it
    try:
        apply_patch(new, text, name=str(patch), target=target)
        return "applies"
    except PatchError:
        pass
    theirs = apply_patch(old, text, name=str(patch), target=target)
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
    patch.write_text(text[: text.index("--- a/")] + f"--- a/{cu}\n+++ b/{cu}\n" + body)
    apply_patch(new, patch.read_text(), name=str(patch), target=target)  # it applies now
    return "rebased"


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    seeds: dict = {}
    status = 0
    for patch in sorted((ROOT / "experiments" / "variants").rglob("*.patch")):
        target = target_of(patch.read_text())
        if target not in seeds:
            cu = f"fa_hw/kernels/{target}"
            seeds[target] = (subprocess.run(["git", "show", f"{args[0]}:{cu}"], cwd=ROOT, capture_output=True,
                                            text=True, check=True).stdout, (ROOT / cu).read_text())
        result = rebase(patch, *seeds[target], target)
        print(f"{result:9} {patch.relative_to(ROOT)}")
        status |= result == "conflict"
    return status


if __name__ == "__main__":
    sys.exit(main())
