"""The on-disk cache shared by everything flashsim compiles or parses: cubins (fa_hw.compile),
PTX (fa_sim.contract.nvrtc) and parsed PTX modules (fa_sim.ptx.load).

One root, $FLASHSIM_CACHE or ~/.cache/flashsim, one subfolder per kind of artefact. Entries are
named by a hash of everything that determines them, so an entry is never stale, only unused.
The cache is an optimisation only: a missing, read-only or full cache directory costs time, never
an error, and writes are atomic so parallel workers may fill the same entry.
"""

from __future__ import annotations

import hashlib
import json
import os
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


def store_atomic(path: Path, data: bytes) -> bool:
    """Write `data` to `path` through a temporary file and a rename, so a reader never sees half
    an entry. Returns False (and leaves no temporary behind) when the directory cannot be written."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
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
