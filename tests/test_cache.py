"""The on-disk cache's writes (fa_sim.cache.store_atomic) under concurrency: writers of the same
entry at once - the processes of a parallel test session, the threads of a Dask worker - leave a
whole entry (one writer's), never a mix, and no temporary behind."""

from __future__ import annotations

import threading

from fa_sim.cache import read_entry, store_atomic


def test_concurrent_writers_of_one_entry_leave_one_whole_entry(tmp_path):
    path = tmp_path / "kind" / "entry.bin"
    payloads = [bytes([i]) * (1 << 20) for i in range(6)]  # 1 MiB each: a write takes many syscalls
    seen, stored, start = [], [], threading.Barrier(len(payloads) + 1)

    def write(data: bytes) -> None:
        start.wait()
        stored.extend(store_atomic(path, data) for _ in range(10))

    def read() -> None:
        start.wait()
        for _ in range(200):
            if (data := read_entry(path)) is not None:
                seen.append(data)

    threads = [threading.Thread(target=write, args=(p,)) for p in payloads] + [threading.Thread(target=read)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert stored == [True] * 10 * len(payloads)  # no writer lost its temporary to another
    assert read_entry(path) in payloads
    assert all(data in payloads for data in seen)  # a reader never sees half an entry or two mixed
    assert [p.name for p in path.parent.iterdir()] == ["entry.bin"]
