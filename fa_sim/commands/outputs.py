"""Output paths of the `fa` commands (--save, --perfetto, --plot): checked before any work runs,
written atomically after it.

Policy: an existing file is never overwritten unless the command was given --force; a file is
written to a temporary name in its own directory and renamed into place, so an interrupted or
failed run leaves neither a partial file nor a half-replaced old one. A FILE output must not be a
directory and its directory must exist; a DIR output (trace archives, figures) is created, with
its parents, when the results are written. Two outputs of one command may not write the same file,
nor one a file where the other needs a directory (`--perfetto D/p.json --save D/p.json`). Writability is probed by creating (and removing) a
file where the output will go, which also tells the truth when running as root.
"""

from __future__ import annotations

import contextlib
import enum
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from . import UsageError

TMP_PREFIX = ".fa-partial-"


class Kind(enum.Enum):
    FILE = "file"
    DIR = "directory"


@dataclass(frozen=True)
class Output:
    """One output of a command: the option that names it, the path, file or directory, and for
    a directory the names of the files that will be written into it."""

    option: str
    path: Path
    kind: Kind
    files: tuple[str, ...] = ()

    def targets(self) -> list[Path]:
        return [self.path] if self.kind is Kind.FILE else [self.path / f for f in self.files]


def _existing_ancestor(path: Path) -> Path:
    p = path.absolute()
    while not p.exists():
        p = p.parent
    return p


def _probe(option: str, path: Path, where: Path) -> None:
    try:
        fd, name = tempfile.mkstemp(prefix=TMP_PREFIX, dir=where)
        os.close(fd)
        os.unlink(name)
    except OSError as exc:
        raise UsageError(f"{option} {path}: cannot write in {where} ({exc.strerror})") from None


def _check_one(out: Output, force: bool) -> None:
    path, option = out.path, out.option
    if out.kind is Kind.FILE:
        if path.is_dir():
            raise UsageError(f"{option} {path}: is a directory; {option} takes a file name")
        parent = path.absolute().parent
        if parent.exists() and not parent.is_dir():
            raise UsageError(f"{option} {path}: {parent} is a file, not a directory")
        if not parent.is_dir():
            raise UsageError(f"{option} {path}: directory {parent} does not exist")
        where = path.absolute().parent
    else:
        if path.exists() and not path.is_dir():
            raise UsageError(f"{option} {path}: is a file; {option} takes a directory (created if missing)")
        where = _existing_ancestor(path)
        if not where.is_dir():
            raise UsageError(f"{option} {path}: {where} is a file, so the directory cannot be created")
    existing = [t for t in out.targets() if t.exists()]
    if existing and not force:
        shown = [str(t) if out.kind is Kind.FILE else t.name for t in existing[:3]]
        more = f" and {len(existing) - 3} more" if len(existing) > 3 else ""
        what = "it exists" if out.kind is Kind.FILE else f"it holds {', '.join(shown)}{more}"
        raise UsageError(f"{option} {path}: {what}; pass --force to overwrite (refused, so nothing is lost)")
    if any(t.is_dir() for t in existing):
        raise UsageError(f"{option} {path}: {next(t for t in existing if t.is_dir())} is a directory")
    _probe(option, path, where)


def _check_apart(outs: list[Output]) -> None:
    """Two outputs must not write the same file, nor a file where the other makes a directory
    (`--perfetto D/p.json --save D/p.json`, or a directory inside the other's file)."""
    seen: dict[Path, str] = {}
    for out in outs:
        for t in out.targets():
            key = t.resolve()
            if key in seen:
                raise UsageError(f"{out.option} {out.path} and {seen[key]} would both write {t}")
            seen[key] = f"{out.option} {out.path}"
    for a in outs:
        for b in outs:
            if a is b or a.kind is not Kind.FILE:
                continue
            file, other = a.path.resolve(), b.path.resolve()
            if file == other or file in other.parents:
                raise UsageError(f"{a.option} {a.path} and {b.option} {b.path}: {a.option} writes a file where "
                                 f"{b.option} needs a directory; give them different paths")


def check_outputs(outputs, force: bool) -> None:
    """Refuse, as one UsageError, any output that could not be written or would overwrite
    something without --force; also two outputs that collide (`_check_apart`)."""
    outs = [o for o in outputs if o is not None]
    _check_apart(outs)
    for out in outs:
        _check_one(out, force)


@contextlib.contextmanager
def atomic_path(path: Path):
    """Yields a temporary path beside `path`; renames it onto `path` when the block succeeds and
    removes it when the block raises (KeyboardInterrupt included)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=TMP_PREFIX, suffix=path.suffix, dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_text(path, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def save_figure(fig, base, formats=("png",), dpi: int = 100) -> list[Path]:
    """fig.savefig as base.<fmt> for each format, each atomically; closes the figure."""
    import matplotlib.pyplot as plt

    out = []
    try:
        for fmt in formats:
            path = Path(base).with_name(Path(base).name + "." + fmt)
            with atomic_path(path) as tmp:
                fig.savefig(tmp, format=fmt, dpi=dpi, bbox_inches="tight")
            out.append(path)
    finally:
        plt.close(fig)
    return out


def save_directory(path, write) -> Path:
    """Fill directory `path` through write(tmp_dir) into a temporary sibling, then move each file
    into place (a new directory moves as a whole); the temporary directory never survives."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=TMP_PREFIX, dir=path.parent))
    try:
        write(tmp)
        if not path.exists():
            os.replace(tmp, path)
        else:
            for f in tmp.iterdir():
                os.replace(f, path / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path
