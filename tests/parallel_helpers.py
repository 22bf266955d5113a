"""Helpers of the parallel-run tests: a deep bitwise comparison, the observers a run carries,
and observers that misbehave in a worker (importable by name, as spawned workers need)."""

from __future__ import annotations

import dataclasses
import os
import signal

import numpy as np

from fa_sim.crosscheck import CheckpointRecorder
from fa_sim.kernels import Mutation
from fa_sim.kernels.labels import Site
from fa_sim.observers import BankCounter, HazardChecker, TraceFilter, TraceRecorder


def same(a, b, where: str = "") -> None:
    """Assert a and b are the same, arrays bit for bit (dtype, shape, bytes), dicts in key order."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{where}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
        assert np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes(), f"{where}: values differ"
    elif dataclasses.is_dataclass(a) and not isinstance(a, type):
        for f in dataclasses.fields(a):
            same(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
    elif isinstance(a, dict):
        assert list(a) == list(b), f"{where}: keys {list(a)[:5]}... vs {list(b)[:5]}..."
        for key in a:
            same(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{where}: length {len(a)} vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} vs {b!r}"


def observers(ctas, hazard_limit: int = 7):
    """One of each observer: a trace of some lanes of `ctas` (every instruction class), a bank
    counter, a hazard checker keeping few hazards in full (so the merge must cut in grid order),
    and the checkpoints of `ctas`."""
    return [TraceRecorder(TraceFilter(ctas=tuple(ctas), lanes=(0, 9, 31))), BankCounter(),
            HazardChecker(limit=hazard_limit), CheckpointRecorder(ctas)]


def results(res, obs) -> dict:
    """Everything a run produced, for `same`."""
    trace, banks, hazards, ck = obs
    return {"o": res.o, "lse": res.lse, "counts": res.counts, "instructions": res.instructions,
            "trace": trace.trace, "banks": banks.report(), "hazards": hazards.report(), "checkpoints": ck.buffer}


RACY = Mutation(drop=frozenset({Site.BAR_PV}))  # RAW on sV, WAR on sK and sO: hazards in every wave


class KillOnCta:
    """Observer whose worker kills itself (SIGKILL, as the out-of-memory killer does) when it sees
    CTA `cta`; in the parent process (pid `parent`) it does nothing."""

    def __init__(self, cta: int, parent: int) -> None:
        self.cta, self.parent = cta, parent

    def on_instr(self, event) -> None:
        if os.getpid() != self.parent and self.cta in np.asarray(event.cta).tolist():
            os.kill(os.getpid(), signal.SIGKILL)

    def fresh(self):
        return KillOnCta(self.cta, self.parent)

    def partial(self):
        return None

    def merge(self, part) -> None:
        pass


class FailOnCta(KillOnCta):
    """Raises a ValueError instead (an error of the simulation itself, anywhere)."""

    def on_instr(self, event) -> None:
        if self.cta in np.asarray(event.cta).tolist():
            raise ValueError(f"test failure at CTA {self.cta}")

    def fresh(self):
        return FailOnCta(self.cta, self.parent)


class Unmergeable:
    """An observer without fresh/partial/merge."""

    def on_instr(self, event) -> None:
        pass


def slow_square(x: int) -> int:
    return x * x


#: A user's script that runs the simulator (the tests of workers that must not re-run it): its
#: header, and an observer class it defines (workers receive the class from the script).
USER_SCRIPT_HEAD = """
import fa_sim
from fa_sim.reference import random_inputs
print("start", flush=True)
"""
COUNT_OBSERVER = """
class Count:
    def __init__(self): self.n = 0
    def on_instr(self, ev): self.n += 1
    def fresh(self): return Count()
    def partial(self): return self.n
    def merge(self, part): self.n += part
"""
