"""Output paths of the `fa` commands (--save, --perfetto, --plot): checked before any work runs,
written atomically after it.

Policy: an output is written only to a new path or over an existing REGULAR file, and over one
only with --force. Never over a directory, a FIFO, a device node or a socket (with or without
--force: renaming a file onto a FIFO or /dev/sda would destroy it and report success), never over
a dangling symbolic link, and never over one of the command's inputs (`check_outputs` compares
every target with the --kernel, --npz and --gpu-npz files and the shipped fa2_fwd.cu by device and
inode, so a hard link or another spelling of the path is caught too). A symbolic link to a regular
file is written through: the file it points to is replaced, the link stays.

A file is written to a temporary name in its own directory and renamed into place, so an
interrupted or failed run leaves neither a partial file nor a half-replaced old one; just before
the rename the target is checked again (`atomic_path`), so a FIFO made while the command ran is
not replaced either. A FILE output's directory must exist; a DIR output (trace archives, figures)
is created, with its parents, when the results are written. Two outputs of one command may not
write the same file, nor one a file where the other needs a directory (`--perfetto D/p.json
--save D/p.json`). Writability is probed by creating (and removing) a file where the output will
go, which also tells the truth when running as root. Every command checks its outputs with
`check_outputs(args, ...)` before any long work.
"""

from __future__ import annotations

import contextlib
import enum
import os
import shutil
import stat
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


# the options of the `fa` commands that name an input file (args destination -> option)
INPUT_OPTIONS = {"kernel": "--kernel", "npz": "--npz", "gpu_npz": "--gpu-npz"}

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def kind_of(path: Path) -> str | None:
    """None for a path that does not exist or is a regular file (a symbolic link: what it points
    to); else what it is, for messages: 'a FIFO (named pipe)', 'a dangling symbolic link to X'."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if os.path.islink(path):
            return f"a dangling symbolic link to {os.readlink(path)}"
        return None
    except NotADirectoryError:
        return None  # a parent is a file: the parent checks say so
    except OSError as exc:
        return f"a path that cannot be examined ({exc.strerror})"
    if stat.S_ISREG(mode):
        return None
    what = next((what for test, what in _KINDS if test(mode)), "not a regular file")
    return f"a symbolic link to {what}" if os.path.islink(path) else what


def input_files(args) -> list[tuple[str, Path]]:
    """(option, path) of every input file the command line names (INPUT_OPTIONS; --npz as it was
    spelled), and the shipped kernel source, which every kernel build reads."""
    from ..contract import SEED_PATH
    from .inputs import inputs_option

    out = []
    for dest, option in INPUT_OPTIONS.items():
        value = getattr(args, dest, None)
        if value is not None:
            out.append((inputs_option(args) if dest == "npz" else option, Path(value)))
    out.append(("shipped kernel source", SEED_PATH))
    return out


def _same_file(a: Path, b: Path) -> bool:
    """One file under two names: the same device and inode (hard links, symbolic links, `..`)."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # either does not exist (or cannot be examined): not one file
        return False


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


def _not_regular(option: str, path: Path, target: Path, what: str) -> UsageError:
    where = "" if target == path else f"{target} in it "
    return UsageError(f"{option} {path}: {where}is {what}, not a regular file; {option} writes a new file or, "
                      f"with --force, replaces a regular file only (refused, so nothing is lost)")


def _check_one(out: Output, force: bool, inputs: list[tuple[str, Path]]) -> None:
    path, option = out.path, out.option
    if out.kind is Kind.FILE:
        if path.is_dir():
            raise UsageError(f"{option} {path}: is a directory; {option} takes a file name")
        what = kind_of(path)
        if what is not None:
            raise _not_regular(option, path, path, what)
        parent = path.absolute().parent
        if parent.exists() and not parent.is_dir():
            raise UsageError(f"{option} {path}: {parent} is a file, not a directory")
        if not parent.is_dir():
            raise UsageError(f"{option} {path}: directory {parent} does not exist")
        where = path.absolute().parent
    else:
        if path.exists() and not path.is_dir():
            what = kind_of(path)
            raise UsageError(f"{option} {path}: is {what or 'a file'}; {option} takes a directory (created if "
                             f"missing)")
        if os.path.islink(path) and not path.exists():
            raise UsageError(f"{option} {path}: is {kind_of(path)}; {option} takes a directory (created if missing)")
        for target in out.targets():
            what = kind_of(target)
            if what is not None:
                raise _not_regular(option, path, target, what)
        where = _existing_ancestor(path)
        if not where.is_dir():
            raise UsageError(f"{option} {path}: {where} is a file, so the directory cannot be created")
    for target in out.targets():
        for in_option, in_path in inputs:
            if _same_file(target, in_path):
                shown = f"{in_option} file" if in_option.startswith("-") else in_option
                raise UsageError(f"{option} {path}: {'it' if target == path else target} is the {shown} "
                                 f"{in_path}, an input of this command; writing it would destroy the input: give "
                                 f"{option} another path")
    existing = [t for t in out.targets() if t.exists()]
    if existing and not force:
        shown = [str(t) if out.kind is Kind.FILE else t.name for t in existing[:3]]
        more = f" and {len(existing) - 3} more" if len(existing) > 3 else ""
        what = "it exists" if out.kind is Kind.FILE else f"it holds {', '.join(shown)}{more}"
        raise UsageError(f"{option} {path}: {what}; pass --force to overwrite (refused, so nothing is lost)")
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


def check_outputs(args, *outputs: Output | None) -> None:
    """Refuse, as one UsageError, any output (None: not requested) that could not be written, is
    not a new path or a regular file (module docstring), is one of the command's input files
    (`input_files(args)`), or would overwrite a file without args.force; also two outputs that
    collide (`_check_apart`). Every command calls it before any long work."""
    outs = [o for o in outputs if o is not None]
    _check_apart(outs)
    inputs = input_files(args)
    for out in outs:
        _check_one(out, bool(getattr(args, "force", False)), inputs)


def _write_target(path: Path) -> Path:
    """Where a file for `path` is renamed to: the file a symbolic link points to (the link stays),
    else `path`; refused when that is not a new path or a regular file (checked at write time too,
    so nothing made while the command ran is replaced)."""
    target = Path(os.path.realpath(path)) if os.path.islink(path) else path
    what = kind_of(path)
    if what is not None:
        raise UsageError(f"{path}: is {what} now, not a regular file; the result was not written there "
                         f"(refused, so nothing is lost)")
    return target


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _give_mode(tmp: Path, target: Path, default: int) -> None:
    """The permissions a plain write would leave: the replaced file's, else `default` less the
    umask (mkstemp and mkdtemp make their files 0600 and 0700)."""
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)
    except OSError:
        mode = default & ~_umask()
    os.chmod(tmp, mode)


@contextlib.contextmanager
def atomic_path(path: Path):
    """Yields a temporary path beside `path`; renames it onto `path` when the block succeeds and
    removes it when the block raises (KeyboardInterrupt included)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path = _write_target(path)
    fd, name = tempfile.mkstemp(prefix=TMP_PREFIX, suffix=path.suffix, dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        _give_mode(tmp, path, 0o666)
        os.replace(tmp, _write_target(path))
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
        for f in tmp.iterdir():
            _give_mode(f, path / f.name, 0o666)
        if not path.exists() and not os.path.islink(path):
            _give_mode(tmp, path, 0o777)
            os.replace(tmp, path)
        else:
            for f in tmp.iterdir():
                os.replace(f, _write_target(path / f.name))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path
