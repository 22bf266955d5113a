"""fa_hw.attention's asynchronous torch path against the direct API's synchronous, timed one (issue 37).

CPU (a fake cuda.core: the launches, the stream's events and synchronisations and fa_hw.runtime's
buffers are recorded instead of run): fa_hw.attention's forward and backward enqueue their kernels
with no CUDA event, no stream.sync(), no cuda.core buffer (the workspaces are torch tensors) and no
read of a tensor's values; fa_hw.forward and fa_hw.backward still time every launch with two events
and synchronise after it; a launch-time error is a KernelFault naming the kernel and its build on
both paths; loading a kernel happens once per build; the plans enqueue_forward and enqueue_backward
keep per key launch what the checked path launches, and bad input after a cached call still gets its
error; the direct eager path launches what the custom ops launch. GPU (marked `gpu`): the asynchronous path equal
to the synchronous fa_hw.forward / fa_hw.backward bit for bit, autograd on a non-default torch stream,
torch.compile through the asynchronous ops.
"""

from __future__ import annotations

import importlib
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cuda.core", reason="the hw extra (cuda-core) is not installed")

from cuda import core as cuda_core  # noqa: E402

import fa_hw  # noqa: E402
from fa_hw import runtime, tensors, tuned_backward  # noqa: E402
from fa_hw.errors import KernelFault  # noqa: E402
from fa_sim.contract.cubin import ResourceUsage  # noqa: E402

hw_backward = importlib.import_module("fa_hw.backward")  # the module (fa_hw.backward is the function)
hw_forward = importlib.import_module("fa_hw.forward")


class FakeEvent:
    def __init__(self, t: float) -> None:
        self.t = t

    def __sub__(self, other: "FakeEvent") -> float:  # cuda.core: end - start is milliseconds
        return self.t - other.t


class FakeStream:
    """Records the calls a cuda.core Stream gets: record (an event) and sync."""

    handle = 0

    def __init__(self, log: list, fault: str | None = None) -> None:
        self.log, self.fault, self.clock = log, fault, 0.0

    def record(self, options=None):
        self.log.append("event")
        self.clock += 0.5
        return FakeEvent(self.clock)

    def sync(self) -> None:
        self.log.append("sync")
        if self.fault:
            raise RuntimeError(self.fault)


class FakeBuffer:
    count = 0

    def __init__(self) -> None:
        FakeBuffer.count += 1
        self.handle = 0x1000 * FakeBuffer.count


@pytest.fixture
def gpu(monkeypatch):
    """A fake GPU: returns the log of launches ("launch <kernel>"), events, syncs, runtime buffers
    (allocate, upload, memset, download). fa_hw's checks run for real; tensors stay on the CPU, which
    the torch path accepts here as its kernel device."""
    log: list = []
    stream = FakeStream(log)
    fake_dev = types.SimpleNamespace(device_id=0, arch="80")

    def launch(s, config, kernel, *args):
        assert s is stream
        log.append(f"launch {kernel}")

    def allocate(nbytes, s):
        log.append("allocate")
        return FakeBuffer()

    def upload(host, s):
        log.append("upload")
        return FakeBuffer()

    def download(dptr, out, s):
        log.append("download")
        return out

    monkeypatch.setattr(cuda_core, "launch", launch)
    monkeypatch.setattr(cuda_core, "LaunchConfig", lambda **kw: kw)
    monkeypatch.setattr(runtime, "device", lambda: fake_dev)
    monkeypatch.setattr(runtime, "device_arch", lambda: "sm_80")
    monkeypatch.setattr(runtime, "own_stream", lambda: stream)
    monkeypatch.setattr(runtime, "torch_stream", lambda device: stream)
    monkeypatch.setattr(runtime, "allocate", allocate)
    monkeypatch.setattr(runtime, "upload", upload)
    monkeypatch.setattr(runtime, "download", download)
    monkeypatch.setattr(runtime, "memset_zero", lambda *a: log.append("memset"))
    monkeypatch.setattr(runtime, "load_kernel", lambda build: runtime.LoadedKernel(
        build, "fa2_fwd_kernel", ResourceUsage(96, 0)))
    monkeypatch.setattr(hw_backward, "load_backward", lambda build: hw_backward.LoadedBackward(
        build, {name: name for name in build.kernels}, {name: ResourceUsage(128, 0) for name in build.kernels}))
    monkeypatch.setattr(hw_backward, "device_config", lambda d, causal, nk, dtype="fp16": tuned_backward.lookup(
        d, causal, nk, "NVIDIA GH200 480GB", "sm_80", dtype).config)  # the tiles of a GPU without a backward table
    monkeypatch.setattr(tensors, "KERNEL_DEVICE", "cpu")
    monkeypatch.setattr(hw_backward, "_PLANS", runtime.PlanCache())  # plans made on this fake GPU stay with it
    monkeypatch.setattr(hw_forward, "_PLANS", runtime.PlanCache())
    return types.SimpleNamespace(log=log, stream=stream)


def _problem(b=1, h=2, nq=40, nk=56, d=64, seed=0):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((b, h, n, d)).astype(np.float16) for n in (nq, nk, nk))
    do = rng.standard_normal((b, h, nq, d)).astype(np.float16)
    return q, k, v, do


def _no_host_reads(monkeypatch):
    """Every way a tensor's values reach the host (which, on a CUDA tensor, waits for the stream)
    raises while the torch path runs."""
    def refuse(*args, **kwargs):
        raise AssertionError("a tensor's values were read on the host")

    for name in ("__bool__", "item", "tolist", "cpu", "numpy", "__float__", "__int__", "__array__"):
        monkeypatch.setattr(torch.Tensor, name, refuse)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
def test_attention_enqueues_without_events_syncs_buffers_or_host_reads(gpu, monkeypatch, deterministic, dtype):
    q, k, v, do = (torch.from_numpy(a).to(dtype) for a in _problem())
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    with monkeypatch.context() as m:
        _no_host_reads(m)
        o = fa_hw.attention(q, k, v, causal=True, deterministic=deterministic, check_finite=False)
        o.backward(do)
    last = "fa2_bwd_dq_kernel" if deterministic else "fa2_bwd_convert_dq_kernel"
    assert gpu.log == ["launch fa2_fwd_kernel", "launch fa2_bwd_preprocess_kernel", "launch fa2_bwd_kernel",
                       f"launch {last}"]
    assert o.dtype == dtype and o.shape == q.shape
    assert [(x.grad.shape, x.grad.dtype) for x in (q, k, v)] == [(x.shape, dtype) for x in (q, k, v)]


def test_attention_checks_values_by_default_and_propagates_them_without(gpu):
    """check_finite=True (the default): NaN in q, then in dO, is one line before any launch, as in
    fa_hw.forward; check_finite=False reads no value and lets NaN propagate (as torch's kernels)."""
    q, k, v, do = _problem()
    q[0, 1, 3, 5] = np.nan
    with pytest.raises(ValueError, match=r"q contains NaN or Inf, first at q\[0, 1, 3, 5\]"):
        fa_hw.forward(q, k, v)
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    with pytest.raises(ValueError, match=r"fa_hw.attention: q contains NaN or Inf, first at q\[0, 1, 3, 5\] = nan"):
        fa_hw.attention(tq, tk, tv)
    assert gpu.log.count("launch fa2_fwd_kernel") == 0
    fa_hw.attention(tq, tk, tv, check_finite=False)
    assert gpu.log.count("launch fa2_fwd_kernel") == 1
    q, k, v, do = (torch.from_numpy(a) for a in _problem())
    do[0, 0, 7, 1] = float("inf")
    o = fa_hw.attention(q.requires_grad_(), k, v)
    with pytest.raises(ValueError, match=r"fa_hw.attention backward: do contains NaN or Inf, first at do\[0, 0, 7, 1\]"):
        o.backward(do)
    assert gpu.log.count("launch fa2_bwd_preprocess_kernel") == 0


def test_direct_forward_times_and_synchronises_its_launch(gpu):
    q, k, v, _ = _problem()
    res = fa_hw.forward(q, k, v, causal=True)
    kernel = gpu.log[gpu.log.index("launch fa2_fwd_kernel") - 1:]
    assert kernel[:4] == ["event", "launch fa2_fwd_kernel", "event", "sync"]
    assert gpu.log.count("event") == 2 and res.kernel_ms == 0.5


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
def test_direct_backward_times_and_synchronises_each_launch(gpu, deterministic):
    q, k, v, do = _problem()
    o, lse = np.zeros_like(q), np.zeros(q.shape[:3], np.float32)
    res = fa_hw.backward(q, k, v, o, lse, do, causal=True, deterministic=deterministic)
    launches = [e for e in gpu.log if e not in ("allocate", "upload", "memset", "download")]
    last = "fa2_bwd_dq_kernel" if deterministic else "fa2_bwd_convert_dq_kernel"
    assert launches == [x for name in ("fa2_bwd_preprocess_kernel", "fa2_bwd_kernel", last)
                        for x in ("event", f"launch {name}", "event", "sync")]
    assert res.kernel_ms == (0.5, 0.5, 0.5)
    assert gpu.log.count("memset") == (0 if deterministic else 1)  # dq_accum zeroed; cuda.core buffers here


def test_a_fault_at_the_sync_names_the_kernel_on_the_direct_api(gpu):
    gpu.stream.fault = "CUDA_ERROR_ILLEGAL_ADDRESS"
    q, k, v, do = _problem()
    with pytest.raises(KernelFault, match=r"kernel fa2_bwd_preprocess_kernel of fa2_bwd.cu \(d=64 .* faulted: "
                                          r"CUDA_ERROR_ILLEGAL_ADDRESS"):
        fa_hw.backward(q, k, v, np.zeros_like(q), np.zeros(q.shape[:3], np.float32), do)


@pytest.mark.parametrize("where", ["forward", "backward"])
def test_a_launch_error_is_a_kernel_fault_on_the_torch_path(gpu, monkeypatch, where):
    def refuse(stream, config, kernel, *args):
        if where in ("forward" if kernel == "fa2_fwd_kernel" else "backward"):
            raise RuntimeError("CUDA_ERROR_INVALID_VALUE")

    monkeypatch.setattr(cuda_core, "launch", refuse)
    q, k, v, do = (torch.from_numpy(a) for a in _problem())
    q.requires_grad_()
    forward = r"launching KernelConfig\(.*\), causal for sm_80 grid=\(1, 2\) block=128 smem=\d+ failed"
    backward = (r"launching fa2_bwd_preprocess_kernel of fa2_bwd.cu \(d=64 .*, causal, atomic dQ for sm_80 "
                r"grid=\(.*\) block=\d+ smem=0 failed")
    want = forward if where == "forward" else backward
    with pytest.raises(KernelFault, match=want + ": CUDA_ERROR_INVALID_VALUE"):
        fa_hw.attention(q, k, v, causal=True).backward(do)
    assert "sync" not in gpu.log and "event" not in gpu.log


def test_the_torch_path_refuses_what_it_would_have_to_convert(gpu):
    from fa_hw.backward import enqueue_backward
    from fa_hw.forward import enqueue_forward

    q, k, v, do = (torch.from_numpy(a) for a in _problem())
    with pytest.raises(ValueError, match=r"fa_hw.attention: k must be a contiguous float16 torch tensor on cpu, got "
                                         r"float32 on cpu"):
        enqueue_forward(q, k.float(), v)
    lse = torch.zeros(q.shape[:3])
    with pytest.raises(ValueError, match=r"fa_hw.attention backward: do must be a contiguous float16 .*strides"):
        enqueue_backward(q, k, v, q, lse, do.transpose(2, 3).contiguous().transpose(2, 3), causal=True)
    assert gpu.log == []


def _recorded_launches(monkeypatch):
    """cuda.core's launch replaced by a recorder: -> the list of (kernel, LaunchConfig, args) it fills."""
    launches = []
    monkeypatch.setattr(cuda_core, "launch", lambda stream, config, kernel, *args: launches.append((kernel, config, args)))
    return launches


def _roles(launches, **tensors) -> list:
    """The launches with each pointer named: the given tensors' by their names, any other (a workspace)
    by its order of first appearance, ws0, ws1 (scalars as they are: np.int32, np.float32, 0)."""
    names = {t.data_ptr(): name for name, t in tensors.items()}
    out = []
    for kernel, config, args in launches:
        named = []
        for a in args:
            if type(a) is int and a != 0:
                a = names.setdefault(a, f"ws{sum(n.startswith('ws') for n in names.values())}")
            named.append((type(a).__name__, a if isinstance(a, str) else repr(a)))
        out.append((kernel, config, tuple(named)))
    return out


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_cached_plans_launch_what_the_checked_path_launches(gpu, monkeypatch, causal, deterministic, dtype):
    """enqueue_backward's first call (every check, then the plan) and its later ones (the key's plan)
    launch the same kernels with the same LaunchConfig (grid, block, shared memory) and arguments as
    _run_torch, the path fa_hw.backward takes on torch tensors (_plan's launches, a LaunchConfig per
    launch); enqueue_forward's as runtime.LaunchPlan.make's launch on torch_problem's outputs."""
    from fa_hw.backward import _run_torch, enqueue_backward
    from fa_hw.forward import enqueue_forward
    from fa_sim.contract import KernelBuild
    from fa_sim import validate

    q, k, v, do = (torch.from_numpy(a).to(dtype) for a in _problem(b=2, h=3, nq=200, nk=77))
    scale = 0.11
    launches = _recorded_launches(monkeypatch)
    o, lse = enqueue_forward(q, k, v, causal=causal, scale=scale)
    first = _roles(launches, q=q, k=k, v=v, o=o, lse=lse)
    del launches[:]
    o2, lse2 = enqueue_forward(q, k, v, causal=causal, scale=scale)
    cached = _roles(launches, q=q, k=k, v=v, o=o2, lse=lse2)
    del launches[:]
    prob = validate.make_problem(q.shape, k.shape, v.shape, causal, scale, None,
                                 dtype="bf16" if dtype == torch.bfloat16 else "fp16")
    dev = tensors.torch_problem(q, k, v, prob)
    runtime.LaunchPlan.make(KernelBuild.of(prob, "sm_80"), (dev.q_ptr, dev.k_ptr, dev.v_ptr, dev.o_ptr, dev.lse_ptr),
                            prob).run(gpu.stream, timed=False)
    want = _roles(launches, q=q, k=k, v=v, o=dev.o, lse=dev.lse)
    assert first == cached == want and len(want) == 1
    del launches[:]

    grads = [enqueue_backward(q, k, v, o, lse, do, causal, scale, deterministic) for _ in range(3)]
    got = [_roles(launches[3 * i:3 * i + 3], q=q, k=k, v=v, o=o, lse=lse, do=do, dq=dq, dk=dk, dv=dv)
           for i, (dq, dk, dv) in enumerate(grads)]
    del launches[:]
    cfg = hw_backward.device_config(q.shape[3], causal, k.shape[2], "bf16" if dtype == torch.bfloat16 else "fp16")
    (dq, dk, dv), *_ = _run_torch(q, k, v, o, lse, do, cfg, causal, scale, deterministic, timed=False)
    want = _roles(launches, q=q, k=k, v=v, o=o, lse=lse, do=do, dq=dq, dk=dk, dv=dv)
    assert got[0] == got[1] == got[2] == want
    last = "fa2_bwd_dq_kernel" if deterministic else "fa2_bwd_convert_dq_kernel"
    assert [x[0] for x in want] == ["fa2_bwd_preprocess_kernel", "fa2_bwd_kernel", last]
    assert len(hw_backward._PLANS.plans) == 1  # one key, one plan


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
def test_the_direct_eager_path_launches_what_the_ops_launch(gpu, monkeypatch, deterministic):
    """fa_hw.attention in plain eager autograd (torch_ops._direct: no dispatcher) and through the
    custom ops launch the same kernels with the same configs and arguments (pointers by role; lse,
    which autograd keeps, and the workspaces by order of appearance)."""
    from fa_hw import torch_ops

    launches = _recorded_launches(monkeypatch)

    def run():
        q, k, v, do = (torch.from_numpy(a) for a in _problem(b=2, h=2, nq=130, nk=90))
        q, k, v = (x.requires_grad_() for x in (q, k, v))
        o = fa_hw.attention(q, k, v, causal=True, deterministic=deterministic, check_finite=False)
        o.backward(do)
        got = _roles(launches, q=q, k=k, v=v, o=o, do=do, dq=q.grad, dk=k.grad, dv=v.grad)
        del launches[:]
        return type(o.grad_fn).__name__, got

    direct = run()
    with monkeypatch.context() as m:
        m.setattr(torch_ops, "_direct", lambda *xs: False)
        ops = run()
    assert direct[0] == "_AttentionBackward" and "attention_fwd" in ops[0]
    assert direct[1] == ops[1] and len(ops[1]) == 4


def test_bad_input_after_a_cached_call_still_gets_its_error(gpu):
    """A key's plan is stored only after its checks passed, and what a key does not fix (contiguity)
    is checked on every call: after good calls, each bad input still gets its one line, and launches
    nothing."""
    from fa_hw.backward import enqueue_backward
    from fa_hw.forward import enqueue_forward

    q, k, v, do = (torch.from_numpy(a) for a in _problem())
    o, lse = enqueue_forward(q, k, v, causal=True, scale=1.0)
    for _ in range(2):
        enqueue_backward(q, k, v, o, lse, do, True, 1.0, False)
    n = len(gpu.log)
    strided = do.transpose(2, 3).contiguous().transpose(2, 3)
    bad_bwd = [
        ((q, k, v, o, lse, strided, True, 1.0, False), r"do must be a contiguous float16 torch tensor on cpu, got "
                                                       r"float16 on cpu, strides"),
        ((q, k, v, o, lse, do, 1, 1.0, False), r"causal must be True or False, got 1"),
        ((q, k, v, o, lse, do, True, True, False), r"scale must be a positive finite number, got True"),
        ((q, k, v, o, lse, do, True, 1.0, 0), r"deterministic must be True or False, got 0"),
        ((q, k, v, o, lse.double(), do, True, 1.0, False), r"lse must be float32"),
        ((q, k, v, o, lse, do.to("meta"), True, 1.0, False), r"do is on the meta device"),
        ((q, k, v, o, lse, do.numpy(), True, 1.0, False), r"do must be a contiguous float16 torch tensor"),
        ((q, k, v, o, lse, do, True, [1.0], False), r"scale must be a positive finite number, got \[1.0\]"),
    ]
    for args, want in bad_bwd:
        with pytest.raises(ValueError, match=want):
            enqueue_backward(*args)
    enqueue_forward(q, k, v, causal=True, scale=1.0)
    bad_fwd = [
        ((q.transpose(2, 3).contiguous().transpose(2, 3), k, v, True, 1.0), r"q must be a contiguous float16 torch "
                                                                           r"tensor on cpu, got float16 on cpu, strides"),
        ((q, k, v, 1, 1.0), r"causal must be True or False, got 1"),
        ((q, k, v, True, True), r"scale must be a positive finite number, got True"),
        ((q, k, v.float(), True, 1.0), r"v must be a contiguous float16 torch tensor on cpu, got float32"),
    ]
    for args, want in bad_fwd:
        with pytest.raises(ValueError, match=want):
            enqueue_forward(*args)
    assert gpu.log[n:] == ["launch fa2_fwd_kernel"]  # the one good forward call in between


def test_host_overhead_fake_mode_times_every_layer_and_puts_the_gpu_back():
    """experiments/host_overhead.py --fake: every layer timed, each call launching its kernels (one
    forward, three backward), and fa_hw as it was afterwards (nothing faked left behind)."""
    from experiment_scripts import load

    ho = load("host_overhead")
    before = (cuda_core.launch, runtime.device, runtime.torch_stream, runtime.load_kernel, hw_backward.load_backward,
              hw_backward._PLANS, hw_forward._PLANS, tensors.KERNEL_DEVICE)
    out = ho.fake_report((4, 8, 300, 64), causal=True, calls=2)
    assert set(out) == {"backward (autograd.grad)", "  attention_bwd op", "  enqueue_backward",
                        "forward (fa_hw.attention)", "  attention_fwd op", "  enqueue_forward"}
    assert all(us > 0 for us, _ in out.values())
    assert [n for _, n in out.values()] == [3, 3, 3, 1, 1, 1]
    after = (cuda_core.launch, runtime.device, runtime.torch_stream, runtime.load_kernel, hw_backward.load_backward,
             hw_backward._PLANS, hw_forward._PLANS, tensors.KERNEL_DEVICE)
    assert all(a is b for a, b in zip(before, after))


def test_kernels_are_loaded_once_per_build(monkeypatch):
    """load_kernel and load_backward compile and load a build once; every later launch of it reuses it."""
    from fa_sim.contract.backward import BackwardBuild, BackwardConfig
    from fa_sim.contract.build import KernelBuild

    compiled = []

    class Code:
        def get_kernel(self, name):
            return name

    def compile_(build):
        compiled.append(build)
        return types.SimpleNamespace(object_code=Code)

    monkeypatch.setattr(runtime, "device", lambda: types.SimpleNamespace(device_id=0))
    monkeypatch.setattr(runtime, "compile_build", compile_)
    monkeypatch.setattr(hw_backward, "compile_backward", compile_)
    monkeypatch.setattr(ResourceUsage, "from_kernel", classmethod(lambda cls, kernel: cls(64, 0)))
    monkeypatch.setattr(runtime, "_set_max_dynamic_smem", lambda *a: None)
    runtime.load_kernel.cache_clear()
    hw_backward.load_backward.cache_clear()
    try:
        for _ in range(3):
            runtime.load_kernel(KernelBuild(arch="sm_80"))
            hw_backward.load_backward(BackwardBuild(BackwardConfig(64), True, False, "sm_80"))
        runtime.load_kernel(KernelBuild(causal=True, arch="sm_80"))
        assert len(compiled) == 3
    finally:
        runtime.load_kernel.cache_clear()
        hw_backward.load_backward.cache_clear()


# ---- on the GPU -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cuda():
    if not fa_hw.has_gpu() or not torch.cuda.is_available():
        pytest.skip("no NVIDIA GPU / CUDA torch here")
    return torch.device("cuda")


def _cuda_problem(shape, seed=0):
    return [torch.from_numpy(a).cuda() for a in _problem(*shape, seed=seed)]


GPU_SHAPES = [(1, 2, 200, 200, 64), (2, 1, 77, 300, 32), (1, 1, 130, 100, 128)]


def _bits(x) -> np.ndarray:
    return x.detach().cpu().numpy().view(np.uint16) if isinstance(x, torch.Tensor) else np.asarray(x).view(np.uint16)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=["x".join(map(str, s)) for s in GPU_SHAPES])
def test_async_path_equals_the_direct_api_bit_for_bit(cuda, shape, causal):
    from fa_hw.backward import enqueue_backward
    from fa_hw.forward import enqueue_forward

    q, k, v, do = _cuda_problem(shape)
    o, lse = enqueue_forward(q, k, v, causal=causal)
    fwd = fa_hw.forward(q, k, v, causal=causal)
    torch.cuda.synchronize()
    assert np.array_equal(_bits(o), _bits(fwd.o))
    assert np.array_equal(lse.cpu().numpy().view(np.uint32), fwd.lse.cpu().numpy().view(np.uint32))
    got = enqueue_backward(q, k, v, o, lse, do, causal=causal, deterministic=True)
    # the async path runs the GPU's tuned tiles; dQ's deterministic order depends on the tiles
    want = fa_hw.backward(q, k, v, fwd.o, fwd.lse, do, causal=causal, deterministic=True, config="auto")
    torch.cuda.synchronize()
    for name, g in zip(("dq", "dk", "dv"), got):
        assert np.array_equal(_bits(g), _bits(getattr(want, name))), name
    atomic = enqueue_backward(q, k, v, o, lse, do, causal=causal, deterministic=False)
    for name, g in zip(("dk", "dv"), atomic[1:]):  # dK, dV take no atomics: equal in both modes
        assert np.array_equal(_bits(g), _bits(getattr(want, name))), name


@pytest.mark.gpu
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
def test_autograd_on_a_side_stream_equals_the_default_stream(cuda, deterministic):
    """The kernels follow torch's current stream: gradients computed on a new stream (the workspaces
    allocated there, nothing synchronised in between) equal those of the default stream; in the
    deterministic mode bit for bit, in the atomic one dK, dV bit for bit and dQ within its bound."""
    shape = (2, 2, 300, 257, 64)

    def grads():
        q, k, v, do = _cuda_problem(shape, seed=5)
        q, k, v = (x.requires_grad_() for x in (q, k, v))
        o = fa_hw.attention(q, k, v, causal=True, deterministic=deterministic)
        o.backward(do)
        return [x.grad for x in (q, k, v)]

    want = grads()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # a queue of steps on the side stream, none waited for
            got = grads()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    for i, (name, g, w) in enumerate(zip(("dq", "dk", "dv"), got, want)):
        if deterministic or i > 0:
            assert np.array_equal(_bits(g), _bits(w)), name
        else:  # atomic dQ: the order of the fp32 adds varies from run to run
            torch.testing.assert_close(g.float(), w.float(), rtol=0, atol=float(w.abs().max()) * 2e-3)


@pytest.mark.gpu
def test_torch_compile_through_the_async_ops(cuda):
    q, k, v, do = _cuda_problem((2, 2, 256, 256, 64), seed=7)
    q, k, v = (x.requires_grad_() for x in (q, k, v))

    def step(a, b, c):
        return fa_hw.attention(a * 1.0, b, c, causal=True, deterministic=True)

    o = torch.compile(step, fullgraph=True)(q, k, v)
    got = torch.autograd.grad(o, (q, k, v), do)
    fwd = fa_hw.forward(q.detach(), k.detach(), v.detach(), causal=True)
    want = fa_hw.backward(q.detach(), k.detach(), v.detach(), fwd.o, fwd.lse, do, causal=True, deterministic=True,
                          config="auto")
    assert np.array_equal(_bits(o), _bits(fwd.o))
    for name, g in zip(("dq", "dk", "dv"), got):
        assert np.array_equal(_bits(g), _bits(getattr(want, name))), name


@pytest.mark.gpu
def test_torch_stream_is_torchs_current_stream(cuda):
    """runtime.torch_stream (torch's raw current stream, its cuda.core wrapper kept per handle) is the
    stream torch.cuda.current_stream names, on the default stream and inside torch.cuda.stream(side)."""
    dev = torch.device("cuda", torch.cuda.current_device())
    side = torch.cuda.Stream()
    for s in (torch.cuda.default_stream(), side):
        with torch.cuda.stream(s):
            got = runtime.torch_stream(dev)
            assert torch.cuda.current_stream().cuda_stream == s.cuda_stream
        assert got is runtime.foreign_stream(s.cuda_stream)
        if s.cuda_stream:  # 0: the legacy default stream, cuda.core's LEGACY_DEFAULT_STREAM
            assert int(got.handle) == s.cuda_stream
