"""fa_hw.blocking without a GPU: the blocking kernel (fa_hw/kernels/block_stream.cu) compiles for
sm_80 and sm_90 with its flag read inside the wait loop, its logic runs on fa_sim's PTX engine (the
release counter's wrap, the timeout), its parameters match the host's arguments, and
`time_launches` is checked on a simulated stream: every timed launch and event enqueued behind the
blocker before it is released, one interval per repetition, the kernels' time rather than the
host's, a timeout repeated once (a warning) and then an error. tests/test_blocking_gpu.py times a
real launch with it."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from fa_hw import blocking
from fa_hw.blocking import BlockingTimeout, StreamBlocker, TimingError, chunk_sizes, time_launches
from fa_hw.errors import KernelFault

pytest.importorskip("cuda.bindings.nvrtc", reason="compiling the blocking kernel needs NVRTC (the hw extra)")

ELF_MACHINE_CUDA = 190


def _elf_sm(cubin: bytes) -> int:
    assert cubin[:4] == b"\x7fELF" and int.from_bytes(cubin[18:20], "little") == ELF_MACHINE_CUDA
    flags = int.from_bytes(cubin[48:52], "little")
    return (flags >> 8) & 0xFF if cubin[8] >= 8 else flags & 0xFF


# ---- the kernel ------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_blocking_kernel_compiles_and_rereads_the_flag_in_its_loop(arch):
    """The cubin is for `arch`, one thread's few registers, no local memory; in the SASS the loop
    (from the label a backward BRA jumps to, to that BRA) loads the flag from system scope
    (volatile: LDG.E.STRONG.SYS, never hoisted out of the loop) and reads the global timer."""
    from fa_sim.contract.cubin import ResourceUsage
    from fa_sim.contract.sass import disassemble

    cubin = blocking.block_cubin(arch)
    assert _elf_sm(cubin) == int(arch[3:])
    usage = ResourceUsage.from_cubin(cubin, blocking.BLOCK_KERNEL)
    assert 0 < usage.registers <= 32 and usage.stack_bytes == 0
    lines = [ln.strip() for ln in disassemble(cubin).splitlines()]
    loops = []
    for i, ln in enumerate(lines):
        m = re.search(r"BRA `\((\.L_x_\d+)\)", ln)
        if m and f"{m.group(1)}:" in lines[:i]:
            loops.append(lines[lines.index(f"{m.group(1)}:"): i + 1])
    assert loops, "no backward branch: the wait is not a loop"
    body = " ".join(max(loops, key=len))
    assert re.search(r"LDG\.E\.STRONG\.SYS", body) and "SR_GLOBALTIMER" in body
    assert any(re.search(r"STG\.E\.STRONG\.SYS", ln) for ln in lines)  # the timeout's count


def test_the_cubin_is_cached_by_source_and_arch(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHSIM_CACHE", str(tmp_path))
    first = blocking.block_cubin("sm_90")
    assert len(list((tmp_path / "cubin").glob("block_stream-*.cubin"))) == 1
    assert blocking.block_cubin("sm_90") == first and blocking.block_cubin("sm_80") != first


def _engine_source() -> str:
    """The kernel with its %globaltimer reads (which fa_sim's PTX engine does not model) replaced by
    a counter of loop iterations: each replacement must match, so a changed kernel fails here."""
    src = blocking.BLOCK_PATH.read_text()
    swaps = {"unsigned long long start, now;": "unsigned long long start, now, ticks = 0;",
             'asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));': "start = 0;",
             'asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));': "now = ++ticks;"}
    for old, new in swaps.items():
        assert src.count(old) == 1, old
        src = src.replace(old, new)
    return src


@pytest.mark.parametrize("release, target, timeout, timeouts", [
    (5, 5, 10**9, 0),             # released: the counter reached the target
    (9, 5, 10**9, 0),             # released by a later target
    (3, 5, 0, 1),                 # not released: the timeout ends the wait and counts itself
    (3, 5, 40, 1),
    (0xFFFFFFFF, 2, 40, 1),       # the counter wrapped past 2^32: 0xFFFFFFFF comes before 2
    (2, 0xFFFFFFFF, 10**9, 0),    # ... and 2 after 0xFFFFFFFF
], ids=["reached", "passed", "timeout", "timeout-40", "wrap-waits", "wrap-released"])
def test_the_kernel_waits_for_its_target_on_the_ptx_engine(release, target, timeout, timeouts):
    """fa_sim.ptx.launch runs the kernel's PTX as the GPU does: one thread."""
    from fa_sim.ptx import launch

    words = np.array([release, 0], np.uint32)
    counted = np.zeros(1, np.uint32)
    launch(_engine_source(), grid=1, block=1, args=[words[:1], counted, np.uint32(target), np.uint64(timeout)])
    assert int(counted[0]) == timeouts


def test_the_kernel_parameters_match_the_host_arguments():
    """The .entry's parameters (PTX) have the sizes of StreamBlocker.args: two pointers, a u32
    target, a u64 timeout; cuda.core packs those numpy scalars as such."""
    from fa_sim.contract.nvrtc import compile_ptx

    ptx = compile_ptx(blocking.BLOCK_PATH.read_text(), name=str(blocking.BLOCK_PATH), arch="compute_90")
    entry = re.search(rf"\.entry {blocking.BLOCK_KERNEL}\((.*?)\)", ptx, re.S).group(1)
    sizes = [int(b) // 8 for b in re.findall(r"\.param \.[usb](\d+)", entry)]
    blocker = StreamBlocker(object(), np.zeros(2, np.uint32), 0x7000_0000_0000)
    args = blocker.args(7)
    assert sizes == [8 if isinstance(a, int) else a.itemsize for a in args] == [8, 8, 4, 8]
    try:
        from cuda.core._kernel_arg_handler import ParamHolder
    except ImportError:
        return
    assert ParamHolder(args).ptr != 0


# ---- StreamBlocker's host side -----------------------------------------------------------------
def test_blocker_targets_grow_wrap_and_release_by_writing_the_counter(monkeypatch):
    launched = []
    monkeypatch.setattr(blocking, "_enqueue", lambda stream, kernel, args: launched.append((stream, kernel, args)))
    words = np.array([0xFFFFFFFE, 0], np.uint32)
    blocker = StreamBlocker("kernel", words, 0x1000, timeout_s=0.25)
    assert [blocker.block("s") for _ in range(3)] == [0xFFFFFFFF, 0, 1]
    assert all(stream == "s" and kernel == "kernel" for stream, kernel, _ in launched)
    assert launched[1][2] == (0x1000, 0x1004, 0, 250_000_000)
    assert isinstance(launched[0][2][2], np.uint32) and isinstance(launched[0][2][3], np.uint64)
    assert words[0] == 0xFFFFFFFE  # nothing released yet
    blocker.release(0)
    assert words[0] == 0 and blocker.timeouts() == 0
    words[1] = 3
    assert blocker.timeouts() == 3
    with pytest.raises(ValueError, match="2 uint32"):
        StreamBlocker("kernel", np.zeros(3, np.int64), 0)


def test_chunk_sizes():
    assert chunk_sizes(20) == [20] and chunk_sizes(70, 32) == [32, 32, 6] and chunk_sizes(0) == []
    assert sum(chunk_sizes(1000, 7)) == 1000
    with pytest.raises(ValueError, match="chunk must be at least 1"):
        chunk_sizes(5, 0)


# ---- time_launches on a simulated stream -------------------------------------------------------
class Event:
    def __init__(self):
        self.at = None

    def __sub__(self, other):
        return (self.at - other.at) * 1e3  # ms, as cuda.core's Event difference


class SimStream:
    """A stream the host enqueues into at `host_s` per launch; sync runs it: each operation starts
    when enqueued and the one before has ended; a kernel takes `kernel_s`, a blocker ends at its
    release (or at its timeout, which it counts). `log` is the host's calls in order."""

    def __init__(self, host_s: float, kernel_s: float, stall_s: float = 0.0, stalls: int = 0):
        self.t, self.host_s, self.kernel_s = 0.0, host_s, kernel_s
        self.stall_s, self.stalls = stall_s, stalls  # the host stalls in its first `stalls` chunks
        self.ops, self.log, self.released, self.syncs = [], [], {}, 0

    def launch(self, stream):
        assert stream is self
        self.t += self.host_s
        self.ops.append(("kernel", self.t, None))
        self.log.append("launch")

    def record(self, stream):
        self.t += 1e-6
        ev = Event()
        self.ops.append(("event", self.t, ev))
        self.log.append("event")
        return ev

    def sync(self, stream):
        self.syncs += 1
        self.log.append("sync")
        gpu = 0.0
        for kind, at, what in self.ops:
            start = max(gpu, at)
            if kind == "event":
                what.at, gpu = start, start
            elif kind == "kernel":
                gpu = start + self.kernel_s
            else:
                blocker, target = what
                released = self.released.get(target, math.inf)
                if released - start > blocker.timeout_ns * 1e-9:
                    blocker.counted += 1
                    gpu = start + blocker.timeout_ns * 1e-9
                else:
                    gpu = max(start, released)
        self.ops.clear()


class SimBlocker:
    """StreamBlocker's interface on a SimStream."""

    def __init__(self, sim: SimStream, timeout_s: float = 1.0, enqueue: bool = True):
        self.sim, self.timeout_ns, self.enqueue = sim, int(timeout_s * 1e9), enqueue
        self.counted, self.issued = 0, 0

    def block(self, stream):
        self.issued += 1
        if self.enqueue:
            self.sim.ops.append(("block", self.sim.t, (self, self.issued)))
        self.sim.log.append(f"block {self.issued}")
        if self.sim.stalls:  # the host stalls while the chunk is enqueued
            self.sim.stalls -= 1
            self.sim.t += self.sim.stall_s
        return self.issued

    def release(self, target):
        self.sim.released[target] = self.sim.t
        self.sim.log.append(f"release {target}")

    def timeouts(self):
        return self.counted


def _time(sim, blocker, warmup=2, reps=5, chunk=blocking.CHUNK):
    return time_launches(sim, sim.launch, sim.sync, warmup, reps, chunk=chunk, blocker=blocker, record=sim.record)


def test_every_timed_launch_is_enqueued_before_the_blocker_is_released():
    sim = SimStream(host_s=30e-6, kernel_s=12e-6)
    ms = _time(sim, SimBlocker(sim), reps=3)
    assert sim.log == ["launch", "launch", "sync", "block 1", "event", "launch", "event", "launch", "event", "launch",
                       "event", "release 1", "sync"]
    assert ms == pytest.approx([0.012] * 3)


def test_the_blocker_measures_the_kernels_where_events_alone_measure_the_host():
    """The host enqueues a launch every 30 us (and an event in 1 us), the kernel runs 12 us: events
    between back-to-back launches (the blocker enqueueing nothing: the method before) give the
    host's 31 us a repetition (the first also the kernel's 12), behind the blocker the kernels' 12 us."""
    sim = SimStream(host_s=30e-6, kernel_s=12e-6)
    assert _time(sim, SimBlocker(sim, enqueue=False), reps=20) == pytest.approx([0.042] + [0.031] * 19)
    assert _time(sim, SimBlocker(sim), reps=20) == pytest.approx([0.012] * 20)
    slow = SimStream(host_s=5e-6, kernel_s=200e-6)  # a long kernel: the same but for the first enqueue
    assert _time(slow, SimBlocker(slow, enqueue=False), reps=4) == pytest.approx([0.205] + [0.2] * 3)
    assert _time(slow, SimBlocker(slow), reps=4) == pytest.approx([0.2] * 4)


def test_long_runs_are_cut_into_chunks_each_behind_its_blocker():
    sim = SimStream(host_s=30e-6, kernel_s=12e-6)
    ms = _time(sim, SimBlocker(sim), warmup=0, reps=70, chunk=32)
    assert len(ms) == 70 and ms == pytest.approx([0.012] * 70)  # no interval spans a blocker
    blocks = [i for i, x in enumerate(sim.log) if x.startswith("block")]
    releases = [i for i, x in enumerate(sim.log) if x.startswith("release")]
    assert [sim.log[i] for i in blocks] == ["block 1", "block 2", "block 3"]
    assert [sim.log[blocks[i] + 1: releases[i]].count("launch") for i in range(3)] == [32, 32, 6]
    assert all(sim.log[r - 1] == "event" for r in releases) and sim.log.count("sync") == 2


def test_a_timeout_is_timed_again_with_a_warning_then_an_error():
    """A host stall longer than the blocker's timeout while a chunk is enqueued: that run's intervals
    hold host time; timed again (BlockingTimeout); a second timed-out run is a TimingError."""
    sim = SimStream(host_s=30e-6, kernel_s=12e-6, stall_s=0.5, stalls=1)
    with pytest.warns(BlockingTimeout, match="1 of 1 blocking kernel timed out after 0.1 s"):
        ms = _time(sim, SimBlocker(sim, timeout_s=0.1))
    assert ms == pytest.approx([0.012] * 5)
    sim = SimStream(host_s=30e-6, kernel_s=12e-6, stall_s=0.5, stalls=2)
    with pytest.warns(BlockingTimeout), pytest.raises(TimingError, match="timed out .* twice"):
        _time(sim, SimBlocker(sim, timeout_s=0.1))


def test_a_failed_launch_releases_the_blocker_before_its_error_propagates():
    sim = SimStream(host_s=30e-6, kernel_s=12e-6)
    calls = []

    def launch(stream):
        calls.append(1)
        if len(calls) == 4:  # the second timed launch (after 2 warm-up launches)
            raise KernelFault("launching x failed: CUDA_ERROR_INVALID_VALUE")
        sim.launch(stream)

    with pytest.raises(KernelFault):
        time_launches(sim, launch, sim.sync, 2, 5, blocker=SimBlocker(sim), record=sim.record)
    assert sim.log[-1] == "release 1"


def test_no_repetitions_enqueue_no_blocker():
    sim = SimStream(host_s=30e-6, kernel_s=12e-6)
    assert _time(sim, SimBlocker(sim), warmup=1, reps=0) == [] and sim.log == ["launch", "sync"]


def test_under_cuda_launch_blocking_nothing_is_blocked(monkeypatch):
    """CUDA_LAUNCH_BLOCKING=1: launches return once run, so no blocker (which would wait out its
    timeout); the default blocker is then Unblocked, asked of no GPU (there is none here)."""
    monkeypatch.setenv("CUDA_LAUNCH_BLOCKING", "1")
    assert isinstance(blocking.default_blocker(), blocking.Unblocked)
    sim = SimStream(host_s=30e-6, kernel_s=12e-6)
    assert time_launches(sim, sim.launch, sim.sync, 0, 3, record=sim.record) == pytest.approx([0.042, 0.031, 0.031])
    assert "block" not in " ".join(sim.log)
