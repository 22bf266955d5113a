"""fa_sim.simulate over shards: the worker side (`run_shard`) and the parent side (`ShardedRun`).

Locally the inputs and outputs live in one file in /dev/shm (`SharedFile`, memory-mapped by
every worker: q, k, v are written once and never copied per worker; each shard writes its own
rows of O and LSE in place). On a Dask cluster q, k, v are scattered once and every shard returns
its rows of O and LSE (shards.rows). Each shard runs its waves through fa_sim.run.run_ctas, the
serial run's own loop, with fresh copies of the observers, and returns its instruction counts and
each observer's partial(); the parent merges them in shard order (fa_sim.parallel.merge), whatever
order they finish in, and returns only when every shard has been merged.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass

import numpy as np

from ..hub import Hub
from ..run import RunSpec, global_memory, run_ctas
from .errors import ShardError
from .job import Job, Task
from .merge import merge_counts
from .shards import TASKS_PER_WORKER, Shard, plan_shards, rows as shard_rows

SHM_DIR = "/dev/shm"  # RAM-backed on Linux; elsewhere (or when full) the temporary directory
ALIGN = 4096


@dataclass(frozen=True)
class SharedFile:
    """Named arrays at page-aligned offsets of one file that every worker maps."""

    path: str
    fields: tuple[tuple[str, int, tuple[int, ...], str], ...]  # (name, offset, shape, dtype)

    @classmethod
    def create(cls, arrays: dict) -> "SharedFile":
        """arrays: name -> an array to copy in, or (shape, dtype) for zeros."""
        fields, size = [], 0
        for name, a in arrays.items():
            shape, dtype = (a.shape, a.dtype) if isinstance(a, np.ndarray) else (tuple(a[0]), np.dtype(a[1]))
            fields.append((name, size, tuple(shape), np.dtype(dtype).str))
            size += -(-max(int(np.prod(shape)) * np.dtype(dtype).itemsize, 1) // ALIGN) * ALIGN
        where = SHM_DIR if os.path.isdir(SHM_DIR) and _free(SHM_DIR) > 2 * size else None
        fd, path = tempfile.mkstemp(prefix="flashsim-", suffix=".shared", dir=where)
        try:
            os.ftruncate(fd, max(size, 1))  # zeros, allocated only where written
        finally:
            os.close(fd)
        shared = cls(path, tuple(fields))
        views = shared.open()
        for name, a in arrays.items():
            if isinstance(a, np.ndarray):
                views[name][...] = a
        return shared

    def open(self) -> dict[str, np.ndarray]:
        mm = np.memmap(self.path, dtype=np.uint8, mode="r+")
        return {name: mm[off: off + int(np.prod(shape)) * np.dtype(dt).itemsize].view(dt).reshape(shape)
                for name, off, shape, dt in self.fields}

    def unlink(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def _free(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


# -- the worker side ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class ShardContext:
    """What every worker gets once: the run, the observers' fresh prototypes, and the inputs
    (`shared`: the mapped file, locally; `qkv`: the arrays themselves, on a cluster)."""

    spec: RunSpec
    prototypes: tuple
    shared: SharedFile | None = None
    qkv: tuple | None = None


@dataclass(frozen=True, eq=False)
class ShardResult:
    counts: dict
    partials: list
    o: np.ndarray | None = None  # [rows, d] uint16, the shard's slab (cluster only)
    lse: np.ndarray | None = None  # [rows] float32


def attach(ctx: ShardContext) -> ShardContext:
    """setup: nothing to do until a shard runs (the mapping is made per shard, and dropped after)."""
    return ctx


def run_shard(ctx: ShardContext, shard: Shard, progress) -> ShardResult:
    """work: the shard's waves on the serial run's loop, with fresh observers."""
    prob = ctx.spec.prob
    if ctx.shared is not None:
        a = ctx.shared.open()
        q, k, v, o, lse = a["q"], a["k"], a["v"], a["o"], a["lse"]
    else:
        (q, k, v), o, lse = ctx.qkv, None, None
    gmem, bufs, ptr = global_memory(prob, q, k, v, o, lse)
    hub = Hub([p.fresh() for p in ctx.prototypes])
    hub.launch(ctx.spec.launch_info())
    run_ctas(ctx.spec, gmem, ptr, hub, list(shard.waves), progress)
    partials = [obs.partial() for obs in hub.observers]
    if ctx.shared is not None:
        return ShardResult(dict(hub.counts), partials)
    mine = shard_rows(prob, shard.ctas)
    d = prob.head_dim
    return ShardResult(dict(hub.counts), partials, bufs["o"].array.reshape(-1, d)[mine],
                       bufs["lse"].array.reshape(-1)[mine])


# -- the parent side ---------------------------------------------------------------------------------
class _Merger:
    """Merges shard results in shard order as soon as the next one is in (results arrive in any order)."""

    def __init__(self, hub, shards: list[Shard], o: np.ndarray, lse: np.ndarray, prob) -> None:
        self.hub, self.shards, self.o, self.lse, self.prob = hub, shards, o, lse, prob
        self.pending: dict[int, ShardResult] = {}
        self.next = 0

    def __call__(self, task: Task, result: ShardResult) -> None:
        self.pending[task.index] = result
        while self.next in self.pending:
            self._apply(self.shards[self.next], self.pending.pop(self.next))
            self.next += 1

    def _apply(self, shard: Shard, r: ShardResult) -> None:
        merge_counts(self.hub.counts, r.counts)
        for obs, part in zip(self.hub.observers, r.partials, strict=True):
            obs.merge(part)
        if r.o is not None:
            mine = shard_rows(self.prob, shard.ctas)
            self.o.reshape(-1, self.prob.head_dim)[mine] = r.o
            self.lse.reshape(-1)[mine] = r.lse

    def check_complete(self) -> None:
        if self.next != len(self.shards):
            missing = [s.name for s in self.shards[self.next:] if s.index not in self.pending]
            raise ShardError(f"{len(missing)} of {len(self.shards)} shards returned no result ({missing[0]} first); "
                             "the run is incomplete and no result is returned")


@dataclass
class ShardedRun:
    """A simulation split over a pool (pool.LocalPool or cluster.DaskPool), TASKS_PER_WORKER
    shards per worker thread (fewer when the grid has fewer waves)."""

    pool: object
    prototypes: tuple

    def simulate(self, spec: RunSpec, q16, k16, v16, hub: Hub, update) -> tuple[np.ndarray, np.ndarray]:
        """Run every shard, merge into hub's counts and observers; returns (o uint16, lse float32)."""
        with self.pool as pool:
            shards = plan_shards(spec, TASKS_PER_WORKER * pool.threads())
            tasks = [Task(s.index, s.name, s, s.cta_rounds) for s in shards]
            if pool.shares_memory:
                return self._local(pool, spec, (q16, k16, v16), hub, update, shards, tasks)
            prob = spec.prob
            rows = prob.batch * prob.heads * prob.seqlen_q
            o, lse = np.zeros((rows, prob.head_dim), np.uint16), np.zeros(rows, np.float32)
            merger = _Merger(hub, shards, o, lse, prob)
            ctx = ShardContext(spec, self.prototypes, qkv=(q16, k16, v16))
            pool.run(Job(attach, ctx, run_shard), tasks, update, merger)
            merger.check_complete()
            return o, lse

    def _local(self, pool, spec, qkv, hub, update, shards, tasks):
        prob = spec.prob
        rows = prob.batch * prob.heads * prob.seqlen_q
        shared = SharedFile.create({**{n: np.ascontiguousarray(a) for n, a in zip(("q", "k", "v"), qkv)},
                                    "o": ((rows, prob.head_dim), np.uint16), "lse": ((rows,), np.float32)})
        try:
            views = shared.open()
            merger = _Merger(hub, shards, views["o"], views["lse"], prob)
            pool.run(Job(attach, ShardContext(spec, self.prototypes, shared=shared), run_shard), tasks, update, merger)
            merger.check_complete()
            return np.array(views["o"]), np.array(views["lse"])  # copies: the file goes now
        finally:
            shared.unlink()
