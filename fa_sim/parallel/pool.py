"""Local worker processes: a small pool that runs a Job's tasks and says which task a dead worker
was running.

Why not concurrent.futures.ProcessPoolExecutor: when one of its workers dies, every pending future
fails with the same BrokenProcessPool and nothing says which task the dead worker held; tasks
cannot report progress while they run. Here each worker is a spawned process (no fork: the caller
may hold threads or a CUDA context) with its own pipe; it runs `job.setup(job.context)` once, then
one task at a time, and sends PROGRESS, then DONE or FAILED, for each. The parent waits on every
pipe and every process sentinel at once, so a worker that exits without answering (killed, out of
memory, a crash in native code) is reported with the task it held and how it ended.

Workers ignore SIGINT: on Ctrl-C the parent's KeyboardInterrupt stops every worker (terminate,
then kill) and propagates; a worker whose parent disappears exits by itself (`_orphan_watch`).
"""

from __future__ import annotations

import enum
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Callable, Sequence

from .errors import ShardError
from .job import Job, Task

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters (malloc.h)
PROGRESS_EVERY_S = 0.2  # a worker batches progress messages to at most five a second
STOP_GRACE_S = 2.0  # after terminate(), how long a worker may take before it is killed


class Msg(enum.Enum):
    READY = "ready"
    PROGRESS = "progress"
    DONE = "done"
    FAILED = "failed"


def cpu_count() -> int:
    """Cores this process may run on (the affinity mask, which containers and taskset narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


# -- the worker side ---------------------------------------------------------------------------------
class _Progress:
    """progress(n) inside a task: batched into one PROGRESS message per PROGRESS_EVERY_S."""

    def __init__(self, conn, index: int) -> None:
        self.conn, self.index, self.pending, self.last = conn, index, 0, time.monotonic()

    def __call__(self, n: int) -> None:
        self.pending += n
        if time.monotonic() - self.last >= PROGRESS_EVERY_S:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            self.conn.send((Msg.PROGRESS, self.index, self.pending))
            self.pending, self.last = 0, time.monotonic()


def _orphan_watch(parent: int) -> None:
    """Exit when the parent is gone (killed hard, so it could not stop us)."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


def _failure(exc: BaseException) -> tuple[BaseException, str]:
    """The exception itself when it pickles (the parent re-raises the same type), and its traceback."""
    text = "".join(traceback.format_exception(exc))
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        exc = RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc, text


def keep_freed_memory() -> bool:
    """Make glibc's malloc keep freed memory for reuse instead of giving every large temporary
    back to the OS (M_TRIM_THRESHOLD 1 GiB, M_MMAP_THRESHOLD its 32 MiB maximum): a simulation
    allocates and frees the same wave-sized arrays at every instruction, and with the defaults
    each one is page-faulted in anew (measured: 15-20 % of a worker's CPU time, all of it system
    time). Only for processes we own (workers); a no-op elsewhere than glibc."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)) and bool(libc.mallopt(M_MMAP_THRESHOLD, 32 << 20))
    except (OSError, AttributeError):
        return False


def _exit_on_term(signum, frame) -> None:
    sys.exit(128 + signum)  # unwinds, so multiprocessing's finalizers release what we hold


def _worker_main(conn, parent: int, setup: Callable, context) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent owns Ctrl-C and stops us
    signal.signal(signal.SIGTERM, _exit_on_term)
    keep_freed_memory()
    threading.Thread(target=_orphan_watch, args=(parent,), daemon=True).start()
    try:
        state = setup(context)
    except Exception as exc:  # reported to the parent, which raises it
        conn.send((Msg.FAILED, -1, *_failure(exc)))
        return
    conn.send((Msg.READY,))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        index, work, payload = msg
        progress = _Progress(conn, index)
        try:
            result = work(state, payload, progress)
            progress.flush()
            conn.send((Msg.DONE, index, result))
        except Exception as exc:  # reported to the parent, which raises it
            conn.send((Msg.FAILED, index, *_failure(exc)))


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
    proc: multiprocessing.process.BaseProcess
    conn: object
    task: Task | None = None
    ready: bool = False
    retired: bool = False


class LocalPool:
    """`workers` spawned processes; `run` hands out tasks, largest weight first."""

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
        ctx = multiprocessing.get_context("spawn")
        queue = sorted(tasks, key=lambda t: -t.weight)
        workers: list[_Worker] = []
        try:
            for _ in range(min(self.workers, len(tasks))):
                mine, theirs = ctx.Pipe()
                proc = ctx.Process(target=_worker_main, args=(theirs, os.getpid(), job.setup, job.context),
                                   daemon=True, name="flashsim-worker")
                proc.start()
                theirs.close()
                workers.append(_Worker(proc, mine))
            self._loop(job, workers, queue, len(tasks), on_progress, on_result)
        finally:
            _stop(workers)

    def _loop(self, job, workers, queue, total, on_progress, on_result) -> None:
        done = 0
        while done < total:
            live = [w for w in workers if not w.retired]
            ready = wait([w.conn for w in live] + [w.proc.sentinel for w in live])
            for w in live:
                if w.conn in ready or w.proc.sentinel in ready:
                    done += self._serve(job, w, queue, on_progress, on_result)

    def _serve(self, job, w: _Worker, queue, on_progress, on_result) -> int:
        """Handle what worker w sent (or its death); returns the number of tasks it finished."""
        finished = 0
        while True:
            try:
                if not w.conn.poll():
                    break
                msg = w.conn.recv()
            except (EOFError, OSError):
                break
            if msg[0] is Msg.PROGRESS:
                on_progress(msg[2])
            elif msg[0] is Msg.FAILED:
                _raise_failure(w, msg)
            else:
                if msg[0] is Msg.DONE:
                    task, w.task = w.task, None
                    on_result(task, msg[2])
                    finished += 1
                w.ready = True
                self._next(job, w, queue)
        if not w.retired and not w.proc.is_alive():
            w.proc.join()
            what = f"{w.task.name}: its" if w.task is not None else "a"
            raise ShardError(f"{what} worker process (pid {w.proc.pid}) died, {describe_exit(w.proc.exitcode)}; "
                             "no result is returned")
        return finished

    @staticmethod
    def _next(job: Job, w: _Worker, queue: list) -> None:
        if queue:
            w.task = queue.pop(0)
            w.conn.send((w.task.index, job.work, w.task.payload))
        else:
            w.conn.send(None)
            w.retired = True


def _raise_failure(w: _Worker, msg) -> None:
    _, index, exc, text = msg
    where = w.task.name if w.task is not None else "worker start-up"
    exc.add_note(f"raised in {where}, worker process pid {w.proc.pid}; its traceback:\n{text}")
    raise exc


def _stop(workers: list[_Worker]) -> None:
    """Every worker ends: retired ones on their own, busy ones asked (terminate), then forced
    (kill); pipes closed."""
    deadline = time.monotonic() + STOP_GRACE_S
    for w in workers:
        if w.retired:
            w.proc.join(max(deadline - time.monotonic(), 0.0))
    for w in workers:
        if w.proc.is_alive():
            w.proc.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    for w in workers:
        w.proc.join(max(deadline - time.monotonic(), 0.0))
        if w.proc.is_alive():
            w.proc.kill()
            w.proc.join()
        w.conn.close()
