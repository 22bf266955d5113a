"""Source locations of PTX instructions: `.loc`, `.file` and the `.debug_str` section.

PTX ISA anchors: `#debugging-directives-loc`, `#debugging-directives-file`,
`#debugging-directives-section`. With `-lineinfo`, NVRTC writes before each instruction
`.loc file line col`, and for code inlined from another function
`.loc file line col, function_name $L__info_stringN, inlined_at file line col`, where the label
names a NUL-terminated string of the `.section .debug_str { $L__info_stringN: .b8 ... }` block at
the end of the module (the function's mangled name), and `inlined_at` is the immediate call site
only. The backend (LLVM's NVPTX printer) writes the call site's own `.loc` before, so the full
inlining chain is the call site's chain: that of the most recent `.loc` at that site. NVRTC
sometimes writes a site again without its scope (`.loc 1 408 5` alone, for an instruction whose
inlining scope was lost when it was moved); since a source position lies in one function, a
site once seen inside an inlined function keeps that chain. The scope-less `.loc` itself is kept
as the PTX says (the enclosing .entry / .func).

`.file` and `.debug_str` come after the code, so the parser records raw locations while it reads
the functions and resolves them into SourceLoc values at the end (`LocTable.resolve`).
"""

from __future__ import annotations

import re
from typing import NamedTuple

from .ir import SourceLoc
from .lexer import ParseError

_LOC = re.compile(r"\.loc\s+(\d+)\s+(\d+)\s+(\d+)"
                  r"(?:\s*,\s*function_name\s+([\w$.]+(?:\s*\+\s*\d+)?)\s*,"
                  r"\s*inlined_at\s+(\d+)\s+(\d+)\s+(\d+))?\s*")
_FILE = re.compile(r'\.file\s+(\d+)\s+"((?:[^"\\]|\\.)*)"(?:\s*,\s*(\d+)\s*,\s*(\d+))?\s*')
_STR_LABEL = re.compile(r"([\w$.]+)\s*:")
_B8 = re.compile(r"\.b8\s+([0-9,\s]+)")


class RawLoc(NamedTuple):
    """A `.loc` before its names are known: file id, line, column, the function_name label (None
    outside inlined code), the call-site chain, innermost first, of (file id, line, col), and the
    directive's own PTX line and text (for errors)."""

    file: int
    line: int
    col: int
    label: str | None
    chain: tuple
    at: int
    text: str


class LocTracker:
    """Follows the `.loc` directives of one function, in order."""

    def __init__(self) -> None:
        self.current: RawLoc | None = None
        self._last_at: dict[tuple[int, int, int], RawLoc] = {}

    def directive(self, text: str, line: int) -> None:
        m = _LOC.fullmatch(text)
        if m is None:
            raise ParseError(line, text, "a .loc must be 'file line col' or 'file line col, "
                                         "function_name LABEL, inlined_at file line col'")
        f, ln, col = int(m[1]), int(m[2]), int(m[3])
        chain: tuple = ()
        if m[4] is not None:
            site = (int(m[5]), int(m[6]), int(m[7]))
            parent = self._last_at.get(site)
            chain = (site, *(parent.chain if parent is not None else ()))
        self.current = RawLoc(f, ln, col, m[4], chain, line, text)
        known = self._last_at.get((f, ln, col))
        if known is None or chain or not known.chain:  # NVVM sometimes repeats an inlined line
            self._last_at[(f, ln, col)] = self.current  # without its function: keep the chain


def parse_file(text: str, line: int) -> tuple[int, str]:
    """(id, path) of a `.file id "path"[, timestamp, size]` directive."""
    m = _FILE.fullmatch(text)
    if m is None:
        raise ParseError(line, text, "a .file must be 'id \"path\"' with an optional ', timestamp, size'")
    return int(m[1]), m[2].encode().decode("unicode_escape") if "\\" in m[2] else m[2]


def debug_strings(body: str, line: int) -> dict[str, bytes]:
    """label -> the bytes from that label to the next, of a `.debug_str` section body (the text
    between its braces)."""
    out: dict[str, bytes] = {}
    parts = _STR_LABEL.split(body)
    if parts[0].strip():
        raise ParseError(line, parts[0], ".debug_str data before its first label")
    for label, data in zip(parts[1::2], parts[2::2]):
        values = [int(v) for m in _B8.finditer(data) for v in m[1].replace(",", " ").split()]
        rest = _B8.sub("", data).strip()
        if rest or any(v > 255 for v in values):
            raise ParseError(line, data, f".debug_str entry {label} holds something other than .b8 bytes")
        out[label] = bytes(values)
    return out


class LocTable:
    """Resolves RawLocs into shared SourceLoc values once .file and .debug_str are known."""

    def __init__(self, files: dict[int, str], strings: dict[str, bytes]) -> None:
        self._files, self._strings = files, strings
        self._memo: dict[tuple, SourceLoc] = {}

    def resolve(self, raw: RawLoc | None, function: str) -> SourceLoc | None:
        if raw is None:
            return None
        key = (raw, function)
        loc = self._memo.get(key)
        if loc is None:
            name = function if raw.label is None else self._string(raw.label, raw)
            chain = tuple((self._file(f, raw), ln, col) for f, ln, col in raw.chain)
            loc = self._memo[key] = SourceLoc(self._file(raw.file, raw), raw.line, raw.col, name, chain)
        return loc

    def _file(self, fid: int, raw: RawLoc) -> str:
        try:
            return self._files[fid]
        except KeyError:
            raise ParseError(raw.at, raw.text, f"file id {fid} has no .file directive") from None

    def _string(self, ref: str, raw: RawLoc) -> str:
        """The NUL-terminated string at `label` or `label+offset` (`#debugging-directives-loc`)."""
        label, _, offset = (part.strip() for part in ref.partition("+"))
        data = self._strings.get(label)
        if data is None or int(offset or 0) >= len(data):
            raise ParseError(raw.at, raw.text, f"function_name {ref} is not in .debug_str")
        return data[int(offset or 0):].split(b"\0", 1)[0].decode("utf-8", errors="replace")


_SOURCE_NAME = re.compile(r"(\d+)")


def short_name(mangled: str) -> str:
    """A readable qualified name for an Itanium-mangled function name, without its parameter
    types: '_ZN2fa13load_qk_fragsERA1_A4_jRA8_A2_jjjj' -> 'fa::load_qk_frags',
    '_ZN2fa7ck_fragILi8EEEvRK...' -> 'fa::ck_frag<8>'. Names it does not understand (extern "C"
    names, operators, substitutions) come back unchanged."""
    if not mangled.startswith("_Z"):
        return mangled
    nested = mangled.startswith("_ZN")
    pos = re.match(r"_ZN[rVKRO]*|_ZL?", mangled).end()  # CV / ref qualifiers of a member function
    parts: list[str] = []
    while pos < len(mangled):
        m = _SOURCE_NAME.match(mangled, pos)
        if m is None:
            break
        n = int(m[1])
        parts.append(mangled[m.end(): m.end() + n])
        pos = m.end() + n
        if mangled.startswith("I", pos):
            args, pos = _template_args(mangled, pos + 1)
            if args is None:
                return mangled
            parts[-1] += f"<{args}>"
        if not nested:
            break
    if not parts or (nested and not mangled.startswith("E", pos)):
        return mangled
    return "::".join(parts)


_LITERAL = re.compile(r"L([bijlmstchy])(n?)(\d+)E")


def _template_args(mangled: str, pos: int) -> tuple[str | None, int]:
    """Literal template arguments `ILi8EE` / `ILb0EE` -> ('8', after) ; None for other kinds."""
    args = []
    while not mangled.startswith("E", pos):
        m = _LITERAL.match(mangled, pos)
        if m is None:
            return None, pos
        kind, neg, digits = m.groups()
        args.append(("false", "true")[int(digits) != 0] if kind == "b" else f"{'-' if neg else ''}{digits}")
        pos = m.end()
    return ", ".join(args), pos + 1
