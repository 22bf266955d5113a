"""The timing model's worker processes (fa_sim.timing.pool): a prediction made with its cold work
split over forked workers - the engine's representative CTAs in parts, the SM model's passes, the
backward's launches - is the one process's, in every field; FLASHSIM_TIMING_WORKERS is checked;
a pool that cannot start or whose worker dies costs time, not the prediction."""

import json

import pytest

import fa_sim.timing.pool as pool


def _calls(monkeypatch) -> list:
    """Each pmap call's (pieces, workers), recorded while it runs as before."""
    seen, real = [], pool.pmap

    def spy(fn, n, n_workers, done=None, sizes=None):
        seen.append((n, n_workers))
        return real(fn, n, n_workers, done, sizes)
    monkeypatch.setattr(pool, "pmap", spy)
    return seen


def _backward(tmp_path, monkeypatch, workers: str, causal: bool) -> tuple[str, list]:
    from fa_sim.timing import predict_backward_seeded

    monkeypatch.setenv("FLASHSIM_CACHE", str(tmp_path / workers))  # cold: every piece is computed
    monkeypatch.setenv(pool.ENV, workers)
    seen = _calls(monkeypatch)
    pred = predict_backward_seeded(8, 32, 1024, 1024, 64, causal)
    monkeypatch.undo()
    return json.dumps(pred.to_json(), sort_keys=True), seen


@pytest.mark.slow
@pytest.mark.parametrize("causal", [True, False])
def test_two_workers_predict_what_one_process_does(causal, tmp_path, monkeypatch):
    """The backward's three launches at (8, 32, 1024, 64), cold, with FLASHSIM_TIMING_WORKERS=2 and 1:
    causal splits each launch's engine run (its representatives) and the SM model's passes, non-causal
    runs the launches at once; the predictions are equal to the last bit."""
    one, serial = _backward(tmp_path, monkeypatch, "1", causal)
    two, parallel = _backward(tmp_path, monkeypatch, "2", causal)
    assert all(w == 1 for _, w in serial)
    if causal:  # the engine's parts and at least one launch's SM passes went to 2 workers
        assert sum(n >= 2 and w == 2 for n, w in parallel) >= 3, parallel
    else:
        assert (3, 2) in parallel, parallel
    assert two == one


def test_workers_rule(monkeypatch):
    monkeypatch.delenv(pool.ENV, raising=False)
    assert pool.workers(1, 1e6) == 1  # one piece: here
    assert pool.workers(8, pool.MIN_PARALLEL_SECONDS / 2) == 1  # too little work to pay
    assert pool.workers(8, 1e6) == min(pool.cpu_count(), 8)
    monkeypatch.setenv(pool.ENV, "3")
    assert pool.workers(8, 0.0) == 3 and pool.workers(2, 0.0) == 2
    monkeypatch.setenv(pool.ENV, "1")
    assert pool.workers(8, 1e6) == 1
    for bad in ("0", "two", "-2", "1.5"):
        monkeypatch.setenv(pool.ENV, bad)
        with pytest.raises(ValueError, match="FLASHSIM_TIMING_WORKERS must be an integer >= 1"):
            pool.workers(8, 1e6)
        with pytest.raises(ValueError, match="FLASHSIM_TIMING_WORKERS must be an integer >= 1"):
            pool.workers(1, 0.0)  # checked though nothing would split


def test_a_bad_worker_count_is_one_line_before_any_work(monkeypatch):
    import fa_sim.timing.launch as tl

    monkeypatch.setenv(pool.ENV, "many")
    monkeypatch.setattr(tl, "_predict", lambda *a, **k: pytest.fail("work started"))
    with pytest.raises(ValueError, match="FLASHSIM_TIMING_WORKERS must be an integer >= 1.*got 'many'"):
        tl.predict_launch("__global__ void k() {}", (1,), (32,), cache=False)


def test_pmap_keeps_index_order_and_raises_a_pieces_error():
    import os

    order = []
    out = pool.pmap(lambda i: (i * i, os.getpid()), 6, 2, done=lambda i, r: order.append(i))
    assert [r[0] for r in out] == [i * i for i in range(6)] and sorted(order) == list(range(6))
    assert {r[1] for r in out} != {os.getpid()}  # the pieces ran in other processes

    def bad(i):
        if i == 3:
            raise ValueError("piece 3 is wrong")
        return i
    with pytest.raises(ValueError, match="piece 3 is wrong"):
        pool.pmap(bad, 5, 2)


def test_pmap_with_sizes_starts_the_largest_pieces_first():
    """Longest processing time first: on 2 workers the pieces of sizes 5 and 4 start first and the one of
    size 1 last, the results still in index order (the SM model's passes: time_sm gives their work)."""
    import time

    def piece(i):
        began = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process of the machine
        time.sleep(0.3)
        return i, began

    out = pool.pmap(piece, 5, 2, sizes=[1, 5, 2, 4, 3])
    assert [i for i, _ in out] == list(range(5))
    started = [i for i, _ in sorted(out, key=lambda r: r[1])]
    assert set(started[:2]) == {1, 3} and started[-1] == 0, started


def test_a_dead_worker_or_no_pool_costs_time_not_the_result(monkeypatch, capsys):
    import os
    import signal

    parent = os.getpid()

    def dies_once(i):
        if i == 2 and os.getpid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)
        return i + 1
    assert pool.pmap(dies_once, 5, 2) == [1, 2, 3, 4, 5]
    assert "a worker process died" in capsys.readouterr().err

    import multiprocessing

    def no_fork(method=None):
        raise ValueError(f"cannot find context for {method!r}")
    monkeypatch.setattr(multiprocessing, "get_context", no_fork)
    assert pool.pmap(lambda i: i, 4, 2) == [0, 1, 2, 3]
    assert "could not start" in capsys.readouterr().err


def test_config_auto_ranks_its_candidates_on_workers_as_in_turn(tmp_path, monkeypatch):
    """fa_sim.timing.rank (config auto without a table entry) predicts its candidates on forked workers:
    two candidates at Nk = 256, cold, with FLASHSIM_TIMING_WORKERS=2 and 1, the same times to the last bit,
    and the two-worker ranking ran as one pmap of 2 pieces on 2 workers."""
    from fa_sim.timing.rank import family_candidates, rank

    cands = tuple(family_candidates(64)[:2])
    got = {}
    for workers in ("2", "1"):
        rank.cache_clear()
        monkeypatch.setenv("FLASHSIM_CACHE", str(tmp_path / workers))
        monkeypatch.setenv(pool.ENV, workers)
        seen = _calls(monkeypatch)
        got[workers] = [(r.config, r.kernel_ms) for r in rank(cands, 256, False, "h200")]
        assert (2, int(workers)) in seen, seen
        monkeypatch.undo()
    rank.cache_clear()
    assert got["2"] == got["1"] and {c for c, _ in got["1"]} == set(cands)
