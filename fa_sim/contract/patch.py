"""Kernel variants as patches: a strict applier of unified diffs (`diff -u`, `git diff`) to fa2_fwd.cu.

Python's standard library writes unified diffs (difflib.unified_diff) but does not apply them, so
this module does, strictly, because a variant that silently applied somewhere else would simulate
and run a kernel nobody wrote:

- one file, named `fa2_fwd.cu` by the `---` header (any directory, `a/` prefix or timestamp);
  anything before that header (`diff --git`, `index`, a description) is ignored;
- every hunk at the line its `@@ -l,s +l,s @@` header names: no offset search, no fuzz;
- every context (' ') and removed ('-') line equal to the seed's line, byte for byte (a blank
  context line whose leading space an editor stripped still counts as blank);
- the header's line counts equal to the hunk's body; hunks in order, not overlapping;
- `\\ No newline at end of file` after a line: that line has no newline.

Anything else raises PatchError naming the patch file and the hunk.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import KernelSourceError

_HUNK = re.compile(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_NO_NEWLINE = "\\"  # '\ No newline at end of file' (the wording varies with the locale)
_SHOWN = 72  # characters of a mismatching line quoted in a message


class PatchError(KernelSourceError):
    """A patch that is not a unified diff of fa2_fwd.cu, or a hunk that does not apply exactly."""


@dataclass(frozen=True)
class Hunk:
    """One `@@` block: where it applies in the seed and the lines it removes and adds."""

    number: int  # 1-based, for messages
    header: str
    old_start: int  # 1-based line of the seed; for old_len 0, the line after which to insert
    old: tuple[str, ...]  # context and removed lines, with their line endings
    new: tuple[str, ...]  # context and added lines, with their line endings

    @property
    def start_index(self) -> int:
        """0-based index of the first seed line the hunk replaces."""
        return self.old_start if not self.old else self.old_start - 1


def apply_patch(seed: str, patch: str, *, name: str, target: str) -> str:
    """The seed text with every hunk of `patch` applied; `name` names the patch in messages (its
    file, as the user gave it), `target` is the file name the patch must name (fa2_fwd.cu)."""
    lines = seed.splitlines(keepends=True)
    out: list[str] = []
    at = 0
    for hunk in parse_patch(patch, name=name, target=target):
        start = hunk.start_index
        if start < at:
            raise PatchError(f"{name}: hunk {hunk.number} ({hunk.header}) starts before the end of the hunk "
                             "above it: hunks must be in order and must not overlap")
        _check_hunk(lines, hunk, name, target)
        out += lines[at:start]
        out += hunk.new
        at = start + len(hunk.old)
    return "".join(out + lines[at:])


def parse_patch(patch: str, *, name: str, target: str) -> list[Hunk]:
    """The hunks of a one-file unified diff of `target`."""
    rows = patch.splitlines()
    i = _file_header(rows, name, target)
    hunks: list[Hunk] = []
    while i < len(rows):
        if rows[i].startswith("--- "):
            raise PatchError(f"{name}: patches more than one file; a variant patches {target} only")
        m = _HUNK.match(rows[i])
        if m is None:
            raise PatchError(f"{name}: line {i + 1} is neither a hunk header '@@ -l,s +l,s @@' nor part of "
                             f"a hunk: {_show(rows[i])}")
        hunk, i = _hunk(rows, i, m, len(hunks) + 1, name)
        hunks.append(hunk)
    if not hunks:
        raise PatchError(f"{name}: a '--- {target}' header but no hunk ('@@ -l,s +l,s @@')")
    return hunks


def _file_header(rows: list[str], name: str, target: str) -> int:
    """Index of the first row after the '--- ' / '+++ ' pair, which must name `target`."""
    start = next((i for i, row in enumerate(rows) if row.startswith("--- ")), None)
    if start is None or start + 1 >= len(rows) or not rows[start + 1].startswith("+++ "):
        raise PatchError(f"{name}: not a unified diff (no '--- {target}' / '+++ ...' header pair); make one "
                         f"with: diff -u fa_hw/kernels/{target} my_variant.cu > my_variant.patch")
    patched = rows[start][4:].split("\t")[0].strip()
    if patched.rsplit("/", 1)[-1] != target:
        raise PatchError(f"{name}: patches {patched!r}; a kernel variant is a patch of {target}")
    return start + 2


def _hunk(rows: list[str], i: int, m: re.Match, number: int, name: str) -> tuple[Hunk, int]:
    """Parse the hunk whose header is rows[i]; returns it and the index of the row after it."""
    old_start, old_len = int(m[1]), 1 if m[2] is None else int(m[2])
    new_len = 1 if m[4] is None else int(m[4])
    header = m[0]
    old: list[str] = []
    new: list[str] = []
    i += 1
    while (len(old) < old_len or len(new) < new_len) and i < len(rows):
        row = rows[i]
        kind, text = (row[:1] or " "), row[1:] + "\n"
        if kind == _NO_NEWLINE:
            _drop_newline(old, new, rows[i - 1][:1] or " ", name, number, header)
        elif kind not in " -+" or (kind in " -" and len(old) == old_len) or (kind in " +" and len(new) == new_len):
            break
        else:
            if kind in " -":
                old.append(text)
            if kind in " +":
                new.append(text)
        i += 1
    if (len(old), len(new)) != (old_len, new_len):
        raise PatchError(f"{name}: hunk {number} ({header}) announces {old_len} old and {new_len} new lines but "
                         f"its body has {len(old)} and {len(new)}")
    if i < len(rows) and rows[i].startswith(_NO_NEWLINE):
        _drop_newline(old, new, rows[i - 1][:1] or " ", name, number, header)
        i += 1
    return Hunk(number, header, old_start, tuple(old), tuple(new)), i


def _drop_newline(old: list[str], new: list[str], kind: str, name: str, number: int, header: str) -> None:
    """'\\ No newline at end of file' applies to the line just above it."""
    sides = {" ": (old, new), "-": (old,), "+": (new,)}.get(kind)
    if not sides or not all(sides):
        raise PatchError(f"{name}: hunk {number} ({header}): a '\\ No newline' marker follows no line")
    for side in sides:
        side[-1] = side[-1][:-1]


def _check_hunk(lines: list[str], hunk: Hunk, name: str, target: str) -> None:
    start = hunk.start_index
    if start + len(hunk.old) > len(lines):
        raise PatchError(f"{name}: hunk {hunk.number} ({hunk.header}) reaches past the end of {target} "
                         f"({len(lines)} lines): the patch is not of this {target}")
    for k, want in enumerate(hunk.old):
        if lines[start + k] != want:
            have, expected, col = _differing(lines[start + k], want)
            raise PatchError(f"{name}: hunk {hunk.number} ({hunk.header}) does not apply to {target}: line "
                             f"{start + k + 1} is {have}, the patch expects {expected} (they first differ at "
                             f"column {col})")


def _differing(have: str, want: str) -> tuple[str, str, int]:
    """The two lines quoted (repr: tabs, carriage returns and trailing spaces visible) around where
    they first differ, each cut to the same window of _SHOWN characters, so that the difference is
    in view even when the lines share a long start; and that 1-based column."""
    a, b = have.rstrip("\n"), want.rstrip("\n")
    i = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    lo = max(0, min(i - _SHOWN // 3, max(len(a), len(b)) - _SHOWN))
    return _window(a, lo), _window(b, lo), i + 1


def _show(line: str) -> str:
    return _window(line.rstrip("\n"), 0)


def _window(text: str, lo: int) -> str:
    cut = text[lo:lo + _SHOWN]
    return ("..." if lo else "") + repr(cut) + ("..." if lo + _SHOWN < len(text) else "")
