"""heavy_first with causal: fa2_fwd.cu maps blockIdx.x to the Q block in reverse (m_block =
gridDim.x - 1 - blockIdx.x). A CTA is its grid index everywhere in fa_sim (`fa trace --cta`,
instruction and checkpoint events); its Q block (m_block) decides its rounds, its coordinates and
the values it holds. The audit's case: `--cta 3` was labelled m_block 3 while it showed m_block 0's
instructions, and `--round 3` was checked against m_block 3's rounds."""

import json

import numpy as np
import pytest

pytest.importorskip("cuda.bindings.nvrtc", reason="the PTX engine compiles with NVRTC (the hw extra)")

import fa_sim  # noqa: E402
from fa_sim.cli import main  # noqa: E402
from fa_sim.crosscheck import CheckpointRecorder  # noqa: E402
from fa_sim.problem import Problem  # noqa: E402

HF = fa_sim.KernelConfig(heavy_first=True)
TRACE = ["trace", "--engine", "ptx", "--causal", "--seqlen", "256"]


def test_the_problem_maps_ctas_to_q_blocks_in_reverse_only_when_causal():
    causal = Problem(1, 2, 256, 256, True, 1.0, HF)  # 4 Q blocks per head
    np.testing.assert_array_equal(causal.m_block_of(np.arange(8)), [3, 2, 1, 0, 3, 2, 1, 0])
    np.testing.assert_array_equal(causal.q_block_index(np.arange(8)), [3, 2, 1, 0, 7, 6, 5, 4])
    np.testing.assert_array_equal(causal.rounds_per_cta(np.arange(4)), [4, 3, 2, 1])  # the heavy ones first
    plain = Problem(1, 2, 256, 256, False, 1.0, HF)  # heavy_first changes nothing without causal
    np.testing.assert_array_equal(plain.m_block_of(np.arange(8)), [0, 1, 2, 3, 0, 1, 2, 3])


def _story(capsys, *args) -> dict:
    assert main([*TRACE, *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_cta_is_labelled_with_the_q_block_it_computes(capsys):
    assert main([*TRACE, "--heavy-first", "--cta", "3", "--round", "0"]) == 0
    head = capsys.readouterr().out.splitlines()[0]
    assert head.startswith("CTA 3 (blockIdx.x 3 -> m_block 0 (heavy_first), batch-head 0)  warp 0  lane 0")
    heavy = _story(capsys, "--heavy-first", "--cta", "3", "--round", "0")
    plain = _story(capsys, "--cta", "0", "--round", "0")  # the same Q block without the reversal
    assert heavy["m_block"] == plain["m_block"] == 0
    assert heavy["state"] == plain["state"] and heavy["state"]  # its S, m, l, P~, O: queries 0..63
    assert {s["row"] for s in heavy["state"]["s_masked"]} <= set(range(64))


def test_the_round_check_uses_the_q_block_of_the_cta(capsys):
    assert main([*TRACE, "--heavy-first", "--cta", "3", "--round", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("fa trace: error: --round 3 is not a round of CTA 3 (blockIdx.x 3: Q block m_block 0 under "
                   "--heavy-first --causal): it runs round 0 only; under --causal its queries 0..63 see keys 0..63 "
                   "only (block_n = 64); CTAs of later query blocks run up to 4 rounds")
    heavy = _story(capsys, "--heavy-first", "--cta", "0", "--round", "3")  # m_block 3 runs rounds 0..3
    plain = _story(capsys, "--cta", "3", "--round", "3")
    assert heavy["m_block"] == 3 and heavy["state"] == plain["state"]
    assert {s["row"] for s in heavy["state"]["o_final"]} <= set(range(192, 256))


def test_the_help_says_what_cta_names(capsys):
    with pytest.raises(SystemExit):
        main(["trace", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "linear CTA id in the grid" in text and "ceil(Nq/block_m) - 1 - blockIdx.x" in text


def test_checkpoints_name_q_blocks_so_heavy_first_lines_up_with_the_plain_run():
    """CheckpointEvents name a CTA by its Q block (what the debug build records): every slot of a
    heavy_first run equals the plain run's, over two waves of 3 CTAs that cut a head's Q blocks
    apart (Q block 2 of head 0 is computed by grid CTA 1, in the first wave)."""
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 2, 256, 64)).astype(np.float16) for _ in range(3))
    heavy, plain = CheckpointRecorder(range(8)), CheckpointRecorder(range(8))
    a = fa_sim.simulate(q, k, v, causal=True, config=HF, observers=[heavy], wave_ctas=3)
    b = fa_sim.simulate(q, k, v, causal=True, config=fa_sim.KernelConfig(), engine="ptx", observers=[plain],
                        wave_ctas=3)
    assert np.array_equal(a.o.view(np.uint16), b.o.view(np.uint16))
    assert np.array_equal(heavy.buffer, plain.buffer)
    assert heavy.buffer[3, :, 3].any() and not heavy.buffer[0, :7, 1:].any()  # Q block 3: 4 rounds; 0: 1
