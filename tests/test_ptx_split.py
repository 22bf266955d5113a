"""A wave whose CTAs part ways splits into waves of their own CTAs (fa_sim/ptx/engine.py `_split`).

When every CTA's running threads are in one group, an unobserved wave goes on as one wave per
group, carrying each CTA's registers (those live at the group's pc: fa_sim/ptx/live.py), shared
memory, cp.async groups and copies in flight. CTAs share nothing but global memory, so the
results, counts and faults must be those of the wave that never split - and of waves of one CTA,
which cannot split. Causal attention splits once per K/V round, its parts views of the wave's
storage (consecutive CTAs); the tests below check that it does, and that nothing it leaves behind
is read: dead registers are poisoned.
"""

import importlib

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

pytest.importorskip("cuda.bindings.nvrtc", reason="the PTX engine compiles with NVRTC (the hw extra)")

import fa_sim  # noqa: E402
from fa_sim.observers import HazardChecker  # noqa: E402
from fa_sim.ptx import launch, parse  # noqa: E402
from fa_sim.ptx import waves  # noqa: E402
from fa_sim.ptx.live import Live  # noqa: E402
from fa_sim.ptx.regs import RegisterFile  # noqa: E402

FAMILY = fa_sim.KernelConfig.family()


@pytest.fixture
def splits(monkeypatch):
    """The CTAs of each wave split off so far (waves._part calls)."""
    made = []
    original = waves._part
    def counted(eng, pos, pc, last):
        made.append(eng.geo.ctas[pos].size)  # pos: an array or a slice of wave positions
        return original(eng, pos, pc, last)
    monkeypatch.setattr(waves, "_part", counted)
    return made


@pytest.fixture
def joins(monkeypatch):
    """The CTAs of each wave joined so far (waves.join calls)."""
    made = []
    original = waves.join
    def counted(parts):
        made.append(sum(len(p.geo.ctas) for p in parts))
        return original(parts)
    monkeypatch.setattr(waves, "join", counted)
    return made


def _poison(out: RegisterFile, live) -> RegisterFile:
    """Every register of `out` but `live` set to all-ones bits (NaN, -1, true)."""
    rows = out._rows(live)
    for prefix, f in out._files.items():
        dead = np.ones(f.shape[0], bool)
        dead[rows.get(prefix, [])] = False
        f[dead] = True if f.dtype == bool else np.iinfo(f.dtype).max
    return out


@pytest.fixture
def poisoned(monkeypatch):
    """Registers not live where a wave splits or joins hold all-ones bits in the new wave."""
    of_ctas, joined = RegisterFile.of_ctas, RegisterFile.joined
    monkeypatch.setattr(RegisterFile, "of_ctas", lambda self, pos, threads, live, reuse=False:
                        _poison(of_ctas(self, pos, threads, live, reuse), live))
    monkeypatch.setattr(RegisterFile, "joined", staticmethod(lambda files, live: _poison(joined(files, live), live)))


def _inputs(cfg, nq, nk, heads, seed):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, heads, nq, cfg.head_dim)).astype(np.float16)
    k, v = (rng.standard_normal((1, heads, nk, cfg.head_dim)).astype(np.float16) for _ in range(2))
    return q, k, v


def _same(a, b):
    assert np.array_equal(a.o.view(np.uint16), b.o.view(np.uint16)), "O differs"
    assert np.array_equal(a.lse.view(np.uint32), b.lse.view(np.uint32)), "LSE differs"
    assert dict(a.counts) == dict(b.counts), "instruction counts differ"


K = fa_sim.KernelConfig
OPTIONS = {  # configs with different control flow around and in the main loop
    "seed": K(),
    "kv_stages 3": K(kv_stages=3),
    "q_in_regs": K(q_in_regs=True),
    "defer_pv": K(kv_stages=2, defer_pv=True),
    "pingpong": K(block_m=128, n_warps=8, kv_stages=2, pingpong=True),
    "heavy_first": K(heavy_first=True),
    "block_n 32": K(block_n=32),
    "head_dim 128, 8 warps": K(block_m=128, head_dim=128, n_warps=8),
}


@pytest.mark.parametrize("name", list(OPTIONS))
def test_causal_waves_split_and_give_the_programs_bits_and_counts(name, splits, joins, poisoned):
    cfg = OPTIONS[name]
    q, k, v = _inputs(cfg, 3 * cfg.block_m + 7, 3 * cfg.block_m + 29, heads=2, seed=len(name))
    ptx = fa_sim.simulate(q, k, v, causal=True, config=cfg, engine="ptx")
    assert splits, "the causal wave did not split"
    assert joins, "the parts did not join for the epilogue"
    _same(fa_sim.simulate(q, k, v, causal=True, config=cfg), ptx)


def test_causal_parts_view_the_wave_and_join_as_a_view(splits, monkeypatch):
    """A causal wave's parts are consecutive CTAs (the grid orders a wave's CTAs by their K/V
    rounds): each views its range of the wave's storage, and past the main loop they join as one
    view of it (no copy)."""
    viewed = []
    original = waves._joined_views
    def counted(parts):
        out = original(parts)
        viewed.append(out is not None)
        return out
    monkeypatch.setattr(waves, "_joined_views", counted)
    cfg = FAMILY[0]
    q, k, v = _inputs(cfg, 8 * cfg.block_m, 8 * cfg.block_m, heads=3, seed=5)
    res = fa_sim.simulate(q, k, v, causal=True, config=cfg, engine="ptx")
    assert splits and viewed and all(viewed), viewed
    _same(fa_sim.simulate(q, k, v, causal=True, config=cfg), res)


def test_an_observed_wave_does_not_split(splits):
    cfg = FAMILY[0]
    q, k, v = _inputs(cfg, 200, 200, heads=1, seed=1)
    res = fa_sim.simulate(q, k, v, causal=True, config=cfg, engine="ptx", observers=[HazardChecker()])
    assert not splits  # observers keep state per wave
    _same(fa_sim.simulate(q, k, v, causal=True, config=cfg), res)


# CTA b skips the work if b % 4 == 3 (its threads exit), else runs b % 5 + 1 rounds; each round
# copies the next tile with cp.async before it waits for the one in flight (a copy is in flight
# where the CTAs part ways), and a block-wide sum through shared memory needs both barriers. Odd
# CTAs copy one more tile in their last round and wait for it after the loop: they reach the
# loop's end, where the parts join, with a copy in flight.
PREFETCH = r"""
extern "C" __global__ void prefetch(const int* g, int* out) {
  __shared__ int tile[2][64];
  __shared__ int red[64];
  const int b = blockIdx.x, t = threadIdx.x;
  if (b % 4 == 3) return;
  const int rounds = b % 5 + 1;
  unsigned d0 = (unsigned)__cvta_generic_to_shared(&tile[0][t]);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" :: "r"(d0), "l"(g + t));
  asm volatile("cp.async.commit_group;");
  int acc = b;
#pragma unroll 1
  for (int r = 0; r < rounds; ++r) {
    if (r + 1 < rounds) {
      unsigned d = (unsigned)__cvta_generic_to_shared(&tile[(r + 1) & 1][t]);
      asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" :: "r"(d), "l"(g + 64 * (r + 1) + t));
    }
    asm volatile("cp.async.commit_group;");
    asm volatile("cp.async.wait_group 1;");
    __syncthreads();
    red[t] = tile[r & 1][(t + b) % 64] * (r + 1);
    __syncthreads();
    acc += red[(t + 7) % 64] ^ red[63 - t];
    __syncthreads();
    if (r + 1 == rounds && b % 2) {  // odd CTAs leave the loop with a copy in flight
      unsigned d = (unsigned)__cvta_generic_to_shared(&red[t]);
      asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" :: "r"(d), "l"(g + 64 * 5 + t));
      asm volatile("cp.async.commit_group;");
    }
  }
  asm volatile("cp.async.wait_group 0;");
  __syncthreads();
  if (b % 2) acc += red[(t + 1) % 64];
  if (t % 2) acc = -acc;
  out[b * 64 + t] = acc;
}
"""


def _prefetch(wave_ctas: int):
    g = (np.arange(64 * 6, dtype=np.int32) * 37) % 1000 - 300
    out = np.full(13 * 64, 12345, np.int32)
    res = launch(PREFETCH, grid=13, block=64, args=[g, out], wave_ctas=wave_ctas)
    return out, res.counts, g


def test_a_split_wave_gives_what_waves_of_one_cta_give(splits, joins, poisoned):
    one, counts_one, g = _prefetch(wave_ctas=1)
    assert not splits  # a wave of one CTA cannot split
    many, counts_many, _ = _prefetch(wave_ctas=13)
    assert len(splits) >= 4  # rounds 1..5 end for different CTAs; b % 4 == 3 exit at once
    assert joins == [10]  # every CTA but those that returned joins past the loop, copies in flight too
    np.testing.assert_array_equal(many, one)
    assert counts_many == counts_one
    b, t = np.divmod(np.arange(13 * 64), 64)  # the oracle, thread by thread
    want = np.full(13 * 64, 12345)
    for i in range(13 * 64):
        if b[i] % 4 == 3:
            continue
        acc = b[i]
        for r in range(b[i] % 5 + 1):
            red = g[64 * r + (np.arange(64) + b[i]) % 64] * (r + 1)
            acc += red[(t[i] + 7) % 64] ^ red[63 - t[i]]
        acc += g[64 * 5 + (t[i] + 1) % 64] if b[i] % 2 else 0
        want[i] = -acc if t[i] % 2 else acc
    np.testing.assert_array_equal(many, want)


LIVE = """
.version 8.0
.target sm_80
.address_size 64
.visible .entry k(.param .u64 out) {
  .reg .pred %p<3>;
  .reg .b32 %r<8>;
  .reg .b64 %rd<3>;
  mov.u32 %r1, %tid.x;
  mov.u32 %r2, 0;
  mov.u32 %r7, 5;
LOOP:
  add.s32 %r2, %r2, %r1;
  setp.lt.u32 %p1, %r2, 100;
  @%p1 mov.u32 %r7, 9;
  mov.u32 %r3, %r2;
  @%p1 bra LOOP;
  ld.param.u64 %rd1, [out];
  st.global.u32 [%rd1], %r7;
  ret;
}
"""


def test_live_registers_follow_loops_guards_and_kills():
    kernel = parse(LIVE).kernels["k"]
    live = Live(kernel)
    pc = {ins.text: ins.pc for ins in kernel.instructions}
    assert live.at(0) == frozenset()  # %tid is read, every register is written before it is read
    head = live.at(pc["add.s32 %r2, %r2, %r1;"])
    assert {"%r1", "%r2", "%r7"} <= head  # loop-carried, and %r7 survives the guarded write
    assert "%r3" not in head  # written, never read
    assert "%p1" not in head  # written before each read
    assert "%rd1" not in live.at(pc["ld.param.u64 %rd1, [out];"])
    assert live.at(pc["st.global.u32 [%rd1], %r7;"]) == {"%rd1", "%r7"}


@pytest.mark.parametrize("engine", ["program", "ptx"])
def test_progress_counts_each_cta_round_once(engine, monkeypatch):
    """Both front ends report the CTA-rounds their CTAs run (a split wave's parts too), so a causal
    run's progress ends at its total, Problem.cta_rounds."""
    sim_module = importlib.import_module("fa_sim.simulate")  # the module (fa_sim.simulate is the function)
    seen = []
    real = sim_module._Lines
    class Counted(real):
        def update(self, n):
            seen.append((n, self.total))
            super().update(n)
    monkeypatch.setattr(sim_module, "_Lines", Counted)
    monkeypatch.setattr(sim_module.sys.stderr, "isatty", lambda: False)
    cfg = K()
    q, k, v = _inputs(cfg, 5 * cfg.block_m + 3, 5 * cfg.block_m + 3, heads=3, seed=4)
    fa_sim.simulate(q, k, v, causal=True, engine=engine, progress=True, wave_ctas=5)
    assert seen and sum(n for n, _ in seen) == seen[0][1]


@settings(max_examples=10, deadline=None, derandomize=True, database=None)
@given(nq=st.integers(1, 300), nk=st.integers(1, 300), heads=st.integers(1, 3), wave=st.sampled_from([2, 3, 5, 64]),
       cfg=st.sampled_from([K(), K(kv_stages=3, q_in_regs=True), K(block_m=128, n_warps=8, kv_stages=2, pingpong=True),
                            K(heavy_first=True, kv_stages=2, defer_pv=True)]))
def test_any_causal_shape_and_wave_size_gives_the_bits_of_waves_of_one_cta(nq, nk, heads, wave, cfg):
    q, k, v = _inputs(cfg, nq, nk, heads=heads, seed=nq * 1000 + nk)
    split = fa_sim.simulate(q, k, v, causal=True, config=cfg, engine="ptx", wave_ctas=wave)
    _same(fa_sim.simulate(q, k, v, causal=True, config=cfg, engine="ptx", wave_ctas=1), split)
