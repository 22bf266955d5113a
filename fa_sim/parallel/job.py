"""What a pool runs: a Job (set up once per worker, then one `work` call per task) over Tasks.

Both pools (pool.LocalPool, cluster.DaskPool) take the same Job: `setup(context) -> state` runs
once in each worker process (the context travels once per worker locally, once per cluster through
Dask's scatter), `work(state, payload, progress) -> result` once per task; `progress(n)` reports n
units of the task's `weight` done (the local pool forwards them, Dask reports whole tasks). setup
and work must be module-level functions (pickled by reference).
"""

from __future__ import annotations

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
