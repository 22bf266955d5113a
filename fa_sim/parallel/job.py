"""What a pool runs: a Job (set up once per worker, then one `work` call per task) over Tasks.

Both pools (pool.LocalPool, cluster.DaskPool) take the same Job: `setup(context) -> state` runs
once in each worker process (the context travels once per worker locally, once per cluster through
Dask's scatter), `work(state, payload, progress) -> result` once per task; `progress(n)` reports n
units of the task's `weight` done (the local pool forwards them, Dask reports whole tasks). setup
and work must be module-level functions (pickled by reference).

A local worker (pool.py) is a process of its own, started at fa_sim's entry point (worker.py); the
messages between the two are defined at the end.
"""

from __future__ import annotations

import enum
import os
import sys
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Task:
    index: int  # position in the caller's order (results merge in this order)
    name: str  # what an error calls it: "shard 3 of 8 (CTAs 192..255)", "case m64n64d64w4-swizzled ..."
    payload: object
    weight: int = 1  # progress units of the whole task (CTA-rounds for shards)


@dataclass(frozen=True)
class Job:
    setup: Callable
    context: object
    work: Callable


def no_setup(context):
    """setup for jobs whose tasks need nothing shared: the state is the context itself."""
    return context


def call_with(state, payload, progress):
    """work for `pmap`: the state is the function, the payload its argument."""
    return state(payload)


# -- what a local worker process and its parent say to each other (pool.py, worker.py) --------------
class Msg(enum.Enum):
    READY = "ready"
    PROGRESS = "progress"
    DONE = "done"
    FAILED = "failed"


IN_WORKER_ENV = "FLASHSIM_WORKER"  # set in every local worker's environment: a worker starts no pool of its own


@dataclass(frozen=True)
class WorkerStart:
    """The first message to a local worker: what it needs before it can unpickle its job. The
    parent's argv, and where its __main__ came from (`python -m NAME` or a script
    FILE; neither for stdin, -c or an interactive session): the worker imports that __main__ only
    if the job refers to something defined there (a function or class of the user's script), as
    multiprocessing's spawn would, and never otherwise."""

    argv: tuple[str, ...]
    main_name: str | None
    main_path: str | None

    @classmethod
    def of_this_process(cls) -> "WorkerStart":
        main = sys.modules.get("__main__")
        name = getattr(getattr(main, "__spec__", None), "name", None)
        path = getattr(main, "__file__", None)
        path = os.path.abspath(path) if path is not None and os.path.isfile(path) else None  # not "<stdin>"
        return cls(tuple(sys.argv), name, path)
