"""The same Jobs on a Dask distributed cluster (the optional extra: pip install flashsim[cluster]).

    DaskPool("local", workers=2)           # starts a LocalCluster of 2 single-threaded processes here
    DaskPool("tcp://10.0.0.5:8786")        # a running scheduler (`dask scheduler`, `dask worker ADDR`)
    DaskPool("10.0.0.5:8786")              # the same

An address is "local", tcp://HOST:PORT or HOST:PORT (HOST a name, an IPv4 address or an IPv6
address in brackets), checked before anything connects (`check_address`: a ValueError naming the
accepted forms). Before the Dask client starts, the address gets CONNECT_TIMEOUT_S (5 s) to accept
a connection and answer Dask's handshake and an identity request as a scheduler does: nothing
listening, no answer (an unreachable host, an HTTP server waiting for a request) and an answer
that is not a Dask scheduler's (garbage, HTTP) are each one ClusterError line, never a hang or
Dask's own errors (which for a foreign server include a MemoryError for an absurd frame length).

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

import asyncio
import logging
import re
import threading
import uuid
from typing import Callable, Sequence

from .errors import CLUSTER_EXTRA, ClusterError, ShardError
from .job import Job, Task

CONNECT_TIMEOUT_S = 5  # a scheduler's connection and first answer; reconnecting to one that went away
LOCAL = "local"
ADDRESS_FORMS = "local, tcp://HOST:PORT or HOST:PORT (e.g. tcp://10.0.0.5:8786)"
_ADDRESS = re.compile(r"(?:tcp://)?(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)"
                      r":(?P<port>\d{1,5})")
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


def check_address(address, option: str = "cluster=") -> str:
    """'local', or the scheduler address as Dask takes it (tcp://HOST:PORT); a ValueError naming
    `option` and the accepted forms for anything else."""
    text = address.strip() if isinstance(address, str) else None
    if text == LOCAL:
        return LOCAL
    match = None if text is None else _ADDRESS.fullmatch(text)
    if match is None or not 1 <= int(match["port"]) <= 65535:
        hint = f" (write {LOCAL} in lower case)" if text is not None and text.lower() == LOCAL else ""
        raise ValueError(f"{option}{address!r} is not a Dask scheduler address{hint}; accepted: {ADDRESS_FORMS}")
    return f"tcp://{match['host']}:{int(match['port'])}"


async def _identity(d, address: str, timeout: float, outcome: dict):
    """Dask's handshake and the scheduler's answer to an identity request (a dict whose type is
    'Scheduler'); outcome["connected"] is set once a plain TCP connection succeeded, so a failure
    after it is the server's answer, not its absence. The caller bounds the exchange in time."""
    host, port = d.comm.addressing.parse_host_port(address.removeprefix("tcp://"))
    _, writer = await asyncio.open_connection(host, port)
    writer.close()
    outcome["connected"] = True
    comm = await d.comm.connect(address, timeout=timeout)
    try:
        await comm.write({"op": "identity"})
        return await comm.read()
    finally:
        comm.abort()


def probe_scheduler(address: str, timeout: float | None = None) -> None:
    """ClusterError unless a Dask scheduler at `address` answers within `timeout` seconds
    (default CONNECT_TIMEOUT_S). Runs its own event loop in a thread, so it works where the caller
    already runs one (Jupyter)."""
    d = _distributed()
    timeout = CONNECT_TIMEOUT_S if timeout is None else timeout
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["reply"] = asyncio.run(asyncio.wait_for(_identity(d, address, timeout, outcome), timeout))
        except BaseException as exc:  # noqa: BLE001 - reported below, whatever a foreign server caused
            outcome["error"] = exc

    thread = threading.Thread(target=run, name="flashsim-cluster-probe", daemon=True)
    thread.start()
    thread.join(timeout + 5)
    _raise_probe_error(address, timeout, outcome)


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:160]}"


def _raise_probe_error(address: str, timeout: float, outcome: dict) -> None:
    """The one-line ClusterError for a failed probe (`outcome`: its reply or its error), if any."""
    err, reply, connected = outcome.get("error"), outcome.get("reply"), outcome.get("connected", False)
    timed_out = ("error" not in outcome and "reply" not in outcome) or isinstance(err, (asyncio.TimeoutError,
                                                                                        TimeoutError))
    if not connected:
        why = f"no connection within {timeout:g} s" if timed_out else _short(err)
        raise ClusterError(f"cannot reach the Dask scheduler at {address} ({why}); is the scheduler running, "
                           "and is this the address `dask scheduler` printed?")
    if timed_out:
        raise ClusterError(f"the server at {address} accepted a connection but did not answer as a Dask scheduler "
                           f"within {timeout:g} s; is this the address `dask scheduler` printed?")
    if err is not None or not isinstance(reply, dict) or reply.get("type") != "Scheduler":
        # what Dask makes of a foreign answer is no help (a garbage frame length reads as a
        # MemoryError for exabytes): say what happened
        what = "it answers, but not in Dask's protocol" if err is not None else "it answers as a Dask " + (
            f"{reply.get('type')}" if isinstance(reply, dict) and reply.get("type") else "peer of another kind")
        raise ClusterError(f"the server at {address} is not a Dask scheduler ({what}); --cluster / cluster= takes "
                           f"{ADDRESS_FORMS}")


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


def _run_task(setup, context, work, payload):
    return work(setup(context), payload, lambda n: None)


class DaskPool:
    """A Dask client (and, for "local", the cluster it started); use as a context manager."""

    shares_memory = False

    def __init__(self, address: str, workers: int | None = None) -> None:
        self.address, self.workers = check_address(address), workers
        self.client = self.cluster = None

    def describe(self) -> str:
        n = self.threads()
        return f"Dask cluster {self.address} ({n} worker thread{'s' if n != 1 else ''})"

    def __enter__(self) -> "DaskPool":
        d = _distributed()
        self._restore = _quiet()  # Dask's errors come back as one ClusterError / ShardError
        try:
            if self.address == "local":
                self.cluster = d.LocalCluster(n_workers=self.workers or 1, threads_per_worker=1, processes=True,
                                              dashboard_address=None, silence_logs=logging.ERROR)
                self.client = d.Client(self.cluster)
            else:
                probe_scheduler(self.address)
                self.client = d.Client(self.address, timeout=CONNECT_TIMEOUT_S)
        except ClusterError:  # the probe's one line
            self.__exit__(None, None, None)
            raise
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
