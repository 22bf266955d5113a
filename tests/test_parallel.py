"""fa_sim.simulate(workers=N): the grid's waves over local processes merge bit for bit into what
the serial run gives - O, LSE, instruction counts, and every observer (trace, banks, hazards,
checkpoints) - on both front ends; shards cut where they should; a dead worker, a failing shard
and an observer that cannot merge are clear errors, never a partial result (issue 12)."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from interrupt import sigint_default  # tests/interrupt.py

import fa_sim
from fa_sim.config import KernelConfig
from fa_sim.parallel import ShardError, plan_shards, pmap, resolve_workers
from fa_sim.parallel.shards import rows as shard_rows
from fa_sim.problem import Problem
from fa_sim.reference import random_inputs
from fa_sim.run import ProgramFrontEnd, RunSpec
from fa_sim.tensorcore import EXACT

from parallel_helpers import (COUNT_OBSERVER, RACY, USER_SCRIPT_HEAD, FailOnCta, KillOnCta, Unmergeable, observers,
                              results, same, slow_square)

ROOT = Path(__file__).resolve().parent.parent
FIXED = settings(derandomize=True, database=None, max_examples=40, deadline=None)


def _run(q, k, v, ctas, workers, **kw):
    obs = observers(ctas)
    res = fa_sim.simulate(q, k, v, observers=obs, workers=workers, progress=False, **kw)
    return results(res, obs)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_two_workers_give_the_serial_bits_for_every_observer(causal):
    """(1, 2, 200, 333): Q tails and Nk != Nq; 8 CTAs in 4 waves of 2, cut into 4 shards run by 2
    processes in whatever order they finish; traced and checkpointed CTAs in different shards; a
    racy program so that the hazard report has more hazards than it keeps in full."""
    q, k, v = random_inputs(1, 2, 200, 333, 64, seed=3)
    kw = dict(causal=causal, wave_ctas=2, mutation=RACY)
    serial = _run(q, k, v, (0, 3, 6), None, **kw)
    assert serial["hazards"].total > len(serial["hazards"].hazards) > 0  # the cut matters
    assert len({r.cta.tolist()[0] for r in serial["trace"].records if r.cta.size == 1}) > 1
    same(serial, _run(q, k, v, (0, 3, 6), 2, **kw), "workers=2")


def test_more_workers_than_waves_and_uneven_waves():
    """d=32 config, 3 workers for 5 CTAs in waves of 2 (the last wave has one CTA)."""
    cfg = KernelConfig(head_dim=32, block_n=32)
    q, k, v = random_inputs(1, 1, 300, 100, 32, seed=5)
    kw = dict(causal=True, wave_ctas=2, config=cfg)
    same(_run(q, k, v, (1, 4), None, **kw), _run(q, k, v, (1, 4), 3, **kw), "workers=3")


def test_ptx_engine_two_workers_give_the_serial_bits():
    """The PTX engine's shards: the same bits, checkpoints from the debug build included."""
    q, k, v = random_inputs(1, 1, 200, 150, 64, seed=9)
    kw = dict(causal=True, wave_ctas=1, engine="ptx")
    serial = _run(q, k, v, (0, 3), None, **kw)  # an Unsupported instruction fails here, never skips
    same(serial, _run(q, k, v, (0, 3), 2, **kw), "ptx workers=2")


def test_what_has_nothing_to_share_runs_here(monkeypatch):
    """One wave, one worker, "auto" on a short run or with an observer that cannot merge: no
    process is started (a pool would fail: its start is broken here)."""
    import fa_sim.parallel.pool as pool

    monkeypatch.setattr(pool.LocalPool, "run", lambda *a, **k: pytest.fail("a worker process was started"))
    q, k, v = random_inputs(1, 1, 128, 128, 64, seed=1)
    fa_sim.simulate(q, k, v, workers=4)  # 2 CTAs: one wave
    fa_sim.simulate(q, k, v, workers=1, wave_ctas=1)
    fa_sim.simulate(q, k, v, workers="auto", wave_ctas=1)  # estimated far under AUTO_MIN_SECONDS
    fa_sim.simulate(q, k, v, workers="auto", wave_ctas=1, observers=[Unmergeable()])


def test_an_observer_that_cannot_merge_is_refused_with_explicit_workers():
    q, k, v = random_inputs(1, 1, 256, 64, 64, seed=1)
    with pytest.raises(ValueError, match="Unmergeable cannot be split over workers.*workers=1"):
        fa_sim.simulate(q, k, v, workers=2, wave_ctas=1, observers=[Unmergeable()])


@pytest.mark.parametrize("bad", [0, -1, 1.5, "two", True])
def test_bad_workers_values(bad):
    q, k, v = random_inputs(1, 1, 64, 64, 64, seed=1)
    with pytest.raises(ValueError, match="workers must be a positive integer, 'auto' or None"):
        fa_sim.simulate(q, k, v, workers=bad)


def test_resolve_workers():
    assert resolve_workers(None) == 1 and resolve_workers(3) == 3 and resolve_workers("auto") >= 1


def test_a_worker_that_dies_names_its_shard_and_returns_nothing():
    q, k, v = random_inputs(1, 1, 512, 64, 64, seed=2)  # 8 CTAs, waves of 2: CTA 5 is in shard 3 of 4
    with pytest.raises(ShardError, match=r"shard 3 of 4 \(CTAs 4\.\.5\): its worker process \(pid \d+\) died, "
                                         r"killed by SIGKILL .*no result is returned"):
        fa_sim.simulate(q, k, v, workers=2, wave_ctas=2, observers=[KillOnCta(5, os.getpid())])


def test_an_error_in_a_shard_is_the_serial_error_with_the_shard_named():
    q, k, v = random_inputs(1, 1, 512, 64, 64, seed=2)
    with pytest.raises(ValueError, match="test failure at CTA 6") as serial:
        fa_sim.simulate(q, k, v, wave_ctas=2, observers=[FailOnCta(6, os.getpid())])
    with pytest.raises(ValueError, match="test failure at CTA 6") as parallel:
        fa_sim.simulate(q, k, v, workers=2, wave_ctas=2, observers=[FailOnCta(6, os.getpid())])
    assert not getattr(serial.value, "__notes__", None)
    assert "raised in shard 4 of 4 (CTAs 6..7)" in parallel.value.__notes__[0]


# -- shards ------------------------------------------------------------------------------------------------
@FIXED
@given(bh=st.integers(1, 6), nq=st.integers(1, 700), nk=st.integers(1, 700), causal=st.booleans(),
       wave=st.integers(1, 9), n=st.integers(1, 12))
def test_shards_are_whole_waves_covering_the_grid_once(bh, nq, nk, causal, wave, n):
    prob = Problem(1, bh, nq, nk, causal, 0.125, KernelConfig())
    spec = RunSpec(prob, ProgramFrontEnd(), EXACT, wave)
    shards, waves = plan_shards(spec, n), spec.waves()
    assert [s.index for s in shards] == list(range(len(shards))) and all(s.of == len(shards) for s in shards)
    ran = [w for s in shards for w in s.waves]  # consecutive runs of the serial waves, none empty
    assert len(ran) == len(waves) and all(np.array_equal(a, b) for a, b in zip(ran, waves))
    assert all(s.waves for s in shards)
    assert np.array_equal(np.sort(np.concatenate(waves)), np.arange(prob.n_ctas))  # every CTA once
    assert all(len(w) == wave for w in waves[:-1])
    rounds = prob.rounds_per_cta(np.concatenate(waves))
    assert (np.diff(rounds) <= 0).all()  # by decreasing K/V rounds: a wave's CTAs run alike
    assert len(shards) == min(n, -(-prob.n_ctas // wave))
    assert sum(s.cta_rounds for s in shards) == prob.cta_rounds
    # the rows of O the shards write tile [0, B*H*Nq) once
    written = np.concatenate([shard_rows(prob, s.ctas) for s in shards])
    assert np.array_equal(np.sort(written), np.arange(bh * nq))


def test_shards_balance_the_work_of_a_causal_grid():
    prob = Problem(1, 1, 64 * 64, 64 * 64, True, 0.125, KernelConfig())
    shards = plan_shards(RunSpec(prob, ProgramFrontEnd(), EXACT, 4), 4)
    work = [s.cta_rounds for s in shards]
    assert max(work) <= 1.25 * sum(work) / len(work)  # equal CTA counts would give 7:1


# -- pmap --------------------------------------------------------------------------------------------------
def test_pmap_keeps_the_order_and_names_the_failing_item():
    assert pmap(slow_square, range(7), workers=2) == [x * x for x in range(7)]
    with pytest.raises(TypeError) as err:
        pmap(slow_square, [1, "x", 3], workers=2, names=["a", "b", "c"])
    assert "raised in b" in err.value.__notes__[0]


# -- the command -------------------------------------------------------------------------------------------
def _env():
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def test_fa_sim_workers_prints_what_one_process_prints():
    args = [sys.executable, "-m", "fa_sim.cli", "sim", "--seqlen", "300", "--heads", "3", "--causal", "--json"]
    one = subprocess.run([*args, "--workers", "1"], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    two = subprocess.run([*args, "--workers", "2"], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert one.returncode == two.returncode == 0, two.stderr
    import json

    a, b = json.loads(one.stdout), json.loads(two.stdout)
    a.pop("seconds"), b.pop("seconds")
    assert a == b


def _children(pid: int) -> list[int]:
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        out += [int(x) for x in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
    return out


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _shared_files(pids: list[int]) -> set[str]:
    """The shared-memory files (fa_sim.parallel.sharded.SharedFile) these processes map now: those
    of this run only, whatever other processes (a parallel test session) have open at the time."""
    out = set()
    for pid in pids:
        try:
            maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
        except OSError:  # gone
            continue
        out |= {p for line in maps if len(f := line.split(maxsplit=5)) == 6
                and (p := f[5].removesuffix(" (deleted)")).rsplit("/", 1)[-1].startswith("flashsim-")}
    return out


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads child processes from /proc")
def test_ctrl_c_stops_every_worker_one_line_exit_130():
    proc = subprocess.Popen([sys.executable, "-m", "fa_sim.cli", "sim", "--seqlen", "8192", "--heads", "4",
                             "--workers", "2"], cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, preexec_fn=sigint_default)
    deadline = time.monotonic() + 120
    while proc.poll() is None and len(_children(proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)  # the two workers
    time.sleep(2.0)  # the workers are simulating
    workers = _children(proc.pid)
    assert proc.poll() is None and len(workers) >= 2, "the run ended before it could be interrupted"
    shared = _shared_files([proc.pid, *workers])
    assert shared, "the run maps no shared-memory file"
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: every process of the foreground group
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert err.decode().splitlines()[-1:] == ["fa sim: interrupted"] and "Traceback" not in err.decode()
    time.sleep(0.5)
    assert [p for p in workers if _alive(p)] == []
    assert [f for f in shared if os.path.exists(f)] == []  # its inputs and outputs file is gone


# -- workers start at fa_sim's entry point, not by re-running the user's script ------------------------
SCRIPT = USER_SCRIPT_HEAD + "{body}\n"
SHARDED_RUN = """q, k, v = random_inputs(1, 1, 256, 256, 64, 0)
serial = fa_sim.simulate(q, k, v, wave_ctas=1)
split = fa_sim.simulate(q, k, v, wave_ctas=1, workers=2)  # 4 waves: two workers
print("same", bool((serial.o == split.o).all() and (serial.lse == split.lse).all() and serial.counts == split.counts))
"""
OBSERVER_IN_MAIN = COUNT_OBSERVER.replace("{", "{{").replace("}", "}}") + """
def main():
    q, k, v = random_inputs(1, 1, 256, 256, 64, 0)
    one, two = Count(), Count()
    fa_sim.simulate(q, k, v, wave_ctas=1, observers=[one])
    fa_sim.simulate(q, k, v, wave_ctas=1, workers=2, observers=[two])
    print("same", one.n == two.n > 0)

{call}
"""


def _script(tmp_path, text: str, stdin: bool = False):
    """Run `text` as a user's script (a file, or `python -` reading stdin) in a directory of its own."""
    path = tmp_path / "user_script.py"
    path.write_text(text)
    argv = [sys.executable, "-"] if stdin else [sys.executable, str(path)]
    return subprocess.run(argv, cwd=tmp_path, env=_env(), input=text if stdin else None, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("stdin", [False, True], ids=["file", "stdin"])
def test_a_script_without_a_main_guard_runs_its_workers_once(tmp_path, stdin):
    out = _script(tmp_path, SCRIPT.format(body=SHARDED_RUN), stdin)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["start", "same True"]  # the script ran once: workers never re-run it


def test_an_observer_defined_in_the_script_reaches_the_workers(tmp_path):
    """Guarded, the workers import the script to find the class (as multiprocessing's spawn does);
    unguarded, that import would start workers again: refused, saying what to write."""
    guard = 'if __name__ == "__main__":\n    main()'
    guarded = _script(tmp_path, SCRIPT.format(body=OBSERVER_IN_MAIN.format(call=guard)))
    assert guarded.returncode == 0, guarded.stderr
    assert guarded.stdout.splitlines()[-1] == "same True"
    unguarded = _script(tmp_path, SCRIPT.format(body=OBSERVER_IN_MAIN.format(call="main()")))
    assert unguarded.returncode == 1 and "Traceback" in unguarded.stderr
    assert ("tried to start worker processes of its own" in unguarded.stderr
            and 'put those calls under `if __name__ == "__main__":`' in unguarded.stderr)
    from_stdin = _script(tmp_path, SCRIPT.format(body=OBSERVER_IN_MAIN.format(call="main()")), stdin=True)
    assert from_stdin.returncode == 1
    assert ("Count is defined in the __main__ of a script read from stdin, -c or an interactive session, which a "
            "worker process cannot import; define it in a module") in from_stdin.stderr


def test_more_workers_than_cores_says_so(monkeypatch, capfd):
    import fa_sim.parallel.pool as pool

    monkeypatch.setattr(pool, "cpu_count", lambda: 1)  # one worker per item: 3 items, 3 processes for 1 core
    assert pmap(slow_square, range(3), workers=1000) == [x * x for x in range(3)]
    assert ("fa_sim: starting 3 worker processes (workers=1000) on the 1 core this process may use; they share the "
            "cores (no faster, more memory)") in capfd.readouterr().err
    monkeypatch.setattr(pool, "cpu_count", lambda: 2)
    assert pmap(slow_square, range(3), workers=2) == [x * x for x in range(3)]
    assert "worker processes" not in capfd.readouterr().err


def test_fa_workers_past_the_cores_says_so(monkeypatch, capfd):
    import fa_sim.parallel.pool as pool
    from fa_sim.cli import main

    monkeypatch.setattr(pool, "cpu_count", lambda: 1)
    assert main(["sweep", "--shape", "1,1,64", "--causal", "off", "--block-n", "32,64", "--workers", "1000"]) == 0
    err = capfd.readouterr().err
    assert re.search(r"^fa_sim: starting \d+ worker processes \(workers=1000\) on the 1 core this process may use; ",
                     err, re.M), err
