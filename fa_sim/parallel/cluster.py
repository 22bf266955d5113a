"""The same Jobs on a Dask distributed cluster (the optional extra: pip install flashsim[cluster]).

    DaskPool("local", workers=2)           # starts a LocalCluster of 2 single-threaded processes here
    DaskPool("tcp://10.0.0.5:8786")        # a running scheduler (`dask scheduler`, `dask worker ADDR`)

Why Dask rather than Ray: the extra is a few pure-Python wheels (about 5 MB with its dependencies,
against about 80 MB for Ray's wheel and its gRPC stack), installs on any Python the project runs
on, starts a local cluster in seconds with ordinary processes, and its model - scatter the inputs
once, submit tasks, collect results as they complete - is exactly a sharded simulation. Every
worker needs flashsim installed (the same version), as it runs fa_sim's own functions.

The job's context is scattered once (broadcast to every worker); each task is a future whose
result streams back as it completes (the progress bar advances per finished task). A task that
kills its worker is retried by Dask on another worker a few times, then reported as
distributed.KilledWorker: here a ShardError naming the task. A scheduler that disappears or
stops answering is a ClusterError naming the task being waited for. On any error or Ctrl-C the
remaining futures are cancelled; a local cluster is closed with its worker processes.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
import types
import uuid
from typing import Callable, Sequence

from .errors import CLUSTER_EXTRA, ClusterError, ShardError
from .job import Job, Task

CONNECT_TIMEOUT_S = 20  # reaching a scheduler, and reconnecting to one that went away
POLL_S = 1.0  # how often a wait for results looks whether the cluster is still there


def _distributed():
    try:
        import distributed
    except ImportError:
        raise ClusterError(f"--cluster / cluster= needs Dask distributed, which is not installed: {CLUSTER_EXTRA}") \
            from None
    return distributed


def check_available() -> None:
    """ClusterError naming the extra when Dask distributed is missing."""
    _distributed()


def _quiet() -> Callable[[], None]:
    """Silence Dask's loggers (each has its own level); returns what restores them."""
    loggers = [logging.getLogger(n) for n in list(logging.Logger.manager.loggerDict)
               if n == "distributed" or n.startswith("distributed.")]
    loggers.append(logging.getLogger("distributed"))
    levels = [(log, log.level) for log in loggers]
    for log, _ in levels:
        log.setLevel(logging.CRITICAL)

    def restore() -> None:
        for log, level in levels:
            log.setLevel(level)
    return restore


@contextlib.contextmanager
def _spawn_without_main():
    """A local cluster's workers start through multiprocessing's spawn, which re-runs the parent's
    __main__ in each: a script without an `if __name__ == "__main__":` guard would start the
    cluster again (and fail), one read from stdin cannot be found. A Dask worker needs nothing from
    __main__ (cloudpickle sends what a script defines by value), so while the cluster starts,
    __main__ is a bare module that spawn leaves alone (no __file__, no __spec__)."""
    real = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = real


def _run_task(setup, context, work, payload):
    return work(setup(context), payload, lambda n: None)


class DaskPool:
    """A Dask client (and, for "local", the cluster it started); use as a context manager."""

    shares_memory = False

    def __init__(self, address: str, workers: int | None = None) -> None:
        if not isinstance(address, str) or not address.strip():
            raise ValueError(f"cluster must be 'local' or a Dask scheduler address like tcp://host:8786, got {address!r}")
        self.address, self.workers = address.strip(), workers
        self.client = self.cluster = None

    def describe(self) -> str:
        n = self.threads()
        return f"Dask cluster {self.address} ({n} worker thread{'s' if n != 1 else ''})"

    def __enter__(self) -> "DaskPool":
        d = _distributed()
        self._restore = _quiet()  # Dask's errors come back as one ClusterError / ShardError
        try:
            if self.address == "local":
                with _spawn_without_main():
                    self.cluster = d.LocalCluster(n_workers=self.workers or 1, threads_per_worker=1, processes=True,
                                                  dashboard_address=None, silence_logs=logging.ERROR)
                self.client = d.Client(self.cluster)
            else:
                self.client = d.Client(self.address, timeout=CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:
            self.__exit__(None, None, None)
            raise ClusterError(f"cannot reach the Dask scheduler at {self.address}: {exc}") from None
        return self

    def __exit__(self, *exc) -> None:
        for closable in (self.client, self.cluster):
            if closable is not None:
                try:
                    closable.close()
                except Exception:  # noqa: BLE001 - closing a cluster that is already gone
                    pass
        self.client = self.cluster = None
        if exc[0] is None:  # after a lost cluster Dask logs its retries for a while: leave them quiet
            getattr(self, "_restore", lambda: None)()

    def threads(self) -> int:
        return max(1, sum(self.client.nthreads().values())) if self.client is not None else 1

    def run(self, job: Job, tasks: Sequence[Task], on_progress: Callable[[int], None],
            on_result: Callable[[Task, object], None]) -> None:
        d = _distributed()
        client = self.client
        run_id = uuid.uuid4().hex[:8]
        context = client.scatter(job.context, broadcast=True, hash=False)
        futures = {client.submit(_run_task, job.setup, context, job.work, t.payload, pure=False,
                                 key=f"flashsim-{run_id}-{t.index}"): t
                   for t in sorted(tasks, key=lambda t: -t.weight)}
        pending = set(futures)
        try:
            while pending:
                done, pending = self._wait(d, pending, futures)
                for fut in done:
                    task = futures[fut]
                    result = self._result(d, fut, task)
                    on_progress(task.weight)
                    on_result(task, result)
        finally:
            try:
                client.cancel(list(futures) + [context], force=True)
            except Exception:  # noqa: BLE001 - the cluster may be gone already
                pass

    def _wait(self, d, pending: set, futures: dict):
        """(done, still pending), polling so that a scheduler that went away is noticed: Dask
        then cancels the futures, and as_completed alone would wait for ever."""
        while True:
            try:
                got = d.wait(pending, timeout=POLL_S, return_when="FIRST_COMPLETED")
                return got.done, got.not_done
            except TimeoutError:
                if self.client.status in ("closing", "closed"):
                    self._lost(futures, pending, "the client was closed")
            except d.CancelledError as exc:
                reason = re.search(r"reason: ([\w-]+)", str(exc))
                self._lost(futures, pending, reason.group(1) if reason else type(exc).__name__)

    def _lost(self, futures: dict, pending: set, why: str) -> None:
        first = min((futures[f] for f in pending), key=lambda t: t.index)
        more = f" and {len(pending) - 1} more task(s)" if len(pending) > 1 else ""
        raise ClusterError(f"{first.name}{more}: the Dask cluster at {self.address} went away ({why}); "
                           "no result is returned")

    def _result(self, d, fut, task: Task):
        try:
            return fut.result()
        except d.KilledWorker as exc:
            raise ShardError(f"{task.name}: the Dask workers that ran it died ({exc}); no result is returned") from None
        except d.CancelledError as exc:
            raise ClusterError(f"{task.name}: cancelled by the Dask cluster at {self.address} ({exc}); "
                               "no result is returned") from None
        except Exception as exc:
            exc.add_note(f"raised in {task.name} on the Dask cluster {self.address}")
            raise
