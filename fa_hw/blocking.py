"""Timing back-to-back launches with CUDA events, the stream held by a blocking kernel (NVBench's).

`time_launches` is what LaunchPlan.time and SplitLaunchPlan.time measure with: warm-up launches,
a synchronisation, then `reps` repetitions of the launch (one or several kernels), a CUDA timing
event recorded before the first and after each; the result is each repetition's milliseconds.

Why a blocking kernel. Events recorded between launches the GPU runs back to back time the
kernels. But when the host enqueues a launch more slowly than the GPU runs it (cuda-python's
launch costs the host 5-40 us; fa compare's N = 512 launch runs in about 12 us on the H100), the
GPU finishes each launch before the next is enqueued and idles in between: the interval between
two events then measures the host (0.034 ms measured on the H100 for a launch the model predicts
at 0.0118 ms). NVBench ("blocking kernel", nvbench/blocking_kernel.cuh) holds the stream with a
1-thread kernel spinning on a pinned host flag, enqueues the start event, the launches and their
events behind it, and only then sets the flag: the GPU finds every timed launch already queued.

Here (fa_hw/kernels/block_stream.cu, `fa_block_stream`, compiled by NVRTC for the GPU's exact
arch and cached on disk as the combine kernel is):

- The flag is a release counter in pinned host memory (`pinned_words`: two uint32 words [release,
  timeouts], cuMemHostAlloc with CU_MEMHOSTALLOC_DEVICEMAP through cuda.bindings.driver; the kernel
  gets the address cuMemHostGetDevicePointer returns). Each blocker waits for the counter to reach
  its own target; the host releases by writing that target, so one blocker can be released and the
  next enqueued at once (NVBench resets a 0/1 flag per use, which needs the stream idle first).
- At most `CHUNK` repetitions queue behind one blocker (NVBench's caveat: a blocked stream holds
  only so much queued work before the host's enqueue call itself waits; it advises about 32
  launches); longer runs use one blocker per chunk, each chunk timed from its own start event, so
  no interval spans a blocker.
- The wait ends after `TIMEOUT_S` of %globaltimer however the host fares, so the stream never
  hangs; a timed-out wait counts itself in the pinned `timeouts` word. Such a run's intervals may
  again hold host time: it is repeated once (a `BlockingTimeout` warning), and a second timed-out
  run is a `TimingError`. Under CUDA_LAUNCH_BLOCKING=1 every launch returns only once it has run,
  so nothing can be enqueued behind a waiting blocker: there the launches are timed without one
  (`Unblocked`), as before. (A tool that serialises launches, such as Nsight Compute, does the same
  to the blocker: each waits out its timeout, and the timing stops with the TimingError.)
"""

from __future__ import annotations

import ctypes
import functools
import os
import warnings
import weakref
from collections.abc import Callable
from pathlib import Path

import numpy as np

from fa_sim.cache import cache_key, cache_root, store_atomic
from fa_sim.contract.nvrtc import NvrtcError, compile_cubin, nvrtc_version

from .device import device, device_arch, driver_call
from .device import short as _short
from .errors import CompileError, FaHwError, KernelFault

BLOCK_PATH = Path(__file__).parent / "kernels" / "block_stream.cu"
BLOCK_KERNEL = "fa_block_stream"
CHUNK = 32  # repetitions enqueued behind one blocking kernel
TIMEOUT_S = 1.0  # the blocking kernel's longest wait (the host enqueues a chunk in milliseconds)
ATTEMPTS = 2  # runs of the timed launches before a blocker's timeout is an error
_WORDS = 2  # the pinned words: [release counter, timeouts]


class TimingError(FaHwError):
    """The timed launches could not be measured as asked (the blocking kernel timed out twice)."""


class BlockingTimeout(UserWarning):
    """A blocking kernel's wait timed out: that run's intervals may hold host time; it is repeated."""


def block_cubin(arch: str) -> bytes:
    """fa_block_stream's cubin for `arch` (e.g. 'sm_90'), compiled by NVRTC and cached on disk by
    source, arch and NVRTC version. Needs no GPU."""
    source = BLOCK_PATH.read_text()
    key = cache_key(format=1, source=source, arch=arch, nvrtc=nvrtc_version())
    path = cache_root() / "cubin" / f"block_stream-{key}.cubin"
    cubin = path.read_bytes() if path.exists() else None
    if cubin is None:
        try:
            cubin, _ = compile_cubin(source, name=str(BLOCK_PATH), arch=arch)
        except NvrtcError as exc:
            raise CompileError(f"NVRTC failed to compile {BLOCK_PATH.name}: {exc.detail}", exc.log) from None
        store_atomic(path, cubin)
    return cubin


def chunk_sizes(reps: int, chunk: int = CHUNK) -> list[int]:
    """The repetitions behind each blocker: `reps` cut into runs of at most `chunk`."""
    if chunk < 1:
        raise ValueError(f"chunk must be at least 1, got {chunk}")
    return [min(chunk, reps - i) for i in range(0, max(int(reps), 0), chunk)]


class StreamBlocker:
    """The blocking kernel and its pinned words [release, timeouts] (`words`, a uint32 numpy view
    the host reads and writes; `device_ptr`, their address for the kernel). `block` enqueues a
    blocker waiting for the next target, `release` lets every blocker up to a target run."""

    def __init__(self, kernel, words: np.ndarray, device_ptr: int, timeout_s: float = TIMEOUT_S):
        if words.dtype != np.uint32 or words.shape != (_WORDS,):
            raise ValueError(f"the blocker's words are {_WORDS} uint32, got {words.dtype} {words.shape}")
        self.kernel, self.words, self.device_ptr = kernel, words, int(device_ptr)
        self.timeout_ns = int(timeout_s * 1e9)
        self.issued = int(words[0])  # the last target handed out (every one so far released)

    def args(self, target: int) -> tuple:
        """fa_block_stream's arguments: release, timeouts (pointers), target (u32), timeout_ns (u64)."""
        return (self.device_ptr, self.device_ptr + 4, np.uint32(target), np.uint64(self.timeout_ns))

    def block(self, stream) -> int:
        """Enqueue a blocker on `stream`, waiting for the next target (returned; 32-bit, wrapping)."""
        target = (self.issued + 1) & 0xFFFFFFFF
        _enqueue(stream, self.kernel, self.args(target))
        self.issued = target
        return target

    def release(self, target: int) -> None:
        """Let the blocker of `target` (and every earlier one) run."""
        self.words[0] = np.uint32(target)

    def timeouts(self) -> int:
        """How many blockers have timed out so far (read after synchronising the stream)."""
        return int(self.words[1])


def pinned_words(n: int = _WORDS) -> tuple[np.ndarray, int]:
    """`n` zeroed uint32 words of pinned host memory mapped into the device's address space: (their
    numpy view for the host, their device address). cuMemHostAlloc with CU_MEMHOSTALLOC_DEVICEMAP,
    cuMemHostGetDevicePointer for the address the kernel uses (the CUDA driver API's pair for
    mapped pinned memory; under unified addressing it is the host pointer itself); freed by
    cuMemFreeHost when the view is collected."""
    from cuda.bindings import driver

    host = int(driver_call(driver.cuMemHostAlloc(4 * n, driver.CU_MEMHOSTALLOC_DEVICEMAP),
                            "allocating the blocking kernel's pinned words"))
    try:
        dptr = int(driver_call(driver.cuMemHostGetDevicePointer(host, 0),
                                "mapping the blocking kernel's pinned words"))
    except KernelFault:
        driver.cuMemFreeHost(host)
        raise
    raw = (ctypes.c_uint32 * n).from_address(host)
    weakref.finalize(raw, driver.cuMemFreeHost, host)
    words = np.ctypeslib.as_array(raw)  # holds `raw`: the memory lives as long as the view
    words[:] = 0
    return words, dptr


@functools.cache
def stream_blocker(ordinal: int = 0) -> StreamBlocker:
    """The current GPU's StreamBlocker: fa_block_stream loaded for its arch, its pinned words zeroed."""
    from cuda.core import ObjectCode

    device(ordinal)
    cubin = block_cubin(device_arch(ordinal))
    try:
        kernel = ObjectCode.from_cubin(cubin, name=BLOCK_PATH.name).get_kernel(BLOCK_KERNEL)
    except Exception as exc:
        raise KernelFault(f"loading {BLOCK_PATH.name}'s cubin failed: {_short(exc)}") from None
    words, dptr = pinned_words()
    return StreamBlocker(kernel, words, dptr)


class Unblocked:
    """StreamBlocker's interface, blocking nothing: where launches run synchronously
    (CUDA_LAUNCH_BLOCKING=1) the host cannot enqueue past a blocker, which would wait its timeout."""

    timeout_ns = 0

    def block(self, stream) -> int:
        return 0

    def release(self, target: int) -> None:
        pass

    def timeouts(self) -> int:
        return 0


def default_blocker():
    """This GPU's StreamBlocker, or Unblocked under CUDA_LAUNCH_BLOCKING=1."""
    return Unblocked() if os.environ.get("CUDA_LAUNCH_BLOCKING") == "1" else stream_blocker()


def _enqueue(stream, kernel, args: tuple) -> None:
    """One launch of fa_block_stream (one thread) on `stream`; a launch-time error is a KernelFault.
    (Not runtime.launch_kernel: fa_hw.runtime times its launches with this module.)"""
    from cuda.core import LaunchConfig, launch

    try:
        launch(stream, LaunchConfig(grid=(1, 1, 1), block=(1, 1, 1)), kernel, *args)
    except Exception as exc:
        raise KernelFault(f"launching {BLOCK_KERNEL} ({BLOCK_PATH.name}) failed: {_short(exc)}") from None


def timing_event(stream):
    """A CUDA event with timing enabled, recorded on `stream` now (cuda.core: `b - a` is ms)."""
    from cuda.core import EventOptions

    return stream.record(options=EventOptions(timing_enabled=True))


def time_launches(stream, launch: Callable, sync: Callable, warmup: int = 5, reps: int = 20, *,
                  chunk: int = CHUNK, blocker: StreamBlocker | None = None,
                  record: Callable | None = None) -> list[float]:
    """Per-repetition times (ms) of `launch(stream)` (one or several kernels), `reps` times after
    `warmup` launches and `sync(stream)` (which reports a fault). Behind each chunk's blocker: the
    start event, then each launch and an event after it; the blocker released once the chunk is
    enqueued (also when an enqueue fails). `blocker` (default: default_blocker()) and
    `record` (default: a CUDA timing event on the stream) are the tests' to replace."""
    for _ in range(warmup):
        launch(stream)
    sync(stream)
    if reps < 1:
        return []
    blocker = default_blocker() if blocker is None else blocker
    record = timing_event if record is None else record
    sizes = chunk_sizes(reps, chunk)
    for attempt in range(1, ATTEMPTS + 1):
        before = blocker.timeouts()
        chunks = []
        for n in sizes:
            target = blocker.block(stream)
            try:
                marks = [record(stream)]
                for _ in range(n):
                    launch(stream)
                    marks.append(record(stream))
            finally:
                blocker.release(target)
            chunks.append(marks)
        sync(stream)
        timed_out = blocker.timeouts() - before
        if not timed_out:
            return [float(b - a) for marks in chunks for a, b in zip(marks, marks[1:])]
        what = (f"{timed_out} of {len(sizes)} blocking kernel{'s' * (len(sizes) > 1)} timed out after "
                f"{blocker.timeout_ns / 1e9:g} s (the host took that long to enqueue {chunk} or fewer repetitions, "
                f"or their launches did not fit the stream's queue, or a tool runs launches one at a time)")
        if attempt < ATTEMPTS:
            warnings.warn(f"{what}: the measurement may hold host time, timing again", BlockingTimeout, stacklevel=3)
    raise TimingError(f"{what}, twice: the measured times would hold host time")
