"""Edits of the kernels as a user writes them, timed (issue 35): a K/V loop NVVM unrolls by 2 ties
every SASS branch to a PTX branch, and `fa time --backward --kernel` takes a patch of fa2_bwd.cu
as `fa time --kernel` takes one of fa2_fwd.cu."""

from __future__ import annotations

import pytest

pytest.importorskip("cuda.bindings.nvrtc", reason="the kernels compile with NVRTC (the hw extra)")

from fa_sim.cli import main  # noqa: E402
from fa_sim.config import KernelConfig  # noqa: E402
from fa_sim.contract import kernel_source  # noqa: E402
from fa_sim.contract.backward import BWD_PATH  # noqa: E402

LOOP = "  // phase: K load\n  for (int t = 0; t < n_block_max; ++t) {\n"


def _patch(tmp_path, seed_path, old: str, new: str, name: str):
    """A unified diff of one replacement in a seed file, as `diff -u` writes it."""
    import difflib

    seed = seed_path.read_text()
    assert seed.count(old) == 1
    text = seed.replace(old, new)
    diff = difflib.unified_diff(seed.splitlines(keepends=True), text.splitlines(keepends=True),
                                f"a/fa_hw/kernels/{seed_path.name}", f"b/fa_hw/kernels/{seed_path.name}")
    path = tmp_path / name
    path.write_text("".join(diff))
    return path


def test_a_kv_loop_unrolled_by_two_ties_every_sass_branch(tmp_path):
    """NVVM copies the K/V body; ptxas labels one copy's copy_tile branch with its cp.async's
    location: the PTX branch alignment leaves unpaired there decides it (timing.walk.tie)."""
    from fa_sim.contract.source import SEED_PATH
    from fa_sim.timing.predict import kernel_model

    path = _patch(tmp_path, SEED_PATH, LOOP, LOOP.replace("  for", "#pragma unroll 2\n  for"), "unroll2.patch")
    model = kernel_model(KernelConfig(), False, "sm_90", str(path))
    walker = model.stream.walker
    conditional = [s for s, b in model.sass.blocks.items()
                   if b.last.conditional and len(b.succ) == 2 and b.func == model.sass.kernel]
    assert conditional and set(conditional) <= set(walker.ties)


def test_an_edit_the_probes_cannot_count_is_timed_as_any_launch(tmp_path):
    """The K/V loop unrolled by 2 runs half as many latch visits as the probes' schedule counts (a
    StreamMismatch): fa_sim.timing.predict times the edited launch through predict_launch instead of
    refusing it, says why, and the grid's instructions are the walks' (near the seed kernel's: the same
    work, one loop test per two rounds)."""
    from fa_sim import Problem
    from fa_sim.contract.source import SEED_PATH
    from fa_sim.timing import predict

    path = _patch(tmp_path, SEED_PATH, LOOP, LOOP.replace("  for", "#pragma unroll 2\n  for"), "unroll2.patch")
    prob = Problem(1, 2, 512, 512, False, 1.0, KernelConfig())
    edited, seed = predict(prob, "h200", str(path), progress=False), predict(prob, "h200", progress=False)
    assert edited.notes["timed_as"] == "launch" and "K/V rounds per warp" in edited.notes["why"], edited.notes
    assert "timed_as" not in seed.notes
    assert 0.9 < edited.instructions / seed.instructions < 1.02, (edited.instructions, seed.instructions)
    assert 0.5 < edited.kernel_ms / seed.kernel_ms < 1.5


FUZZ = __import__("pathlib").Path(__file__).resolve().parents[1] / "experiments" / "variants" / "edits_fuzz"


@pytest.mark.parametrize("causal", [False, True])
def test_noinline_mask_walks_the_called_body_on_its_call_sites_copy(causal):
    """mask_scores made __noinline__ (experiments/variants/edits_fuzz/noinline_mask.patch): ptxas
    if-converts 31 of the body's 32 masking tests and returns early over the last one's store
    (`@!P RET`, a conditional branch inside the called SASS function). It is tied to the PTX copy of
    its call site, to exactly that test (the SASS and PTX arms store the score at byte 124 of the
    tile), and the walk follows the copy's outcomes: the body runs in the masked round only (one of
    3), all lanes store in warps 0-2 of the causal diagonal, and warp 3's lanes split (those of the
    masked last score store, the others return; both groups issue the BSYNC after the CALL) - taken
    as never taken, warp 3 would issue one BSYNC, as always taken no warp would store."""
    from fa_sim.observers.branches import NONE, SOME
    from fa_sim.timing.predict import kernel_model
    from fa_sim.timing.stream import Kind, paths_of

    patch, cfg = str(FUZZ / "noinline_mask.patch"), KernelConfig()
    model = kernel_model(cfg, causal, "sm_90", patch)
    walker, g = model.stream.walker, model.sass
    func = next(f for f in g.funcs if "mask_scores" in f)
    ret = next(i for i in g.funcs[func] if i.base == "RET" and i.conditional)
    entry = max(a for a in g.blocks if a <= ret.addr)
    store = min(a for a in g.blocks if a > ret.addr)  # the arm that stays: the last score's store
    assert any(i.base == "STL" and "+0x7c]" in i.operands for i in g.blocks[store].instrs), \
        g.blocks[store].instrs
    [(chain, pc, same)] = walker.ties[entry].sites
    code = walker.ptx.code
    assert code[pc + 2].text.startswith("st.local") and "+124]" in code[pc + 2].text, code[pc + 2].text
    bsync = chain[0]
    assert g.blocks[bsync].instrs[0].base == "BSYNC"
    paths = paths_of(cfg, causal, patch, Kind.DIAGONAL if causal else Kind.TAIL, 3)
    for w, path in enumerate(paths):
        outcomes = [o for p, o in path if p == pc]
        split = causal and w == cfg.n_warps - 1
        assert outcomes == [SOME if split else NONE], (w, outcomes)
        walk = walker.walk(path)
        assert (walk.count(entry), walk.count(store), walk.count(bsync)) == (1, 1, 2 if split else 1), w


def test_noinline_mask_is_timed_and_noinline_quad_max_unchanged():
    """Both __noinline__ edits are timed, causal and not; noinline_mask (its score tile in local
    memory) is slower than the seed kernel. noinline_quad_max's body has no branch: its walk is the one
    it had before the walk followed call sites (the grid's warp instructions as recorded then)."""
    from fa_sim import Problem
    from fa_sim.timing import predict

    for causal, quad_max_instructions in ((False, 250240), (True, 159744)):
        prob = Problem(1, 2, 512, 512, causal, 1.0, KernelConfig())
        seed = predict(prob, "h200", progress=False)
        mask = predict(prob, "h200", str(FUZZ / "noinline_mask.patch"), progress=False)
        quad = predict(prob, "h200", str(FUZZ / "noinline_quad_max.patch"), progress=False)
        assert mask.kernel_ms > seed.kernel_ms and mask.instructions > seed.instructions
        assert quad.instructions == quad_max_instructions and quad.kernel_ms > seed.kernel_ms


FUZZ2 = FUZZ.parent / "edits_fuzz2"


def test_a_second_loop_over_the_kv_blocks_is_timed_as_a_launch():
    """two_pass_max (experiments/variants/edits_fuzz2/): a first K loop takes each row's maximum, then
    the K/V loop runs. The probes cut the walk at the second loop's latch, so the first pass is in
    the prologue, which grows with the rounds (2 and 8-round CTAs differ): charging every CTA the fixed
    cost of one round count predicted the seed kernel's time (0.01126 against 0.01125 ms) for 25 %
    more instructions. It is timed as a launch now, slower than the seed kernel; the seed's prologue
    and epilogue do not grow."""
    from fa_sim import Problem
    from fa_sim.timing import predict
    from fa_sim.timing.predict import STEADY_RUN, TOGETHER_RUN, kernel_model
    from fa_sim.timing.stream import StreamMismatch

    patch = str(FUZZ2 / "two_pass_max.patch")
    with pytest.raises(StreamMismatch, match="prologue .* grows with the rounds"):
        kernel_model(KernelConfig(), False, "sm_90", patch).stream.check_fixed(TOGETHER_RUN, STEADY_RUN)
    kernel_model(KernelConfig(), False, "sm_90").stream.check_fixed(TOGETHER_RUN, STEADY_RUN)
    prob = Problem(1, 2, 512, 512, False, 1.0, KernelConfig())
    edited, seed = predict(prob, "h200", patch, progress=False), predict(prob, "h200", progress=False)
    assert edited.notes["timed_as"] == "launch" and "grows with the rounds" in edited.notes["why"], edited.notes
    assert edited.instructions > 1.2 * seed.instructions
    assert edited.kernel_ms > 1.15 * seed.kernel_ms, (edited.kernel_ms, seed.kernel_ms)


@pytest.mark.parametrize("causal", [False, True])
def test_a_switch_on_the_rounds_kind_is_timed(causal):
    """switch_round: `switch (kind)` picks the mask and the softmax of a round (kind 0: the first round,
    2: a later one, +1 masked), three PTX and SASS branches on one line; round 0 falls through the
    tests for kinds 1 and 2 to the test for 3, which sends it to case 0. The all-masked steady run is
    the plain CTA with a masked last round's difference applied to each round: after the test for
    kind 2 (not taken when masked) it runs the test for kind 3 - which round 0 runs already, so it ran
    it twice (refused: 'took the PTX branch ... 1 more times than the SASS walk reached it'). Events are
    put in after a pc only where the round goes on from it as the plain round did: round 0 keeps its
    own; every later round gets them, and so does every round of the seed kernel (its masked round's
    difference, the mask's branch, comes before the first round's own softmax)."""
    from fa_sim import Problem
    from fa_sim.timing import predict
    from fa_sim.timing.predict import STEADY_RUN, kernel_model
    from fa_sim.timing.stream import Kind, paths_of

    cfg = KernelConfig()
    def count(path, events):
        return sum(path[i: i + len(events)] == events for i in range(len(path)))

    switch = str(FUZZ2 / "switch_round.patch")
    for patch in (switch, None):
        stream = kernel_model(cfg, causal, "sm_90", patch).stream
        edit = stream._mask_outcomes()[0]
        plain = paths_of(cfg, causal, patch, Kind.PLAIN, STEADY_RUN)[0]
        masked = stream._masked(plain, edit, 0, STEADY_RUN)
        put_in = sorted(count(masked, events) - count(plain, events) for events, _ in edit[1].values())
        # the switch: the test for kind 3 in rounds 1 on (and non-causal the mask's branch in every round)
        assert put_in == ([STEADY_RUN - 1] if patch else []) + [STEADY_RUN] * (len(put_in) - bool(patch)), \
            (patch, put_in)
        assert len(stream.warp_walks(STEADY_RUN, STEADY_RUN)[0]) == STEADY_RUN + 2
    prob = Problem(1, 2, 512, 512, causal, 1.0, cfg)
    edited, seed = predict(prob, "h200", switch, progress=False), predict(prob, "h200", progress=False)
    assert "timed_as" not in edited.notes
    assert 0.95 < edited.kernel_ms / seed.kernel_ms < 1.1, (edited.kernel_ms, seed.kernel_ms)


def test_a_variants_own_shared_buffer_is_named_and_the_tiles_start_past_it():
    """o_buffer_no_sync stages O in a static `__shared__ u16 sObuf[...]` and drops the barrier before
    reading it back: the hazard checker names the buffer and the source line (before, the labels put
    the tiles at byte 0 of the CTA's window, so the buffer's bytes were named sO, and every tile's
    coordinates were shifted by the buffer's size). With the barrier (o_own_buffer) there is none."""
    from fa_sim import simulate
    from fa_sim.kernels.labels import FA2Labels, Tile, source_name
    from fa_sim.observers.hazards import HazardChecker
    from fa_sim.timing.stream import probe_program
    import numpy as np

    assert source_name("_ZZ14fa2_fwd_kernelE5sObuf") == "sObuf" and source_name("smem") == "smem"
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, 64, 64)).astype(np.float16) for _ in range(3))
    for name, want in (("o_buffer_no_sync", {("RAW_NO_BARRIER", "sObuf")}), ("o_own_buffer", set())):
        hazards = HazardChecker()
        simulate(q, k, v, causal=False, kernel=str(FUZZ2 / f"{name}.patch"), observers=[hazards])
        assert {(kind.name, str(where)) for kind, where in hazards.report().kinds()} == want, name
    program = probe_program(KernelConfig(), False, str(FUZZ2 / "o_own_buffer.patch"))
    base = program.dynamic_smem_offset
    assert base >= 2 * 64 * 64
    labels = FA2Labels(KernelConfig(), {}, program)
    on = np.ones(1, bool)
    assert labels.smem(np.array([0]), on, 0) == ("sObuf", None, None)
    tile, row, col = labels.smem(np.array([base + 2 * 64]), on, 0)  # sQ row 1, (swizzled) chunk 1
    assert tile is Tile.SQ and row.tolist() == [1] and col.tolist() == [8]
