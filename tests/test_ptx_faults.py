"""The PTX engine's faults where a kernel is wrong, and its refusals where a launch is: an index past
a global buffer (a KernelFault naming the PTX and source line, never a neighbour silently
overwritten), a kernel that never ends (its step budget, progress on stderr, Ctrl-C), and
fa_sim.ptx.launch's arguments checked against SM80's limits (one ValueError line each)."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("cuda.bindings.nvrtc", reason="the PTX engine compiles with NVRTC (the hw extra)")

import fa_sim  # noqa: E402
from fa_sim.errors import KernelFault  # noqa: E402
from fa_sim.memory import GUARD, GlobalMemory  # noqa: E402
from fa_sim.ptx import budget, launch  # noqa: E402
from fa_sim.contract import SEED_PATH  # noqa: E402
from interrupt import sigint_default  # noqa: E402  tests/interrupt.py

ROOT = Path(__file__).resolve().parent.parent

COPY = r"""extern "C" __global__ void copy(const float* a, float* b, float* c, int n) {
  int i = threadIdx.x;
  if (i < n) b[i] = a[i];
}"""


# -- global memory bounds --------------------------------------------------------------------------
def test_buffers_are_apart_so_an_index_past_one_never_lands_in_the_next():
    mem = GlobalMemory()
    a, b = mem.alloc("a", np.zeros(64, np.float32)), mem.alloc("b", np.zeros(10**6, np.float32))
    c = mem.alloc("c", np.zeros(3, np.uint8))
    assert b.base - a.end >= GUARD and c.base - b.end >= GUARD
    assert all(x.base % 256 == 0 for x in (a, b, c))
    with pytest.raises(KernelFault, match=r"'a'.*of 256 bytes.*4 bytes past its end"):
        mem.scatter(np.array([a.base + 256]), np.zeros((1, 4), np.uint8), np.ones(1, bool))
    with pytest.raises(KernelFault, match=r"'b'.*8 bytes before its start"):
        mem.gather(np.array([b.base - 8]), 4, np.ones(1, bool))


def test_a_copy_past_the_end_of_its_buffers_is_a_fault_and_leaves_the_third_alone():
    """The audit's case: 128 floats copied between 64-element buffers used to read b as a[64:] and
    zero c (stored as b[64:]), exit 0."""
    a, b, c = np.arange(64, dtype=np.float32), np.zeros(64, np.float32), np.full(64, 7, np.float32)
    with pytest.raises(KernelFault, match=r"illegal global load: 4 bytes .*'arg0'.*past its end.*kernel.cu:3\)"):
        launch(COPY, grid=1, block=128, args=[a, b, c, np.int32(128)])
    assert (c == 7).all()
    launch(COPY, grid=1, block=128, args=[a, b, c, np.int32(64)])  # in bounds: the same kernel is fine
    assert np.array_equal(b, a) and (c == 7).all()


def test_a_store_before_the_start_of_a_buffer_is_a_fault():
    src = r"""extern "C" __global__ void k(const int* a, int* o) { o[(int)threadIdx.x - 1] = a[threadIdx.x]; }"""
    with pytest.raises(KernelFault, match=r"illegal global store.*'arg1'.*4 bytes before its start.*kernel.cu:1\)"):
        launch(src, grid=1, block=32, args=[np.zeros(32, np.int32), np.zeros(32, np.int32)])


def _variant(tmp_path, name, old, new):
    text = SEED_PATH.read_text()
    assert text.count(old) == 1, old
    path = tmp_path / name
    path.write_text(text.replace(old, new))
    return path


def _inputs(nq, d=64):
    rng = np.random.default_rng(0)
    return tuple(rng.standard_normal((1, 2, nq, d)).astype(np.float16) for _ in range(3))


def test_a_kernel_that_stores_one_row_past_o_is_a_fault_at_its_store(tmp_path):
    """`<=` for `<` in the O store: the last head's extra row lies past o (it used to be written
    into lse, exit 0); Nq = 70 is not a multiple of the tile, so the tail row exists."""
    path = _variant(tmp_path, "o_past.cu", "if (row0 + r < seqlen_q) stg128(", "if (row0 + r <= seqlen_q) stg128(")
    with pytest.raises(KernelFault, match=r"illegal global store: 16 bytes .*'o'.*16 bytes past its end.*"
                                          r"st\.global.*PTX line \d+ \(.*o_past\.cu:\d+\)"):
        fa_sim.simulate(*_inputs(70), engine="ptx", kernel=path)


def test_a_kernel_that_reads_past_q_is_a_fault_at_its_copy(tmp_path):
    path = _variant(tmp_path, "q_past.cu", "copy_tile<kBlockM>(sQ, gQ, row0, seqlen_q);",
                    "copy_tile<kBlockM>(sQ, gQ + kHeadDim, row0, seqlen_q);")
    with pytest.raises(KernelFault, match=r"illegal global cp\.async source: 16 bytes .*'q'.*past its end.*"
                                          r"cp\.async.*PTX line \d+ \(.*q_past\.cu:\d+\)"):
        fa_sim.simulate(*_inputs(128), engine="ptx", kernel=path)


# -- the step budget -------------------------------------------------------------------------------
SPIN = r"""extern "C" __global__ void spin(int* o, int n) {
  while (n > 0) { }
  o[threadIdx.x] = 1;
}"""

LOOP = r"""extern "C" __global__ void loop(int* o, int n) {
  int acc = 0;
  for (int i = 0; i < n; ++i) acc += i ^ (int)threadIdx.x;
  o[threadIdx.x] = acc;
}"""


def test_a_kernel_that_never_ends_is_a_fault_naming_its_loop():
    t = time.monotonic()
    with pytest.raises(KernelFault, match=r"step budget of [\d,]+ instruction issues \(4 x \d+ instructions x 1025 "
                                          r"trips.*\) in CTA 0; its threads were at `bra\.uni .*` at PTX line \d+ "
                                          r"\(.*kernel\.cu:2\).*max_steps=N.*FLASHSIM_MAX_STEPS"):
        launch(SPIN, grid=1, block=32, args=[np.zeros(32, np.int32), np.int32(1)])
    assert time.monotonic() - t < 60


def test_the_budget_follows_the_arguments_and_can_be_set(monkeypatch):
    """A loop of n = 5,000 trips is within the default budget (the largest integer argument); a
    budget set below what it needs stops it, by keyword or by FLASHSIM_MAX_STEPS."""
    n = 5000
    o = np.zeros(32, np.int32)
    launch(LOOP, grid=1, block=32, args=[o, np.int32(n)])
    want = [sum(i ^ t for i in range(n)) for t in range(32)]
    np.testing.assert_array_equal(o, np.array(want, np.int64).astype(np.int32))
    with pytest.raises(KernelFault, match=r"step budget of 1,000 instruction issues \(max_steps\) in CTA 0"):
        launch(LOOP, grid=1, block=32, args=[o, np.int32(n)], max_steps=1000)
    monkeypatch.setenv(budget.ENV, "2000")
    with pytest.raises(KernelFault, match=r"step budget of 2,000 instruction issues \(FLASHSIM_MAX_STEPS\)"):
        launch(LOOP, grid=1, block=32, args=[o, np.int32(n)])
    monkeypatch.setenv(budget.ENV, "lots")
    with pytest.raises(ValueError, match=r"^the environment variable FLASHSIM_MAX_STEPS must be a positive whole"):
        launch(LOOP, grid=1, block=32, args=[o, np.int32(n)])


def _spinning_fa2(tmp_path) -> Path:
    return _variant(tmp_path, "spin.cu", "  // phase: setup\n", "  // phase: setup\n  while (seqlen_q > 0) {}\n")


def test_the_attention_kernel_that_never_ends_is_a_fault_from_simulate_and_fa_sim(tmp_path, capsys):
    """The audit's `while (seqlen_q > 0) {}`: the budget of the attention kernel is its K/V rounds."""
    from fa_sim.cli import main

    path = _spinning_fa2(tmp_path)
    with pytest.raises(KernelFault, match=r"step budget .* \(4 x \d+ instructions x 3 trips.*\) in CTAs 0\.\.3; "
                                          r"its threads were at `bra\.uni .*` at PTX line \d+ \(.*spin\.cu:\d+\)"):
        fa_sim.simulate(*_inputs(128), engine="ptx", kernel=path)
    assert main(["sim", "--kernel", str(path), "--seqlen", "64"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fa sim: kernel fault: the kernel ran past its step budget")


def _env(**extra):
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra}


def _interrupt_after(proc, marker: bytes, timeout=120) -> bytes:
    """Read stderr until `marker` appears, then SIGINT; -> everything stderr said."""
    seen = b""
    deadline = time.monotonic() + timeout
    while marker not in seen and time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen += line
    assert marker in seen, seen.decode()
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
    return seen + proc.stderr.read()


def test_a_long_spin_reports_progress_and_stops_on_ctrl_c(tmp_path):
    code = (f"import numpy as np, fa_sim.ptx as P, fa_sim.ptx.budget as B\n"
            f"B.PROGRESS_SECONDS = B.PROGRESS_EVERY = 0.2\n"
            f"P.launch({SPIN!r}, grid=1, block=32, args=[np.zeros(32, np.int32), np.int32(1)], max_steps=10**15)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, env=_env(), stderr=subprocess.PIPE,
                            preexec_fn=sigint_default)
    err = _interrupt_after(proc, b"still running")
    assert proc.returncode != 0 and b"KeyboardInterrupt" in err
    assert re.search(rb"fa_sim.ptx: simulating CTA 0 on the PTX engine, still running after [01] s \(working, not hung\): "
                     rb"[\d,]+ instruction issues so far \(a kernel that never ends is stopped at "
                     rb"1,000,000,000,000,000: max_steps\); threads at `bra.uni", err), err


def test_fa_sim_on_a_spinning_kernel_stops_on_ctrl_c(tmp_path):
    path = _spinning_fa2(tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", "import fa_sim.ptx.budget as B, sys\n"
                             "B.PROGRESS_SECONDS = 0.2\nfrom fa_sim.cli import main\nsys.exit(main())",
                             "sim", "--kernel", str(path), "--seqlen", "64"], cwd=ROOT,
                            env=_env(**{budget.ENV: str(10**15)}), stderr=subprocess.PIPE, stdout=subprocess.PIPE,
                            preexec_fn=sigint_default)
    err = _interrupt_after(proc, b"still running").decode()
    assert proc.returncode == 130, err
    assert err.splitlines()[-1] == "fa sim: interrupted" and "Traceback" not in err


# -- launch's arguments ----------------------------------------------------------------------------
OK = {"grid": (1,), "block": (32,), "smem_bytes": 0, "args": [np.zeros(32, np.int32), np.int32(1)]}
REFUSED = {
    "smem_bytes=300000": ({"smem_bytes": 300_000}, r"smem_bytes must be a whole number of bytes 0 \.\. 232,448 .*300000"),
    "smem_bytes=10**12": ({"smem_bytes": 10**12}, r"smem_bytes must be .*sm_90's 227 KB"),
    "smem_bytes=-100": ({"smem_bytes": -100}, r"smem_bytes must be .*got -100"),
    "smem_bytes='abc'": ({"smem_bytes": "abc"}, r"smem_bytes must be .*got 'abc'"),
    "smem_bytes=1.5": ({"smem_bytes": 1.5}, r"smem_bytes must be .*got 1\.5"),
    "grid=(1, 70000)": ({"grid": (1, 70000)}, r"grid \(1, 70000\) is over SM80's limits \(y = 70,000 > 65,535\)"),
    "grid=(2**31,)": ({"grid": (2**31,)}, r"grid .* over SM80's limits \(x = 2,147,483,648 > 2,147,483,647\)"),
    "grid=1.5": ({"grid": 1.5}, r"grid must be 1 to 3 positive integers .*got 1\.5"),
    "grid=(0,)": ({"grid": (0,)}, r"grid must be 1 to 3 positive integers"),
    "grid=(1,1,1,1)": ({"grid": (1, 1, 1, 1)}, r"grid must be 1 to 3 positive integers"),
    "grid='8'": ({"grid": "8"}, r"grid must be 1 to 3 positive integers .*got '8'"),
    "block=(2048,)": ({"block": (2048,)}, r"block \(2048,\) is over SM80's limits \(x = 2,048 > 1,024\)"),
    "block=(1,1,128)": ({"block": (1, 1, 128)}, r"block .* over SM80's limits \(z = 128 > 64\)"),
    "block=(64,32)": ({"block": (64, 32)}, r"block \(64, 32\) has 2,048 threads; SM80 allows at most 1024"),
    "wave_ctas=0": ({"wave_ctas": 0}, r"wave_ctas must be a positive integer .*got 0"),
    "wave_ctas=2.0": ({"wave_ctas": 2.0}, r"wave_ctas must be a positive integer .*got 2\.0"),
    "observers=None": ({"observers": None}, r"observers must be an observer or a list of observers .*NoneType"),
    "observers=[object()]": ({"observers": [object()]}, r"observers must be .*got object"),
    "args=None": ({"args": None}, r"args must be a list of the kernel's arguments .*NoneType"),
    "macros=None": ({"macros": None}, r"macros must be a mapping"),
    "max_steps=0": ({"max_steps": 0}, r"max_steps must be a positive whole number .*got 0"),
    "max_steps='x'": ({"max_steps": "x"}, r"max_steps must be a positive whole number .*got 'x'"),
    "mma_model='nope'": ({"mma_model": "nope"}, r"unknown tensor-core model 'nope'"),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_a_bad_launch_argument_is_one_line_naming_it(name):
    change, message = REFUSED[name]
    with pytest.raises(ValueError, match=message) as err:
        launch(SPIN, **{**OK, **change})
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("source", ["no_such_kernel.cu", Path("no_such_dir/kernel.ptx"), "kernels/missing"])
def test_a_missing_path_is_not_taken_for_cuda_source(source):
    named = r"cannot read no_such_dir/kernel\.ptx" if isinstance(source, Path) else f"source_or_ptx '{source}'"
    with pytest.raises(ValueError, match=rf"^{named}: no such file \(pass CUDA C\+\+ or PTX text"):
        launch(source, **OK)
    with pytest.raises(ValueError, match="expected CUDA source, PTX text or a path, not int"):
        launch(42, **OK)


def test_the_largest_grid_is_announced_up_front_with_its_least_time(capsys):
    """grid = (2**31 - 1,): 16.8 million waves; the launch says at once that it takes hours (then
    runs; an observer stops it here at its first instruction)."""
    class Stop(Exception):
        pass

    class StopAtOnce:
        def on_instr(self, ev):
            raise Stop

    with pytest.raises(Stop):
        launch(SPIN, **{**OK, "grid": (2**31 - 1,)}, observers=[StopAtOnce()])
    err = capsys.readouterr().err
    assert "fa_sim.ptx.launch: 2,147,483,647 CTAs in 16,777,216 waves of 128: at least 2.3 hours" in err
    assert "Ctrl-C stops it" in err
