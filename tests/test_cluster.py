"""fa_sim.simulate(cluster=...): the same shards on a Dask cluster (the [cluster] extra, which
`dev` includes so that CI runs this): a local two-worker cluster gives the serial bits; a missing
extra, an unreachable scheduler and a scheduler that disappears are one clear error each
(issue 12)."""

import builtins
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import fa_sim
from fa_sim.parallel import ClusterError, pmap
from fa_sim.reference import random_inputs

from parallel_helpers import RACY, observers, results, same, slow_square

distributed = pytest.importorskip("distributed", reason="the [cluster] extra is not installed")
ROOT = Path(__file__).resolve().parent.parent


def test_local_two_worker_cluster_gives_the_serial_bits():
    q, k, v = random_inputs(1, 2, 200, 333, 64, seed=4)
    kw = dict(causal=True, wave_ctas=2, mutation=RACY, progress=False)
    obs_serial = observers((1, 6))
    serial = results(fa_sim.simulate(q, k, v, observers=obs_serial, **kw), obs_serial)
    obs_cluster = observers((1, 6))
    cluster = results(fa_sim.simulate(q, k, v, observers=obs_cluster, cluster="local", workers=2, **kw), obs_cluster)
    same(serial, cluster, "cluster=local")


def test_pmap_on_a_local_cluster():
    assert pmap(slow_square, range(5), cluster="local", workers=2) == [0, 1, 4, 9, 16]


def test_missing_extra_names_the_install_command(monkeypatch):
    real = builtins.__import__

    def no_dask(name, *args, **kwargs):
        if name == "distributed" or name.startswith("distributed."):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_dask)
    q, k, v = random_inputs(1, 1, 64, 64, 64, seed=1)
    with pytest.raises(ClusterError, match=r"needs Dask distributed, which is not installed: "
                                           r"pip install flashsim\[cluster\]"):
        fa_sim.simulate(q, k, v, cluster="local")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_scheduler_is_one_line_exit_2(monkeypatch, capsys):
    from fa_sim.cli import main
    from fa_sim.parallel import cluster

    monkeypatch.setattr(cluster, "CONNECT_TIMEOUT_S", 2)
    port = _free_port()  # nothing listens there
    assert main(["sim", "--cluster", f"tcp://127.0.0.1:{port}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fa sim: error: cannot reach the Dask scheduler at tcp://127.0.0.1:{port}")
    assert err.count("\n") == 1  # one line


def test_a_cluster_that_disappears_names_a_shard_and_returns_nothing():
    """A scheduler and one worker as separate processes on loopback; the scheduler is killed while
    the shards run."""
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    address = f"tcp://127.0.0.1:{port}"
    scheduler = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                                  "--port", str(port), "--no-dashboard"], env=env, stderr=subprocess.DEVNULL)
    worker = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", address, "--nworkers", "1",
                               "--nthreads", "1", "--no-dashboard"], env=env, stderr=subprocess.DEVNULL)
    try:
        client = distributed.Client(address, timeout=60)
        client.wait_for_workers(1, timeout=60)
        client.close()
        q, k, v = random_inputs(1, 8, 2048, 2048, 64, seed=1)  # 256 CTAs in 4 shards: far longer than 3 s
        timer = threading.Timer(3.0, scheduler.kill)
        timer.start()
        start = time.monotonic()
        with pytest.raises(ClusterError, match=r"shard \d of 4 \(CTAs \d+\.\.\d+\).*: the Dask cluster at "
                                               rf"{address} went away .*no result is returned"):
            fa_sim.simulate(q, k, v, cluster=address, wave_ctas=4, progress=False)
        assert time.monotonic() - start < 60
    finally:
        scheduler.kill()
        worker.kill()
        scheduler.wait(10)
        worker.wait(10)


@pytest.mark.parametrize("stdin", [False, True], ids=["file", "stdin"])
def test_a_local_cluster_from_a_script_without_a_main_guard(tmp_path, stdin):
    """The local cluster's workers start through spawn, which would re-run the script (and fail, or
    not find a script read from stdin); they start without it, and a class the script defines
    still reaches them (cloudpickle sends it by value)."""
    text = """
import fa_sim
from fa_sim.reference import random_inputs
print("start", flush=True)

class Count:
    def __init__(self): self.n = 0
    def on_instr(self, ev): self.n += 1
    def fresh(self): return Count()
    def partial(self): return self.n
    def merge(self, part): self.n += part

q, k, v = random_inputs(1, 1, 256, 256, 64, 0)
one, two = Count(), Count()
serial = fa_sim.simulate(q, k, v, wave_ctas=1, observers=[one])
split = fa_sim.simulate(q, k, v, wave_ctas=1, cluster="local", workers=2, observers=[two])
print("same", bool((serial.o == split.o).all()) and serial.counts == split.counts and one.n == two.n > 0)
"""
    (tmp_path / "user_script.py").write_text(text)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-"] if stdin else [sys.executable, "user_script.py"], cwd=tmp_path,
                         env=env, input=text if stdin else None, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["start", "same True"]
