"""Parsed PTX modules from CUDA source or PTX text, cached on disk and in the process.

`load_module` is what the engine calls: CUDA C++ goes through NVRTC (fa_sim.contract.nvrtc, its
own PTX cache), the PTX through the parser, and the parsed Module is pickled under
`fa_sim.cache.cache_root()/ptx-parsed`, keyed by the PTX text and by the source of the parser
modules themselves (a changed parser never reads an old pickle). A warm load is a hash, a file
read and an unpickle: about 6 ms of CPU for fa2_fwd.cu, plus about 45 ms once per process to load
NVRTC, whose version is part of the PTX cache key (measured, tests/test_ptx_load.py); a repeated
load in one process comes from a memo. Modules are shared values: do not mutate their dicts.
A cached PTX text that does not parse (a damaged entry) is compiled again once, replacing it; only
NVRTC's own output failing to parse is an error.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..cache import cache_root, read_entry, store_atomic
from ..contract.build import KernelBuild
from ..contract.nvrtc import DEFAULT_ARCH, compile_ptx, kernel_ptx
from .ir import Module
from .launch_args import source as check_source
from .parser import parse

_PARSER_SOURCES = ("ir.py", "lexer.py", "operands.py", "decls.py", "debuginfo.py", "parser.py")
_PTX_TEXT = re.compile(r"^\s*\.version\s+\d", re.M)
_MEMO_SIZE = 16
_MEMO: dict[str, Module] = {}  # key -> Module, oldest first


def load_module(source_or_ptx: str | os.PathLike, *, name: str | None = None, arch: str = DEFAULT_ARCH,
                macros: Mapping[str, int | str] = {}, options: Sequence[str] = (),
                use_cache: bool = True) -> Module:
    """The parsed Module of CUDA C++ source or PTX text.

    source_or_ptx: a path (os.PathLike, or a one-line str naming an existing file; '.ptx' files
    are PTX, others CUDA), or the text itself (PTX when it has a `.version` directive, else
    CUDA C++). name: the CUDA program name shown in source locations (default: the file's path,
    or 'kernel.cu'). arch, macros, options: as fa_sim.contract.nvrtc.compile_ptx (ignored for PTX).
    A one-line str without `{` that names no file is a ValueError, not CUDA source."""
    check_source(source_or_ptx)
    text, path = _read(source_or_ptx)
    if _is_ptx(text, path):
        return parsed(text, use_cache=use_cache)
    return _compiled(lambda refresh: compile_ptx(text, name=name or (str(path) if path else "kernel.cu"), arch=arch,
                                                 macros=macros, options=options, use_cache=use_cache,
                                                 refresh=refresh), use_cache)


def kernel_module(build: KernelBuild, *, use_cache: bool = True) -> Module:
    """The parsed PTX of a KernelBuild's kernel (fa2_fwd.cu or the build's variant), for SM80."""
    return _compiled(lambda refresh: kernel_ptx(build, use_cache=use_cache, refresh=refresh), use_cache)


def _compiled(compile_ptx_text, use_cache: bool) -> Module:
    """parsed(compile_ptx_text(refresh=False)); when that PTX came from the cache and does not
    parse, the entry is damaged: compile again (refresh=True replaces it) and parse that."""
    ptx = compile_ptx_text(False)
    try:
        return parsed(ptx, use_cache=use_cache)
    except ValueError:  # ParseError, or text the lexer cannot make sense of
        if not use_cache:
            raise
        fresh = compile_ptx_text(True)
        if fresh == ptx:  # NVRTC's own output: a real parse error
            raise
        return parsed(fresh, use_cache=use_cache)


def parsed(ptx: str, *, use_cache: bool = True) -> Module:
    """parse(ptx) through the in-process memo and the on-disk pickle cache."""
    if not use_cache:
        return parse(ptx)
    return _memo(hashlib.sha256(ptx.encode()).hexdigest()[:32] + parser_fingerprint(), ptx)


def _memo(key: str, ptx: str) -> Module:
    module = _MEMO.get(key)
    if module is None:
        module = _from_disk(key, ptx)
        if len(_MEMO) >= _MEMO_SIZE:
            _MEMO.pop(next(iter(_MEMO)))
        _MEMO[key] = module
    return module


def clear_memo() -> None:
    """Forget the modules parsed in this process (the disk cache stays)."""
    _MEMO.clear()


def _from_disk(key: str, ptx: str) -> Module:
    path = cache_root() / "ptx-parsed" / f"{key}.pickle"
    blob = read_entry(path)
    if blob is not None:
        try:
            module = pickle.loads(blob)
        except Exception:  # a truncated or foreign file: parse again and overwrite it
            module = None
        if isinstance(module, Module) and module.text == ptx:
            return module
    module = parse(ptx)
    store_atomic(path, pickle.dumps(module, protocol=pickle.HIGHEST_PROTOCOL))
    return module


@functools.cache
def parser_fingerprint() -> str:
    """16 hex digits of the parser's own source: part of every parsed-module cache key."""
    here = Path(__file__).parent
    digest = hashlib.sha256()
    for name in _PARSER_SOURCES:
        digest.update((here / name).read_bytes())
    return digest.hexdigest()[:16]


def _read(source_or_ptx) -> tuple[str, Path | None]:
    if isinstance(source_or_ptx, os.PathLike) or (
            isinstance(source_or_ptx, str) and "\n" not in source_or_ptx and len(source_or_ptx) < 4096
            and source_or_ptx.strip() and Path(source_or_ptx).is_file()):
        path = Path(source_or_ptx).resolve()
        try:
            return path.read_text(), path
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"cannot read {path}: {exc}") from None
    if not isinstance(source_or_ptx, str):
        raise ValueError(f"expected CUDA source, PTX text or a path, not {type(source_or_ptx).__name__}")
    return source_or_ptx, None


def _is_ptx(text: str, path: Path | None) -> bool:
    if path is not None:
        return path.suffix == ".ptx"
    return _PTX_TEXT.search(text) is not None
