"""The trace-driven SASS walk (fa_sim/timing/walk.py) and predict_launch (fa_sim/timing/launch.py):
each warp's SASS stream from its path in the functional run, for any control flow."""

import warnings

import numpy as np
import pytest

import fa_sim.ptx
from fa_sim.config import KernelConfig
from fa_sim.contract import KernelBuild, kernel_source
from fa_sim.contract.cubins import compile_build
from fa_sim.contract.nvrtc import compile_cubin
from fa_sim.contract.sass import disassemble
from fa_sim.observers.branches import ALL, NONE, SOME, BranchRecorder
from fa_sim.ptx.load import kernel_module, load_module
from fa_sim.timing import predict_launch
from fa_sim.timing.program import Sync, step
from fa_sim.timing.sass import Control
from fa_sim.timing.walk import PtxGraph, SassGraph, TieError, Walker, post_dominators

SRC = r'''
extern "C" __global__ void branchy(float* out, int n) {
  const int t = threadIdx.x, w = t / 32;
  float s = 0.f;
#pragma unroll 1
  for (int i = 0; i <= w; ++i) s += out[i * 32 + t % 32] * 0.5f;   // warp w loops w + 1 times
  if (t % 2) {                                                      // lanes diverge
#pragma unroll 1
    for (int j = 0; j < n; ++j) s = s * 0.5f + out[j];
  } else {
    out[t + 128] = s;
    s = s * s - 2.f;
  }
  if (w == 3) return;                                               // the last warp leaves early
  out[t] = s;
}
'''


def _walker(source: str, kernel: str) -> Walker:
    cubin, _ = compile_cubin(source, name="kernel.cu", arch="sm_90", lineinfo=True)
    listing = disassemble(cubin, inlined=True)
    return Walker(SassGraph(listing, kernel), PtxGraph(load_module(source).kernels[kernel]))


def _run(source, kernel, grid, block, args):
    rec = BranchRecorder()
    fa_sim.ptx.launch(source, grid, block, 0, args, kernel=kernel, observers=[rec])
    return rec


def test_branch_recorder_sees_each_warps_outcomes():
    out = np.arange(256, dtype=np.float32)
    rec = _run(SRC, "branchy", (1,), (128,), [out, np.int32(128)])
    outcomes = {w: [o for _, o in rec.path(0, w)] for w in range(4)}
    assert all(SOME in outcomes[w] for w in range(4))  # the t % 2 branch splits every warp
    assert {o for w in range(4) for o in outcomes[w]} <= {ALL, NONE, SOME}
    assert len({tuple(rec.path(0, w)) for w in range(4)}) == 4  # four different paths


def test_walk_follows_loops_divergence_and_early_exit():
    out = np.arange(256, dtype=np.float32)
    rec = _run(SRC, "branchy", (1,), (128,), [out, np.int32(128)])
    w = _walker(SRC, "branchy")
    walks = [w.walk(rec.path(0, k)) for k in range(4)]
    blocks = w.sass.blocks
    # the loop's back edge: the block whose tied branch jumps backwards
    back = [a for a, b in blocks.items() if b.func == "branchy" and b.last.base == "BRA"
            and b.last.conditional and b.succ[0] <= a]
    if back:  # ptxas kept the loop rolled: warp w issues its body w + 1 times
        assert [wk.count(back[0]) for wk in walks] == [1, 2, 3, 4]
    lengths = [sum(len(blocks[b].instrs) for b in wk) for wk in walks]
    assert lengths[0] < lengths[1] < lengths[2]
    stores = [sum(i.base == "STG" for b in wk for i in blocks[b].instrs) for wk in walks]
    # divergence issues both arms (the even lanes' store, the odd lanes' loop); warp 3 leaves
    # before the last store
    assert stores[:3] == [2, 2, 2] and stores[3] == 1
    loads = [sum(i.base == "LDG" for b in wk for i in blocks[b].instrs) for wk in walks]
    assert all(n > 100 for n in loads)  # the odd arm's loop over n = 128 loads
    # two BSYNCs: after the warp-uniform loop (issued once) and where the divergent arms meet, which
    # each of the two lane groups issues on arrival (Nsight Compute: split-KV's store_partial)
    bsyncs = [a for a, b in blocks.items() if b.func == "branchy" and b.instrs[0].base == "BSYNC"]
    assert all(len(blocks[a].instrs) == 1 for a in bsyncs)  # a block of its own, issued alone
    assert [sorted(wk.count(a) for a in bsyncs) for wk in walks] == [[1, 2]] * 4


def test_walk_refuses_a_path_the_sass_cannot_follow():
    out = np.arange(256, dtype=np.float32)
    rec = _run(SRC, "branchy", (1,), (128,), [out, np.int32(128)])
    w = _walker(SRC, "branchy")
    path = rec.path(0, 1)
    extra = path + tuple(p for p in path if p[0] in w.tied_pcs)[:1]  # one outcome the SASS never reaches
    with pytest.raises(TieError, match="more times than the SASS walk reached it"):
        w.walk(extra)


def test_post_dominators_of_a_diamond_and_a_loop():
    succ = {0: [1, 2], 1: [3], 2: [3], 3: [4, 0], 4: [None]}
    pd = post_dominators(succ)
    assert pd[0] == 3 and pd[1] == 3 and pd[2] == 3 and pd[3] == 4 and pd[4] is None


@pytest.mark.parametrize("causal,nk,qtail", [(False, 192, False), (False, 160, False), (True, 192, False)])
def test_walk_equals_the_region_paths_of_the_attention_kernel(causal, nk, qtail):
    """The oracle: on the seed kernel the trace-driven walk of a CTA is, block for block, the path
    the region matching (fa_sim.timing.stream) selects - for every warp."""
    from fa_sim.hub import Hub
    from fa_sim.ptx.fa2 import run_attention
    from fa_sim.run import global_memory
    from fa_sim.timing.predict import kernel_model
    from fa_sim.timing.stream import Kind, probe_problem

    cfg = KernelConfig()
    kind = (Kind.DIAGONAL if causal else Kind.TAIL) if nk % cfg.block_n or causal else Kind.PLAIN
    prob, mb = probe_problem(cfg, causal, kind, 3)
    ck = compile_build(KernelBuild(cfg, causal, "sm_90", False, kernel_source(None), lineinfo=True))
    module = kernel_module(KernelBuild(cfg, causal, "sm_80", False, kernel_source(None)))
    kernel = next(iter(module.kernels.values()))
    walker = Walker(SassGraph(disassemble(ck.cubin, inlined=True), kernel.name), PtxGraph(kernel))
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, n, cfg.head_dim)).astype(np.float16)
               for n in (prob.seqlen_q, prob.seqlen_k, prob.seqlen_k))
    gmem, _, ptr = global_memory(prob, q, k, v)
    rec = BranchRecorder()
    cta = int(prob.q_block_index(np.array([mb]))[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        run_attention(prob, gmem, ptr, Hub([rec]), [np.arange(cta, cta + 1)])
    model = kernel_model(cfg, causal, "sm_90", None)
    masked = model.stream._real_masked(3) if kind is not Kind.PLAIN else 0
    old = tuple(b for part in model.stream.walks(3, masked, kind is Kind.TAIL, qtail) for b in part)
    for w in range(cfg.n_warps):
        assert walker.walk(rec.path(cta, w)) == old


def test_guarded_exit_passed_is_not_the_warps_end():
    ctl = Control(1, False, None, None, 0, 0)
    from fa_sim.timing.gpus import GPUS
    assert step("EXIT", "", "@P0", ctl, GPUS["h200"], {}).sync is Sync.NONE
    assert step("EXIT", "", "", ctl, GPUS["h200"], {}).sync is Sync.EXIT
    ld = step("LDG.E.128", "R4, desc[UR4][R2.64]", "", ctl, GPUS["h200"], {})
    assert ld.sync is Sync.GLOBAL_LOAD and ld.bytes == 512


REDUCE = r'''
extern "C" __global__ void reduce(const float* __restrict__ x, float* out, int n) {
  float s = 0.f;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) s += x[i];
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffff, s, o);
  __shared__ float part[32];
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x < 32) {
    s = threadIdx.x < blockDim.x / 32 ? part[threadIdx.x] : 0.f;
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffff, s, o);
    if (threadIdx.x == 0) atomicAdd(out, s);
  }
}
'''


def test_predict_launch_times_a_kernel_that_is_not_attention():
    x = np.random.default_rng(1).standard_normal(1 << 16).astype(np.float32)
    out = np.zeros(1, np.float32)
    small = predict_launch(REDUCE, (132,), (256,), [x, out, np.int32(x.size // 4)])
    big = predict_launch(REDUCE, (132,), (256,), [x, out, np.int32(x.size)])
    assert out[0] == 0  # the user's arrays are not written
    assert 0 < small.kernel_ms < big.kernel_ms  # four times the loop trips take longer
    assert big.notes["sm_ctas"] == 1 and big.occupancy >= 1
    assert big.instructions > small.instructions


def test_predict_launch_refuses_bad_input():
    x = np.ones(64, np.float32)
    with pytest.raises(ValueError, match="gpu must be one of"):
        predict_launch(REDUCE, (1,), (32,), [x, x[:1], np.int32(64)], gpu="h900")
    with pytest.raises(ValueError, match="needs the CUDA source"):
        predict_launch(fa_sim.ptx.compile_ptx(REDUCE), (1,), (32,), [x, x[:1], np.int32(64)])


def test_a_loop_ptxas_unrolls_is_a_clear_error():
    src = SRC.replace("#pragma unroll 1\n    for (int j", "    for (int j")
    out = np.arange(256, dtype=np.float32)
    rec = _run(src, "branchy", (1,), (128,), [out, np.int32(128)])
    w = _walker(src, "branchy")
    with pytest.raises(TieError, match="loop ptxas unrolled"):
        for k in range(4):
            w.walk(rec.path(0, k))


def test_fa_time_backward_times_the_three_launches(capsys):
    """The backward pass (fa2_bwd.cu) timed like any kernel: each launch's warps walked through
    its SASS; the deterministic mode's third launch is its dQ kernel (S, dP, dQ recomputed per
    K/V block), the atomic mode's the convert kernel, and the main kernel is the lighter for it."""
    import json

    from fa_sim.cli import main

    assert main(["time", "--backward", "--heads", "2", "--seqlen", "128", "--head-dim", "32", "--json"]) == 0
    det = json.loads(capsys.readouterr().out)
    assert list(det["kernels"]) == ["fa2_bwd_preprocess_kernel", "fa2_bwd_kernel", "fa2_bwd_dq_kernel"]
    assert det["kernel_ms"] == pytest.approx(sum(k["kernel_ms"] for k in det["kernels"].values()))
    assert main(["time", "--backward", "--heads", "2", "--seqlen", "128", "--head-dim", "32", "--json",
                 "--dq", "atomic"]) == 0
    atomic = json.loads(capsys.readouterr().out)
    assert list(atomic["kernels"]) == ["fa2_bwd_preprocess_kernel", "fa2_bwd_kernel", "fa2_bwd_convert_dq_kernel"]
    main_ = "fa2_bwd_kernel"
    assert det["kernels"][main_]["instructions"] < atomic["kernels"][main_]["instructions"]
    dq_kernel, conv = det["kernels"]["fa2_bwd_dq_kernel"], atomic["kernels"]["fa2_bwd_convert_dq_kernel"]
    assert dq_kernel["instructions"] > conv["instructions"]
    assert main(["time", "--backward", "--perfetto", "x.json"]) == 2  # refused with --backward


def test_a_sass_branch_labelled_with_another_call_sites_line_is_tied_to_its_own():
    """no_prefetch (experiments/variants/edits/): K[t] and V[t] are copied by two inlined calls of
    copy_tile, whose interior-tile tests are one condition; ptxas labels the K copy's SASS branch
    with the V copy's call site. Each PTX branch of copy_tile's test is tied to exactly one SASS
    branch, the K copy's to the one whose arms run the K copy (never both to the V copy's, which
    the walk refused: 'reaches this branch more often than the functional run took')."""
    from fa_sim.ptx.fa2 import _program
    from fa_sim.timing.stream import PLAIN
    from fa_sim.timing.walk import tie

    patch = str(__import__("pathlib").Path(__file__).parents[1] / "experiments" / "variants" / "edits"
                / "no_prefetch.patch")
    cfg = KernelConfig()
    ck = compile_build(KernelBuild(cfg, False, "sm_80", False, kernel_source(patch), lineinfo=True))
    program = _program(kernel_source(patch), cfg, False, False, PLAIN.kv_group, PLAIN.window, PLAIN.softcap)
    sass = SassGraph(disassemble(ck.cubin, inlined=True), program.kernel.name)
    ptx = PtxGraph(program.kernel)
    ties = tie(sass, ptx)
    text = kernel_source(patch).text.splitlines()
    line = 1 + next(n for n, t in enumerate(text) if "if (row0 + kRows <= seqlen)" in t)  # copy_tile's test
    copies = [i for i in ptx.control() if ptx.loc(i)[1] == line]
    assert len(copies) >= 3  # Q, the prologue's K and V, and the loop's K and V copies
    tied = [t.pc for t in ties.values() if t.pc is not None]
    loop = [i for i in copies if tied.count(i.pc)]
    assert all(tied.count(i.pc) == 1 for i in copies if i.pc in tied)
    sites = {ptx.loc(i)[2] for i in loop}
    assert len(sites) == len(loop)  # distinct call sites: the K copy's not folded onto the V copy's
    by_site = {ptx.loc(ptx.code[t.pc])[2]: s for s, t in ties.items() if t.pc in {i.pc for i in loop}}
    for site, start in by_site.items():  # each SASS branch's arms run its own call site's copies
        arms = sass.arms(start)
        assert any(len(loc) > 2 and loc[2] == site for arm in arms for loc in arm.locs if loc != ("<exit>",))


CALLS = r'''
__device__ __noinline__ void bump(float* out, int i, float v) {
  if (v <= 0.f) return;                                 // ptxas: an early `@!P0 RET` of the called body
  out[i] = sqrtf(v) * out[i + 256] + out[i + 384];
}
extern "C" __global__ void calls2(float* out) {
  const int t = threadIdx.x, w = t / 32;
  bump(out, t, w == 1 ? 1.f + t : -1.f);                // site 1: warp 1 runs the body, the others return
  bump(out, t + 128, (t % 2) ? 2.f + t : -1.f);         // site 2: every warp's lanes split
}
'''


def _calls_walker(kernel_calls=None):
    from dataclasses import replace

    from fa_sim.ptx.program import build_program

    cubin, _ = compile_cubin(CALLS, name="kernel.cu", arch="sm_90", lineinfo=True)
    kernel = build_program(load_module(CALLS), "calls2", CALLS).kernel  # the calls inlined, as the engine runs it
    if kernel_calls is not None:
        kernel = replace(kernel, calls=kernel_calls)
    return Walker(SassGraph(disassemble(cubin, inlined=True), "calls2"), PtxGraph(kernel))


def test_a_branch_of_a_called_function_takes_its_call_sites_outcomes():
    """One SASS body of a __noinline__ function, CALLed from two sites, its early return a guarded
    RET; the PTX engine runs a copy per call site. The walk decides the RET at each call by the copy
    of that call: warp 0 returns at once from the first call (all lanes) and runs the body at the
    second (its lanes split: the staying ones run the body, both groups issue the BSYNC after the
    CALL); warp 1 runs the body at both. The body's sqrt slow path (a ptxas-internal branch) is the
    fast arm at both sites."""
    w = _calls_walker()
    g = w.sass
    body = g.funcs["$calls2$_Z4bumpPfif"]
    ret = next(i for i in body if i.base == "RET" and i.conditional)  # the early `@!P0 RET`
    entry = max(a for a in g.blocks if a <= ret.addr)
    after = min(a for a in g.blocks if a > ret.addr)  # the body past the early return
    calls = [a for a, b in sorted(g.blocks.items()) if b.func == "calls2" and b.last.base == "CALL"]
    bsync = [g.blocks[a].succ[0] for a in calls]  # the return addresses, each a BSYNC
    assert len(calls) == 2 and all(g.blocks[a].instrs[0].base == "BSYNC" for a in bsync)
    t = w.ties[entry]
    assert len(t.sites) == 2 and len({pc for _, pc, _ in t.sites}) == 2  # one PTX copy per call site
    out = np.arange(1024, dtype=np.float32)
    rec = _run(CALLS, "calls2", (1,), (128,), [out, ])
    copy_pc = {chain[0]: pc for chain, pc, _ in t.sites}
    for k in range(4):
        path = rec.path(0, k)
        outcome = {pc: o for pc, o in path if pc in w.tied_pcs}
        assert outcome[copy_pc[bsync[0]]] == (NONE if k == 1 else ALL)  # site 1: warp 1 stays, the others return
        assert outcome[copy_pc[bsync[1]]] == SOME
        walk = w.walk(path)
        first = walk[:walk.index(bsync[0]) + 1]
        second = walk[len(first):]
        assert first.count(entry) == 1 and first.count(after) == (1 if k == 1 else 0) and first.count(bsync[0]) == 1
        assert second.count(entry) == 1 and second.count(after) == 1 and second.count(bsync[1]) == 2


def test_a_call_no_ptx_copy_matches_is_refused_with_its_line():
    """Without the inliner's record of its copies the SASS calls match no PTX copy: a TieError that
    names the call's source line, not a walk on another copy's outcomes."""
    with pytest.raises(TieError, match=r"a conditional branch inside the called function .*bump.* line 8.*"
                                       r"__forceinline__"):
        _calls_walker(kernel_calls=())
