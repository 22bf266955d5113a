"""The GPU side of fa_hw through cuda.core: device, loaded kernels, buffers, launches, CUDA events.

Models the host half of a CUDA program, top to bottom as in the cuda.core examples:
Device (fa_hw.device) -> cubin (fa_hw.compile, NVRTC through fa_sim.contract) ->
ObjectCode.get_kernel -> LaunchConfig -> launch -> sync. A `LaunchPlan` is one ready launch of fa2_fwd_kernel:

  grid   Problem.grid = (ceil(Nq / block_m), B*H)   block  n_threads   dynamic smem  config.smem_bytes
  args   q k v o lse (device pointers, 8-byte ints), seqlen_q, seqlen_k (np.int32), scale
         (np.float32) [+ checkpoint buffer, CTA selection (pointers), n_rounds (np.int32)]
  packed batch (FA_VARLEN, Problem.cu_seqlens): grid Problem.launch_grid = (ceil(max Nq / block_m),
         H, B); seqlen_q, seqlen_k are total_q, total_k; + cu_seqlens_q, cu_seqlens_k (device int32)

Scalars are packed as np.int32/np.float32 on purpose: cuda.core packs a bare Python int as an
8-byte value and a float as a double. Shared memory over 48 KB needs the kernel's
max-dynamic-shared-size attribute raised first.

Every launch goes through `launch_kernel`, in one of two modes:
  timed=True    the direct API (fa_hw.forward, fa_hw.backward, which report kernel_ms): the launch is
                bracketed by CUDA timing events and the stream synchronised after it, so that a fault
                while the kernel runs is a KernelFault naming the kernel and its build.
  timed=False   the torch path (fa_hw.attention): the launch is only enqueued on torch's current
                stream (`torch_stream`): no event, no synchronisation, as torch's own kernels. A
                launch-time error (bad grid, too much shared memory) is still a KernelFault naming
                the kernel and its build; a fault while the kernel runs surfaces asynchronously, at
                torch's next synchronisation (a .item(), .cpu(), torch.cuda.synchronize()), as
                torch's CUDA error, and names neither (CUDA_LAUNCH_BLOCKING=1 makes every launch
                synchronous, as for torch's kernels).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from fa_sim.contract import KERNEL_NAME, KernelBuild, kernel_source
from fa_sim.contract.cubin import ResourceUsage
from fa_sim.contract.cubins import compile_build
from fa_sim.problem import Problem

from .blocking import time_launches
from .blocking import timing_event as _timing_event
from .device import device, device_arch, has_gpu
from .device import driver_call as _driver_call
from .device import short as _short
from .errors import FaHwError, KernelFault, NoGPUError

DEFAULT_SMEM_LIMIT = 48 * 1024
MAX_GRID_Y = 65535
MAX_SEQLEN = 2**31 - 1  # seqlen_q, seqlen_k are int32 kernel arguments


@dataclass(frozen=True)
class LoadedKernel:
    build: KernelBuild
    kernel: object  # cuda.core Kernel
    usage: ResourceUsage  # as the driver reports it for the loaded kernel (Kernel.attributes)

    @property
    def registers(self) -> int:
        return self.usage.registers


@functools.cache
def load_kernel(build: KernelBuild) -> LoadedKernel:
    """Compile (cached), load on the current device, raise the dynamic-smem limit if needed.
    Registers and local memory are the driver's (the loaded kernel's attributes)."""
    dev = device()
    compiled = compile_build(build)
    try:
        kernel = compiled.object_code().get_kernel(KERNEL_NAME)
        usage = ResourceUsage.from_kernel(kernel)
    except Exception as exc:
        raise KernelFault(f"loading the cubin of {build.describe()} failed: {_short(exc)}") from None
    smem = build.config.smem_bytes
    if smem > DEFAULT_SMEM_LIMIT:
        _set_max_dynamic_smem(kernel, smem, dev.device_id)
    return LoadedKernel(build, kernel, usage)


def check_launch(config, causal: bool, kernel=None, checkpoints: bool = False) -> None:
    """Before any input is made (fa hw, fa compare): a usable GPU (NoGPUError otherwise), and the
    cubin the launch will use compiled and loaded (cached, so the launch reuses it): a kernel that
    does not compile fails at once."""
    device()
    load_kernel(KernelBuild(config, bool(causal), device_arch(), bool(checkpoints), kernel_source(kernel)))


def _set_max_dynamic_smem(kernel, nbytes: int, device_id: int) -> None:
    from cuda.bindings import driver

    attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    handle = kernel.handle
    if isinstance(handle, driver.CUkernel):
        _driver_call(driver.cuKernelSetAttribute(attr, nbytes, handle, driver.CUdevice(device_id)),
                     f"raising max dynamic shared memory to {nbytes} B")
    else:
        _driver_call(driver.cuFuncSetAttribute(handle, attr, nbytes), f"raising max dynamic shared memory to {nbytes} B")


# ---- streams, buffers, copies ----------------------------------------------------------------
@functools.cache
def own_stream():
    return device().create_stream()


#: foreign_stream's wrappers by raw handle: a cuda.core Stream made from a handle holds that handle and
#: owns nothing (it never destroys the stream), so one wrapper serves every launch on that handle;
#: fa_hw.attention asks for torch's current stream on every call. Bounded: cleared past _MAX_STREAMS.
_STREAMS: dict = {}
_MAX_STREAMS = 64


class PlanCache:
    """Launch plans by call key, for fa_hw.attention's paths (enqueue_forward, enqueue_backward): a
    call's key is its scalars with their types (True and 1 hash alike) and each tensor's type, shape,
    dtype and device - what the path's checks read but contiguity; a plan is stored only after its
    key's first call passed every check, and a call whose tensors are not all contiguous runs the
    checks again (their error names what is wrong). Bounded: cleared past `limit` keys."""

    def __init__(self, limit: int = 256):
        self.plans: dict = {}
        self.limit = limit

    def get(self, scalars: tuple, tensors: tuple, checked_plan):
        """The plan of this call (`checked_plan()`: every check, then a new plan, on a miss)."""
        try:
            key = (*[(type(x), x) for x in scalars], *[(type(x), x.shape, x.dtype, x.device) for x in tensors])
            plan = self.plans.get(key)
        except (AttributeError, TypeError):  # not tensors, an unhashable scalar: the checks say what is wrong
            key = plan = None
        if plan is None or not all(x.is_contiguous() for x in tensors):
            plan = checked_plan()
            if key is not None:
                if len(self.plans) >= self.limit:
                    self.plans.clear()
                self.plans[key] = plan
        return plan


def foreign_stream(handle: int):
    """Wrap a stream owned by torch/cupy (its raw cudaStream_t) so launches stay ordered with it."""
    handle = int(handle)
    stream = _STREAMS.get(handle)
    if stream is None:
        from cuda.core import LEGACY_DEFAULT_STREAM, Stream

        stream = LEGACY_DEFAULT_STREAM if handle == 0 else Stream.from_handle(handle)
        if len(_STREAMS) >= _MAX_STREAMS:
            _STREAMS.clear()
        _STREAMS[handle] = stream
    return stream


def torch_stream(device):
    """torch's current stream on `device` (a torch.device) as a cuda.core Stream: launches on it are
    ordered with torch's work, and with torch's caching allocator, which hands a freed block only to
    later work of the stream it was allocated on (so a torch workspace dropped after the launches
    are enqueued is not reused before they run). The raw handle comes from
    torch._C._cuda_getCurrentRawStream where torch has it (what torch.compile's generated code
    calls: one C call instead of building a torch.cuda.Stream), else torch.cuda.current_stream."""
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is None or device.index is None:
        return foreign_stream(torch.cuda.current_stream(device).cuda_stream)
    return foreign_stream(raw(device.index))


def allocate(nbytes: int, stream):
    return device().allocate(max(int(nbytes), 1), stream=stream)


def upload(host: np.ndarray, stream):
    """numpy -> new device Buffer (pageable copy, ordered on `stream`)."""
    from cuda.bindings import driver

    host = np.ascontiguousarray(host)
    buf = allocate(host.nbytes, stream)
    _driver_call(driver.cuMemcpyHtoDAsync(int(buf.handle), host.ctypes.data, host.nbytes, stream.handle),
                 "host-to-device copy")
    return buf


def download(dptr: int, out: np.ndarray, stream) -> np.ndarray:
    """Device memory at dptr -> the contiguous numpy array `out`; synchronises `stream`."""
    from cuda.bindings import driver

    _driver_call(driver.cuMemcpyDtoHAsync(out.ctypes.data, int(dptr), out.nbytes, stream.handle),
                 "device-to-host copy")
    stream.sync()
    return out


def memset_zero(dptr: int, nbytes: int, stream) -> None:
    from cuda.bindings import driver

    _driver_call(driver.cuMemsetD8Async(int(dptr), 0, int(nbytes), stream.handle), "memset")


# ---- launches --------------------------------------------------------------------------------
@dataclass(frozen=True)
class LaunchPlan:
    """One fa2_fwd_kernel launch, ready to go (see the module docstring for the argument list)."""

    loaded: LoadedKernel
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem_bytes: int
    args: tuple

    @classmethod
    def make(cls, build: KernelBuild, ptrs: tuple[int, ...], problem: Problem,
             checkpoint_args: tuple = (), varlen_args: tuple = ()) -> "LaunchPlan":
        grid = problem.launch_grid  # (ceil(Nq / block_m), B*H, 1); packed: (ceil(max Nq / block_m), H, B)
        if grid[1] > MAX_GRID_Y:
            raise ValueError(f"{'heads' if problem.varlen else 'batch*heads'} = {grid[1]} exceeds the grid's y limit "
                             f"{MAX_GRID_Y}")
        if max(problem.seqlen_q, problem.seqlen_k) > MAX_SEQLEN:
            raise ValueError(f"sequence lengths up to {MAX_SEQLEN} fit the kernel's int32 arguments, "
                             f"got Nq={problem.seqlen_q}, Nk={problem.seqlen_k}")
        cfg = build.config
        args = tuple(int(p) for p in ptrs) + (np.int32(problem.seqlen_q), np.int32(problem.seqlen_k),
                                              np.float32(problem.scale))
        if build.varlen:  # the totals, then the offsets' device pointers (cu_seqlens_q, cu_seqlens_k)
            if max(problem.total_q, problem.total_k) > MAX_SEQLEN:
                raise ValueError(f"packed rows up to {MAX_SEQLEN} fit the kernel's int32 arguments, "
                                 f"got total_q={problem.total_q}, total_k={problem.total_k}")
            args = args[:5] + (np.int32(problem.total_q), np.int32(problem.total_k), args[7]) + \
                tuple(int(p) for p in varlen_args)
        if build.checkpoints:
            ck_buf, ck_sel, n_rounds = checkpoint_args
            args += (int(ck_buf), int(ck_sel), np.int32(n_rounds))
        return cls(load_kernel(build), grid, (cfg.n_threads, 1, 1), cfg.smem_bytes, args)

    def launch(self, stream) -> None:
        """Enqueue once (no sync, no event); launch-time errors become KernelFault."""
        launch_kernel(stream, self.loaded.kernel, self.grid, self.block, self.smem_bytes, self.args, self.describe())

    def sync(self, stream) -> None:
        """The check after a launch: wait for the stream, report a fault with the config."""
        _sync(stream, self.describe())

    def run(self, stream, timed: bool = True) -> float | None:
        """One launch through `launch_kernel` (module docstring): timed, milliseconds (CUDA events,
        the stream synchronised and checked); not timed, None (enqueued only)."""
        return launch_kernel(stream, self.loaded.kernel, self.grid, self.block, self.smem_bytes, self.args,
                             self.describe(), timed=timed)

    def time(self, stream, warmup: int = 5, reps: int = 20) -> list[float]:
        """Per-launch times (ms) of `reps` back-to-back launches after `warmup`, each between two
        CUDA events, all enqueued behind a blocking kernel (fa_hw.blocking.time_launches)."""
        return time_launches(stream, self.launch, self.sync, warmup, reps)

    def describe(self) -> str:
        return f"{self.loaded.build.describe()} grid={self.grid[:2]} block={self.block[0]} smem={self.smem_bytes}"


def launch_kernel(stream, kernel, grid, block, smem: int, args: tuple, what: str, *,
                  timed: bool = False) -> float | None:
    """Launch `kernel` once on `stream`; `what` names the kernel and its build in a KernelFault.
    timed=False: enqueue only (no event, no sync; a fault while it runs surfaces at the stream's next
    synchronisation) -> None. timed=True: bracketed by CUDA timing events, the stream synchronised
    and a fault reported -> milliseconds. See the module docstring."""
    config = launch_config(grid, block, smem)
    start = _timing_event(stream) if timed else None
    enqueue_launch(stream, kernel, config, args, what)
    if not timed:
        return None
    end = _timing_event(stream)
    _sync(stream, what)
    return float(end - start)


def launch_config(grid, block, smem: int):
    """The cuda.core LaunchConfig of one launch: made once per cached plan by fa_hw.attention's
    paths (enqueue_forward, enqueue_backward), per launch by launch_kernel."""
    from cuda.core import LaunchConfig

    return LaunchConfig(grid=tuple(grid), block=tuple(block), shmem_size=smem)


def enqueue_launch(stream, kernel, config, args: tuple, what: str) -> None:
    """launch_kernel(timed=False) with a ready LaunchConfig (launch_config): enqueue only; a
    launch-time error is a KernelFault naming `what` (the kernel and its build)."""
    from cuda.core import launch

    try:
        launch(stream, config, kernel, *args)
    except Exception as exc:
        raise KernelFault(f"launching {what} failed: {_short(exc)}") from None


def _sync(stream, what: str) -> None:
    try:
        stream.sync()
    except Exception as exc:
        raise KernelFault(f"kernel {what} faulted: {_short(exc)}") from None


__all__ = ["FaHwError", "LaunchPlan", "NoGPUError", "device", "device_arch", "has_gpu", "launch_kernel",
           "load_kernel", "torch_stream"]
