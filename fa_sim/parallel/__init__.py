"""Large problems and sweeps on every core and across machines (issue 12).

    fa_sim.simulate(q, k, v, workers=4)              # the grid's waves over 4 local processes
    fa_sim.simulate(q, k, v, workers="auto")         # one per core
    fa_sim.simulate(q, k, v, cluster="local")        # a Dask LocalCluster here (pip install flashsim[cluster])
    fa_sim.simulate(q, k, v, cluster="tcp://host:8786")
    results = pmap(fn, items, workers="auto")        # any picklable module-level fn, e.g. sweep cases

Modules: shards.py cuts the grid (whole waves, so results are bit-identical to the serial run),
merge.py is the observers' merge protocol, sharded.py the sharded simulation (on fa_sim.run, the
serial run's own loop), pool.py the local worker processes and worker.py their entry point (they
import the user's script only to find a class or function defined there, so a script needs no
`if __name__ == "__main__":` guard otherwise), cluster.py the Dask backend, job.py what both run.

`workers`: None or 1 = this process; an integer N >= 1; "auto" = the cores this process may use.
A local pool starts min(N, tasks) processes (a grid has at most one task per wave); more than the
cores this process may use is allowed (a line on stderr says so: they share the cores).
Grids of one wave run here whatever `workers` says (nothing to share out), and so do runs
estimated under AUTO_MIN_SECONDS with "auto"; an observer without fresh/partial/merge makes an
explicit `workers` or `cluster` a ValueError, and "auto" serial.
"""

from __future__ import annotations

from typing import Callable, Iterable

from ..estimate import Estimate, estimate
from ..run import RunSpec
from .cluster import DaskPool, check_available
from .errors import CLUSTER_EXTRA, ClusterError, ParallelError, ShardError
from .job import Job, Task, call_with, no_setup
from .merge import mergeable, merge_counts, unmergeable
from .pool import LocalPool, cpu_count
from .sharded import ShardedRun
from .shards import Shard, plan_shards

AUTO = "auto"
AUTO_MIN_SECONDS = 2.0  # "auto" runs shorter simulations (fa_sim.estimate) here: starting workers costs ~0.5 s

__all__ = ["AUTO", "CLUSTER_EXTRA", "ClusterError", "Job", "LocalPool", "ParallelError", "Shard", "ShardError",
           "Task", "choose_pool", "cpu_count", "mergeable", "merge_counts", "plan_shards", "pmap", "resolve_workers",
           "unmergeable"]


def resolve_workers(workers) -> int:
    """None -> 1, "auto" -> cpu_count(), a positive integer -> itself; anything else a ValueError."""
    if workers is None:
        return 1
    if workers == AUTO:
        return cpu_count()
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive integer, 'auto' or None, got {workers!r}")
    return workers


def _pool(workers: int, cluster: str | None):
    return LocalPool(workers) if cluster is None else DaskPool(cluster, workers)


def choose_pool(spec: RunSpec, observers, workers, cluster, plan: Estimate) -> ShardedRun | None:
    """The ShardedRun that fa_sim.simulate delegates to, or None to run in this process."""
    n = resolve_workers(workers)
    if cluster is not None:
        check_available()
    elif n == 1:
        return None
    bad = unmergeable(observers)
    if bad:
        if workers == AUTO and cluster is None:
            return None
        raise ValueError(f"observer(s) {', '.join(bad)} cannot be split over workers (no fresh/partial/merge, "
                         "fa_sim.parallel.merge); run with workers=1 or give them those methods")
    waves = len(spec.waves())
    if cluster is None and (waves == 1 or (workers == AUTO and plan.sim_seconds < AUTO_MIN_SECONDS)):
        return None
    if cluster is None:
        _check_memory(spec, min(n, waves), plan)  # LocalPool starts at most one process per wave
    return ShardedRun(_pool(n, cluster), tuple(o.fresh() for o in observers))


def _check_memory(spec: RunSpec, n: int, plan: Estimate) -> None:
    """Workers share the inputs; each holds the temporaries of one wave."""
    one, two = (estimate(spec.prob, spec.mma_model, w).sim_bytes for w in (1, 2))
    per_cta, io = two - one, one - (two - one)
    need = 2 * io + n * min(spec.wave_ctas, spec.prob.n_ctas) * per_cta
    if need > plan.machine:
        fit = max(int((plan.machine - 2 * io) // max(min(spec.wave_ctas, spec.prob.n_ctas) * per_cta, 1)), 0)
        raise ValueError(f"{spec.prob.describe()}: {n} workers need about {need / 2**30:.1f} GiB, more than the "
                         f"{plan.machine / 2**30:.1f} GiB this machine has; use at most {fit} workers or a smaller "
                         "wave_ctas")


def pmap(fn: Callable, items: Iterable, *, workers=AUTO, cluster: str | None = None, names=None,
         on_done: Callable[[int, object], None] | None = None) -> list:
    """[fn(item) for item in items], the calls spread over local processes or a Dask cluster.

    fn must be a module-level function; items and results picklable. names[i] is what an error
    calls item i. on_done(i, result) is called as each finishes (progress). One process and no
    pool when there is one item or one worker."""
    items = list(items)
    names = [f"item {i + 1} of {len(items)}" for i in range(len(items))] if names is None else list(names)
    n = resolve_workers(workers)
    results: dict[int, object] = {}

    def done(task: Task, result) -> None:
        results[task.index] = result
        if on_done is not None:
            on_done(task.index, result)

    if cluster is None and (n == 1 or len(items) <= 1):
        for i, item in enumerate(items):
            done(Task(i, names[i], item), fn(item))
    else:
        tasks = [Task(i, names[i], item) for i, item in enumerate(items)]
        with _pool(n, cluster) as pool:
            pool.run(Job(no_setup, fn, call_with), tasks, lambda n: None, done)
    if len(results) != len(items):
        raise ShardError(f"{len(items) - len(results)} of {len(items)} tasks returned no result")
    return [results[i] for i in range(len(items))]
