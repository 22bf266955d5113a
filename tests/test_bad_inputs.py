"""Bad and edge inputs as a new user gives them (issue 36), by kind:

- Tracebacks: a malformed --npz member, predict_time's config given as 'auto' or a tag, torch
  tensors that require grad or live on the meta device, and every API argument (predict_time,
  fa_hw.forward, fa_sim.ptx.launch) type-checked as simulate checks its own, before any work.
- Late or unclear: numpy integers in KernelConfig, empty inputs, grids the GPU cannot launch,
  the timing model's and NVRTC's errors about a --kernel variant, a patch that does not apply,
  long messages, the config tag `fa banks` prints, and a kernel that computes nothing.
"""

from __future__ import annotations

import importlib
import re
import types
import zipfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import fa_sim
import fa_sim.timing
from fa_sim import validate
from fa_sim.cli import main
from fa_sim.config import KernelConfig, SmemLayout
from fa_sim.contract import KernelBuild
from fa_sim.contract.nvrtc import nvrtc_options
from fa_sim.contract.patch import PatchError, apply_patch

SEED = Path(__file__).parent.parent / "fa_hw" / "kernels" / "fa2_fwd.cu"
Q = np.random.default_rng(0).standard_normal((1, 1, 16, 32)).astype(np.float16)


def _message(fn, *args, **kwargs) -> str:
    with pytest.raises(ValueError) as info:
        fn(*args, **kwargs)
    return str(info.value)


# ---- tracebacks: --npz members ---------------------------------------------------------------------------
def _zip(path: Path, members: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)


@pytest.fixture(scope="module")
def npz_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("npz")
    x = np.zeros((1, 1, 64, 64), np.float16)
    _zip(d / "bytes.npz", {"q.npy": b"hello", "k.npy": b"x", "v.npy": b"x"})  # members that are not .npy data
    _zip(d / "noext.npz", {"q": b"hello", "k": b"x", "v": b"x"})
    made = {"zerod": dict(q=np.float16(1)), "complex": dict(q=x.astype(np.complex64)), "bool": dict(q=x > 0),
            "dates": dict(q=x.astype("datetime64[s]")), "struct": dict(q=np.zeros(x.shape, [("a", "f2")])),
            "objects": dict(q=np.array([{"a": 1}], dtype=object)), "rows0": dict(q=x[:, :, :0]),
            "keys0": dict(k=x[:, :, :0], v=x[:, :, :0]), "batch0": dict(q=x[:0], k=x[:0], v=x[:0]),
            "d80": dict(q=np.zeros((1, 1, 64, 80), np.float16), k=np.zeros((1, 1, 64, 80), np.float16),
                        v=np.zeros((1, 1, 64, 80), np.float16)),
            "kv": dict(k=np.zeros((1, 2, 64, 64), np.float16)), "nan": dict(q=x + np.nan),
            "inexact": dict(q=x.astype(np.float64) + 0.1)}
    for name, arrays in made.items():
        np.savez(d / f"{name}.npz", **{"q": x, "k": x, "v": x, **arrays})
    np.savez(d / "nov.npz", q=x, k=x)
    return d


@pytest.mark.parametrize("name, fragment", [
    ("bytes", "member q is not a .npy array (5 bytes of other data)"),
    ("noext", "member q is not a .npy array"),
    ("zerod", "q must have rank 4 [batch, heads, seqlen, head_dim], got shape ()"),
    ("complex", "q has dtype complex64, not a number type"), ("bool", "q has dtype bool, not a number type"),
    ("dates", "q has dtype datetime64[s], not a number type"), ("struct", "not a number type"),
    ("objects", "array q holds Python objects, which are never loaded"), ("nov", "lacks array(s) v"),
    ("rows0", "q has 0 rows (an empty sequence) (shape (1, 1, 0, 64)); at least 1 is needed"),
    ("keys0", "k has 0 rows (an empty sequence)"), ("batch0", "q has batch 0 (an empty batch)"),
    ("d80", "q has head_dim 80 (shape (1, 1, 64, 80)); the kernel supports head_dim 32, 64, 96, 128, 160, 192, 256"),
    ("kv", "k and v must have the same shape, got (1, 2, 64, 64) and (1, 1, 64, 64)"),
    ("nan", "q contains NaN or Inf, first at q[0, 0, 0, 0]"),
    ("inexact", "q (float64) holds 4,096 values that fp16 does not represent exactly"),
])
def test_every_malformed_npz_is_one_line_naming_the_option_and_file(npz_files, name, fragment, capsys):
    path = npz_files / f"{name}.npz"
    assert main(["sim", "--npz", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"--npz {path}: " in err and fragment in err and len(err.strip().splitlines()) == 1


# ---- tracebacks and silent misreadings: predict_time's arguments -------------------------------------------
@pytest.fixture
def no_prediction(monkeypatch):
    """predict_time's checks, with the model itself replaced: -> the Problems it was asked about.
    A bad argument must be refused before the model (a compile) is reached."""
    asked = []

    def model(prob, gpu, kernel):
        asked.append((prob, gpu, kernel))
        return "predicted"

    monkeypatch.setattr(fa_sim.timing, "predict", model)
    return asked


@pytest.mark.parametrize("args, kwargs, fragment", [
    ((1, 16, 1024), dict(causal="no"), "causal must be True or False, got 'no'"),
    ((1, 16, 1024), dict(causal=1), "causal must be True or False"),
    ((1.5, 16, 1024), {}, "batch must be an integer >= 1, got float 1.5"),
    ((True, 16, 1024), {}, "batch must be an integer >= 1, got bool True"),
    ((1, np.bool_(True), 1024), {}, "heads must be an integer >= 1"),
    ((1, 16, "1024"), {}, "seqlen_q must be an integer >= 1, got str '1024'"),
    ((1, 16, 0), {}, "seqlen_q must be an integer >= 1, got int 0"),
    ((1, 16, 1024, 0.5), {}, "seqlen_k must be an integer >= 1"),
    ((1, 16, 1024), dict(head_dim=80), "head_dim 80 is not supported; choose one of (32, 64, 96, 128, 160, 192, 256)"),
    ((1, 16, 1024), dict(head_dim=64.0), "head_dim must be an integer >= 1"),
    ((1, 16, 1024), dict(gpu="H100"), "gpu must be one of a100, h200 (or a fa_sim.timing.GpuModel), got 'H100'"),
    ((1, 16, 1024), dict(gpu=3), "(or a fa_sim.timing.GpuModel), got 3"),
    ((1, 16, 1024), dict(config="auto"), "config='auto' (a GPU's fastest measured config, fa_hw.tuned) needs the GPU"),
    ((1, 16, 1024), dict(config="fastest"), "a KernelConfig or a config tag such as 'm128n64d64w4-swizzled-s2', got str 'fastest'"),
    ((1, 16, 1024), dict(config=64), "config must be None (the seed config), a KernelConfig or a config tag"),
    ((1, 16, 1024), dict(head_dim=64, config=KernelConfig(head_dim=128)), "head_dim 64 disagrees with config.head_dim 128"),
    ((1, 16, 1024), dict(kernel=3), "kernel= takes the path of a .cu file"),
    ((1, 16, 1024), dict(kernel="/no/such/variant.cu"), "kernel= /no/such/variant.cu: no such file"),
    ((70_000, 1, 64), {}, "batch * heads = 70,000 * 1 = 70,000 is over 65,535, the grid's y limit"),
    ((1, 1, 2**31), {}, "seqlen_q = 2,147,483,648 is over 2,147,483,647"),
])
def test_predict_time_checks_every_argument_before_the_model(no_prediction, args, kwargs, fragment):
    assert fragment in _message(fa_sim.predict_time, *args, **kwargs)
    assert no_prediction == []


def test_predict_time_takes_tags_numpy_integers_and_the_config_head_dim(no_prediction):
    tag = "m128n64d128w4-swizzled-s2-qr"
    fa_sim.predict_time(np.int64(2), np.int32(3), np.uint16(256), config=tag, causal=np.bool_(True))
    fa_sim.predict_time(1, 1, 128, config=KernelConfig(head_dim=32))
    fa_sim.predict_time(1, 1, 128, head_dim=128)
    (tagged, gpu, kernel), (given, _, _), (plain, _, _) = no_prediction
    assert tagged.config == KernelConfig.from_tag(tag) and (tagged.batch, tagged.heads, tagged.seqlen_q) == (2, 3, 256)
    assert type(tagged.batch) is int and tagged.causal is True and gpu.name == "h200" and kernel is None
    assert given.head_dim == 32 and plain.config == KernelConfig(head_dim=128)


# ---- simulate: tensors that require grad, or have no values --------------------------------------------------
class FakeTensor:
    """What validate sees of a torch tensor, without torch: reading values of one that requires grad
    fails as torch's .numpy() does; detach() gives one that does not."""

    def __init__(self, values: np.ndarray, requires_grad: bool = False, device: str = "cpu") -> None:
        self.values, self.requires_grad = values, requires_grad
        self.device = types.SimpleNamespace(type=device)
        self.shape = values.shape

    def detach(self) -> "FakeTensor":
        return FakeTensor(self.values, False, self.device.type)

    def __array__(self, dtype=None, copy=None):
        if self.requires_grad:
            raise RuntimeError("Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead.")
        if self.device.type == "meta":
            raise NotImplementedError("Cannot copy out of meta tensor; no data!")
        return self.values if dtype is None else self.values.astype(dtype)


def test_a_tensor_that_requires_grad_is_read_through_detach():
    want = fa_sim.simulate(Q, Q, Q)
    got = fa_sim.simulate(FakeTensor(Q, requires_grad=True), Q, FakeTensor(Q, requires_grad=True))
    assert np.array_equal(got.o, want.o) and np.array_equal(got.lse, want.lse)


def test_a_meta_tensor_is_refused_by_both_backends():
    import fa_hw

    meta = FakeTensor(Q, device="meta")
    message = _message(fa_sim.simulate, Q, meta, Q)
    assert message.startswith("k is on the meta device: it has a shape but no values")
    assert _message(fa_hw.forward, Q, meta, Q) == message


def test_real_torch_tensors_that_require_grad_or_live_on_meta():
    torch = pytest.importorskip("torch")
    x = torch.from_numpy(Q.astype(np.float32)).requires_grad_(True)
    assert np.array_equal(fa_sim.simulate(x, x, x).o, fa_sim.simulate(Q, Q, Q).o)
    meta = torch.empty(Q.shape, dtype=torch.float16, device="meta")
    assert "q is on the meta device" in _message(fa_sim.simulate, meta, x, x)


# ---- fa_hw.forward: the Python-side arguments, before any device call ---------------------------------------
class _Reached(Exception):
    pass


@pytest.fixture
def no_device(monkeypatch):
    """fa_hw.forward up to its first device call (placing the inputs), which raises _Reached."""
    forward = importlib.import_module("fa_hw.forward")  # the module: fa_hw.forward is also the function

    def place(*args, **kwargs):
        raise _Reached

    monkeypatch.setattr(forward, "to_device", place)
    return forward.forward


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(causal="no"), "causal must be True or False, got 'no'"),
    (dict(scale="0.1"), "scale must be a positive finite number"),
    (dict(config="m64n64d64w4-swizzled"), "inputs have head_dim 32 but config.head_dim is 64"),
    (dict(config="fastest"), "a KernelConfig or a config tag such as 'm128n64d64w4-swizzled-s2', got str 'fastest'"),
    (dict(config=3), "config must be None (the seed config), a KernelConfig or a config tag"),
    (dict(checkpoint_ctas=[0.0]), "checkpoint_ctas must be distinct integer CTA ids in 0..0, got float 0.0"),
    (dict(checkpoint_ctas=[True]), "got bool True"),
    (dict(checkpoint_ctas=0), "checkpoint_ctas must be a sequence of distinct integer CTA ids in 0..0, got int 0"),
    (dict(checkpoint_ctas="0"), "must be a sequence"),
    (dict(checkpoint_ctas=[0, 0]), "got [0, 0]"), (dict(checkpoint_ctas=[]), "got []"),
    (dict(checkpoint_ctas=range(1, 40)), "got [1, 2, 3, 4, 5, 6, 7, 8, ... 31 more]"),
    (dict(kernel=3), "kernel= takes the path of a .cu file"),
])
def test_forward_checks_its_arguments_before_any_device_call(no_device, kwargs, fragment):
    assert fragment in _message(no_device, Q, Q, Q, **kwargs)


def test_forward_takes_a_tag_and_numpy_cta_ids(no_device):
    with pytest.raises(_Reached):  # every check passed
        no_device(Q, Q, Q, config="m64n64d32w4-plain", checkpoint_ctas=np.array([0]))


# ---- fa_sim.ptx.launch: a scalar argument is never wrapped, truncated or reinterpreted ----------------------
KERNEL = 'extern "C" __global__ void k(float* out, int n, float s) { int i = threadIdx.x; if (i < n) out[i] = s * i; }'


@pytest.mark.parametrize("args, fragment", [
    ((2**40, 2.0), "argument 1 (int 1099511627776) does not fit parameter k_param_1 (.u32): 32-bit integers run"),
    ((-2**31 - 1, 2.0), "32-bit integers run from -2,147,483,648 (signed) to 4,294,967,295 (unsigned)"),
    ((1.5, 2.0), "a float for an integer parameter; pass an int"),
    ((np.float32(3), 2.0), "its numpy type is a float of the parameter's size; pass np.uint32"),
    ((32, np.int32(2)), "its numpy type is not an integer of the parameter's size; pass np.float32"),
    ((np.int64(32), 2.0), "argument 1 has 8 bytes, parameter k_param_1 (.u32) takes 4"),
    ((32, 1e300), ".f32 holds it only as inf"), ((32, 2**200), ".f32 holds it only as inf"),
    ((32, 2**24 + 1), ".f32 holds it only rounded (to 16,777,216)"), ((32, "2"), "pass a number"),
])
def test_launch_refuses_scalars_the_parameter_does_not_hold(args, fragment):
    pytest.importorskip("cuda.bindings")
    from fa_sim.ptx import launch

    assert fragment in _message(launch, KERNEL, 1, 32, args=[np.zeros(32, np.float32), *args])


def test_launch_takes_exact_scalars_and_refuses_object_buffers_and_odd_names():
    pytest.importorskip("cuda.bindings")
    from fa_sim.ptx import launch

    out = np.zeros(32, np.float32)
    launch(KERNEL, 1, 32, args=[out, np.uint32(32), 2**24])  # an int a float holds exactly
    assert out[3] == 3 * 2**24
    assert "an array of dtype object" in _message(launch, KERNEL, 1, 32, args=[out.astype(object), 32, 2.0])
    assert "kernel must be None (the module's one kernel) or a kernel's name (str), got int 3" in _message(
        launch, KERNEL, 1, 32, args=[out, 32, 2.0], kernel=3)


# ---- late: numpy integers in KernelConfig, messages that fit a few lines -------------------------------------
def test_kernel_config_converts_numpy_integers_and_refuses_bools():
    cfg = KernelConfig(block_m=np.int64(128), head_dim=np.int32(32), kv_stages=np.uint8(2), poly_exp=np.int16(1))
    assert cfg == KernelConfig(block_m=128, head_dim=32, kv_stages=2, poly_exp=1) and type(cfg.block_m) is int
    assert hash(cfg) == hash(KernelConfig(block_m=128, head_dim=32, kv_stages=2, poly_exp=1))
    macros = KernelBuild(cfg, False, "sm_80").macros()
    assert all(type(v) is int for v in macros.values()) and "-DFA_BLOCK_M=128" in nvrtc_options(macros=macros)
    assert "-DX=3" in nvrtc_options(macros={"X": np.int64(3)})
    for bad in (True, np.bool_(True)):
        assert f"block_m={bad!r} is not one of (64, 128, 256)" in _message(KernelConfig, block_m=bad)


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(head_dim=80), "unsupported KernelConfig(head_dim=80): head_dim=80 is not one of (32, 64, 96, 128, 160, 192, 256)"),
    (dict(block_m=256), "unsupported KernelConfig(block_m=256): block_m=256 needs n_warps 8"),
    (dict(pingpong=True), "pingpong needs kv_stages >= 2, n_warps 8"),
    (dict(head_dim=256, block_m=64, block_n=128, kv_stages=3), "needs 425984 bytes of shared memory, over 232448"),
])
def test_kernel_config_errors_name_the_fields_given_in_a_short_line(kwargs, fragment):
    message = _message(KernelConfig, **kwargs)
    assert fragment in message and len(message) < 200


# ---- late: empty inputs and grids past the GPU's limits, in the user's terms ---------------------------------
@pytest.mark.parametrize("q, k, fragment", [
    (Q[:, :, :0], Q, "q has 0 rows (an empty sequence) (shape (1, 1, 0, 32)); at least 1 is needed"),
    (Q, Q[:, :, :0], "k has 0 rows (an empty sequence)"),
    (Q[:0], Q[:0], "q has batch 0 (an empty batch)"), (Q[:, :0], Q[:, :0], "q has 0 heads"),
])
def test_empty_inputs_are_named_in_the_users_terms(q, k, fragment):
    message = _message(fa_sim.simulate, q, k, k)
    assert fragment in message and "Problem." not in message
    assert validate.empty_message("q", (1, 1, 0, 32)) in _message(validate.make_problem, (1, 1, 0, 32), Q.shape, Q.shape,
                                                                   False, None, None)


def test_a_grid_past_the_launch_limits_is_refused_before_any_work(capsys):
    wide = np.broadcast_to(Q[:, :, :1], (70_000, 1, 1, 32))  # 4 MB of views, never copied
    assert "batch * heads = 70,000 * 1 = 70,000 is over 65,535" in _message(fa_sim.simulate, wide, wide, wide)
    assert main(["time", "--batch", "2147483647", "--heads", "2147483647", "--seqlen", "2147483647"]) == 2
    err = capsys.readouterr().err
    assert "--batch 2147483647 --heads 2147483647 --seqlen 2147483647: batch * heads = " in err
    assert "Maximum allowed size" not in err and len(err.strip().splitlines()) == 1


# ---- late: a patch that does not apply shows where the lines differ -------------------------------------------
def test_a_patch_mismatch_shows_the_differing_part_of_long_lines():
    seed = SEED.read_text()
    lines = seed.splitlines()
    n = next(i for i, line in enumerate(lines) if len(line) > 100)  # a line longer than the quoted window
    stale = lines[n][:-1] + ("X" if lines[n][-1] != "X" else "Y")
    patch = f"--- a/fa2_fwd.cu\n+++ b/fa2_fwd.cu\n@@ -{n + 1},1 +{n + 1},1 @@\n-{stale}\n+x\n"
    with pytest.raises(PatchError) as info:
        apply_patch(seed, patch, name="stale.patch", target="fa2_fwd.cu")
    message = str(info.value)
    have, want = message.split(" is ", 1)[1].split(", the patch expects ")
    assert have != want and f"(they first differ at column {len(lines[n])})" in message
    assert repr(lines[n][-20:])[1:-1] in have and repr(stale[-20:])[1:-1] in want


# ---- late: --kernel errors name the option and the user's file -------------------------------------------------
@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    d = tmp_path_factory.mktemp("variants")
    source = SEED.read_text()
    lines = source.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith("fa2_fwd_kernel("))
    brace = next(i for i in range(start, len(lines)) if lines[i].rstrip().endswith("{"))
    macros = " ".join(sorted(set(re.findall(r"FA_[A-Z_0-9]+", source))))
    (d / "empty.cu").write_text("".join(lines[:brace + 1]) + f"  // computes nothing; mentions {macros}\n}}\n")
    (d / "broken.cu").write_text(source + "\nthis is not C++;\n")
    return d


def test_fa_time_names_the_kernel_file_in_model_errors(variants, monkeypatch, capsys):
    """The model's own words about a variant it cannot follow (its SASS structure, a deadlock of the
    SM model) name neither --kernel nor the file: the command adds both."""
    from fa_sim.commands import time as command

    empty = variants / "empty.cu"
    errors = (ValueError("expected one loop (the K/V loop), found back edges []"), RuntimeError("no end after 1e9 cycles"))
    for error in errors:
        def model(*args, error=error):
            raise error

        monkeypatch.setattr(command, "predict", model)
        assert main(["time", "--kernel", str(empty), "--seqlen", "128", "--heads", "1"]) == 2
        err = capsys.readouterr().err
        assert f"--kernel {empty}: the timing model cannot time this variant: {error}" in err

    def refuse(*args):
        raise ValueError("m64n64d64w4-swizzled: a limit of the model")

    monkeypatch.setattr(command, "predict", refuse)
    assert main(["time", "--seqlen", "128", "--heads", "1"]) == 2  # no --kernel: the model's words as they are
    assert "--kernel" not in capsys.readouterr().err


def test_fa_time_names_the_kernel_file_in_compile_errors(variants, capsys):
    pytest.importorskip("cuda.bindings")
    broken = variants / "broken.cu"
    assert main(["time", "--kernel", str(broken), "--seqlen", "128", "--heads", "1"]) == 2
    err = capsys.readouterr().err
    assert f"NVRTC could not compile {broken} (config m64n64d64w4-swizzled, sm_90): {broken}(" in err
    assert "fa2_fwd.cu(" not in err and len(err.strip().splitlines()) == 1


def test_fa_banks_refuses_a_kernel_that_computes_nothing(variants, capsys):
    pytest.importorskip("cuda.bindings")
    empty = variants / "empty.cu"
    assert main(["banks", "--kernel", str(empty), "--seqlen", "64", "--heads", "1"]) == 2
    assert (f"--kernel {empty} (m64n64d64w4-swizzled) stored no output element: no st.global ran in the whole grid"
            in capsys.readouterr().err)


# ---- silently wrong: the config tag `fa banks` prints is the config that ran ------------------------------------
def _option_values() -> list[tuple[str, list[str]]]:
    """Each config option at a value away from its default (with what it needs), as argv."""
    from fa_sim.commands.common import config_options

    needs = {"defer_pv": ["--kv-stages", "2"], "pingpong": ["--kv-stages", "2", "--warps", "8", "--block-m", "128"],
             "n_warps": ["--block-m", "128"]}
    out = []
    for opt in config_options():
        if opt.hint is bool:
            argv = [opt.option]
        else:
            value = next(c for c in opt.choices if c != opt.default and not (opt.dest == "block_m" and c == 256))
            argv = [opt.option, str(value)]
        out.append((opt.dest, argv + needs.get(opt.dest, [])))
    return out


@pytest.mark.parametrize("compare", [False, True])
@pytest.mark.parametrize("dest, argv", _option_values(), ids=[d for d, _ in _option_values()])
def test_fa_banks_header_names_the_config_of_every_option(dest, argv, compare, monkeypatch, capsys):
    from fa_sim.cli import build_parser
    from fa_sim.commands import banks
    from fa_sim.commands.common import config_from_args
    from fa_sim.observers.banks import BankCounter

    ran = []

    def count(config, inputs, causal, front, feats, cu_seqlens, split):  # the run itself is fa sim's business:
        assert not any(feats.values())  # no --heads-k, --window, --softcap: the plain kernel's features
        assert cu_seqlens is None and not split  # a dense batch, no split-KV
        ran.append(config)  # record what it was asked
        return BankCounter().report(), None

    monkeypatch.setattr(banks, "_report", count)
    monkeypatch.setattr(banks, "check_engine", lambda *a, **k: None)
    full = ["banks", "--seqlen", "64", "--heads", "1", *argv, *(["--compare"] if compare else [])]
    if dest == "smem" and compare:  # --compare sets every layout side by side: --smem is refused with it
        assert main(full) == 2 and "--smem does not apply with --compare" in capsys.readouterr().err
        return
    assert main(full) == 0
    header = capsys.readouterr().out.splitlines()[0]
    tag = header.split(", config ")[1].split(", ")[0]
    config = config_from_args(build_parser().parse_args(full))
    assert config != KernelConfig() and [c.smem for c in ran] == (list(SmemLayout) if compare else [config.smem])
    assert all(replace(c, smem=config.smem) == config for c in ran)  # the runs are of the config the options name
    assert tag == (config.tag.replace("-swizzled", "-{swizzled,plain,padded}", 1) if compare else config.tag)


def test_fa_banks_header_end_to_end(capsys):
    pytest.importorskip("cuda.bindings")
    assert main(["banks", "--kv-stages", "2", "--seqlen", "64", "--heads", "1"]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith("config m64n64d64w4-swizzled-s2, PTX of fa2_fwd.cu")


# ---- unclear: messages fit a few lines however long the list or value they quote --------------------------------
@pytest.mark.parametrize("argv, fragment", [
    (["sim", "--kernel", "{old}"], "old.cu does not use FA_BLOCK_M=64, FA_BLOCK_N=64, FA_HEAD_DIM=64, FA_N_WARPS=4, "
                                   "FA_ROW_PITCH=64, FA_SWZ_B=3, ... 7 more, which this config needs"),
    (["compare", "--seqlen", "64", "--ctas", ",".join(map(str, range(101)))],
     "--ctas must be distinct CTA ids in 0..0; outside the grid: 1, 2, 3, 4, 5, 6, ... 94 more"),
    (["compare", "--seqlen", "64", "--ctas", "0,0"], "--ctas must be distinct CTA ids in 0..0; repeated: 0"),
    (["sim", "--config", "m" * 300], f"--config {'m' * 60!r}... (300 characters): {'m' * 60!r}... (300 characters) is "
                                     "not a config tag"),
    (["trace", "--ops", ",".join(["FOO"] * 40)], "unknown instruction class(es) FOO, FOO, FOO, FOO, FOO, FOO, ... 34 more"),
    (["sweep", "--shape", ",".join(["1"] * 200)], "(399 characters): expected B,H,Nq or B,H,Nq,Nk"),
    (["sim", "--workers", "x" * 200], "--workers takes auto or an integer >= 1, got 'xxxx"),
])
def test_long_lists_and_values_are_cut(argv, fragment, tmp_path, capsys):
    (tmp_path / "old.cu").write_text('extern "C" __global__ void fa2_fwd_kernel() {}\n')  # no FA_* macro
    assert main([a.replace("{old}", str(tmp_path / "old.cu")) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and len(err.splitlines()) == 1 and len(err) < 300


@pytest.mark.parametrize("config, fragment", [
    ("m64n64d64w4-swizzled-zz", "config: config tag 'm64n64d64w4-swizzled-zz': unknown suffix 'zz'"),
    ("m64n64d64w4-swizzled-s2-s3", "suffix 's3' contradicts 's2' (both set kv_stages)"),
    ("seed", "config must be None (the seed config), a KernelConfig or a config tag"),
])
def test_simulate_names_what_is_wrong_with_a_tag(config, fragment):
    assert fragment in _message(fa_sim.simulate, Q, Q, Q, config=config)


# ---- silently wrong: Problem and Mutation, public values, never guess ------------------------------------------
@pytest.mark.parametrize("kwargs, fragment", [
    (dict(causal="no"), "Problem.causal must be True or False, got 'no'"),
    (dict(causal=None), "Problem.causal must be True or False"),
    (dict(scale="0.1"), "Problem.scale must be a positive finite number, got '0.1'"),
    (dict(scale=-1.0), "Problem.scale must be a positive finite number"),
    (dict(scale=True), "Problem.scale must be a positive finite number"),
])
def test_problem_refuses_what_bool_and_float_would_misread(kwargs, fragment):
    args = dict(batch=1, heads=1, seqlen_q=8, seqlen_k=8, causal=False, scale=1.0, config=KernelConfig())
    assert fragment in _message(fa_sim.Problem, **{**args, **kwargs})


def test_mutation_takes_sites_or_their_names_only():
    from fa_sim.kernels.labels import Site

    assert fa_sim.Mutation(drop="WAIT_QK") == fa_sim.Mutation(drop=frozenset({Site.WAIT_QK}))  # not its letters
    assert fa_sim.Mutation(drop=["bar_qk", Site.WAIT_PV]).drop == {Site.BAR_QK, Site.WAIT_PV}
    assert fa_sim.Mutation(late_wait=Site.WAIT_PV).late_wait == {Site.WAIT_PV}
    for bad in ([1], "x", 3):
        assert "Mutation.drop takes Sites or their names (WAIT_QK, BAR_QK" in _message(fa_sim.Mutation, drop=bad)


@pytest.mark.parametrize("args, fragment", [
    ((1.5, 1, 16, 16, 32), "batch must be an integer >= 1, got float 1.5"),
    ((1, 1, 0, 16, 32), "seqlen_q must be an integer >= 1, got int 0"),
    ((1, 1, 16, 16, 80), "head_dim 80 is not supported"), ((True, 1, 16, 16, 32), "got bool True"),
    ((1, 1, 16, 16, 32, -1), "seed must be an integer >= 0, got int -1"),
])
def test_random_inputs_and_max_scale_check_their_arguments(args, fragment):
    from fa_sim.reference import random_inputs

    assert fragment in _message(random_inputs, *args)
    assert [x.shape for x in random_inputs(np.int64(1), 2, 3, 4, 32)] == [(1, 2, 3, 32), (1, 2, 4, 32), (1, 2, 4, 32)]
    assert "head_dim 80 is not supported" in _message(validate.max_scale, 80)
    assert "head_dim must be an integer >= 1, got bool True" in _message(validate.max_scale, True)


@pytest.mark.parametrize("args, kwargs, fragment", [
    (("h200",), {}, "prob must be a fa_sim.Problem (or use fa_sim.predict_time), got str"),
    ((fa_sim.Problem(1, 1, 128, 128, False, 1.0, KernelConfig()), "b200"), {}, "gpu must be one of a100, h200"),
    ((fa_sim.Problem(1, 1, 128, 128, False, 1.0, KernelConfig()),), dict(exact="yes"), "exact must be True or False"),
    ((fa_sim.Problem(1, 1, 128, 128, False, 1.0, KernelConfig()),), dict(kernel=3), "kernel= takes the path"),
    ((fa_sim.Problem(70_000, 1, 64, 64, False, 1.0, KernelConfig()),), {}, "is over 65,535, the grid's y limit"),
])
def test_timing_predict_checks_its_arguments_before_compiling(args, kwargs, fragment, monkeypatch):
    from fa_sim.timing import predict as module  # the function; its module is below

    model = importlib.import_module("fa_sim.timing.predict")
    monkeypatch.setattr(model, "kernel_model", lambda *a, **k: pytest.fail("compiled before the checks"))
    assert fragment in _message(module, *args, **kwargs)
    if "exact" not in kwargs:  # issue_timeline (fa time --perfetto) has no exact
        assert fragment in _message(model.issue_timeline, *args, **kwargs)
