"""config="auto" on a GPU without a tuned table: time a few candidates on the GPU once per problem
class, cache the choice on disk, reuse it in every later process.

    cls = ProblemClass.of(64, 4096, 4096, 128, True)      # batch*heads, Nq, Nk, head_dim, causal
    config, source = choose(cls, "NVIDIA H100 80GB HBM3", "sm_90", pool, timer_factory,
                            timing_shape(64, 4096, 4096, 128))
    # what fa_hw.tuned.device_choice does on a GPU without a table, pool = tuned.autotune_candidates

Problem class: what the fastest config depends on besides the GPU - head_dim, causal, the query and
key lengths (rounds per CTA, the causal triangle), each rounded up to a power of two, and the work
in 128-row query tiles, batch * heads * ceil(Nq / 128), rounded up to a power of two and capped at
MAX_TILES (1024 tiles are about 8 CTAs of 128 rows per SM on a 132-SM GPU: past that the wave
tail is small and the choice no longer depends on the grid). `ProblemClass.key` names it:
'd128-causal-q4096-k4096-t1024'. Issue 38's features (`Features`, fa_sim.problem) are part of the
class and of every timed launch: grouped-query K/V ('-g4': Q heads per K/V head), a sliding window
('-w256_0': its effective sides rounded up to powers of two, 'inf' unbounded) and softcap
('-softcap': its tanh costs the same for any cap); so is a bf16 run ('-bf16', KernelConfig.dtype:
the candidates are timed as bf16 builds). A plain fp16 launch keeps the plain key.

Candidates (fa_hw.tuned.autotune_candidates, given to `choose`): static, no timing model. The
winners of every shipped table (fa_hw/tuned/*.json, today the H100's and the H200's) for this
head_dim, causal flag and nearest size class; the first one's two neighbours (the other kv_stages,
1 or 2, and lazy_sum toggled); the tables' winners of the other size classes, nearest first;
fa_hw.tuned's heuristic tile (with heavy_first when causal): three to six configs. The timing model is not used to prune: on the 2-core development machine, ranking three candidates
(fa_sim.timing.rank) took 55 s at d=64 and 332 s at d=128 causal from cold caches, and 62 s at
d=64 again in a new process with every disk cache warm - 20 s or more per candidate, the whole
15 s budget for one - while compiling a candidate (about 1 s, in parallel, cached on disk) and
timing it on the GPU costs about a second, and the GPU's time is the truth the model approximates.

Timing (`tune`, with an injectable timer: a function config -> milliseconds): ROUNDS rounds
round-robin over the candidates (slow drift hits all alike), each a median of CUDA-event-timed
launches after a warm-up (`DeviceTimer`); the candidate with the lowest median over rounds wins
(ties: the earlier candidate). A candidate whose compile or launch fails is recorded and skipped;
when none runs, a FaHwError names each failure. `DeviceTimer` times the real problem's shape - on
the caller's own q, k, v (fa_hw.forward) or, without them (`fa hw`), on random normal inputs - with
batch * heads capped (`timing_shape`) so that the launch stays inside the class: the first heads
of the real tensors, never zeros.

Cache: one JSON file per GPU (its marketing name and exact arch) in the project's cache
(fa_sim.cache: $FLASHSIM_CACHE or ~/.cache/flashsim), autotune/<gpu_key>-<arch>.json:

    {"format": 1, "gpu": "NVIDIA H100 80GB HBM3", "arch": "sm_90", "entries": {
      "d128-causal-q4096-k4096-t1024": {"config": {KernelConfig JSON}, "kernel": "<fingerprint>",
        "timed_shape": [32, 4096, 4096, 128], "times_ms": {"<tag>": 1.02, ...}, "failed": {},
        "seconds": 3.1}}}

An entry answers only for the kernel source and NVRTC version it was timed with (`fingerprint`):
after an edit of fa2_fwd.cu it is timed again. As fa_sim.cache's other entries, the file is an
optimisation: missing, unreadable, damaged or malformed, it is treated as empty (the class is timed
again and the file rewritten, atomically); a file that cannot be written costs a timing per process,
never an error. Two processes tuning different classes at once each re-read the file before writing
theirs; a lost race only costs one class a second timing.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from fa_sim.cache import cache_key, cache_root, read_text_entry, store_atomic
from fa_sim.config import KernelConfig

from .errors import FaHwError

CACHE_FORMAT = 1
MAX_TILES = 1024  # 128-row query tiles past which the class no longer grows (module docstring)
TILE_ROWS = 128
ROUNDS = 3  # round-robin rounds over the candidates; each candidate's time is the median over them
WARMUP = 2  # launches before each timed batch (the first launch of a round also loads the module)
MIN_REPS, MAX_REPS = 3, 20  # timed launches per batch
BATCH_MS = 60.0  # a batch's target length: reps = BATCH_MS / one launch's time, within the bounds above
RANDOM_CHUNK = 1 << 22  # random fp16 values generated on the host and repeated to fill an input buffer

Timer = Callable[[KernelConfig], float]  # one batch's median kernel time (ms) of a config
TimerFactory = Callable[["ProblemClass", tuple, list], Timer]  # (class, timing_shape, candidates) -> Timer


def _pow2_ceil(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def _tiles(batch_heads: int, seqlen_q: int) -> int:
    return int(batch_heads) * -(-int(seqlen_q) // TILE_ROWS)


@dataclass(frozen=True)
class Features:
    """Issue 38's features of the launch that is tuned (fa_sim.problem.Problem): Q heads per K/V
    head, the effective window (left, right; -1 unbounded), the softcap (0: none) and the 16-bit
    type (KernelConfig.dtype) the candidates are built in."""

    kv_group: int = 1
    window: tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    dtype: str = "fp16"

    @classmethod
    def of(cls, problem) -> "Features":
        return cls(problem.kv_group, (problem.window_left, problem.window_right), problem.softcap,
                   problem.config.dtype)

    @property
    def plain(self) -> bool:
        return self == Features()

    @property
    def suffix(self) -> str:
        """What the class key adds (module docstring); '' for the plain kernel."""
        def side(n: int) -> str:
            return "inf" if n < 0 else str(n and _pow2_ceil(n))
        out = f"-g{self.kv_group}" if self.kv_group != 1 else ""
        out += f"-w{side(self.window[0])}_{side(self.window[1])}" if self.window != (-1, -1) else ""
        out += "-softcap" if self.softcap else ""
        return out + (f"-{self.dtype}" if self.dtype != "fp16" else "")


@dataclass(frozen=True)
class ProblemClass:
    """The key of an autotuned choice (module docstring): lengths and tiles rounded up to powers of
    two, and the features' suffix."""

    head_dim: int
    causal: bool
    seqlen_q: int
    seqlen_k: int
    tiles: int
    features: str = ""  # Features.suffix

    @classmethod
    def of(cls, batch_heads: int, seqlen_q: int, seqlen_k: int, head_dim: int, causal: bool,
           features: Features | None = None) -> "ProblemClass":
        if min(int(batch_heads), int(seqlen_q), int(seqlen_k)) < 1:
            raise ValueError(f"batch*heads, seqlen_q and seqlen_k must be positive, got {batch_heads}, "
                             f"{seqlen_q}, {seqlen_k}")
        return cls(int(head_dim), bool(causal), _pow2_ceil(seqlen_q), _pow2_ceil(seqlen_k),
                   min(MAX_TILES, _pow2_ceil(_tiles(batch_heads, seqlen_q))),
                   "" if features is None else features.suffix)

    @property
    def key(self) -> str:
        return (f"d{self.head_dim}-{'causal' if self.causal else 'full'}-q{self.seqlen_q}-k{self.seqlen_k}"
                f"-t{self.tiles}{self.features}")


def timing_shape(batch_heads: int, seqlen_q: int, seqlen_k: int, head_dim: int,
                 kv_group: int = 1) -> tuple[int, int, int, int]:
    """(batch*heads, Nq, Nk, d) of the launch that times the candidates: the problem's own, with
    batch*heads cut to the fewest heads that still fill MAX_TILES tiles (so the same class), a
    multiple of kv_group (whole K/V heads; batch*heads is one)."""
    per_head = -(-int(seqlen_q) // TILE_ROWS)
    group = int(kv_group)
    heads = -(-(-(-MAX_TILES // per_head)) // group) * group
    return min(int(batch_heads), heads), int(seqlen_q), int(seqlen_k), int(head_dim)


@dataclass(frozen=True)
class Tuned:
    """What `tune` measured: the winner, each candidate's median ms, and why any did not run."""

    config: KernelConfig
    times_ms: dict
    failed: dict


def tune(configs: list[KernelConfig], timer: Timer, rounds: int = ROUNDS) -> Tuned:
    """Time every config `rounds` times round-robin with `timer`; the lowest median wins."""
    if not configs:
        raise ValueError("config='auto': no candidate configs to time")
    times: dict[KernelConfig, list[float]] = {c: [] for c in configs}
    failed: dict[KernelConfig, str] = {}
    for _ in range(rounds):
        for c in configs:
            if c in failed:
                continue
            try:
                ms = float(timer(c))
                if not (math.isfinite(ms) and ms > 0):
                    raise FaHwError(f"the timer returned {ms} ms")
            except Exception as exc:  # a config that does not build or run here: recorded, never chosen
                failed[c] = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
            else:
                times[c].append(ms)
    medians = {c: statistics.median(v) for c, v in times.items() if c not in failed}
    if not medians:
        raise FaHwError("config='auto': no candidate config ran on this GPU: "
                        + "; ".join(f"{c.tag}: {why}" for c, why in failed.items()))
    best = min(medians, key=medians.get)
    return Tuned(best, {c.tag: medians[c] for c in medians}, {c.tag: failed[c] for c in failed})


# ---- the cache -------------------------------------------------------------------------------------
def cache_path(gpu: str, arch: str) -> Path:
    from .device import gpu_key

    return cache_root() / "autotune" / f"{gpu_key(gpu)}-{arch}.json"


def fingerprint() -> str:
    """What a cached choice is valid for: fa2_fwd.cu's text as it is on disk and NVRTC's version."""
    from fa_sim.contract.nvrtc import nvrtc_version
    from fa_sim.contract.source import seed_source

    return cache_key(kernel=seed_source().text, nvrtc=list(nvrtc_version()))


def read_cache(path: Path) -> tuple[dict, str]:
    """(entries, '') - none when the file is absent - or ({}, why the file was not usable:
    unreadable, damaged or malformed)."""
    text = read_text_entry(path)
    if text is None:
        return {}, "" if not path.exists() else "cache file unreadable"
    try:
        data = json.loads(text)
        if data.get("format") != CACHE_FORMAT or not isinstance(data.get("entries"), dict):
            raise ValueError(f"format {data.get('format')!r}")
    except (ValueError, AttributeError):
        return {}, "cache file damaged"
    return data["entries"], ""


def cached_config(entries: dict, cls: ProblemClass, kernel: str) -> KernelConfig | None:
    """The cached config of this class for this kernel fingerprint; None when absent, timed with
    another kernel, or malformed (all: time it again)."""
    entry = entries.get(cls.key)
    if not isinstance(entry, dict) or entry.get("kernel") != kernel:
        return None
    try:
        config = KernelConfig.from_json(entry["config"])
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    return config if config.head_dim == cls.head_dim else None


def write_cache(path: Path, gpu: str, arch: str, cls: ProblemClass, entry: dict) -> bool:
    """Add one class's entry to the file (re-read first, so other classes written meanwhile stay)."""
    entries, _ = read_cache(path)
    entries = dict(entries)
    entries[cls.key] = entry
    data = {"format": CACHE_FORMAT, "gpu": gpu, "arch": arch, "entries": dict(sorted(entries.items()))}
    return store_atomic(path, (json.dumps(data, indent=1) + "\n").encode())


def choose(cls: ProblemClass, gpu: str, arch: str, pool: list[KernelConfig], timer_factory: TimerFactory,
           shape: tuple[int, int, int, int], kernel: str | None = None) -> tuple[KernelConfig, str]:
    """(config, where it came from): the cached choice of this GPU and class, else the best of
    `pool` timed now (and cached). `timer_factory(cls, shape, pool)` is called only when timing is
    needed."""
    kernel = fingerprint() if kernel is None else kernel
    path = cache_path(gpu, arch)
    entries, why = read_cache(path)
    config = cached_config(entries, cls, kernel)
    if config is not None:
        return config, f"autotuned {cls.key} (cached in {path})"
    if not why:
        why = "not tuned yet" if cls.key not in entries else "cache entry stale or malformed"
    start = time.perf_counter()
    timer = timer_factory(cls, shape, pool)
    got = tune(pool, timer)
    seconds = time.perf_counter() - start
    entry = {"config": got.config.to_json(), "kernel": kernel, "timed_shape": list(shape), "times_ms": got.times_ms,
             "failed": got.failed, "seconds": round(seconds, 3)}
    stored = write_cache(path, gpu, arch, cls, entry)
    return got.config, (f"autotuned {cls.key} ({why}: timed {len(pool)} candidates on {shape} in {seconds:.1f} s; "
                        f"{'cached in ' + str(path) if stored else 'cache not writable'})")


# ---- the GPU backend ---------------------------------------------------------------------------------
class DeviceTimer:
    """Times configs on the current GPU on one launch shape (bh, Nq, Nk, d) with `features`, on given
    device pointers (q, k, v, o, lse of at least that shape, contiguous [bh, N, d], k and v with
    bh / kv_group heads) or on random normal inputs."""

    def __init__(self, shape: tuple[int, int, int, int], causal: bool, ptrs: tuple[int, ...] | None = None,
                 stream=None, features: Features | None = None):
        from . import runtime

        self.shape, self.causal = tuple(int(n) for n in shape), bool(causal)
        self.features = Features() if features is None else features
        self.arch = runtime.device_arch()
        self.stream = runtime.own_stream() if stream is None else stream
        self.keep: list = []
        self.ptrs = ptrs if ptrs is not None else self._random_inputs()

    def _random_inputs(self) -> tuple[int, ...]:
        import numpy as np

        from . import runtime

        bh, nq, nk, d = self.shape
        bh_k = bh // self.features.kv_group
        chunk = np.random.default_rng(0).standard_normal(min(RANDOM_CHUNK, bh * max(nq, nk) * d), dtype=np.float32)
        # 16-bit patterns of the run's type: fp16, or bf16 (the float32's upper half: truncated, still normal)
        chunk = chunk.astype(np.float16) if self.features.dtype == "fp16" else (chunk.view(np.uint32) >> 16).astype(
            np.uint16)
        ptrs = []
        for n in (bh * nq * d, bh_k * nk * d, bh_k * nk * d):
            buf = runtime.allocate(2 * n, self.stream)
            self._fill(int(buf.handle), n, chunk)
            self.keep.append(buf)
            ptrs.append(int(buf.handle))
        for nbytes in (2 * bh * nq * d, 4 * bh * nq):
            buf = runtime.allocate(nbytes, self.stream)
            self.keep.append(buf)
            ptrs.append(int(buf.handle))
        self.stream.sync()
        return tuple(ptrs)

    def _fill(self, dptr: int, n: int, chunk) -> None:
        from cuda.bindings import driver

        from .runtime import _driver_call

        for off in range(0, n, chunk.size):
            count = min(chunk.size, n - off)
            _driver_call(driver.cuMemcpyHtoDAsync(dptr + 2 * off, chunk.ctypes.data, 2 * count, self.stream.handle),
                         "host-to-device copy")

    def compile(self, configs) -> None:
        """The candidates' cubins the disk cache lacks, in parallel processes (a single one is
        compiled by its first launch; with all cached, no process is started)."""
        import os

        from fa_sim.contract import KernelBuild
        from fa_sim.contract.cubins import compile_many, is_cached

        missing = [b for b in map(self._build, configs) if not is_cached(b)]
        if len(missing) > 1:
            compile_many(missing, min(len(missing), os.cpu_count() or 1))

    def _problem(self, config: KernelConfig):
        """The launch a config is timed on: batch*heads as one batch, K/V heads of the features."""
        from fa_sim.problem import Problem

        bh, nq, nk, d = self.shape
        f = self.features
        return Problem(1, bh, nq, nk, self.causal, d ** -0.5, replace(config, dtype=f.dtype), heads_k=bh // f.kv_group,
                       window=f.window, softcap=f.softcap)

    def _build(self, config: KernelConfig):
        from fa_sim.contract import KernelBuild

        f = self.features
        return KernelBuild(replace(config, dtype=f.dtype), self.causal, self.arch, kv_group=f.kv_group,
                           window=f.window, softcap=f.softcap)

    def __call__(self, config: KernelConfig) -> float:
        from .runtime import LaunchPlan

        problem = self._problem(config)
        plan = LaunchPlan.make(self._build(config), self.ptrs, problem)
        first = plan.run(self.stream)  # loads the module on the first round
        reps = max(MIN_REPS, min(MAX_REPS, int(BATCH_MS / max(first, 1e-3))))
        return statistics.median(plan.time(self.stream, WARMUP, reps))


def device_timer_factory(ptrs: tuple[int, ...] | None = None, stream=None,
                         features: Features | None = None) -> TimerFactory:
    """A TimerFactory for the current GPU: the candidates compiled in parallel first, then timed on
    `ptrs` (the caller's inputs and outputs) or on random inputs, with the launch's `features`."""
    def factory(cls: ProblemClass, shape, pool) -> Timer:
        timer = DeviceTimer(shape, cls.causal, ptrs, stream, features)
        timer.compile(pool)
        return timer
    return factory
