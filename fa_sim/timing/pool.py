"""A prediction's independent cold work over a few processes: `pmap`.

    n = workers(len(items), estimated_seconds)     # 1: run here; else min(cores, items)
    results = pmap(lambda i: work(items[i]), len(items), n, done=lambda i, r: ...)

What runs here is what `predict_launch` does cold with pieces that do not read one another: the
SM model's passes of the busiest SM (fa_sim.timing.launch.time_sm: each chain of memoized chunk
runs is one pass) and the PTX engine's run of a launch's representative CTAs (split into
interleaved parts, each part's branch paths and sector counts merged; `_predict`). The results
are put back in index order and merged in a fixed order, so a prediction is the same, bit for
bit, on one process or several (tests/test_timing_pool.py).

How: the work (a closure over the parent's data: Step streams, the launch's arrays) is left in a
module global and the workers are forked (multiprocessing's fork context, concurrent.futures'
ProcessPoolExecutor, which forks every worker at the first submit), so they find it in their
copy of the parent's memory; only an index goes to a worker and its result comes back pickled.
The disk cache is written by the parent alone (the prediction, once merged); a worker writes no
entry of its own. Nothing runs in a pool inside a worker.

When: `workers` gives 1 (run in this process) for one piece, inside a worker, or when the
estimated serial seconds are below MIN_PARALLEL_SECONDS (forking and the results' trip cost
about 0.1 s a worker; below a couple of seconds the estimate is too rough to be sure of a gain); else
one worker per core this process may use (its affinity mask), at most one per piece. The
environment variable FLASHSIM_TIMING_WORKERS=N sets N instead (1: always in this process; N >= 2:
up to N workers whenever there are several pieces, whatever their size). A pool that cannot start
(no fork on this system, a process limit) or whose worker dies (killed, out of memory) costs time,
never the prediction: the pieces it did not return run here, with one line on stderr. An
exception raised by a piece is raised here as it was.
"""

from __future__ import annotations

import os
import sys
from typing import Callable

ENV = "FLASHSIM_TIMING_WORKERS"
MIN_PARALLEL_SECONDS = 2.0  # estimated serial seconds of work below which it runs in this process (4 s kept the
# causal (8, 32, 8192, 128) backward's main-kernel SM passes, 3.4 s estimated and taken, on one core)

_work: Callable | None = None  # the piece function of the pmap in progress (read by the forked workers)
_in_worker = False  # set in a worker: it starts no pool of its own


def env_workers() -> int | None:
    """FLASHSIM_TIMING_WORKERS as an integer >= 1, None where unset or empty; ValueError (one line)
    for anything else."""
    text = os.environ.get(ENV, "").strip()
    if not text:
        return None
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"{ENV} must be an integer >= 1 (the timing model's worker processes; 1: none), got "
                         f"{text!r:.40}")
    return n


def cpu_count() -> int:
    """Cores this process may run on (its affinity mask, which containers and taskset narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def workers(items: int, seconds: float) -> int:
    """The processes for `items` independent pieces of about `seconds` of work in all (serial,
    estimated): see the module docstring."""
    asked = env_workers()  # checked whatever the pieces (predict_launch checks it before any work)
    if items < 2 or _in_worker:
        return 1
    if asked is not None:
        return min(asked, items)
    if seconds < MIN_PARALLEL_SECONDS:
        return 1
    return max(1, min(cpu_count(), items))


def _mark_worker() -> None:
    global _in_worker
    _in_worker = True


def _call(i: int):
    return _work(i)


def pmap(fn: Callable, n: int, n_workers: int, done: Callable | None = None, sizes=None) -> list:
    """[fn(0), ..., fn(n - 1)], computed on `n_workers` forked processes when more than 1, else
    here; `done(i, result)` is called here as each piece finishes (in the order they finish: for
    progress; the result list is in index order whatever that order). `sizes`: each piece's
    estimated work, where known; the workers then take the largest first (longest processing time
    first: the last pieces end together instead of one long piece starting last)."""
    global _work

    results: list = [None] * n
    have = [False] * n

    def keep(i, r) -> None:
        results[i], have[i] = r, True
        if done is not None:
            done(i, r)

    if n_workers > 1 and n > 1 and not _in_worker:
        import multiprocessing
        from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
        from concurrent.futures.process import BrokenProcessPool

        why, pool, pending = None, None, {}
        _work = fn
        try:
            try:
                pool = ProcessPoolExecutor(min(n_workers, n), mp_context=multiprocessing.get_context("fork"),
                                           initializer=_mark_worker)
                order = range(n) if sizes is None else sorted(range(n), key=lambda i: (-sizes[i], i))
                pending = {pool.submit(_call, i): i for i in order}  # forks every worker at the first submit
            except (OSError, ValueError) as exc:  # no fork start method; no process or pipe to be had
                why = f"the worker processes could not start ({type(exc).__name__}: {exc})"
            while pending and why is None:
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for f in sorted(finished, key=pending.__getitem__):
                    i = pending.pop(f)
                    try:
                        r = f.result()  # a piece's own exception is raised as it was
                    except BrokenProcessPool as exc:
                        why = f"a worker process died ({exc})"
                        break
                    keep(i, r)
        finally:
            _work = None
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
        if why is not None:
            left = have.count(False)
            print(f"fa_sim.timing: {why}; the {left} piece{'s' if left != 1 else ''} not done run in this process",
                  file=sys.stderr, flush=True)
    for i in range(n):
        if not have[i]:
            keep(i, fn(i))
    return results
