"""Split PTX text into statements, each with its 1-based line number.

PTX is a statement language (`#ptx-statements`): directives and instructions end with ';', but
several directives end at the end of their line (`.version`, `.target`, `.address_size`, `.file`,
`.loc`, and the performance-tuning directives between a kernel's signature and its body), a
function header (`.entry name(...)`) ends at its parameter list, `{` and `}` open and close
scopes, `label:` marks a position, and `.section name { ... }` holds DWARF data. Comments are
`//` to the end of the line and `/* ... */` (`#comments`); both are removed first, keeping every
newline so that line numbers stay those of the original text.
"""

from __future__ import annotations

import enum
import re
from typing import Iterator, NamedTuple


class ParseError(ValueError):
    """PTX the front end does not understand; names the PTX line and its text."""

    def __init__(self, line: int, text: str, reason: str) -> None:
        snippet = " ".join(text.split())
        snippet = snippet if len(snippet) <= 160 else snippet[:157] + "..."
        super().__init__(f"PTX line {line}: {reason}: {snippet!r}")
        self.line, self.text, self.reason = line, text, reason


class Unit(enum.Enum):
    OPEN = "{"
    CLOSE = "}"
    LABEL = "label"  # text: the label's name
    LINE = "line"  # a directive ending at the end of its line
    HEADER = "header"  # `.entry name(...)` / `.func (ret) name(...)`, without body
    SECTION = "section"  # text: the whole `.section name { ... }`
    STATEMENT = "statement"  # text: up to and without the ';' (may be empty)


class Piece(NamedTuple):
    kind: Unit
    text: str
    line: int


#: Directives that end at the end of their line rather than with ';'.
LINE_DIRECTIVES = ("version", "target", "address_size", "file", "loc", "maxntid", "reqntid",
                   "minnctapersm", "maxnctapersm", "maxnreg", "noreturn", "explicitcluster",
                   "reqnctapercluster", "maxclusterrank")

_COMMENT = re.compile(r'"(?:[^"\\\n]|\\.)*"|//[^\n]*|/\*.*?\*/|/\*', re.S)
_UNIT = re.compile(r"""
    \s*(?:
      (?P<open>\{)
    | (?P<close>\})
    | (?P<section>\.section\b[^{;]*\{[^}]*\})
    | (?P<header>(?:\.(?:visible|weak|extern)\s+)*\.(?:entry|func)\b[^;{]*?\)(?=\s*(?:[.{;]|$)))
    | (?P<line>\.(?:""" + "|".join(LINE_DIRECTIVES) + r""")\b[^\n]*)
    | (?P<label>[A-Za-z_$%][\w$]*)\s*:(?!:)
    | (?P<statement>[^;{}]*(?:\{(?:[^{}]|\{[^{}]*\})*\}[^;{}]*)*);
    )""", re.X)
_KINDS = {"open": Unit.OPEN, "close": Unit.CLOSE, "section": Unit.SECTION, "header": Unit.HEADER,
          "line": Unit.LINE, "label": Unit.LABEL, "statement": Unit.STATEMENT}


def strip_comments(text: str) -> str:
    """The text with comments replaced by nothing (// ...) or by their newlines (/* ... */);
    string literals are kept as they are, comment markers inside them included."""

    def repl(m: re.Match) -> str:
        s = m.group()
        if s[0] == '"':
            return s
        if s == "/*":
            line = text.count("\n", 0, m.start()) + 1
            raise ParseError(line, text[m.start():].split("\n", 1)[0], "unterminated /* comment")
        return "\n" * s.count("\n") if s[1] == "*" else ""

    return _COMMENT.sub(repl, text)


def scan(text: str) -> Iterator[Piece]:
    """The statements of comment-free PTX text, in order."""
    pos, line, end = 0, 1, len(text)
    while True:
        m = _UNIT.match(text, pos)
        if m is None:
            rest = text[pos:].lstrip()
            if not rest:
                return
            line += text.count("\n", pos, end - len(rest))
            raise ParseError(line, rest.split("\n", 1)[0], _why_not(rest))
        kind = m.lastgroup
        start = m.start(kind)
        line += text.count("\n", pos, start)
        yield Piece(_KINDS[kind], m.group(kind), line)
        line += text.count("\n", start, m.end())
        pos = m.end()


def _why_not(rest: str) -> str:
    stop = re.search(r"[;{}]", rest)
    if stop is None or stop.group() != ";":
        return "statement without its terminating ';'"
    return "unbalanced or too deeply nested braces in a statement"
