"""fa_hw.attention, the differentiable torch op (fa_hw/torch_ops.py). CPU: the ops registered, their
fake (meta) implementations' shapes and dtypes, torch.library.opcheck, gradcheck in float64 (the
reference path) with tails causal and not, torch.compile(fullgraph=True) through the ops, one-line
errors, fa_hw importing without torch. GPU (marked `gpu`): fp16 and bf16 gradients of the kernels
within the float64 bound of docs/backward.md (its fp16 and bf16 forms), the torch path of
fa_hw.backward equal to its numpy path bit for bit in the deterministic mode, torch.compile on
CUDA. Skips cleanly without torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fa_hw  # noqa: E402
from fa_hw import torch_ops  # noqa: E402

SHAPES = [(1, 2, 5, 7, 8), (2, 1, 9, 4, 16)]  # (B, H, Nq, Nk, d): tails, Nq != Nk both ways


def _qkv(b, h, nq, nk, d, dtype=torch.float64, device="cpu", seed=0, grad=True):
    gen = torch.Generator().manual_seed(seed)
    xs = [torch.randn((b, h, n, d), generator=gen, dtype=torch.float64) for n in (nq, nk, nk)]
    return [x.to(device=device, dtype=dtype).requires_grad_(grad) for x in xs]


def test_the_ops_are_registered_with_their_schemas():
    fwd, bwd = torch.ops.flashsim.attention_fwd.default, torch.ops.flashsim.attention_bwd.default
    assert [a.name for a in fwd._schema.arguments] == ["q", "k", "v", "causal", "scale", "deterministic", "check_finite"]
    assert len(fwd._schema.returns) == 2
    assert [a.name for a in bwd._schema.arguments][:6] == ["do", "q", "k", "v", "o", "lse"]
    assert len(bwd._schema.returns) == 3


@pytest.mark.parametrize("dtype,device,lse_dtype", [(torch.float16, "cuda", torch.float32),
                                                    (torch.bfloat16, "cuda", torch.float32),
                                                    (torch.float64, "cpu", torch.float64)])
def test_fake_implementations_give_shapes_and_dtypes(dtype, device, lse_dtype):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        q = torch.empty((2, 3, 100, 64), dtype=dtype, device=device)
        k = torch.empty((2, 3, 37, 64), dtype=dtype, device=device)
        v = torch.empty_like(k)
        o, lse = torch.ops.flashsim.attention_fwd(q, k, v, True, 0.125, False, True)
        assert (o.shape, o.dtype, o.device.type) == (q.shape, dtype, device)
        assert (lse.shape, lse.dtype) == ((2, 3, 100), lse_dtype)
        dq, dk, dv = torch.ops.flashsim.attention_bwd(torch.empty_like(o), q, k, v, o, lse, True, 0.125, False, True)
        assert [x.shape for x in (dq, dk, dv)] == [q.shape, k.shape, k.shape]
        assert all(x.dtype == dtype for x in (dq, dk, dv))
        if dtype != torch.float64:  # the kernels' head_dim family, checked at trace time too
            q48 = torch.empty((2, 3, 100, 48), dtype=dtype, device=device)
            with pytest.raises(ValueError, match="head_dim 48"):
                torch.ops.flashsim.attention_fwd(q48, q48, q48, True, 0.125, False, True)
            q256 = torch.empty((2, 3, 100, 256), dtype=dtype, device=device)  # the forward's, not the backward's
            with pytest.raises(ValueError, match="head_dim 256 .*the backward does not"):
                torch.ops.flashsim.attention_fwd(q256, q256, q256, True, 0.125, False, True)
    assert mode is not None


def test_opcheck_on_the_reference_path():
    q, k, v = _qkv(1, 2, 5, 7, 8, grad=False)
    torch.library.opcheck(torch.ops.flashsim.attention_fwd.default, (q, k, v, True, 0.3, False, True))
    o, lse = torch.ops.flashsim.attention_fwd(q, k, v, True, 0.3, False, True)
    do = torch.randn_like(o)
    torch.library.opcheck(torch.ops.flashsim.attention_bwd.default, (do, q, k, v, o, lse, True, 0.3, False, True))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{b}x{h}x{nq}x{nk}-d{d}" for b, h, nq, nk, d in SHAPES])
def test_gradcheck_float64(shape, causal):
    q, k, v = _qkv(*shape)
    assert torch.autograd.gradcheck(lambda a, b, c: fa_hw.attention(a, b, c, causal=causal), (q, k, v))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_the_direct_eager_path_equals_the_ops_bit_for_bit(monkeypatch, causal):
    """Plain eager autograd runs the ops' implementations without the dispatcher (torch_ops._direct,
    _Attention); the same call through the custom ops gives the same o and gradients, bit for bit
    (float64 reference path; on the kernels tests/test_hw_async.py checks the launches)."""
    def run():
        q, k, v = _qkv(2, 3, 9, 6, 16, seed=4)
        o = fa_hw.attention(q, k, v, causal=causal, scale=0.4)
        o.backward(torch.randn(o.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64))
        return o.grad_fn, [x.detach() for x in (o, q.grad, k.grad, v.grad)]

    fn_direct, direct = run()
    monkeypatch.setattr(torch_ops, "_direct", lambda *xs: False)
    fn_ops, ops = run()
    assert type(fn_direct).__name__ == "_AttentionBackward" and "attention_fwd" in type(fn_ops).__name__
    for a, b in zip(direct, ops):
        assert torch.equal(a, b)


def test_which_path_runs(monkeypatch):
    """The ops' dispatcher is skipped only in plain eager autograd: a torch dispatch mode sees both ops
    (it would not see a direct call), and in plain eager neither op is called."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    q, k, v = _qkv(1, 2, 5, 7, 8)
    with Seen() as seen:
        fa_hw.attention(q, k, v, causal=True).sum().backward()
    assert "flashsim.attention_fwd.default" in seen.ops and "flashsim.attention_bwd.default" in seen.ops

    def refuse(*args):
        raise AssertionError("the op was called")

    monkeypatch.setattr(torch_ops, "attention_fwd", refuse)
    monkeypatch.setattr(torch_ops, "attention_bwd", refuse)
    q, k, v = _qkv(1, 2, 5, 7, 8)
    fa_hw.attention(q, k, v, causal=True).sum().backward()
    assert q.grad is not None and k.grad is not None and v.grad is not None


def test_double_backward_is_refused_on_both_paths():
    """create_graph=True keeps grad mode on in the backward, where the op runs (its autograd kernel):
    a gradient of the gradients is the op's error, as before the direct path existed."""
    q, k, v = _qkv(1, 2, 5, 7, 8)
    o = fa_hw.attention(q, k, v, causal=True)
    (dq,) = torch.autograd.grad(o.sum(), (q,), create_graph=True)
    with pytest.raises(RuntimeError, match="no autograd formula"):
        dq.sum().backward()


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_reference_path_equals_sdpa(causal):
    """The float64 path is attention itself: torch's SDPA (top-left causal) gives the same O and grads."""
    q, k, v = _qkv(1, 2, 9, 6, 16)
    q2, k2, v2 = (x.detach().clone().requires_grad_() for x in (q, k, v))
    o = fa_hw.attention(q, k, v, causal=causal, scale=0.3)
    ref = torch.nn.functional.scaled_dot_product_attention(q2, k2, v2, is_causal=causal, scale=0.3)
    do = torch.randn_like(o)
    o.backward(do)
    ref.backward(do)
    for got, want in ((o, ref), (q.grad, q2.grad), (k.grad, k2.grad), (v.grad, v2.grad)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_torch_compile_fullgraph_matches_eager(dynamic):
    def loss(a, b, c):
        return (fa_hw.attention(a, b, c, causal=True) ** 2).sum()

    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager", dynamic=dynamic)  # dynamo + AOTAutograd
    for shape in [(1, 2, 9, 6, 16), (2, 1, 5, 11, 8)][: 2 if dynamic else 1]:  # dynamic: symbolic sizes, head_dim too
        q, k, v = _qkv(*shape)
        got = torch.autograd.grad(compiled(q, k, v), (q, k, v))
        want = torch.autograd.grad(loss(q, k, v), (q, k, v))
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_lse_is_not_differentiable():
    q, k, v = _qkv(1, 1, 4, 4, 8)
    o, lse = torch.ops.flashsim.attention_fwd(q, k, v, False, 0.5, False, True)
    assert o.requires_grad and not lse.requires_grad


def test_strided_inputs_and_gradients_are_made_contiguous():
    """A transformer's q = x.view(B, N, H, d).transpose(1, 2) is strided, and so is its gradient."""
    x = torch.randn((1, 6, 2, 8), dtype=torch.float64, requires_grad=True)
    q = x.transpose(1, 2)  # [1, 2, 6, 8], not contiguous
    assert not q.is_contiguous()
    o = fa_hw.attention(q, q, q, causal=True)
    o.transpose(1, 2).sum().backward()  # the incoming gradient is strided too
    x2 = x.detach().clone().requires_grad_()
    q2 = x2.transpose(1, 2)
    ref = torch.nn.functional.scaled_dot_product_attention(q2, q2, q2, is_causal=True)
    ref.transpose(1, 2).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-12, atol=1e-12)


def _one_line(exc) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def _strided(x):
    """x's values and shape in a non-contiguous layout (as a gradient through a transpose)."""
    return x.transpose(2, 3).contiguous().transpose(2, 3)


def test_bad_inputs_get_one_line():
    q, k, v = _qkv(1, 2, 5, 7, 8, grad=False)
    cases = [
        (lambda: fa_hw.attention(q.float(), k.float(), v.float()), "dtype torch.float32 is not accepted"),
        (lambda: fa_hw.attention(q.half(), k.half(), v.half()), "float16 tensors on cpu are not accepted"),
        (lambda: fa_hw.attention(q.bfloat16(), k.bfloat16(), v.bfloat16()), "bfloat16 tensors on cpu are not accepted"),
        (lambda: fa_hw.attention(q, k[:, :1], v), "must agree"),
        (lambda: fa_hw.attention(q[0], k, v), "rank 4"),
        (lambda: fa_hw.attention(q.numpy(), k, v), "must be a torch tensor"),
        (lambda: fa_hw.attention(q, k, v.float()), "one dtype"),
        (lambda: fa_hw.attention(q, k, v, scale=-1.0), "positive finite"),
        (lambda: fa_hw.attention(q, k, v, causal=1), "True or False"),
        (lambda: torch.ops.flashsim.attention_fwd(_strided(q), k, v, False, 0.5, False, True), "q must be contiguous"),
    ]
    o, lse = torch.ops.flashsim.attention_fwd(q, k, v, True, 0.3, False, True)
    do = torch.randn_like(o)
    bwd = torch.ops.flashsim.attention_bwd
    cases += [
        (lambda: bwd(_strided(do), q, k, v, o, lse, True, 0.3, False, True), "do must be contiguous"),
        (lambda: bwd(do[:, :, :4].contiguous(), q, k, v, o, lse, True, 0.3, False, True), "do must be like q"),
        (lambda: bwd(do, q, k, v, o, lse.float(), True, 0.3, False, True), "lse must be"),
        (lambda: bwd(do, q, k, v, o, lse[..., :3].contiguous(), True, 0.3, False, True), "lse must be"),
    ]
    for call, words in cases:
        with pytest.raises(ValueError) as exc:
            call()
        assert words in _one_line(exc)


def test_fa_hw_imports_without_torch_and_attention_says_so():
    code = ("import sys; sys.modules['torch'] = None\n"
            "import fa_hw\n"
            "try:\n    fa_hw.attention(1, 2, 3)\n"
            "except ImportError as exc:\n    print('ERR', exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip()
    assert line.startswith("ERR fa_hw.attention needs PyTorch") and "\n" not in line


def test_backward_layout_checks_read_no_values():
    """fa_hw.backward's torch CUDA path checks shapes and dtypes with check_backward_layout, which must
    not copy any array to the host: a tensor that refuses __array__ stands in for a CUDA one."""
    from fa_sim.backward import check_backward_layout

    class NoHost(torch.Tensor):
        __module__ = "torch.stand_in"  # read as a torch tensor (fa_sim.validate.kind_of)

        def __array__(self, *args, **kwargs):
            raise TypeError("copied to the host")

    q = torch.zeros((1, 1, 4, 32), dtype=torch.float16).as_subclass(NoHost)
    lse = torch.zeros((1, 1, 4)).as_subclass(NoHost)
    ins, causal, scale, config = check_backward_layout(q, q, q, q, lse, q, causal=True)
    assert [i.shape for i in ins] == [(1, 1, 4, 32)] * 5 and causal and config.head_dim == 32
    with pytest.raises(ValueError, match="lse must be float32"):
        check_backward_layout(q, q, q, q, lse.double(), q)
    with pytest.raises(ValueError, match=r"lse must have shape \(1, 1, 4\)"):
        check_backward_layout(q, q, q, q, lse[..., :3], q)


# ---- on the GPU -----------------------------------------------------------------------------------
GPU_SHAPES = [(1, 2, 200, 200, 64, False), (1, 2, 77, 300, 64, True), (2, 1, 300, 77, 32, True),
              (1, 1, 130, 100, 128, True)]


@pytest.fixture(scope="module")
def cuda():
    if not fa_hw.has_gpu() or not torch.cuda.is_available():
        pytest.skip("no NVIDIA GPU / CUDA torch here")
    return torch.device("cuda")


def _fp16_problem(b, h, nq, nk, d, seed=0, dtype=torch.float16):
    q, k, v = _qkv(b, h, nq, nk, d, dtype=dtype, device="cuda", seed=seed)
    do = torch.randn((b, h, nq, d), generator=torch.Generator().manual_seed(seed + 100)).to(dtype).cuda()
    return q, k, v, do


@pytest.mark.gpu
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=[f"{b}x{h}x{nq}x{nk}-d{d}{'-causal' if c else ''}"
                                                   for b, h, nq, nk, d, c in GPU_SHAPES])
def test_fp16_gradients_within_the_float64_bound(cuda, shape, deterministic):
    from fa_sim.reference import attention_backward

    *dims, causal = shape
    q, k, v, do = _fp16_problem(*dims)
    o = fa_hw.attention(q, k, v, causal=causal, deterministic=deterministic)
    assert o.dtype == torch.float16 and o.is_cuda
    o.backward(do)
    host = [x.detach().cpu().numpy() for x in (q, k, v, do)]
    *want, bq, bk, bv = attention_backward(*host, causal=causal, bound=True)
    for name, got, ref, bound in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad), want, (bq, bk, bv)):
        assert got.dtype == torch.float16 and got.is_cuda
        err = np.abs(got.cpu().numpy().astype(np.float64) - ref)
        worst = np.unravel_index(np.argmax(err / bound), err.shape)
        assert (err <= bound).all(), f"{name}: error {err[worst]:.3g} over the bound {bound[worst]:.3g} at {worst}"


@pytest.mark.gpu
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("shape", [(1, 2, 130, 100, 64, True), (1, 1, 77, 200, 128, False), (2, 1, 70, 90, 96, True)],
                         ids=["130x100-d64-causal", "77x200-d128", "70x90-d96-causal"])
def test_bf16_gradients_within_the_float64_bound(cuda, shape, deterministic):
    """bf16 q, k, v, dO: o and the gradients bfloat16, within the bf16 form of the bound (u = 2^-8)."""
    from fa_sim.reference import attention_backward

    *dims, causal = shape
    q, k, v, do = _fp16_problem(*dims, dtype=torch.bfloat16)
    o = fa_hw.attention(q, k, v, causal=causal, deterministic=deterministic)
    assert o.dtype == torch.bfloat16 and o.is_cuda
    o.backward(do)
    host = [x.detach().float().cpu().numpy() for x in (q, k, v, do)]
    *want, bq, bk, bv = attention_backward(*host, causal=causal, bound=True, dtype="bf16")
    for name, got, ref, bound in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad), want, (bq, bk, bv)):
        assert got.dtype == torch.bfloat16 and got.is_cuda
        err = np.abs(got.float().cpu().numpy().astype(np.float64) - ref)
        worst = np.unravel_index(np.argmax(err / bound), err.shape)
        assert (err <= bound).all(), f"{name}: error {err[worst]:.3g} over the bound {bound[worst]:.3g} at {worst}"


@pytest.mark.gpu
def test_torch_path_of_fa_hw_backward_equals_its_numpy_path(cuda):
    q, k, v, do = (x.detach() for x in _fp16_problem(1, 2, 130, 100, 64, seed=3))
    fwd = fa_hw.forward(q, k, v, causal=True)
    dev = fa_hw.backward(q, k, v, fwd.o, fwd.lse, do, causal=True, deterministic=True)
    host = fa_hw.backward(*(x.cpu().numpy() for x in (q, k, v, fwd.o, fwd.lse, do)), causal=True,
                          deterministic=True)
    for name in ("dq", "dk", "dv"):
        got = getattr(dev, name)
        assert isinstance(got, torch.Tensor) and got.is_cuda and got.dtype == torch.float16
        assert np.array_equal(got.cpu().numpy().view(np.uint16), getattr(host, name).view(np.uint16)), name


@pytest.mark.gpu
def test_torch_compile_on_cuda(cuda):
    q, k, v, do = _fp16_problem(2, 2, 256, 256, 64, seed=4)

    def step(a, b, c):
        return fa_hw.attention(a * 1.0, b, c, causal=True).float().square().mean()

    compiled = torch.compile(step, fullgraph=True)  # inductor around the opaque ops
    got = torch.autograd.grad(compiled(q, k, v), (q, k, v))
    want = torch.autograd.grad(step(q, k, v), (q, k, v))
    for g, w in zip(got, want):  # atomic dQ: last bits may differ from run to run
        torch.testing.assert_close(g.float(), w.float(), rtol=0, atol=float(w.abs().max()) * 2e-3)


def test_train_lm_smoke_on_the_float64_reference(tmp_path):
    """experiments/train_lm.py's model code, tiny, on the CPU: fa_hw.attention's float64 reference path
    and SDPA train the same model from the same seed on the same batches to the same losses."""
    from experiment_scripts import load

    lm = load("train_lm")
    src = tmp_path / "lib"
    (src / "site-packages").mkdir(parents=True)
    (src / "a.py").write_bytes(Path(lm.__file__).read_bytes())
    (src / "site-packages" / "skipped.py").write_bytes(b"x" * 100)
    data, corpus = lm.load_corpus(str(src))
    assert corpus["files"] == 1 and data.size == Path(lm.__file__).stat().st_size
    train, val = lm.split(data, lm.TINY)
    runs = [lm.train(b, lm.TINY, 3, "cpu", 0, train, val, log=lambda s: None) for b in ("fa_hw", "sdpa")]
    assert len(runs[0]["loss"]) == 3 and all(np.isfinite(runs[0]["loss"]))
    np.testing.assert_allclose(runs[0]["loss"], runs[1]["loss"], rtol=1e-10)
    np.testing.assert_allclose([v for _, v in runs[0]["val"]], [v for _, v in runs[1]["val"]], rtol=1e-10)
    other = lm.train("sdpa", lm.TINY, 3, "cpu", 1, train, val, log=lambda s: None)
    assert other["loss"] != runs[1]["loss"]  # another seed: other weights and batches
    np.testing.assert_allclose(lm.smooth(np.arange(30.0)), np.arange(30.0))  # a line stays itself, ends too
    np.testing.assert_allclose(lm.smooth(np.array([0, 0, 3.0, 0, 0]), 3), [0, 1, 1, 1, 0])
    lm.figure([*runs, other], tmp_path / "f.png", "smoke")
    assert (tmp_path / "f.png").stat().st_size > 1000
