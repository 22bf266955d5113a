"""Part 3 of bench_sim.py (issue 12): serial against `workers=N`, the measured costs, and the
time model for N cores on M machines.

    python experiments/bench_sim.py --parallel [--workers 2] [--shapes 1,4,4096,64] [--json]

Measured here (seconds, on this machine, with its load printed beside them):
- the wall time of the shape serially in this process, serially in one worker process of the
  pool (its start and its allocator setting included), and with workers=N - best of REPEATS
  alternating runs (same bits: O, LSE and counts are compared);
- c: seconds per CTA-round of one process, for the seed config (d = 64) and for head_dim 128,
  on (1, 1, 4096, d): one full wave of 64 CTAs, as a large run is made of;
- S_pool: what a local pool adds besides the work (spawning N interpreters, imports, the shared
  file, merging), from a grid of N one-CTA waves;
- with the [cluster] extra: S_cluster, the start of a two-worker LocalCluster, and the scatter
  bandwidth to it (loopback: an upper bound for a real network).

The model: a run of R CTA-rounds, inputs of I bytes and outputs of O bytes takes

    T(N, M) = S + M * I / B + c * R / (N * M) * (1 + 1 / (2 * TASKS_PER_WORKER)) + O / B

on M machines of N cores: S the start (S_pool locally, S_cluster on a cluster started for the
run, 0 on a running one), B the bandwidth from the client to the machines (each receives the
inputs once; 0 transfer locally, where the inputs are shared), and the last term of the work the
average tail of TASKS_PER_WORKER shards per worker (the slowest worker finishes up to one shard late).
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import asdict, dataclass, field

import numpy as np

import fa_sim
from fa_sim.config import KernelConfig
from fa_sim.parallel.shards import TASKS_PER_WORKER
from fa_sim.problem import Problem
from fa_sim.reference import random_inputs

TARGET = (1, 32, 8192, 128)  # the realistic prefill
REPEATS = 3  # serial and parallel runs, alternating; the best of each is reported
NETWORK_BYTES_S = 1.25e9  # 10 Gb/s, an assumed cluster network (the loopback figure is printed too)


@dataclass(frozen=True)
class Costs:
    per_cta_round_s: dict  # config tag -> c
    pool_start_s: float
    cluster_start_s: float | None = None
    scatter_bytes_s: float | None = None


@dataclass(frozen=True)
class Report:
    shape: tuple
    workers: int
    cta_rounds: int
    serial_s: float
    serial_worker_s: float
    parallel_s: float
    identical: bool
    load_before: float
    load_after: float
    parent_peak_rss_mb: float
    worker_peak_rss_mb: float
    costs: Costs
    predictions: list = field(default_factory=list)  # (N, M, where, seconds)

    @property
    def speedup(self) -> float:
        return self.serial_s / self.parallel_s

    def to_json(self) -> dict:
        return asdict(self) | {"speedup": self.speedup}

    def render(self) -> str:
        c = self.costs
        lines = [f"parallel runs, shape (B,H,N,d) = {self.shape}, {self.cta_rounds:,} CTA-rounds "
                 f"(load average {self.load_before:.2f} before, {self.load_after:.2f} after; {os.cpu_count()} cores)",
                 f"  serial, this process        {self.serial_s:8.2f} s",
                 f"  serial, one worker process  {self.serial_worker_s:8.2f} s   (its start and tuned allocator "
                 "included: worker.keep_freed_memory)",
                 f"  workers={self.workers:<19} {self.parallel_s:8.2f} s   speedup {self.speedup:.2f}x over this "
                 f"process, {self.serial_worker_s / self.parallel_s:.2f}x over one worker; "
                 f"bit-identical: {'yes' if self.identical else 'NO'}",
                 f"  peak RSS: parent {self.parent_peak_rss_mb:.0f} MB, largest worker {self.worker_peak_rss_mb:.0f} MB",
                 "measured costs:"]
        for tag, sec in c.per_cta_round_s.items():
            lines.append(f"  c ({tag})  {sec * 1e3:.3f} ms per CTA-round (one process)")
        lines.append(f"  S_pool           {c.pool_start_s:.2f} s (spawn, imports, shared file, merge)")
        if c.cluster_start_s is not None:
            lines.append(f"  S_cluster        {c.cluster_start_s:.2f} s (LocalCluster of 2 workers)")
            lines.append(f"  scatter          {c.scatter_bytes_s / 1e9:.2f} GB/s (loopback; model uses "
                         f"{NETWORK_BYTES_S / 1e9:.2f} GB/s)")
        lines.append(f"model T(N, M) for {TARGET} (head_dim 128 seed config):")
        for n, m, where, sec in self.predictions:
            lines.append(f"  N={n:<3} M={m:<3} {where:<24} {_duration(sec)}")
        return "\n".join(lines)


def _duration(sec: float) -> str:
    return f"{sec:8.0f} s  ({sec / 60:.1f} min)" if sec >= 60 else f"{sec:8.1f} s"


def load() -> float:
    return os.getloadavg()[0]


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


C_SHAPE = (1, 1, 4096, None)  # c is measured on one full default wave (64 CTAs of block_m 64), as large runs have


def per_cta_round(config: KernelConfig, shape) -> float:
    b, h, n, d = shape
    q, k, v = random_inputs(b, h, n, n, d, 0)
    sec, _ = timed(lambda: fa_sim.simulate(q, k, v, config=config, progress=False))
    return sec / Problem(b, h, n, n, False, d ** -0.5, config).cta_rounds


def pool_start(workers: int) -> float:
    """A grid of `workers` one-round CTAs, one per wave: parallel minus serial is the pool's cost."""
    q, k, v = random_inputs(1, workers, 64, 64, 64, 0)
    serial, _ = timed(lambda: fa_sim.simulate(q, k, v, wave_ctas=1, progress=False))
    par, _ = timed(lambda: fa_sim.simulate(q, k, v, wave_ctas=1, workers=workers, progress=False))
    return max(par - serial, 0.0)


def cluster_costs() -> tuple[float | None, float | None]:
    try:
        import distributed
    except ImportError:
        return None, None
    import logging

    t0 = time.perf_counter()
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None,
                                  silence_logs=logging.ERROR) as cluster, distributed.Client(cluster) as client:
        start = time.perf_counter() - t0
        data = np.ones(64 << 20, np.uint8)
        t1 = time.perf_counter()
        fut = client.scatter(data, broadcast=True, hash=False)
        client.run(lambda: None)
        sec = time.perf_counter() - t1
        del fut
    return start, 2 * data.nbytes / sec  # broadcast: one copy per worker


def predictions(costs: Costs) -> list:
    b, h, n, d = TARGET
    cfg = KernelConfig(head_dim=d)
    rounds = Problem(b, h, n, n, False, d ** -0.5, cfg).cta_rounds
    c = costs.per_cta_round_s[cfg.tag]
    inputs, outputs = 3 * b * h * n * d * 2, b * h * n * (2 * d + 4)
    tail = 1 + 1 / (2 * TASKS_PER_WORKER)
    out = [(1, 1, "one process", c * rounds)]
    for nn in (2, 16, 64):
        out.append((nn, 1, "local workers", costs.pool_start_s + c * rounds / nn * tail))
    for nn, m in ((16, 4), (32, 16)):
        s = costs.cluster_start_s or 0.0
        out.append((nn, m, "running Dask cluster", m * inputs / NETWORK_BYTES_S + c * rounds / (nn * m) * tail
                    + outputs / NETWORK_BYTES_S))
        out.append((nn, m, "cluster started for it", s + out[-1][3]))
    return out


def simulate_shape(shape) -> None:
    b, h, n, d = shape
    fa_sim.simulate(*random_inputs(b, h, n, n, d, 0), progress=False)


def in_one_worker(shape) -> None:
    """The serial run in one worker process of the pool (its start and its allocator included)."""
    from fa_sim.parallel import Job, LocalPool, Task
    from fa_sim.parallel.job import call_with, no_setup

    LocalPool(1).run(Job(no_setup, simulate_shape, call_with), [Task(0, "serial", shape)], lambda n: None,
                     lambda t, r: None)


def run(shape, workers: int) -> Report:
    b, h, n, d = shape
    q, k, v = random_inputs(b, h, n, n, d, 0)
    before = load()
    serial_s = worker_s = parallel_s = float("inf")
    for _ in range(REPEATS):  # alternating, best of each: other processes' load comes and goes
        sec, serial = timed(lambda: fa_sim.simulate(q, k, v, progress=False))
        serial_s = min(serial_s, sec)
        worker_s = min(worker_s, timed(lambda: in_one_worker(shape))[0])
        sec, par = timed(lambda: fa_sim.simulate(q, k, v, workers=workers, progress=False))
        parallel_s = min(parallel_s, sec)
    after = load()
    identical = (serial.o.tobytes() == par.o.tobytes() and serial.lse.tobytes() == par.lse.tobytes()
                 and serial.counts == par.counts)
    worker_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    parent_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    costs = Costs({KernelConfig().tag: per_cta_round(KernelConfig(), C_SHAPE[:3] + (64,)),
                   KernelConfig(head_dim=128).tag: per_cta_round(KernelConfig(head_dim=128), C_SHAPE[:3] + (128,))},
                  pool_start(workers), *cluster_costs())
    rounds = Problem(b, h, n, n, False, d ** -0.5, KernelConfig(head_dim=d)).cta_rounds
    return Report(tuple(shape), workers, rounds, serial_s, worker_s, parallel_s, identical, before, after, parent_rss,
                  worker_rss, costs, predictions(costs))
