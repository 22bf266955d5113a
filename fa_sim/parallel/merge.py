"""How observers' results merge when the grid is split into shards (issue 12).

A shard is a run of consecutive waves of the grid, exactly the waves the serial run has
(fa_sim.run.RunSpec.waves), so each shard's observers see exactly the events the serial
run's observers see for those waves. An observer that can take part implements three methods:

    fresh()       -> a new observer configured like this one that has seen nothing: the worker's
                     copy (sent to the worker, which calls its on_launch and feeds it the shard)
    partial()     -> what the copy learnt from its shard, picklable and small (no shadow state)
    merge(part)   -> fold in the partial of the NEXT shard of the same launch

The law every implementation keeps (tests/test_parallel.py checks it bit for bit against the
serial run, for every observer and both front ends): for consecutive event sequences s1, s2,

    observer after (on_launch, s1) then merge(partial of a fresh copy after (on_launch, s2))
        == observer after (on_launch, s1 + s2)

The parent observer sees on_launch, then the merges in shard order, then on_finish, as a serial
observer sees on_launch, the events and on_finish. An observer without these methods needs the
whole event stream in one process (it may keep state across waves or depend on global order):
fa_sim.simulate refuses to split the grid for it (explicit workers) or runs serially ("auto").
The instruction counts of fa_sim.hub.Hub merge by addition (`merge_counts`).
"""

from __future__ import annotations

from typing import Mapping, Protocol, runtime_checkable

MERGE_METHODS = ("fresh", "partial", "merge")


@runtime_checkable
class Mergeable(Protocol):
    """An observer whose results merge over shards (see the module docstring for the law)."""

    def fresh(self) -> "Mergeable": ...

    def partial(self) -> object: ...

    def merge(self, part: object) -> None: ...


def mergeable(observer) -> bool:
    return all(callable(getattr(observer, m, None)) for m in MERGE_METHODS)


def unmergeable(observers) -> list[str]:
    """Class names of the observers that cannot be split over shards."""
    return [type(o).__name__ for o in observers if not mergeable(o)]


def merge_counts(into: dict, counts: Mapping) -> None:
    """Add one shard's warp-instruction counts per (op, phase, round) into a Hub's counts (in
    shard order, so keys keep the order in which the serial run first met them)."""
    for key, n in counts.items():
        into[key] = into.get(key, 0) + n
