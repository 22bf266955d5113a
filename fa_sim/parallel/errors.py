"""Errors of parallel runs: the run did not complete, so no result is returned."""

from __future__ import annotations

CLUSTER_EXTRA = "pip install flashsim[cluster]"


class ParallelError(RuntimeError):
    """A parallel run could not complete (the `fa` command prints it as one line)."""


class ShardError(ParallelError):
    """A task (a shard of the grid, a case of a sweep) got no result: its worker died or vanished."""


class ClusterError(ParallelError):
    """The Dask cluster is missing (the extra is not installed), unreachable or went away."""
