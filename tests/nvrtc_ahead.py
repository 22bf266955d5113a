"""NVRTC work done ahead on the spare cores (conftest.py): the builds that tests marked
`nvrtc_ahead` compile through the on-disk cache (fa_sim.cache) are compiled in worker processes
while the test process runs the tests before them; each test still compiles its build, which is
then a cache hit (keyed by the exact source, options and NVRTC version: the same NVRTC output).

NVRTC compiles are single-threaded C and pytest runs one test at a time, so on a machine with
two cores the second one is otherwise idle. A failing compile is not reported here: the test
that compiles the build reports it. Importable by name, as spawned workers need.
"""

from __future__ import annotations

import enum
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

from fa_sim.contract import KernelBuild

MIN_BUILDS = 8  # fewer builds than this (one test picked by hand): not worth starting workers


class Kind(enum.Enum):
    """What a test compiles for its build: the GPU's cubin, or the simulator's PTX."""

    CUBIN = "cubin"
    PTX = "ptx"


def compile_one(kind: Kind, build: KernelBuild) -> None:
    """Fill the cache entry of one build; any error is the test's to report."""
    try:
        if kind is Kind.CUBIN:
            from fa_sim.contract.cubins import compile_build

            compile_build(build)
        else:
            from fa_sim.contract.nvrtc import kernel_ptx

            kernel_ptx(build)
    except Exception:  # noqa: BLE001 - the test compiles it again and fails with the real error
        pass


def spare_cores() -> int:
    """Cores this process may use beyond the one the tests run on."""
    try:
        return len(os.sched_getaffinity(0)) - 1
    except AttributeError:  # not Linux
        return (os.cpu_count() or 1) - 1


class Ahead:
    """Workers compiling the tests' builds from the last test's backwards, while the tests run
    forwards: the two meet in the middle and no build is compiled twice (`claim`)."""

    def __init__(self, work: list[tuple[Kind, KernelBuild]], workers: int) -> None:
        # spawn, not fork: a test may hold a CUDA context, which a fork must not copy
        self.pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
        self.futures = {key: self.pool.submit(compile_one, *key) for key in reversed(work)}

    def claim(self, key: tuple[Kind, KernelBuild]) -> None:
        """Before the test of `key` runs: a build not started is the test's to compile; one being
        compiled is waited for (the test then reads it from the cache)."""
        future = self.futures.pop(key, None)
        if future is not None and not future.cancel():
            try:
                future.result()
            except Exception:  # noqa: BLE001 - a worker that died: the test compiles the build itself
                pass

    def stop(self) -> None:
        """A run cut short (-x, Ctrl-C, the end) does not wait for the rest of the work."""
        self.pool.shutdown(wait=False, cancel_futures=True)


def start(work: list[tuple[Kind, KernelBuild]]) -> Ahead | None:
    """Workers for `work` (in the tests' order), or None where there is no spare core or too
    little work."""
    work = list(dict.fromkeys(work))
    workers = spare_cores()
    if workers < 1 or len(work) < MIN_BUILDS:
        return None
    return Ahead(work, workers)
