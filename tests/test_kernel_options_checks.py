"""Kernel options and PTX semantics that a mutation run could change without any test noticing
(issue 36, item 2), each checked by what it does:

- max.NaN / min.NaN (PTX ISA #floating-point-instructions-max, #half-precision-...-max): any NaN
  operand gives the canonical NaN, where plain max / min give the other operand; run through the
  PTX engine on a tiny PTX kernel, instruction by instruction and in its fast paths;
- pingpong: the build's FA_PINGPONG macro is 1, the PTX differs from the kernel without it, and on
  the PTX engine warps 4-7 run each round's PV one round late (none in round 0, their last PV after
  the loop) while warps 0-3 run it in its round; a config of 4 warps is refused when it is made;
- poly_exp: the .cu selects the polynomial for eighths of the scores: per warp and round, the engine
  runs s_values x e / 8 polynomial exponentials (ex2_poly's max.NaN clamp) and MUFU's ex2.approx for
  the rest (and alpha); the output's bits differ from the spec's; and the timing model's
  config-derived oracle (fa_sim.timing.oracle.trip_key) counts the EX2 the engine runs.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

from fa_sim.config import KernelConfig
from fa_sim.events import ROUND_EPILOGUE
from fa_sim.ptx import launch

F32_NAN = 0x7FFFFFFF  # the canonical NaN of .f32 results
F16_NAN = 0x7FFF  # and of .f16 halves


class Watcher:
    """An observer of instruction events: the engine then runs every instruction by itself."""

    def on_instr(self, ev):
        pass


# ---- max.NaN / min.NaN ----------------------------------------------------------------------------------
MIN_MAX = """
.version 7.8
.target sm_80
.address_size 64

.visible .entry minmax(.param .u64 pa, .param .u64 pb, .param .u64 ph, .param .u64 pg, .param .u64 po)
{
    .reg .b32 %r<8>;
    .reg .f32 %f<8>;
    .reg .b64 %rd<16>;
    ld.param.u64 %rd1, [pa];
    ld.param.u64 %rd2, [pb];
    ld.param.u64 %rd3, [ph];
    ld.param.u64 %rd4, [pg];
    ld.param.u64 %rd5, [po];
    mov.u32 %r0, %tid.x;
    mul.wide.u32 %rd6, %r0, 4;
    add.s64 %rd7, %rd1, %rd6;
    add.s64 %rd8, %rd2, %rd6;
    add.s64 %rd9, %rd3, %rd6;
    add.s64 %rd10, %rd4, %rd6;
    ld.global.f32 %f1, [%rd7];
    ld.global.f32 %f2, [%rd8];
    ld.global.b32 %r1, [%rd9];
    ld.global.b32 %r2, [%rd10];
    max.f32 %f3, %f1, %f2;
    max.NaN.f32 %f4, %f1, %f2;
    min.f32 %f5, %f1, %f2;
    min.NaN.f32 %f6, %f1, %f2;
    max.f16x2 %r3, %r1, %r2;
    max.NaN.f16x2 %r4, %r1, %r2;
    min.f16x2 %r5, %r1, %r2;
    min.NaN.f16x2 %r6, %r1, %r2;
    mul.wide.u32 %rd11, %r0, 32;
    add.s64 %rd12, %rd5, %rd11;
    st.global.f32 [%rd12], %f3;
    st.global.f32 [%rd12+4], %f4;
    st.global.f32 [%rd12+8], %f5;
    st.global.f32 [%rd12+12], %f6;
    st.global.b32 [%rd12+16], %r3;
    st.global.b32 [%rd12+20], %r4;
    st.global.b32 [%rd12+24], %r5;
    st.global.b32 [%rd12+28], %r6;
    ret;
}
"""
_NAN, _SNAN, _NEG_NAN = 0x7FC00000, 0x7F800001, 0xFFC00000
# (a, b) as f32 bits -> (max, max.NaN, min, min.NaN) as bits, by the PTX ISA's rules
F32_CASES = [
    ((_NAN, 0x3F800000), (0x3F800000, F32_NAN, 0x3F800000, F32_NAN)),  # NaN, 1
    ((0x3F800000, _NAN), (0x3F800000, F32_NAN, 0x3F800000, F32_NAN)),  # 1, NaN
    ((_NAN, _NAN), (F32_NAN, F32_NAN, F32_NAN, F32_NAN)),  # two NaNs: NaN either way
    ((_SNAN, 0x40A00000), (0x40A00000, F32_NAN, 0x40A00000, F32_NAN)),  # a signalling NaN, 5
    ((0xBF800000, _NEG_NAN), (0xBF800000, F32_NAN, 0xBF800000, F32_NAN)),  # -1, a negative NaN
    ((0x7F800000, _NAN), (0x7F800000, F32_NAN, 0x7F800000, F32_NAN)),  # +inf, NaN
    ((0xC0000000, 0xC0400000), (0xC0000000, 0xC0000000, 0xC0400000, 0xC0400000)),  # -2, -3
    ((0x80000000, 0x00000000), (0x00000000, 0x00000000, 0x80000000, 0x80000000)),  # -0, +0: +0 > -0
]
# (a, b) as f16 bits -> (max, max.NaN, min, min.NaN)
F16_CASES = [
    ((0x7E00, 0x3C00), (0x3C00, F16_NAN, 0x3C00, F16_NAN)),  # NaN, 1
    ((0xBC00, 0xFE00), (0xBC00, F16_NAN, 0xBC00, F16_NAN)),  # -1, a negative NaN
    ((0x7E00, 0x7D00), (F16_NAN, F16_NAN, F16_NAN, F16_NAN)),  # two NaNs
    ((0xC000, 0xC200), (0xC000, 0xC000, 0xC200, 0xC200)),  # -2, -3
]


@pytest.mark.parametrize("observed", [False, True], ids=["fast", "one-by-one"])
def test_max_nan_gives_nan_for_any_nan_operand_and_plain_max_the_other_operand(observed):
    lanes = 32
    rng = np.random.default_rng(5)
    a = rng.standard_normal(lanes).astype(np.float32)
    b = rng.standard_normal(lanes).astype(np.float32)
    a.view(np.uint32)[:len(F32_CASES)] = [x for (x, _), _ in F32_CASES]
    b.view(np.uint32)[:len(F32_CASES)] = [y for (_, y), _ in F32_CASES]
    h = rng.standard_normal((lanes, 2)).astype(np.float16)
    g = rng.standard_normal((lanes, 2)).astype(np.float16)
    for i, ((x, y), _) in enumerate(F16_CASES):  # low half of lane i, high half of lane i + 8
        h.view(np.uint16)[i, 0], g.view(np.uint16)[i, 0] = x, y
        h.view(np.uint16)[i + 8, 1], g.view(np.uint16)[i + 8, 1] = x, y
    out = np.zeros((lanes, 8), np.uint32)
    launch(MIN_MAX, grid=(1,), block=(lanes,), args=[a, b, h.view(np.uint32).ravel(), g.view(np.uint32).ravel(), out],
           observers=[Watcher()] if observed else ())
    for i, (_, want) in enumerate(F32_CASES):
        assert out[i, :4].tolist() == list(want), (i, [hex(v) for v in out[i, :4]])
    plain = slice(len(F32_CASES), None)  # ordinary numbers: numpy's max and min
    assert np.array_equal(out[plain, 0].view(np.float32), np.maximum(a[plain], b[plain]))
    assert np.array_equal(out[plain, 1].view(np.float32), np.maximum(a[plain], b[plain]))
    assert np.array_equal(out[plain, 2].view(np.float32), np.minimum(a[plain], b[plain]))
    assert np.array_equal(out[plain, 3].view(np.float32), np.minimum(a[plain], b[plain]))
    halves = out[:, 4:].view(np.uint16).reshape(lanes, 4, 2)  # [lane, (max, max.NaN, min, min.NaN), half]
    for i, (_, want) in enumerate(F16_CASES):
        assert halves[i, :, 0].tolist() == list(want), (i, [hex(v) for v in halves[i, :, 0]])
        assert halves[i + 8, :, 1].tolist() == list(want), (i, [hex(v) for v in halves[i + 8, :, 1]])
    hf, gf = h.astype(np.float32), g.astype(np.float32)
    ordinary = [(lane, half) for lane in range(16, lanes) for half in (0, 1)]
    for lane, half in ordinary:
        got = halves[lane, :, half].view(np.float16).astype(np.float32).tolist()
        hi, lo = max(hf[lane, half], gf[lane, half]), min(hf[lane, half], gf[lane, half])
        assert got == [hi, hi, lo, lo], (lane, half)


# ---- the fa2_fwd.cu options on the PTX engine --------------------------------------------------------
def _has_nvrtc() -> bool:
    try:
        import cuda.bindings.nvrtc  # noqa: F401
    except ImportError:
        return False
    return True


needs_nvrtc = pytest.mark.skipif(not _has_nvrtc(), reason="fa2_fwd.cu compiles with NVRTC (the hw extra)")

PINGPONG = KernelConfig.from_tag("m128n64d64w8-swizzled-s2-pp")


class Counts:
    """Per (round, phase, PTX opcode, warp): the warp instructions the engine runs."""

    def __init__(self) -> None:
        self.n: Counter = Counter()

    def on_instr(self, ev) -> None:
        op = ev.ptx.split(" ")[0]
        if op.startswith(("mma.", "ex2.", "max.NaN")):
            for w in np.flatnonzero(ev.active.any(axis=(0, 2))):
                self.n[(ev.round, ev.phase, op, int(w))] += ev.repeat

    def warps(self, rnd: int, phase: str, prefix: str) -> dict:
        """warp -> count of the instructions starting with `prefix` in round `rnd`, phase `phase`."""
        out: Counter = Counter()
        for (r, p, op, w), n in self.n.items():
            if r == rnd and p == phase and op.startswith(prefix):
                out[w] += n
        return dict(out)


def _run(cfg: KernelConfig, n_keys_blocks: int = 2, seed: int = 0):
    from fa_sim import simulate
    from fa_sim.observers import HazardChecker

    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, 1, cfg.block_m, cfg.head_dim)).astype(np.float16)
    k, v = (rng.standard_normal((1, 1, n_keys_blocks * cfg.block_n, cfg.head_dim)).astype(np.float16)
            for _ in range(2))
    counts, hazards = Counts(), HazardChecker()
    res = simulate(q, k, v, config=cfg, engine="ptx", observers=[counts, hazards])
    assert hazards.report().ok
    return res, counts


def test_pingpong_builds_with_its_macro():
    from fa_sim.contract import KernelBuild

    for cfg in (PINGPONG, KernelConfig(block_m=256, n_warps=8, kv_stages=3, pingpong=True)):
        macros = KernelBuild(cfg).macros()
        assert (macros["FA_PINGPONG"], macros["FA_N_WARPS"], macros["FA_KV_STAGES"]) == (1, 8, cfg.kv_stages)
    assert KernelBuild(replace(PINGPONG, pingpong=False)).macros()["FA_PINGPONG"] == 0


def test_every_option_reaches_its_macro():
    """Each option's macro carries its value (a build that dropped one would run the spec's schedule
    under a config that says otherwise)."""
    from fa_sim.contract import KernelBuild

    cfg = KernelConfig(block_m=128, n_warps=8, kv_stages=3, q_in_regs=True, heavy_first=True, pingpong=True,
                       lazy_sum=True, poly_exp=3, min_blocks=2, softmax="ffma")
    m = KernelBuild(cfg, causal=True).macros()
    assert {k: m[k] for k in ("FA_KV_STAGES", "FA_Q_IN_REGS", "FA_HEAVY_FIRST", "FA_DEFER_PV", "FA_PINGPONG",
                              "FA_LAZY_SUM", "FA_POLY_EXP", "FA_MIN_BLOCKS", "FA_SOFTMAX_FFMA", "FA_CAUSAL")} == {
        "FA_KV_STAGES": 3, "FA_Q_IN_REGS": 1, "FA_HEAVY_FIRST": 1, "FA_DEFER_PV": 0, "FA_PINGPONG": 1,
        "FA_LAZY_SUM": 1, "FA_POLY_EXP": 3, "FA_MIN_BLOCKS": 2, "FA_SOFTMAX_FFMA": 1, "FA_CAUSAL": 1}
    dp = KernelBuild(KernelConfig(kv_stages=2, defer_pv=True)).macros()
    assert (dp["FA_DEFER_PV"], dp["FA_PINGPONG"]) == (1, 0)


@needs_nvrtc
def test_pingpongs_second_warp_group_runs_each_rounds_pv_one_round_late():
    """m128n64d64w8, kv_stages 2, two K/V rounds: warps 0-3 run PV(0) in round 0 and PV(1) in round
    1; warps 4-7 (group 1) none in round 0, PV(0) in round 1 and PV(1) after the loop. 32 MMAs a PV
    per warp (16 rows x 64 columns of O: 8 n-tiles x 4 k-steps of 16 keys). Without pingpong every
    warp runs its PV in its round. Hazard-free either way, and the same bits."""
    from fa_sim.contract import KernelBuild
    from fa_sim.contract.nvrtc import kernel_ptx

    mma = "mma."
    res, pp = _run(PINGPONG)
    group0, group1 = range(4), range(4, 8)
    assert pp.warps(0, "PV", mma) == {w: 32 for w in group0}
    assert pp.warps(1, "PV", mma) == {w: 32 for w in range(8)}
    assert pp.warps(ROUND_EPILOGUE, "PV", mma) == {w: 32 for w in group1}
    assert pp.warps(0, "QK", mma) == pp.warps(1, "QK", mma) == {w: 32 for w in range(8)}
    plain_cfg = replace(PINGPONG, pingpong=False)
    plain, pl = _run(plain_cfg)
    assert pl.warps(0, "PV", mma) == pl.warps(1, "PV", mma) == {w: 32 for w in range(8)}
    assert pl.warps(ROUND_EPILOGUE, "PV", mma) == {}
    assert np.array_equal(res.o.view(np.uint16), plain.o.view(np.uint16))
    assert np.array_equal(res.lse.view(np.uint32), plain.lse.view(np.uint32))
    assert kernel_ptx(KernelBuild(PINGPONG)) != kernel_ptx(KernelBuild(plain_cfg))


@pytest.mark.parametrize("kw", [dict(kv_stages=2), dict(block_m=128, kv_stages=2), dict(block_m=128, kv_stages=3)])
def test_pingpong_with_four_warps_is_refused_when_the_config_is_made(kw):
    with pytest.raises(ValueError, match=r"pingpong needs kv_stages >= 2, n_warps 8 \(two groups of 4 warps\)") as info:
        KernelConfig(pingpong=True, n_warps=4, **kw)
    assert "\n" not in str(info.value)
    KernelConfig(pingpong=True, n_warps=8, **{**kw, "block_m": 128})  # with 8 warps: accepted


POLY = [KernelConfig(poly_exp=e) for e in (1, 2, 4)] + [KernelConfig.from_tag("m128n64d64w8-swizzled-s2-e3")]


@needs_nvrtc
@pytest.mark.parametrize("cfg", POLY, ids=lambda c: c.tag)
def test_poly_exp_computes_its_eighths_of_the_scores_by_the_polynomial(cfg):
    """Per warp and round: s_values x e / 8 scores through ex2_poly (its max.NaN clamp, one each),
    the other scores and, after round 0, each row's alpha through MUFU (ex2.approx); the spec's
    kernel runs every score on MUFU and no max.NaN. The timing model's oracle counts the same EX2
    per round (trip_key's "ex2", the SASS feature of a round's path). The output's bits differ from
    the spec's."""
    from fa_sim.timing.oracle import trip_key

    rounds = 3
    res, got = _run(cfg, rounds)
    base, spec = _run(replace(cfg, poly_exp=0), rounds)
    warps = range(cfg.n_warps)
    poly = cfg.s_values_per_thread * cfg.poly_exp // 8
    assert poly > 0
    for t in range(rounds):
        mufu = cfg.s_values_per_thread - poly + (t > 0) * cfg.rows_per_thread
        assert got.warps(t, "softmax", "max.NaN") == {w: poly for w in warps}, t
        assert got.warps(t, "softmax", "ex2.") == {w: mufu for w in warps}, t
        assert spec.warps(t, "softmax", "max.NaN") == {}, t
        assert spec.warps(t, "softmax", "ex2.") == {w: mufu + poly for w in warps}, t
        assert trip_key(cfg, t, rounds)["ex2"] == mufu, t
        assert trip_key(replace(cfg, poly_exp=0), t, rounds)["ex2"] == mufu + poly, t
    assert not np.array_equal(res.o.view(np.uint16), base.o.view(np.uint16))
    assert not np.array_equal(res.lse.view(np.uint32), base.lse.view(np.uint32))


# ---- the README's table of which command models which option ------------------------------------------
README_ROWS = {  # row of the README's table -> configs with that option
    "tiles, --warps": [KernelConfig(block_m=128, n_warps=8)],
    "--smem layouts": [KernelConfig(smem="plain"), KernelConfig(smem="padded")],
    "--softmax ffma": [KernelConfig(softmax="ffma")],
    "--min-blocks": [KernelConfig(min_blocks=2)],
    "--kv-stages, --q-in-regs, --defer-pv": [KernelConfig(kv_stages=2), KernelConfig(q_in_regs=True),
                                            KernelConfig(kv_stages=3, defer_pv=True)],
    "--heavy-first": [KernelConfig(heavy_first=True)],
    "--pingpong": [PINGPONG],
    "--lazy-sum, --poly-exp": [KernelConfig(lazy_sum=True), KernelConfig(poly_exp=2)],
    "--dtype bf16": [KernelConfig(dtype="bf16"), KernelConfig(block_m=128, head_dim=128, dtype="bf16")],
}


def _readme_options_table() -> dict:
    from pathlib import Path

    lines = (Path(__file__).parent.parent / "README.md").read_text().splitlines()
    start = next(i for i, s in enumerate(lines) if s.startswith("<!-- options by command:"))
    cells = [[c.strip().replace("`", "") for c in s.strip().strip("|").split("|")]
             for s in lines[start + 1:] if s.startswith("|")]
    rows = [row for row in cells[2:] if row]
    for row in rows[: len(README_ROWS)]:
        assert len(row) == len(cells[0]), row
    return {row[0]: dict(zip(cells[0][1:], row[1:])) for row in rows[: len(README_ROWS)]}


def test_the_readmes_option_table_says_what_the_program_and_the_timing_model_refuse(monkeypatch):
    """The hand-written program refuses exactly the rows the README says (the CLI then runs them on
    the PTX engine), and `fa time` refuses pingpong before it compiles anything, and nothing else."""
    import importlib

    from fa_sim.kernels.fa2_fwd import check_program_config, engine_for

    predict = importlib.import_module("fa_sim.timing.predict")  # the module (fa_sim.timing.predict is also a function)

    table = _readme_options_table()
    assert list(table) == list(README_ROWS)

    class Compiled(Exception):
        pass

    def compile_build(*args, **kwargs):
        raise Compiled

    monkeypatch.setattr(predict, "compile_build", compile_build)
    for row, configs in README_ROWS.items():
        program, time_ = table[row]["fa sim (hand-written program)"], table[row]["fa time"]
        for cfg in configs:
            assert (engine_for(cfg) == "ptx") == program.startswith("refuses"), (row, cfg.tag)
            if program.startswith("refuses"):
                with pytest.raises(ValueError, match="engine='ptx'"):
                    check_program_config(cfg)
            else:
                check_program_config(cfg)
            refused = None
            try:
                predict.kernel_model(cfg, False, "sm_90")
            except ValueError as e:
                refused = str(e)
            except Compiled:
                pass
            assert (refused is not None) == time_.startswith("refuses"), (row, cfg.tag, refused)
