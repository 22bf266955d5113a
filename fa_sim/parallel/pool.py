"""Local worker processes: a small pool that runs a Job's tasks and says which task a dead worker
was running.

Why not concurrent.futures.ProcessPoolExecutor or multiprocessing: when one of the executor's
workers dies, every pending future fails with the same BrokenProcessPool and nothing says which task
the dead worker held; tasks cannot report progress while they run; and every start method but fork
(which the caller's threads or CUDA context rule out) re-runs the user's __main__ in each child, so
`fa_sim.simulate(..., workers=2)` in a script without an `if __name__ == "__main__":` guard, or read
from stdin, would fail. Here each worker is a fresh interpreter running fa_sim.parallel.worker.main
(fa_sim's own entry point, which imports the user's __main__ only when the job needs something
defined there), with its own socket; it runs `job.setup(job.context)` once, then one task at a
time, and sends PROGRESS, then DONE or FAILED, for each. The parent waits on every socket
at once, so a worker that exits without answering (killed, out of memory, a crash in native code)
is reported with the task it held and how it ended.

Workers ignore SIGINT from their first instruction (WORKER_BOOT): on a terminal's Ctrl-C the
parent's KeyboardInterrupt stops every worker (terminate, then kill) and propagates; they stay in
the terminal's process group, so Ctrl-Z stops them with the parent. A worker whose parent
disappears exits by itself. More processes than this process's cores are started as asked, with a
line on stderr that says so (they share the cores: no faster, more memory).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Callable, Sequence

from .errors import ParallelError, ShardError
from .job import IN_WORKER_ENV, Job, Msg, Task, WorkerStart

STOP_GRACE_S = 2.0  # after terminate(), how long a worker may take before it is killed
# `python -c WORKER_BOOT FD PID SYS_PATH`, as `python -m fa_sim.parallel.worker FD PID SYS_PATH`
# except that SIGINT is ignored, and the parent's import path (JSON) set, before fa_sim is imported:
# the worker imports the parent's own fa_sim, and a Ctrl-C during the imports prints nothing
WORKER_BOOT = ("import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); import json, sys; "
               "sys.path[:] = json.loads(sys.argv[3]); from fa_sim.parallel.worker import main; main(sys.argv[1:])")


def cpu_count() -> int:
    """Cores this process may run on (the affinity mask, which containers and taskset narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


# -- the parent side ---------------------------------------------------------------------------------
def describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (out of memory?)" if -code == signal.SIGKILL else ""
        return f"killed by {name}{hint}"
    return f"exit status {code}"


@dataclass
class _Worker:
    proc: subprocess.Popen
    conn: Connection
    task: Task | None = None
    retired: bool = False

    def send(self, msg) -> None:
        try:
            self.conn.send(msg)
        except OSError:  # its socket closed: the worker is gone
            raise self.died() from None

    def died(self) -> ShardError:
        """The error of a worker whose socket closed: it is exiting (killed if it lingers)."""
        try:
            code = self.proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        what = f"{self.task.name}: its" if self.task is not None else "a"
        return ShardError(f"{what} worker process (pid {self.proc.pid}) died, {describe_exit(code)}; "
                          "no result is returned")


def _start_worker() -> _Worker:
    """A fresh interpreter at WORKER_BOOT with this process's import path, holding one end of a
    socket pair."""
    mine, theirs = socket.socketpair()
    try:
        proc = subprocess.Popen([sys.executable, "-c", WORKER_BOOT, str(theirs.fileno()), str(os.getpid()),
                                 json.dumps(sys.path)], pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
    except BaseException:
        mine.close()
        raise
    finally:
        theirs.close()
    return _Worker(proc, Connection(mine.detach()))


def _refuse_in_worker() -> None:
    if os.environ.get(IN_WORKER_ENV):
        raise ParallelError("a worker process of fa_sim.parallel tried to start worker processes of its own. If a "
                            "script defines what the workers run (pmap's function, an observer class) and calls "
                            "fa_sim at its top level, the worker ran the script again to find it: put those calls "
                            'under `if __name__ == "__main__":` (or define the function or class in a module)')


def _say_oversubscribed(started: int, asked: int) -> None:
    cores = cpu_count()
    if started > cores:
        print(f"fa_sim: starting {started} worker processes (workers={asked}) on the {cores} core"
              f"{'s' if cores != 1 else ''} this process may use; they share the cores (no faster, more memory)",
              file=sys.stderr, flush=True)


class LocalPool:
    """`workers` local processes (at most one per task); `run` hands out tasks, largest weight first."""

    def __init__(self, workers: int) -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        self.workers = workers

    shares_memory = True  # workers map the parent's files (sharded.SharedFile)

    def describe(self) -> str:
        return f"{self.workers} local worker process{'es' if self.workers != 1 else ''}"

    def threads(self) -> int:
        return self.workers

    def __enter__(self) -> "LocalPool":
        return self  # processes start per run(), so that every run ends with none left

    def __exit__(self, *exc) -> None:
        return None

    def run(self, job: Job, tasks: Sequence[Task], on_progress: Callable[[int], None],
            on_result: Callable[[Task, object], None]) -> None:
        """Run every task; on_result(task, result) in completion order. A failed task raises its
        own exception (with a note naming the task); a dead worker raises ShardError."""
        _refuse_in_worker()
        queue = sorted(tasks, key=lambda t: -t.weight)
        workers: list[_Worker] = []
        n = min(self.workers, len(tasks))
        _say_oversubscribed(n, self.workers)
        try:
            for _ in range(n):
                workers.append(_start_worker())
            start = WorkerStart.of_this_process()
            for w in workers:  # all started first: they import fa_sim at the same time
                w.send(start)
                w.send((job.setup, job.context))
            self._loop(job, workers, queue, len(tasks), on_progress, on_result)
        finally:
            _stop(workers)

    def _loop(self, job, workers, queue, total, on_progress, on_result) -> None:
        done = 0
        while done < total:
            live = [w for w in workers if not w.retired]
            ready = wait([w.conn for w in live])
            for w in live:
                if w.conn in ready:
                    done += self._serve(job, w, queue, on_progress, on_result)

    def _serve(self, job, w: _Worker, queue, on_progress, on_result) -> int:
        """Handle what worker w sent (or its death); returns the number of tasks it finished."""
        finished = 0
        while not w.retired:
            try:
                if not w.conn.poll():
                    return finished
                msg = w.conn.recv()
            except (EOFError, OSError):  # its socket closed: the worker is gone
                raise w.died() from None
            if msg[0] is Msg.PROGRESS:
                on_progress(msg[2])
            elif msg[0] is Msg.FAILED:
                _raise_failure(w, msg)
            else:
                if msg[0] is Msg.DONE:
                    task, w.task = w.task, None
                    on_result(task, msg[2])
                    finished += 1
                self._next(job, w, queue)
        return finished

    @staticmethod
    def _next(job: Job, w: _Worker, queue: list) -> None:
        if queue:
            w.task = queue.pop(0)
            w.send((w.task.index, job.work, w.task.payload))
        else:
            w.send(None)
            w.retired = True


def _raise_failure(w: _Worker, msg) -> None:
    _, index, exc, text = msg
    where = w.task.name if w.task is not None else "worker start-up"
    exc.add_note(f"raised in {where}, worker process pid {w.proc.pid}; its traceback:\n{text}")
    raise exc


def _stop(workers: list[_Worker]) -> None:
    """Every worker ends: retired ones on their own, busy ones asked (terminate), then forced
    (kill); sockets closed."""
    deadline = time.monotonic() + STOP_GRACE_S
    for w in workers:
        if w.retired:
            _wait(w.proc, deadline)
    for w in workers:
        if w.proc.poll() is None:
            w.proc.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    for w in workers:
        if not _wait(w.proc, deadline):
            w.proc.kill()
            w.proc.wait()
        w.conn.close()


def _wait(proc: subprocess.Popen, deadline: float) -> bool:
    """Whether proc ended by `deadline`."""
    try:
        proc.wait(max(deadline - time.monotonic(), 0.0))
        return True
    except subprocess.TimeoutExpired:
        return False
