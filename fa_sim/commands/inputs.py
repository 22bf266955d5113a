"""Input files and sizes of the `fa` commands, checked before any long work.

`load_npz` reads only what numpy.savez writes: a zip archive of plain numeric arrays, never
pickled objects (loading a pickle can run arbitrary code). Anything else - a missing, truncated
or corrupt file, a single .npy array, a pickle, an object array - is one UsageError naming the
option, the file, what is wrong and what is accepted.
"""

from __future__ import annotations

import argparse
import copy
import os
import zipfile
import zlib
from pathlib import Path

import numpy as np

from ..config import HEAD_DIMS
from ..validate import check_input, check_shapes, empty_message
from . import UsageError

NPY_MAGIC = b"\x93NUMPY"
ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")  # a local file header; an empty archive's end record
PICKLE_PROTO = b"\x80"  # pickle protocol 2 and later start with PROTO
QKV = "arrays q [B, H, Nq, d], k and v [B, H, Nk, d] (numpy.savez(FILE, q=q, k=k, v=v))"
PACKED = ("arrays q [total_q, H, d], k and v [total_k, H_k, d], cu_seqlens_q and cu_seqlens_k (int32, B + 1 "
          "offsets; a packed batch, fa_sim.varlen)")
CU_NAMES = ("cu_seqlens_q", "cu_seqlens_k")

# -- --npz FILE: the one name of the q, k, v input file in every command ---------------------------------
INPUTS_OPTION = "--npz"
HIDDEN_ALIASES = ("--input",)  # fa trace's former name of --npz: old command lines keep working


class _InputsFile(argparse.Action):
    """Stores the file and the spelling used, so that messages name the option as it was typed."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        setattr(namespace, "npz_option", option_string)


def add_inputs_argument(p) -> None:
    """--npz FILE (hidden alias --input): q, k, v from a file instead of random ones."""
    p.add_argument(INPUTS_OPTION, *HIDDEN_ALIASES, dest="npz", action=_InputsFile, metavar="FILE", default=None,
                   help=f"inputs from an .npz with {QKV} instead of random ones; the file fixes the shape "
                        f"(default: random)")


def inputs_option(args) -> str:
    """How the command line spelled the input file's option (--npz, or its alias)."""
    return getattr(args, "npz_option", None) or INPUTS_OPTION


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The subcommands' help: descriptions as written, hidden aliases (HIDDEN_ALIASES) left out."""

    def _format_action_invocation(self, action):
        if set(action.option_strings) & set(HIDDEN_ALIASES):
            action = copy.copy(action)
            action.option_strings = [o for o in action.option_strings if o not in HIDDEN_ALIASES]
        return super()._format_action_invocation(action)


def host_memory_bytes() -> int | None:
    """Physical memory of this machine (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


def check_host_memory(need: int, shape: str, what: str, fix: str) -> None:
    """UsageError when `need` bytes exceed the machine's physical memory."""
    have = host_memory_bytes()
    if have is not None and need > have:
        raise UsageError(f"{shape}: {what} alone need {gib(need)}, more than this machine's {gib(have)} of "
                         f"memory; {fix}")


def _refuse(option: str, path, problem: str, accepted: str) -> UsageError:
    return UsageError(f"{option} {path}: {problem}; {option} takes an .npz archive holding {accepted}")


def _sniff(option: str, path: Path, accepted: str) -> None:
    """Refuse what is not a zip archive before numpy guesses at it."""
    if not path.exists():
        raise _refuse(option, path, "no such file", accepted)
    if path.is_dir():
        raise _refuse(option, path, "is a directory", accepted)
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError as exc:
        raise _refuse(option, path, f"cannot be read ({exc.strerror})", accepted) from None
    if head.startswith(NPY_MAGIC):
        raise _refuse(option, path, "is a single .npy array, not an .npz archive", accepted)
    if head.startswith(PICKLE_PROTO):
        raise _refuse(option, path, "is a pickle file, which is never loaded (it could run code)", accepted)
    if not head.startswith(ZIP_MAGICS):
        raise _refuse(option, path, "is not an .npz archive (not a zip file)" if head else "is empty", accepted)


def load_npz(path, names, option: str, accepted: str, optional=()) -> dict[str, np.ndarray]:
    """The named arrays of an .npz file, and those of `optional` it holds (module docstring)."""
    path = Path(path)
    _sniff(option, path, accepted)
    out = {}
    try:
        with np.load(path, allow_pickle=False) as data:
            missing = [n for n in names if n not in data.files]
            if missing:
                raise _refuse(option, path, f"lacks array(s) {', '.join(missing)}", accepted)
            for name in [*names, *(n for n in optional if n in data.files)]:
                try:
                    out[name] = data[name]
                except ValueError as exc:
                    if "allow_pickle" not in str(exc):
                        raise
                    raise _refuse(option, path, f"array {name} holds Python objects, which are never loaded",
                                  accepted) from None
                if not isinstance(out[name], np.ndarray):  # a member that is not .npy data comes back as bytes
                    raise _refuse(option, path, f"member {name} is not a .npy array ({len(out[name]):,} bytes of "
                                                "other data)", accepted)
    except (OSError, EOFError, ValueError, zipfile.BadZipFile, zlib.error) as exc:
        raise _refuse(option, path, f"is truncated or corrupt ({type(exc).__name__}: {exc})", accepted) from None
    return out


def load_qkv(path, option: str, packed: bool = False):
    """q, k, v [B, H, N, d] of numeric dtype from an .npz. `packed` (fa sim): the file may hold a packed
    batch (cu_seqlens_q, cu_seqlens_k with q [total_q, H, d], ...): -> (q, k, v, (cu_q, cu_k) or None);
    elsewhere such a file is refused in one line."""
    data = load_npz(path, ("q", "k", "v"), option, QKV, optional=CU_NAMES)
    if any(n in data for n in CU_NAMES):
        if not packed:
            raise UsageError(f"{option} {path}: holds {' and '.join(n for n in CU_NAMES if n in data)} (a packed "
                             "batch), which this command does not take (fa sim, fa hw, fa time, fa trace and fa banks do); unpack the "
                             "sequences for this command")
        return (*_packed_qkv(data, path, option), (data.get("cu_seqlens_q"), data.get("cu_seqlens_k")))
    for name, x in data.items():
        if x.ndim != 4:
            raise _refuse(option, path, f"{name} must have rank 4 [batch, heads, seqlen, head_dim], got shape "
                                        f"{x.shape}", QKV)
        if x.dtype.kind not in "fiu":
            raise _refuse(option, path, f"{name} has dtype {x.dtype}, not a number type", QKV)
        if 0 in x.shape:
            raise UsageError(f"{option} {path}: {empty_message(name, x.shape)}")
        if x.shape[3] not in HEAD_DIMS:
            raise UsageError(f"{option} {path}: {name} has head_dim {x.shape[3]} (shape {x.shape}); the kernel "
                             f"supports head_dim {', '.join(map(str, HEAD_DIMS))}")
    try:  # the shapes together and every value (fa_sim.validate's policy), with the file named
        check_shapes(*(data[n].shape for n in ("q", "k", "v")))
        for name in ("q", "k", "v"):
            check_input(data[name], name).fp16()
    except ValueError as exc:
        raise UsageError(f"{option} {path}: {exc}") from None
    if packed:
        return data["q"], data["k"], data["v"], None
    return data["q"], data["k"], data["v"]


def _packed_qkv(data, path, option: str):
    """q, k, v of a packed file, after fa_sim.varlen's checks of the shapes and offsets and every
    value check of the policy: one UsageError line each."""
    from ..varlen import head_major, make_varlen_problem

    missing = [n for n in CU_NAMES if n not in data]
    if missing:
        raise _refuse(option, path, f"lacks array {missing[0]} (a packed batch needs both offsets)", PACKED)
    try:
        views = [head_major(data[n], n, "total_q" if n == "q" else "total_k") for n in ("q", "k", "v")]
        for name, x in zip("qkv", views):
            if x.dtype.kind not in "fiu":
                raise ValueError(f"{name} has dtype {x.dtype}, not a number type")
            if x.shape[3] not in HEAD_DIMS:
                raise ValueError(f"{name} has head_dim {x.shape[3]}; the kernel supports head_dim "
                                 f"{', '.join(map(str, HEAD_DIMS))}")
        make_varlen_problem(*(x.shape for x in views), data["cu_seqlens_q"], data["cu_seqlens_k"], False, None, None)
        for name, x in zip("qkv", views):
            check_input(x, name).fp16()
    except ValueError as exc:
        raise UsageError(f"{option} {path}: {exc}") from None
    return data["q"], data["k"], data["v"]
