"""The shape sets of the GPU benchmark and of the tuning that config="auto" comes from, and the
repeated-runs timing both use (issue 19: a claim must survive a rerun, on shapes it was not tuned on).

TRAIN: what experiments/tune_hw.py times the candidates on and chooses fa_hw/tuned/<gpu>.json from.
TEST: held out, disjoint from TRAIN (other B, H and N; several N not powers of two); what
experiments/bench_hw.py reports by default. Every (head_dim, causal, size class) key of fa_hw.tuned
that TEST touches has TRAIN shapes, so each test row is answered by a tuned entry, never by a
nearest-class fallback or the heuristic. LEGACY: the six shapes of the earlier benchmark (issue 11),
on which the previous table was tuned.

Timing: a *run* is one median of `reps` CUDA-event-timed launches after `warmup`; every backend of a
case is measured once unrecorded, then `runs` times, round-robin (flash, ours, flash, ours, ...), on
the same inputs in one process, so slow drift hits them alike. A row reports the median over runs
and the spread (min, max) of the time and of the per-run ratio SDPA-flash time / our time.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from fa_hw.tuned import size_class

TRAIN = [  # (B, H, N, d): each head_dim in every size class, causal and not (both are run)
    (16, 16, 1024, 32), (4, 16, 4096, 32), (2, 16, 8192, 32), (8, 12, 2500, 32),
    (8, 16, 1024, 64), (4, 16, 4096, 64), (16, 16, 2048, 64), (1, 16, 16384, 64), (2, 12, 3000, 64), (6, 8, 700, 64),
    (8, 16, 1024, 128), (4, 16, 4096, 128), (1, 32, 8192, 128), (2, 20, 2500, 128), (4, 8, 5000, 128),
]
TEST = [  # held out: none of these (B, H, N) is in TRAIN
    (32, 8, 1000, 32), (8, 16, 3000, 32), (2, 8, 6000, 32),
    (32, 8, 1000, 64), (8, 32, 2048, 64), (3, 24, 3333, 64), (2, 32, 6144, 64),
    (12, 16, 900, 128), (8, 32, 2048, 128), (16, 8, 1200, 128), (2, 16, 7000, 128),
]
# Issue 38's feature classes (experiments/tune_hw.py --features; fa_hw.tuned.FeatureClass): (B, H, N, d,
# features), features as experiments/bench_features.py's rows (dtype, heads_k, softcap). One training
# shape per (head_dim, size class, feature class) that bench_features.py's rows touch (all "medium"),
# none of them a bench_features.py shape (tune_hw.check_feature_sets); GQA at 4 Q heads per K/V head
# (the class "gqa" covers every ratio > 1), softcap at 40. Windows need no class of their own: they
# are looked up by the size class of their effective keys (fa_hw.tuned.effective_keys).
FEATURE_TRAIN = [
    (6, 16, 2560, 96, {}), (3, 16, 2300, 160, {}), (2, 16, 3600, 192, {}), (3, 16, 2400, 256, {}),
    (6, 16, 2300, 64, {"dtype": "bf16"}), (3, 24, 2600, 128, {"dtype": "bf16"}),
    (6, 32, 2300, 64, {"heads_k": 8}), (6, 24, 2400, 128, {"heads_k": 6}),
    (6, 16, 2600, 64, {"softcap": 40.0}), (3, 16, 3600, 128, {"softcap": 40.0}),
    # a second shape for the classes whose first tuning left held-out rows under SDPA-flash (one shape
    # per class chose by noise: experiments/bench_features_h100.md)
    (4, 16, 3200, 96, {}), (3, 16, 3300, 192, {}), (2, 16, 3000, 256, {}),
    (4, 32, 2800, 128, {"heads_k": 8}), (5, 16, 2900, 128, {"dtype": "bf16"}),
]
LEGACY = [(4, 16, 4096, 64), (8, 16, 1024, 64), (1, 16, 16384, 64), (4, 16, 4096, 128), (16, 16, 2048, 64),
          (1, 32, 8192, 128)]
#: experiments/tune_bwd.py's training shapes (the backward's tiles, fa_hw/tuned/backward/): TRAIN and
#: head_dim 96 (which TRAIN, the forward's, leaves out), disjoint from TEST as TRAIN is
BWD_TRAIN = TRAIN + [(8, 16, 1024, 96), (4, 16, 4096, 96), (2, 12, 3000, 96), (1, 16, 12000, 96)]
SETS = {"test": TEST, "train": TRAIN, "legacy": LEGACY}


def keys(cases) -> set:
    """The (head_dim, size class) keys of fa_hw.tuned that `cases` touch (both causal flags run)."""
    return {(c[3], size_class(c[2])) for c in cases}


def check_sets() -> None:
    """TEST is disjoint from TRAIN and every key it needs was tuned on (module docstring)."""
    overlap = (set(TRAIN) | set(BWD_TRAIN)) & set(TEST)
    missing = keys(TEST) - keys(TRAIN)
    if overlap or missing:
        raise ValueError(f"bad shape sets: in both {sorted(overlap)}; "
                         f"test keys without training shapes {sorted(missing)}")


@dataclass(frozen=True)
class Spread:
    """Median, min and max of per-run values."""

    median: float
    lo: float
    hi: float

    @classmethod
    def of(cls, values) -> "Spread":
        values = list(values)
        return cls(statistics.median(values), min(values), max(values))

    def fmt(self, spec: str = ".3f") -> str:
        return f"{self.median:{spec}} [{self.lo:{spec}}, {self.hi:{spec}}]"


def round_robin(timers: dict, runs: int) -> dict:
    """{label: callable -> ms} -> {label: [ms per run]}, the labels interleaved run by run, after one
    unrecorded pass (the first launches of a process or of new inputs run while clocks ramp up)."""
    for timer in timers.values():
        timer()
    out = {label: [] for label in timers}
    for _ in range(runs):
        for label, timer in timers.items():
            out[label].append(timer())
    return out


def ratios(flash_runs, our_runs) -> Spread:
    """Per-run SDPA-flash time / our time (runs pair up: they were measured in the same round)."""
    return Spread.of(f / o for f, o in zip(flash_runs, our_runs))
