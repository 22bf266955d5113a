"""fa_hw.attention: differentiable attention for PyTorch, as two torch.library custom ops.

    o = fa_hw.attention(q, k, v, causal=False, scale=None)    # q [B, H, Nq, d], k, v [B, H, Nk, d]
    o.sum().backward()                                        # q.grad, k.grad, v.grad

Two ops, opaque to autograd and to torch.compile (fullgraph), each with a fake (meta) implementation
that gives the outputs' shapes and dtypes without running anything:

  flashsim::attention_fwd(q, k, v, causal, scale, deterministic) -> (o, lse)
  flashsim::attention_bwd(do, q, k, v, o, lse, causal, scale, deterministic) -> (dq, dk, dv)

(scale: a float, or None for 1/sqrt(d), resolved inside the ops.)

`torch.library.register_autograd` joins them: the forward saves q, k, v, o and lse (natural log,
[B, H, Nq]); the backward makes dO contiguous (a gradient arriving through a transpose is
strided) and calls attention_bwd. lse is marked non-differentiable (its gradient is not
computed: a loss through lse raises instead of being silently dropped).
The direct eager path: in plain eager autograd (`_direct`: not under torch.compile, plain
torch.Tensors, no torch dispatch or function mode, no functorch transform) fa_hw.attention runs the
same two implementations and the same autograd formula as a torch.autograd.Function (`_Attention`),
and its backward calls the backward's implementation itself when grad mode is off (no
create_graph), skipping the dispatcher's layers (schema, autograd kernel, aliasing check, dynamo's
disable wrapper), which cost about as much host time per call as the kernels' launch path. The
same functions run, so the results are the same bits; o.grad_fn is `_AttentionBackward` there, and
a profiler records the kernels without the op's name around them. Everything else (torch.compile,
fake tensors, FlopCounterMode, vmap, double backward) goes through the ops.

Two paths, chosen by the inputs' dtype (all three alike):
  float16 or bfloat16, CUDA   fa2_fwd.cu and fa2_bwd.cu (dQ by atomics unless deterministic=True;
                  FA_BF16 for bfloat16) on the tensors in place, asynchronously as torch's own
                  kernels: fa_hw.forward.enqueue_forward and fa_hw.backward.enqueue_backward enqueue
                  the launches on torch's current stream with no CUDA event and no synchronisation,
                  and the backward's workspaces (D, and dq_accum in atomic mode) are torch tensors
                  from its caching allocator on that stream; o and the gradients in the inputs'
                  dtype, lse float32. head_dim one of the backward's (fa_sim.contract.backward.HEAD_DIMS:
                  not 256).
  float64, CPU or CUDA   THE REFERENCE, not the kernels: fa_sim.reference.attention and
                  attention_backward in float64 numpy (CUDA tensors are copied to the host and the
                  results back). This path exists so that torch.autograd.gradcheck checks the
                  autograd wiring and the gradient formula against finite differences; the
                  kernels' own accuracy is checked against the same reference within the bound of
                  docs/backward.md (tests/test_torch_attention.py, marked gpu).
Masking is top-left causal as everywhere in flashsim (key j visible to query i iff j <= i), which is
torch SDPA's is_causal. Bad input (not tensors, ranks and shapes, dtypes, devices, non-contiguous
tensors given to the ops directly, a head_dim outside the family, a scale that is not positive and
finite) is one ValueError line before any work; these checks read no values. Values: with
check_finite=True (fa_hw.attention's default) NaN or Inf in q, k, v (forward) or dO (backward) is
one ValueError line naming the tensor and its first bad element; the check reduces on the device and
reads one bool per tensor back, so each call waits for the GPU once. With check_finite=False nothing
reads a value and the kernel path never waits: non-finite values propagate into o and the gradients,
as with torch's kernels (a dynamic loss scale's GradScaler sees the non-finite gradients and skips the
step). fa_hw.forward and fa_hw.backward, the direct API, always check values.
Errors: a launch the driver refuses is a fa_hw KernelFault naming the kernel and its build, at the
call; a fault while a kernel runs surfaces asynchronously, at torch's next synchronisation (.item(),
.cpu(), torch.cuda.synchronize()), as torch's CUDA error, which names no kernel -
CUDA_LAUNCH_BLOCKING=1 makes the launches synchronous, or rerun the step through fa_hw.forward and
fa_hw.backward, which synchronise after each kernel and name it.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from fa_sim.contract.backward import HEAD_DIMS, UNSUPPORTED

from . import tensors

KERNEL_DTYPES = (torch.float16, torch.bfloat16)
REFERENCE_DTYPE = torch.float64
ACCEPTED = ("float16 or bfloat16 CUDA tensors (the kernels) or float64 tensors (the float64 reference, for "
            "gradcheck)")


def _check_qkv(q, k, v, scale, contiguous: bool) -> None:
    """Every metadata check of the module docstring (no values read; runs in the fake impls too)."""
    for name, x in zip("qkv", (q, k, v)):
        if not isinstance(x, Tensor):
            raise ValueError(f"fa_hw.attention: {name} must be a torch tensor, got {type(x).__name__}")
        if x.dim() != 4:
            raise ValueError(f"fa_hw.attention: {name} must be [B, H, N, d] (rank 4), got shape {tuple(x.shape)}")
    if k.shape != v.shape or k.shape[:2] != q.shape[:2] or k.shape[3] != q.shape[3]:
        raise ValueError(f"fa_hw.attention: q [B, H, Nq, d] and k, v [B, H, Nk, d] must agree, got q "
                         f"{tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise ValueError(f"fa_hw.attention: q, k, v must have one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.device != k.device or q.device != v.device:
        raise ValueError(f"fa_hw.attention: q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    _check_dtype_device(q.dtype, q.device)
    if q.dtype in KERNEL_DTYPES and q.shape[3] not in HEAD_DIMS:
        why = f" ({q.shape[3]}: the forward runs it, the backward does not)" if q.shape[3] in UNSUPPORTED else ""
        raise ValueError(f"fa_hw.attention: head_dim {q.shape[3]} is not one of the kernels' {HEAD_DIMS}{why}")
    if scale is not None and not (isinstance(scale, float) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"fa_hw.attention: scale must be None or a positive finite float, got {scale!r}")
    if contiguous:
        _check_contiguous(q=q, k=k, v=v)


def _check_dtype_device(dtype, device) -> None:
    if dtype == REFERENCE_DTYPE:
        return
    if dtype not in KERNEL_DTYPES:
        raise ValueError(f"fa_hw.attention: dtype {dtype} is not accepted; pass {ACCEPTED}")
    if device.type != tensors.KERNEL_DEVICE:
        raise ValueError(f"fa_hw.attention: {dtype} tensors on {device} are not accepted; pass {ACCEPTED}")


def _check_contiguous(**xs) -> None:
    for name, x in xs.items():
        if not x.is_contiguous():
            raise ValueError(f"fa_hw.attention: {name} must be contiguous (shape {tuple(x.shape)}, strides "
                             f"{tuple(x.stride())}); call .contiguous() first")


def _scale(q: Tensor, scale: float | None) -> float:
    """None: 1/sqrt(head_dim), resolved inside the ops (at run time, so that a symbolic head_dim under
    torch.compile(dynamic=True) never becomes a symbolic float argument)."""
    return 1.0 / math.sqrt(q.shape[3]) if scale is None else scale


def _check_bwd(do, q, k, v, o, lse, scale) -> None:
    _check_qkv(q, k, v, scale, contiguous=True)
    _check_like_q("do", do, q)
    _check_like_q("o", o, q)
    lse_dtype = torch.float64 if q.dtype == REFERENCE_DTYPE else torch.float32
    if not isinstance(lse, Tensor) or lse.shape != q.shape[:3] or lse.dtype != lse_dtype or lse.device != q.device:
        what = f"{tuple(lse.shape)} {lse.dtype} on {lse.device}" if isinstance(lse, Tensor) else type(lse).__name__
        raise ValueError(f"fa_hw.attention backward: lse must be {tuple(q.shape[:3])} {lse_dtype} on {q.device} "
                         f"(the forward's), got {what}")
    _check_contiguous(do=do, o=o, lse=lse)


def _check_like_q(name: str, x, q) -> None:
    if not isinstance(x, Tensor) or x.shape != q.shape or x.dtype != q.dtype or x.device != q.device:
        what = f"{tuple(x.shape)} {x.dtype} on {x.device}" if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"fa_hw.attention backward: {name} must be like q ({tuple(q.shape)} {q.dtype} on "
                         f"{q.device}), got {what}")


def _check_finite(what: str, **xs: Tensor) -> None:
    """One ValueError line naming the first tensor with a NaN or Inf and its first such element: all
    tensors reduced on their device and read back once (the one wait of check_finite=True)."""
    ok = torch.stack([torch.isfinite(x).all() for x in xs.values()]).cpu()
    for (name, x), fine in zip(xs.items(), ok.tolist()):
        if not fine:
            at = tuple(int(i) for i in torch.nonzero(~torch.isfinite(x))[0].tolist())
            raise ValueError(f"{what}: {name} contains NaN or Inf, first at {name}{list(at)} = {float(x[at])}; "
                             "pass finite values (or check_finite=False to let them propagate, as torch's kernels do)")


def _host(x: Tensor):
    return x.detach().cpu().numpy()


def _back(a, like: Tensor) -> Tensor:
    return torch.from_numpy(a).to(device=like.device, dtype=REFERENCE_DTYPE).contiguous()


def _attention_fwd(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float | None,
                   deterministic: bool, check_finite: bool) -> tuple[Tensor, Tensor]:
    """(o, lse): fa2_fwd.cu for fp16 / bf16 CUDA tensors, the float64 reference for float64 ones."""
    _check_qkv(q, k, v, scale, contiguous=True)
    return _forward_checked(q, k, v, causal, scale, check_finite)


def _forward_checked(q, k, v, causal, scale, check_finite):
    """_attention_fwd after its metadata checks (_Attention's: fa_hw.attention ran them and made q, k, v
    contiguous)."""
    if check_finite:
        _check_finite("fa_hw.attention", q=q, k=k, v=v)
    scale = _scale(q, scale)
    if q.dtype == REFERENCE_DTYPE:
        from fa_sim.reference import attention

        o, lse = attention(_host(q), _host(k), _host(v), causal, scale)
        return _back(o, q), _back(lse, q)
    from .forward import enqueue_forward

    return enqueue_forward(q, k, v, causal=causal, scale=scale)


attention_fwd = torch.library.custom_op("flashsim::attention_fwd", _attention_fwd, mutates_args=())


@attention_fwd.register_fake
def _attention_fwd_fake(q, k, v, causal, scale, deterministic, check_finite):
    _check_qkv(q, k, v, scale, contiguous=True)
    lse_dtype = REFERENCE_DTYPE if q.dtype == REFERENCE_DTYPE else torch.float32
    return torch.empty_like(q), q.new_empty(q.shape[:3], dtype=lse_dtype)


def _attention_bwd(do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, causal: bool,
                   scale: float | None, deterministic: bool, check_finite: bool) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv): fa2_bwd.cu for fp16 / bf16 CUDA tensors, the float64 reference for float64 ones."""
    _check_bwd(do, q, k, v, o, lse, scale)
    return _backward_checked(do, q, k, v, o, lse, causal, scale, deterministic, check_finite)


def _backward_checked(do, q, k, v, o, lse, causal, scale, deterministic, check_finite):
    """_attention_bwd after its metadata checks (the direct backward's: q, k, v, o, lse are the saved
    tensors its forward checked and made, which autograd keeps from changing; dO is checked there)."""
    if check_finite:
        _check_finite("fa_hw.attention backward", do=do)
    scale = _scale(q, scale)
    if q.dtype == REFERENCE_DTYPE:
        from fa_sim.reference import attention_backward

        dq, dk, dv = attention_backward(_host(q), _host(k), _host(v), _host(do), causal, scale)
        return _back(dq, q), _back(dk, k), _back(dv, v)
    from .backward import enqueue_backward

    return enqueue_backward(q, k, v, o, lse, do, causal=causal, scale=scale, deterministic=deterministic)


attention_bwd = torch.library.custom_op("flashsim::attention_bwd", _attention_bwd, mutates_args=())


@attention_bwd.register_fake
def _attention_bwd_fake(do, q, k, v, o, lse, causal, scale, deterministic, check_finite):
    _check_bwd(do, q, k, v, o, lse, scale)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, causal, scale, deterministic, check_finite = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.mark_non_differentiable(lse)
    ctx.causal, ctx.scale, ctx.deterministic, ctx.check_finite = causal, scale, deterministic, check_finite


def _backward(ctx, do, dlse):
    q, k, v, o, lse = ctx.saved_tensors
    do = torch.zeros_like(o) if do is None else do.contiguous()  # None: _Attention's grads are not materialised
    args = (do, q, k, v, o, lse, ctx.causal, ctx.scale, ctx.deterministic, ctx.check_finite)
    if not torch.is_grad_enabled() and _direct(do, q, k, v, o, lse):
        _check_like_q("do", do, q)  # the rest was checked by the forward (_backward_checked)
        dq, dk, dv = _backward_checked(*args)
    else:
        dq, dk, dv = attention_bwd(*args)
    return dq, dk, dv, None, None, None, None


attention_fwd.register_autograd(_backward, setup_context=_setup_context)


def _direct(*xs) -> bool:
    """Whether fa_hw.attention may run an op's implementation (_attention_fwd, _attention_bwd) itself
    instead of through torch's dispatcher: plain eager autograd - not under torch.compile, every
    tensor a plain torch.Tensor (no FakeTensor, functional tensor or subclass), no torch dispatch or
    function mode (FakeTensorMode, FlopCounterMode, `with torch.device(...)`), no functorch transform
    (vmap, grad), and grad mode off when called from a backward (the op's autograd kernel would give
    a double backward its error). The same functions run either way, so the results are the same
    bits; the dispatcher's layers (schema, autograd kernel, aliasing check, dynamo's disable
    wrapper) cost about as much host time per call as the kernels' own launch path."""
    if torch.compiler.is_compiling():
        return False
    for x in xs:
        if type(x) is not Tensor:
            return False
    return not (torch._C._len_torch_dispatch_stack() or torch._C._is_torch_function_mode_enabled()
                or torch._C._are_functorch_transforms_active())


class _Attention(torch.autograd.Function):
    """attention_fwd with register_autograd's formula (_setup_context, _backward) as a plain
    autograd.Function: what fa_hw.attention runs where _direct allows (no dispatcher)."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, deterministic, check_finite):
        ctx.set_materialize_grads(False)  # no zeros for lse's (non-differentiable) gradient
        out = _forward_checked(q, k, v, causal, scale, check_finite)  # fa_hw.attention checked q, k, v, scale
        _setup_context(ctx, (q, k, v, causal, scale, deterministic, check_finite), out)
        return out

    @staticmethod
    def backward(ctx, do, dlse):
        return _backward(ctx, do, dlse)


def attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False, scale: float | None = None, *,
              deterministic: bool = False, check_finite: bool = True) -> Tensor:
    """Differentiable attention O [B, H, Nq, d]; see the module docstring. Strided q, k, v are made
    contiguous first (a copy, as torch does for its own kernels). check_finite (default): q, k, v and
    then dO are checked for NaN and Inf, one ValueError line naming the tensor and the first bad
    element, at the cost of one device-to-host read per call (it waits for the GPU); False: nothing
    reads a value and the calls never wait (non-finite values propagate, as with torch's kernels)."""
    if not all(isinstance(x, bool) for x in (causal, deterministic, check_finite)):
        raise ValueError(f"fa_hw.attention: causal, deterministic and check_finite must be True or False, got "
                         f"{causal!r}, {deterministic!r}, {check_finite!r}")
    if isinstance(scale, int) and not isinstance(scale, bool):
        scale = float(scale)
    _check_qkv(q, k, v, scale, contiguous=False)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    if _direct(q, k, v):
        o, _ = _Attention.apply(q, k, v, causal, scale, deterministic, check_finite)
    else:
        o, _ = attention_fwd(q, k, v, causal, scale, deterministic, check_finite)
    return o
