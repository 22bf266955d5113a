"""The on-disk cache shared by everything flashsim compiles or parses: cubins (fa_hw.compile),
PTX (fa_sim.contract.nvrtc) and parsed PTX modules (fa_sim.ptx.load).

One root, $FLASHSIM_CACHE or ~/.cache/flashsim, one subfolder per kind of artefact. Entries are
named by a hash of everything that determines them, so an entry is never stale, only unused.
The cache is an optimisation only: a missing, read-only or full cache directory (or a root that
cannot be a directory at all, such as FLASHSIM_CACHE=/proc/nocache) costs time, never an error,
and writes are atomic so parallel workers may fill the same entry. A damaged entry is rebuilt:
`read_text_entry` treats text that does not decode as absent, and the callers that parse what
they read compile again when it does not parse (fa_sim.ptx.load), as the cubin and parsed-module
caches do. A file that must exist as a path (a recorded kernel to compile) goes to a temporary
directory of the process when the cache cannot hold it (`stored_file`).
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import json
import os
import shutil
import tempfile
import threading
from pathlib import Path


def cache_root() -> Path:
    """$FLASHSIM_CACHE, or ~/.cache/flashsim."""
    return Path(os.environ.get("FLASHSIM_CACHE") or Path.home() / ".cache" / "flashsim")


def cache_key(**parts) -> str:
    """A stable 32-hex-digit key for JSON-serialisable parts (sorted, so order does not matter)."""
    blob = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def read_entry(path: Path) -> bytes | None:
    """The entry's bytes, or None when it is absent or unreadable."""
    try:
        return path.read_bytes()
    except OSError:
        return None


def read_text_entry(path: Path) -> str | None:
    """The entry as UTF-8 text, or None when it is absent, unreadable or does not decode (damaged:
    the caller rebuilds it and overwrites the entry)."""
    data = read_entry(path)
    try:
        return None if data is None else data.decode()
    except UnicodeDecodeError:
        return None


def store_atomic(path: Path, data: bytes) -> bool:
    """Write `data` to `path` through a temporary file and a rename, so a reader never sees half
    an entry. Returns False (and leaves no temporary behind) when the directory cannot be written.
    The temporary is this thread's own (processes of a parallel test session, or threads of a Dask
    worker, may fill the same entry at once: the last rename wins, each with a whole file)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        return False
    return True


@functools.cache
def _scratch_dir() -> Path:
    """A temporary directory of this process, removed at exit: where files go that the cache
    cannot hold."""
    path = Path(tempfile.mkdtemp(prefix="flashsim-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def stored_file(kind: str, name: str, data: bytes) -> Path:
    """A path whose file holds `data`: the cache entry cache_root()/kind/name (written if it does
    not hold `data` yet), or, where the cache cannot be written, a file of this process's
    temporary directory."""
    path = cache_root() / kind / name
    if read_entry(path) == data or store_atomic(path, data):
        return path
    path = _scratch_dir() / kind / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path
