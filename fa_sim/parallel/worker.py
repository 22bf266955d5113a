"""A local worker process of fa_sim.parallel: `python -m fa_sim.parallel.worker FD PARENT_PID SYS_PATH`
(pool.WORKER_BOOT: the same `main`, SIGINT ignored and the parent's import path set from the start).

pool.LocalPool starts every worker here, at fa_sim's own entry point, not through
multiprocessing's spawn, which re-runs the user's __main__ in each child: a script without an
`if __name__ == "__main__":` guard, or one read from stdin, would then run again in every worker
(and die in multiprocessing's bootstrapping check). The worker talks to its parent over the socket
FD (a multiprocessing Connection): first a job.WorkerStart (the parent's argv and __main__), then
the job's (setup, context), then one (index, work, payload) per task and None to stop; it answers
READY, then PROGRESS and DONE or FAILED per task (job.Msg).

The user's __main__ is imported here only when the job refers to something defined there (pmap's
function or an observer class of the script), exactly as spawn would, and the worker's own pools
are refused (job.IN_WORKER_ENV), so an unguarded script that re-runs says what to write.
Whatever travels by pickle (job.Msg, job.WorkerStart) lives in job.py, so that the module works as
__main__ too (run with -m).

Workers ignore SIGINT (the parent owns Ctrl-C and stops them), exit on SIGTERM through Python's
finalizers, and exit by themselves when the parent disappears (`_orphan_watch`).
"""

from __future__ import annotations

import io
import json
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from multiprocessing import spawn
from multiprocessing.connection import Connection

from .job import IN_WORKER_ENV, Msg, WorkerStart

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters (malloc.h)
PROGRESS_EVERY_S = 0.2  # a worker batches progress messages to at most five a second
MAIN = "__main__"


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


class _Loader:
    """Unpickles what the parent sends; a reference to the parent's __main__ imports it first."""

    def __init__(self, start: WorkerStart) -> None:
        self.start, self.main_imported = start, False

    def load(self, data: bytes):
        loader = self

        class Unpickler(pickle.Unpickler):
            def find_class(self, module: str, name: str):
                if module == MAIN:
                    loader.import_main(name)
                return super().find_class(module, name)

        return Unpickler(io.BytesIO(data)).load()

    def import_main(self, name: str) -> None:
        if self.main_imported:
            return
        start = self.start
        if start.main_name is None and start.main_path is None:
            raise ValueError(f"{name} is defined in the __main__ of a script read from stdin, -c or an interactive "
                             "session, which a worker process cannot import; define it in a module (a .py file "
                             "on the import path) or run with workers=1")
        # multiprocessing's own import of a parent's main (spawn.prepare), so a guarded script behaves as under spawn
        spawn.prepare({"init_main_from_name": start.main_name} if start.main_name is not None
                      else {"init_main_from_path": start.main_path})
        self.main_imported = True


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
    sys.exit(128 + signum)  # unwinds, so finalizers release what we hold


def serve(conn: Connection, loader: _Loader) -> None:
    """Set the job up, then run tasks until the parent says stop (None) or goes away."""
    try:
        setup, context = loader.load(conn.recv_bytes())
        state = setup(context)
    except Exception as exc:  # reported to the parent, which raises it
        conn.send((Msg.FAILED, -1, *_failure(exc)))
        return
    conn.send((Msg.READY,))
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            return
        try:
            msg = loader.load(data)
        except Exception as exc:
            conn.send((Msg.FAILED, -1, *_failure(exc)))
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


def main(argv: list[str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent owns Ctrl-C and stops us
    signal.signal(signal.SIGTERM, _exit_on_term)
    if len(argv) != 3 or not all(a.isdigit() for a in argv[:2]):
        sys.exit("usage: python -m fa_sim.parallel.worker FD PARENT_PID SYS_PATH (JSON; started by "
                 "fa_sim.parallel.pool, not by hand)")
    fd, parent = int(argv[0]), int(argv[1])
    sys.path[:] = json.loads(argv[2])  # the parent's, as multiprocessing's spawn sets it
    os.set_inheritable(fd, False)  # nothing this worker starts holds the parent's line open
    os.environ[IN_WORKER_ENV] = "1"
    keep_freed_memory()
    threading.Thread(target=_orphan_watch, args=(parent,), daemon=True).start()
    with Connection(fd) as conn:
        try:
            start = conn.recv()
        except (EOFError, OSError):
            return
        sys.argv[:] = start.argv
        serve(conn, _Loader(start))


if __name__ == "__main__":
    main(sys.argv[1:])
