"""fa_hw.blocking on a real GPU (marked `gpu`; skipped cleanly where there is none): the blocking
kernel holds the stream until released and times out by itself; a launch shorter than the host's
enqueue (fa compare's N = 512, 8 heads: about 12 us on the H100, where events between back-to-back
launches measured 34 us) is timed below the events-only method and close to the average of a long
batch of the same launch run back to back (behind a blocker too, with no event between launches)."""

from __future__ import annotations

import statistics
import time

import numpy as np
import pytest

import fa_hw
from fa_hw import runtime
from fa_hw.blocking import BlockingTimeout, StreamBlocker, TimingError, pinned_words, stream_blocker, time_launches

pytestmark = [pytest.mark.gpu, pytest.mark.gpu_alone]  # it times the GPU

BATCH = 64  # launches averaged behind one blocker (NVBench: a blocked stream holds about 32 launches safely;
#             a timeout here fails the test with its own message)


@pytest.fixture(scope="module")
def gpu():
    if not fa_hw.has_gpu():
        pytest.skip("no NVIDIA GPU / driver here")
    return fa_hw.device_arch()


def test_the_blocker_holds_the_stream_until_released(gpu):
    blocker, stream = stream_blocker(), runtime.own_stream()
    before = blocker.timeouts()
    target = blocker.block(stream)
    event = runtime._timing_event(stream)
    time.sleep(0.05)
    held = not event.is_done
    blocker.release(target)
    stream.sync()
    assert held, "the event behind the blocker completed before the release"
    assert event.is_done and blocker.timeouts() == before


def test_a_blocker_never_released_times_out_and_counts_it(gpu):
    words, dptr = pinned_words()
    blocker = StreamBlocker(stream_blocker().kernel, words, dptr, timeout_s=0.05)
    stream = runtime.own_stream()
    t0 = time.perf_counter()
    blocker.block(stream)
    stream.sync()
    waited = time.perf_counter() - t0
    assert blocker.timeouts() == 1 and 0.05 <= waited < 5.0


def _plan(n: int = 512, heads: int = 8):
    """fa compare's launch (the seed config, B = 1, d = 64): (LaunchPlan, DeviceProblem), the
    latter holding the device buffers alive."""
    from fa_hw.forward import prepare

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, heads, n, 64)).astype(np.float16) for _ in range(3))
    plan, dev, _ = prepare(q, k, v)
    return plan, dev


def test_time_launches_reports_a_blocker_that_timed_out(gpu):
    """A 1 us timeout ends every wait before the host has enqueued the chunk: a warning, the launches
    timed again, then a TimingError."""
    plan, dev = _plan()
    stream = dev.stream
    words, dptr = pinned_words()
    blocker = StreamBlocker(stream_blocker().kernel, words, dptr, timeout_s=1e-6)
    with pytest.warns(BlockingTimeout), pytest.raises(TimingError, match="timed out"):
        time_launches(stream, plan.launch, plan.sync, 2, 5, blocker=blocker)
    assert blocker.timeouts() == 2


def _events_only(plan, stream, warmup: int = 5, reps: int = 20) -> list[float]:
    """The method before fa_hw.blocking: events between launches enqueued one by one."""
    for _ in range(warmup):
        plan.launch(stream)
    plan.sync(stream)
    marks = [runtime._timing_event(stream)]
    for _ in range(reps):
        plan.launch(stream)
        marks.append(runtime._timing_event(stream))
    plan.sync(stream)
    return [float(b - a) for a, b in zip(marks, marks[1:])]


def _batch_average(plan, stream, n: int = BATCH) -> float:
    """One interval over `n` launches run back to back behind a blocker, divided by n."""
    blocker = stream_blocker()
    before = blocker.timeouts()
    plan.launch(stream)
    plan.sync(stream)
    target = blocker.block(stream)
    start = runtime._timing_event(stream)
    for _ in range(n):
        plan.launch(stream)
    end = runtime._timing_event(stream)
    blocker.release(target)
    plan.sync(stream)
    assert blocker.timeouts() == before, f"the blocker timed out while {n} launches were enqueued behind it"
    return float(end - start) / n


def test_a_tiny_launch_is_timed_as_the_gpu_runs_it(gpu, record_property):
    """Three rounds of each method, interleaved: the blocker's median below the events-only one,
    and within 15 % of the batch average (the events between launches cost the GPU a little)."""
    plan, dev = _plan()
    stream = dev.stream
    old, new, batch = [], [], []
    for _ in range(3):
        old.append(statistics.median(_events_only(plan, stream)))
        new.append(statistics.median(plan.time(stream, 5, 20)))
        batch.append(_batch_average(plan, stream))
    old, new, batch = (statistics.median(x) for x in (old, new, batch))
    for name, value in (("events_only_ms", old), ("blocking_ms", new), ("batch_ms", batch)):
        record_property(name, value)
    print(f"N=512 H=8 d=64 on {fa_hw.device_arch()}: events only {old:.4f} ms, behind the blocker {new:.4f} ms, "
          f"batch of {BATCH} {batch:.4f} ms")
    assert new < old
    assert abs(new / batch - 1) < 0.15, (new, batch)
