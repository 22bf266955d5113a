"""The dynamic SASS stream from the functional run (fa_sim.timing.stream): each warp's path,
walked through the SASS (fa_sim.timing.walk) and cut into regions at the K/V loop's latch.

- Oracle: on a family of configs (layouts, d 32/64, block_m 128 with 4 and 8 warps, block_m / block_n
  1, 2 and 4, the kernel options kv_stages, defer_pv, q_in_regs) x causal, every path class the model
  uses issues per region exactly the classes and EX2 count the config-derived choice
  (fa_sim.timing.oracle, over the static path analysis fa_sim.timing.paths) names; CTAs without
  masking take the very same paths; where a masked round or a key tail takes another arm of equal
  counts, the functional run's is the copy arm the round runs (a causal diagonal round copies
  interior tiles, unless its keys end in a tail).
- A --kernel variant whose control flow differs gets its own path; a trip count other than the
  schedule's, and SASS that does not compile the run's PTX, are errors.

Cost: per config a lineinfo NVRTC compile (cached on disk) and a few PTX engine probes of up to
8 rounds of one CTA (cached on disk too).
"""

from __future__ import annotations

import functools
from collections import Counter

import pytest

from fa_sim.config import KernelConfig

pytest.importorskip("cuda.bindings")

from fa_sim.contract import KernelBuild, kernel_source  # noqa: E402
from fa_sim.contract.cubins import compile_build  # noqa: E402
from fa_sim.contract.sass import disassemble  # noqa: E402
from fa_sim.contract.source import SEED_PATH  # noqa: E402
from fa_sim.timing.oracle import schedule_walks  # noqa: E402
from fa_sim.timing.paths import EX2, KernelSass, analyze  # noqa: E402
from fa_sim.timing.predict import kernel_model  # noqa: E402
from fa_sim.timing.stream import KernelStream, StreamMismatch, probe_rounds  # noqa: E402
from fa_sim.timing.walk import TieError  # noqa: E402

C = KernelConfig
FAMILY = [C(), C(block_n=32, head_dim=32, smem="padded"), C(block_m=128, block_n=32, head_dim=64, n_warps=4),
          C.from_tag("m64n64d64w4-swizzled-s2-dp"), C.from_tag("m128n64d64w8-swizzled-qr")]
CASES = [(cfg, causal) for cfg in FAMILY for causal in (False, True)]


def _stream(cfg: KernelConfig, causal: bool, kernel=None) -> KernelStream:
    return kernel_model(cfg, causal, "sm_90", kernel).stream


@functools.cache
def _static(cfg: KernelConfig, causal: bool, kernel=None) -> KernelSass:
    """The static path analysis of the same cubin (the oracle's ground)."""
    ck = compile_build(KernelBuild(cfg, causal, "sm_90", False, kernel_source(kernel), lineinfo=True))
    return analyze(disassemble(ck.cubin, encodings=True, inlined=True))


def _features(ks: KernelSass, walks: tuple) -> list[Counter]:
    regions = ["prologue"] + ["trip"] * (len(walks) - 3) + ["last_trip", "epilogue"]
    table = {(region, starts): dict(f) for region, paths in ks.walks.items() for f, starts in paths}
    return [table[(region, w)] for region, w in zip(regions, walks)]


def _on(features: dict) -> dict:
    """What a path issues (its EX2 count too), without the if-converted arms it issues switched off."""
    return {k: v for k, v in features.items() if not k.startswith("off:")}


def _lines(st: KernelStream, walk) -> set:
    return {i.loc[1] for b in walk for i in st.graph.blocks[b].instrs if i.loc}


def _classes(cfg: KernelConfig, causal: bool) -> list[tuple[int, int, bool]]:
    """(rounds, masked, keys ending in a tail) the model asks for: plain CTAs of 1, 2, 8 rounds and
    one longer than a probe; a masked CTA as short and as long as it comes, and one longer than a
    probe (causal: also with a key tail); the all-masked steady run."""
    per = max(1, cfg.block_m // cfg.block_n) if causal else 1
    m = per if causal else 1
    long = probe_rounds(cfg) + 3 * per
    masked = [(r, m, tail) for r in (per, 2 * per, long) for tail in ((False, True) if causal else (True,))]
    return [(1, 0, False), (2, 0, False), (8, 0, False), (long, 0, False), *masked, (8, 8, False)]


@pytest.mark.parametrize("cfg,causal", CASES, ids=[f"{c.tag}-{'causal' if k else 'full'}" for c, k in CASES])
def test_functional_run_paths_issue_what_the_schedule_says(cfg, causal):
    st, ks = _stream(cfg, causal), _static(cfg, causal)
    for rounds, masked, tail in _classes(cfg, causal):
        for new in st.warp_walks(rounds, masked, tail):  # every warp
            old = schedule_walks(ks, cfg, rounds, masked)
            assert len(new) == rounds + 2
            if masked == 0:
                assert new == old, rounds
            else:  # the same classes; the copy arms the rounds really run (the oracle takes the longest)
                assert [_on(f) for f in _features(ks, new)] == [_on(f) for f in _features(ks, old)], (rounds, masked)


def test_a_causal_diagonal_round_copies_interior_tiles():
    """The functional run tells the arms the schedule's longest path mixes up: a diagonal round of
    N_k = 8 block_n masks, but copies V (and prefetches nothing) through the interior arm."""
    cfg = C()
    st = _stream(cfg, True)
    walk = st.walks(8, 1, False)[-2]  # the last round
    lines = _lines(st, walk)
    source = kernel_source(None).text.splitlines()
    cond = next(i + 1 for i, s in enumerate(source) if "if (key >= seqlen_k ||" in s)  # the mask: its
    mask_lines = set(range(cond, next(i + 1 for i, s in enumerate(source) if "tCrS[mi][nj][v] = neg_inf()" in s) + 1))
    interior = next(i + 1 for i, s in enumerate(source) if "cp_async_cg16(copy_dst(dst, sTile, o, i, j), src + kCopyRows" in s)
    boundary = next(i + 1 for i, s in enumerate(source) if "const bool ok = r < seqlen - row0" in s)
    assert mask_lines & lines and interior in lines and boundary not in lines
    tail = st.walks(8, 1, True)[-2]  # keys ending in a tail: the boundary arm
    assert boundary in _lines(st, tail)


@pytest.mark.parametrize("causal", (False, True), ids=("full", "causal"))
def test_a_query_tail_copies_q_through_the_boundary_arm(causal):
    """The last Q block of N_q not a multiple of block_m copies Q with the zero fill of rows past
    N_q (the boundary arm, more instructions per warp); its rounds are the full block's."""
    cfg = C()
    st = _stream(cfg, causal)
    source = kernel_source(None).text.splitlines()
    boundary = next(i + 1 for i, s in enumerate(source) if "const bool ok = r < seqlen - row0" in s)
    copy_q = next(i + 1 for i, s in enumerate(source) if "copy_tile<kBlockM>(sQ, gQ, row0, seqlen_q)" in s)
    rounds, masked = (6, 1) if causal else (3, 1)
    full, qtail = st.walks(rounds, masked, True, False), st.walks(rounds, masked, True, True)
    assert full[1:-1] == qtail[1:-1]
    q_locs = [{i.loc for b in walk for i in st.graph.blocks[b].instrs if i.loc and i.loc[1] == boundary
               and i.loc[-1] == copy_q} for walk in (full[0], qtail[0])]
    assert not q_locs[0] and q_locs[1]
    size = [sum(len(st.graph.blocks[b].instrs) for b in walk) for walk in (full[0], qtail[0])]
    assert size[1] > size[0]


def test_warps_whose_rows_lie_past_the_queries_leave_early():
    """A query tail of half a block: the warps whose LSE rows all lie past N_q leave at the guarded
    EXIT before the LSE stores, so their epilogue is shorter than the others' (the region model
    issued those 2 instructions anyway)."""
    st = _stream(C(), False)
    sizes = [sum(len(st.graph.blocks[b].instrs) for b in warp[-1]) for warp in st.warp_walks(3, 1, True, True)]
    assert sizes[0] == sizes[1] > sizes[2] == sizes[3]


def test_the_epilogue_takes_the_fast_reciprocal():
    """normalize's __frcp_rn: a row that is not empty sums at least 1, so every warp takes the
    MUFU.RCP arm, never the slow-path call."""
    st = _stream(C(), True)
    epilogue = st.walks(8, 1, False)[-1]
    instrs = [i for b in epilogue for i in st.graph.blocks[b].instrs]
    assert not any(i.base == "CALL" for i in instrs)
    assert any(i.opcode == "MUFU.RCP" for i in instrs)


def _variant(tmp_path, name: str, old: str, new: str) -> str:
    text = SEED_PATH.read_text()
    assert old in text
    path = tmp_path / name
    path.write_text(text.replace(old, new))
    return str(path)


def test_a_variant_with_another_branch_gets_its_own_path(tmp_path):
    """A variant that runs the first-round softmax (no rescale of O, no alpha exponentials) in
    rounds 0 and 1: round 1 takes the first round's arm, which the config would not say."""
    cfg = C()
    kernel = _variant(tmp_path, "first_two.cu", "if (t == 0) softmax_rescale_o<true>", "if (t < 2) softmax_rescale_o<true>")
    st, ks = _stream(cfg, False, kernel), _static(cfg, False, kernel)
    feats = _features(ks, st.walks(4, 0))
    first = cfg.s_values_per_thread
    assert [f[EX2] for f in feats[1:5]] == [first, first, first + cfg.rows_per_thread, first + cfg.rows_per_thread]
    seed, sks = _stream(cfg, False), _static(cfg, False)
    assert [f[EX2] for f in _features(sks, seed.walks(4, 0))[1:5]] == [first] + [first + cfg.rows_per_thread] * 3
    longer = [f[EX2] for f in _features(ks, st.walks(12, 0))[1:13]]  # a steady round repeats, not round 1
    assert longer == [first, first] + [first + cfg.rows_per_thread] * 10


def test_a_trip_count_other_than_the_schedule_is_an_error(tmp_path):
    kernel = _variant(tmp_path, "short_loop.cu", "for (int t = 0; t < n_block_max; ++t)",
                      "for (int t = 0; t < n_block_max - (n_block_max > 1); ++t)")
    with pytest.raises(StreamMismatch, match=r"runs \[2\] K/V rounds per warp; the schedule the model dispatches by says 3"):
        _stream(C(), False, kernel).walks(3, 0)


def test_sass_that_does_not_compile_the_run_is_an_error(tmp_path):
    """The seed's SASS walked with the run of a variant with one more barrier per round: the walks
    issue fewer barriers than the engine counted."""
    from fa_sim.timing.stream import probe_counts, paths_of, Kind
    from fa_sim.timing.walk import check_counts

    kernel = _variant(tmp_path, "extra_bar.cu", "    // phase: mask\n", "    __syncthreads();\n    // phase: mask\n")
    assert _stream(C(), False, kernel).walks(2, 0)  # its own SASS explains it
    seed = _stream(C(), False)
    walks = [seed.walker.walk(p) for p in paths_of(C(), False, None, Kind.PLAIN, 2)]
    prob, mbs, counts = probe_counts(C(), False, kernel, Kind.PLAIN, 2)
    with pytest.raises(TieError, match=r"issues \d+ BAR warp instructions, the SASS walk"):
        check_counts(seed.graph, walks, counts, "seed SASS, variant run")
