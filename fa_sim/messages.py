"""The words of error messages that quote what a user gave: every message fits a few lines, however
long the list or the value it names (issue 36: errors of 750-1,060 characters on one line).

    listed(["FA_BLOCK_M=64", ...])      'FA_BLOCK_M=64, FA_BLOCK_N=64, ..., ... 7 more'
    quoted("m" * 300)                   "'mmmm...mmm'... (300 characters)"
"""

from __future__ import annotations

LIST_MOST = 6  # items of a list a message shows before '... N more'
QUOTE_MOST = 60  # characters of a value a message quotes


def listed(items, most: int = LIST_MOST, sep: str = ", ") -> str:
    """The first `most` items, then how many more there are."""
    items = [str(i) for i in items]
    more = len(items) - most
    return sep.join(items[:most]) + (f"{sep}... {more} more" if more > 0 else "")


def quoted(value, most: int = QUOTE_MOST) -> str:
    """repr(value) of a str, cut to `most` characters with its full length said."""
    text = str(value)
    if len(text) <= most:
        return repr(text)
    return f"{text[:most]!r}... ({len(text):,} characters)"
