"""Every document the repository cites is in the repository.

- Every path to a .md or .txt file named in a tracked .py, .md, .cu or .sh file exists (relative to
  the citing file or to the repository root; a bare file name somewhere in the repository). Names
  of files a script in experiments/ writes (bare names, paths under a placeholder such as OUT/ or
  under an ignored directory) are outputs, not citations.
- No file points at the developers' notes outside the repository (the old design notes, GPU notes
  and the untranslated walk-through) or at a directory above the repository.
- Citations of the walk-through ("spec table N", "spec section N") name a table, figure or section
  docs/walkthrough.md has; its marked tables agree with the code.
- Every link and named file of every document in docs/ resolves (test_docs.check_links).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from fa_sim.config import KernelConfig
from fa_sim.layout import acc_rowcol_coords, smem_layout
from test_docs import DOCS, ROOT, check_links, ints, pairs, read_tables

WALKTHROUGH = DOCS / "walkthrough.md"
SCANNED = ("*.py", "*.md", "*.cu", "*.sh")
CITED = re.compile(r"(?<![\w./-])((?:\.\.?/)?[\w.-]+(?:/[\w.-]+)*\.(?:md|txt))\b")
# Written so that this file does not match them itself.
OUTSIDE = {
    "a path into the shared notes directory": re.compile(r"(?<![\w.])shared[/]"),
    "the old design notes": re.compile(r"\bDESIGN[.]md"),
    "the old GPU notes": re.compile(r"gpu_facts[.]md"),
    "the untranslated walk-through": re.compile(r"spec/000[_]"),
}
SPEC_CITE = re.compile(r"\bspec,? (tables?|figures?|section) (\d+)(?:\s*[-,/]\s*(\d+))?", re.IGNORECASE)


def tracked_files() -> list[str]:
    """The repository's files (git's index when there is one, else the tree without build output)."""
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        return out.split()
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", "__pycache__", ".pytest_cache", ".hypothesis", "build", "dist", ".venv", "out"}
        return [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and not skip & set(p.parts)]


FILES = tracked_files()
SOURCES = [f for f in FILES if any(Path(f).match(g) for g in SCANNED)]
IGNORED_DIRS = tuple(line.strip() for line in (ROOT / ".gitignore").read_text().splitlines()
                     if line.strip().endswith("/") and "/" in line.strip()[:-1])


def _is_script_output(path: str, citing: str) -> bool:
    """A file a command writes: under a placeholder folder (OUTDIR/summary.txt), or named by an
    experiments/ script (a bare name, a folder .gitignore ignores)."""
    first = path.split("/")[0]
    if "/" in path and first.isupper():
        return True
    return citing.startswith("experiments/") and ("/" not in path or path.startswith(IGNORED_DIRS))


def _exists(path: str, citing: str) -> bool:
    if "/" not in path:
        return path in {Path(f).name for f in FILES}
    return (ROOT / citing).parent.joinpath(path).exists() or (ROOT / path).exists()


def test_every_cited_document_exists():
    missing = []
    for name in SOURCES:
        for n, line in enumerate((ROOT / name).read_text(errors="replace").splitlines(), 1):
            for path in CITED.findall(line):
                if not _exists(path, name) and not _is_script_output(path, name):
                    missing.append(f"{name}:{n}: {path}")
    assert SOURCES and not missing, "cited but not in the repository:\n" + "\n".join(missing)


def test_nothing_points_outside_the_repository():
    found = []
    for name in SOURCES:
        for n, line in enumerate((ROOT / name).read_text(errors="replace").splitlines(), 1):
            if " not in " in line:  # a test asserting the absence of such a path
                continue
            found += [f"{name}:{n}: {what}" for what, pattern in OUTSIDE.items() if pattern.search(line)]
    assert not found, "\n".join(found)


def test_the_checker_sees_what_it_must():
    """The patterns above on the kinds of text they must catch and must let pass."""
    outside = "notes in ../" + "shar" + "ed/notes/x" + ".md, " + "DESIGN" + ".md, spec/000" + "_1" + ".txt"
    assert {w for w, p in OUTSIDE.items() if p.search(outside)} == set(OUTSIDE) - {"the old GPU notes"}
    assert not any(p.search("ld.shared/st.shared, docs/hardware_facts.md") for p in OUTSIDE.values())
    gone = "notes/gone" + ".md"  # (not written out: this file is scanned too)
    assert CITED.findall(f"see docs/walkthrough.md, table 5 ({gone}; README.md)") == [
        "docs/walkthrough.md", gone, "README.md"]
    assert not _exists(gone, "fa_sim/layout.py") and _exists("SCHEDULE.md", "docs/kernel.md")
    assert _is_script_output("OUT/summary" + ".txt", "experiments/device_kernel.sh")
    assert not _is_script_output(gone, "fa_sim/layout.py") and not _is_script_output(gone, "experiments/x.py")


# == the walk-through ===================================================================================
def _walkthrough_numbers() -> dict[str, set[int]]:
    """The tables and figures the walk-through summarises (a bold "**Table N**" or a "### Table N"
    heading) and its numbered sections."""
    text = WALKTHROUGH.read_text()
    found = {kind: re.findall(rf"\*\*{kind.title()} (\d+)\*\*|^### {kind.title()} (\d+)", text, re.M)
             for kind in ("table", "figure")}
    out = {kind: {int(a or b) for a, b in hits} for kind, hits in found.items()}
    return out | {"section": {int(n) for n in re.findall(r"^## (\d+)\. ", text, re.M)}}


def test_the_walkthrough_has_every_table_figure_and_section_cited():
    have = _walkthrough_numbers()
    assert have["table"] == set(range(1, 13)) and have["figure"] == set(range(1, 13))
    cited = []
    for name in SOURCES:
        for n, line in enumerate((ROOT / name).read_text(errors="replace").splitlines(), 1):
            for kind, a, b in SPEC_CITE.findall(line):
                kind = kind.lower().rstrip("s")
                cited += [(f"{name}:{n}", kind, int(x)) for x in (a, b) if x]
    assert cited
    assert [c for c in cited if c[2] not in have[c[1]]] == []


def test_walkthrough_tables_agree_with_the_code():
    wt, seed = read_tables(WALKTHROUGH), KernelConfig()
    assert set(wt) == {"spec-table-2", "spec-table-6", "spec-table-11"}
    L, plain = smem_layout(seed, 64), smem_layout(KernelConfig(smem="plain"), 64)
    for row in wt["spec-table-11"]:
        (r, c), = pairs(row["(r, c)"])
        assert (int(row["row-major 64r + c"]), int(row["swizzled"])) == (int(plain(r, c)), int(L(r, c)))
    q, k = acc_rowcol_coords(seed, np.arange(128))
    for row in wt["spec-table-2"]:
        threads = ints(row["threadIdx.x"])
        assert threads == list(range(32 * int(row["warp"]), 32 * int(row["warp"]) + 32))
        assert sorted(set(q[threads].ravel())) == ints(row["query rows of Q, S, O"])
    for row in wt["spec-table-6"]:
        keys = ints(row["keys 0..31"]) + ints(row["keys 32..63"])
        lane = int(row["lane"])
        assert list(k[lane, 0]) == list(k[lane, 1]) == keys


@pytest.mark.parametrize("path", sorted(DOCS.glob("*.md")), ids=lambda p: p.name)
def test_every_document_links_resolve(path):
    check_links(path)


def test_the_mufu_table_size_the_readme_states():
    size = (ROOT / "fa_sim" / "isa" / "mufu_data" / "mufu_tables.json").stat().st_size
    stated = re.search(r"\((\d+) KB of fitted\s+coefficients", (ROOT / "README.md").read_text())
    assert stated and int(stated[1]) == round(size / 1000), (stated and stated[1], size)
