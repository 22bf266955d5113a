"""The dynamic SASS stream from the functional run (fa_sim.timing.stream): the PTX engine's record
of each warp selects the SASS path of every region.

- Oracle: on a family of configs (layouts, d 32/64, block_m 128 with 4 and 8 warps, block_m / block_n
  1, 2 and 4, the kernel options kv_stages, defer_pv, q_in_regs) x causal, every path class the model uses issues per region exactly the classes and
  EX2 count the config-derived choice (fa_sim.timing.oracle) names; CTAs without masking take the
  very same paths; where a masked round or a key tail takes another arm of equal counts, the
  functional run's is the copy arm the round runs (a causal diagonal round copies interior tiles,
  unless its keys end in a tail).
- A --kernel variant whose control flow differs gets its own path; a trip count other than the
  schedule's, and a run that no SASS path explains, are StreamMismatch errors.

Cost: per config a lineinfo NVRTC compile (cached on disk) and a few PTX engine probes of up to
8 rounds of one CTA, recorded instruction by instruction (about 0.2 s a round); probes are cached
on disk too.
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
from fa_sim.timing.paths import EX2, analyze  # noqa: E402
from fa_sim.timing.stream import KernelStream, StreamMismatch, probe_rounds, sass_locations  # noqa: E402

C = KernelConfig
FAMILY = [C(), C(block_n=32, head_dim=32, smem="padded"), C(block_m=128, block_n=32, head_dim=64, n_warps=4),
          C.from_tag("m64n64d64w4-swizzled-s2-dp"), C.from_tag("m128n64d64w8-swizzled-qr")]
CASES = [(cfg, causal) for cfg in FAMILY for causal in (False, True)]


@functools.cache
def _stream(cfg: KernelConfig, causal: bool, kernel=None, sass_of=None) -> KernelStream:
    """The stream of a build; `sass_of`: take the SASS of another kernel source (None: the same)."""
    ck = compile_build(KernelBuild(cfg, causal, "sm_90", False, kernel_source(sass_of or kernel), lineinfo=True))
    text = disassemble(ck.cubin, encodings=True, inlined=True)
    return KernelStream(cfg, causal, kernel, analyze(text), sass_locations(text))


def _features(st: KernelStream, walks: tuple) -> list[Counter]:
    regions = ["prologue"] + ["trip"] * (len(walks) - 3) + ["last_trip", "epilogue"]
    table = {(region, starts): dict(f) for region, paths in st.paths.items() for f, starts in paths}
    return [table[(region, w)] for region, w in zip(regions, walks)]


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
    st = _stream(cfg, causal)
    for rounds, masked, tail in _classes(cfg, causal):
        new = st.walks(rounds, masked, tail)
        old = schedule_walks(st.ks, cfg, rounds, masked)
        assert len(new) == rounds + 2
        assert _features(st, new) == _features(st, old), (rounds, masked, tail)
        if masked == 0:
            assert new == old, rounds


def test_a_causal_diagonal_round_copies_interior_tiles():
    """The functional run tells the arms the schedule's longest path mixes up: a diagonal round of
    N_k = 8 block_n masks, but copies V (and prefetches nothing) through the interior arm."""
    cfg = C()
    st = _stream(cfg, True)
    walk = st.walks(8, 1, False)[-2]  # the last round
    lines = {loc[0] for b in walk for loc in st.block_locs[b]}
    source = kernel_source(None).text.splitlines()
    mask_line = next(i + 1 for i, s in enumerate(source) if "tCrS[mi][nj][v] = neg_inf()" in s)
    interior = next(i + 1 for i, s in enumerate(source) if "cp_async_cg16(dst + 2u * kCopyRows * i * kPitch" in s)
    boundary = next(i + 1 for i, s in enumerate(source) if "const bool ok = r < seqlen - row0" in s)
    assert mask_line in lines and interior in lines and boundary not in lines
    old = schedule_walks(st.ks, cfg, 8, 1)[-2]
    assert boundary in {loc[0] for b in old for loc in st.block_locs[b]}  # what the oracle took
    tail = st.walks(8, 1, True)[-2]  # keys ending in a tail: the boundary arm
    assert boundary in {loc[0] for b in tail for loc in st.block_locs[b]}


@pytest.mark.parametrize("causal", (False, True), ids=("full", "causal"))
def test_a_query_tail_copies_q_through_the_boundary_arm(causal):
    """The last Q block of N_q not a multiple of block_m copies Q with the zero fill of rows past
    N_q (the boundary arm, 47 more instructions per warp on the seed's cubin); its rounds and its
    epilogue are the full block's. Without the query-tail class the grid's count was 0.28 % below
    Nsight Compute's on N = 333 causal (+47 per warp of each last Q block)."""
    cfg = C()
    st = _stream(cfg, causal)
    source = kernel_source(None).text.splitlines()
    boundary = next(i + 1 for i, s in enumerate(source) if "const bool ok = r < seqlen - row0" in s)
    copy_q = next(i + 1 for i, s in enumerate(source) if "copy_tile<kBlockM>(sQ, gQ, row0, seqlen_q)" in s)
    rounds, masked = (6, 1) if causal else (3, 1)
    full, qtail = st.walks(rounds, masked, True, False), st.walks(rounds, masked, True, True)
    assert full[1:] == qtail[1:]
    q_locs = [{loc for b in walk for loc in st.block_locs[b] if loc[0] == boundary and loc[-1] == copy_q}
              for walk in (full[0], qtail[0])]
    assert not q_locs[0] and q_locs[1]
    size = [sum(len(st.ks.blocks[b].instrs) for b in walk) for walk in (full[0], qtail[0])]
    assert size[1] > size[0]


def test_the_epilogue_takes_the_fast_reciprocal():
    """normalize's __frcp_rn: a row that is not empty sums at least 1, so every warp takes the
    MUFU.RCP arm, never the slow-path call (which the oracle's longest epilogue took)."""
    st = _stream(C(), True)
    epilogue = st.walks(8, 1, False)[-1]
    assert st.ks.slow_calls(epilogue) == 0
    assert any(i.opcode == "MUFU.RCP" for b in epilogue for i in st.ks.blocks[b].instrs)


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
    st = _stream(cfg, False, kernel)
    feats = _features(st, st.walks(4, 0))
    first = cfg.s_values_per_thread
    assert [f[EX2] for f in feats[1:5]] == [first, first, first + cfg.rows_per_thread, first + cfg.rows_per_thread]
    seed = _stream(cfg, False)
    assert [f[EX2] for f in _features(seed, seed.walks(4, 0))[1:5]] == [first] + [first + cfg.rows_per_thread] * 3
    longer = [f[EX2] for f in _features(st, st.walks(12, 0))[1:13]]  # a steady round repeats, not round 1
    assert longer == [first, first] + [first + cfg.rows_per_thread] * 10


def test_a_trip_count_other_than_the_schedule_is_an_error(tmp_path):
    kernel = _variant(tmp_path, "short_loop.cu", "for (int t = 0; t < n_block_max; ++t)",
                      "for (int t = 0; t < n_block_max - (n_block_max > 1); ++t)")
    with pytest.raises(StreamMismatch, match=r"runs \[2\] K/V rounds per warp; the schedule the model dispatches by says 3"):
        _stream(C(), False, kernel).walks(3, 0)


def test_a_run_no_sass_path_explains_is_an_error(tmp_path):
    """The seed's SASS against the run of a variant with one more barrier per round."""
    kernel = _variant(tmp_path, "extra_bar.cu", "    // phase: mask\n", "    __syncthreads();\n    // phase: mask\n")
    st = _stream(C(), False, kernel, sass_of=None)
    assert st.walks(2, 0)  # its own SASS explains it
    wrong = KernelStream(C(), False, kernel, _stream(C(), False).ks, {})
    with pytest.raises(StreamMismatch, match=r"trip: the functional run issues .*BAR 3.*; no SASS path does"):
        wrong.walks(2, 0)
