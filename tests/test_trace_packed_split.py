"""`fa trace` on a packed batch (--seqlens) and on split-KV decoding (--splits): the per-round S, m, l, P,
O sections come from the real run (the PTX engine running FA_VARLEN's / FA_SPLITKV's checkpoint build),
at the sequence's / the cache's coordinates, and split-KV adds the combine step of the lane's rows.

Checked against independent runs and float64:
- a packed lane's sections equal those of the same lane of the hand-written program's dense run of its
  sequence alone (bit for bit: the same arithmetic), and its S and O slots are float64's to fp32 / fp16
  accuracy; the coordinates line names the lane's packed rows.
- a split lane's sections equal those of the hand-written program's dense run of the same query on the
  split's keys alone (keys shifted by the split's first key); its combine step's split LSEs are float64's
  LSE over each split's keys, the weights float64's exp(lse_s - m), the final O and LSE those of the normal
  split-KV run (fa_sim.simulate, bit for bit) and float64's over all keys, and the weights and partial O it
  shows reproduce the final O's fp16 bits in fa2_combine.cu's arithmetic.
Refusals of --sequence / --split are one line before any work. Shapes are tiny (block 64, d 32).
"""

from __future__ import annotations

import numpy as np
import pytest

import fa_sim
from fa_sim.reference import random_inputs

from cli_helpers import ok_json as _json, refused_line as _refused

LENS = (5, 70)  # packed: sequence 1 has Q blocks 0 (queries 0..63) and 1 (64..69, a tail)
NK = 300  # split-KV: 5 K/V tiles of 64, the last one 44 keys; 3 splits of 2 tiles (split 2: keys 256..299)


def _slots(story, name, key_shift=0):
    """{(row, col): value} of a state section, columns (keys) shifted by key_shift."""
    return {(s["row"], None if s["col"] is None else s["col"] + key_shift): s["value"] for s in story["state"][name]}


SECTIONS = ("s_acc", "s_masked", "row_max", "row_sum", "p_f16", "o_acc", "o_final")
KEYED = ("s_acc", "s_masked", "p_f16")  # columns are keys; the others' are rows only or O's d


def _attention64(q, k, v, causal=False):
    """float64 O [Nq, d] and LSE [Nq] of one head, scale 1/sqrt(d) (causal: top-left aligned)."""
    s = q.astype(np.float64) @ k.astype(np.float64).T / np.sqrt(q.shape[-1])
    if causal:
        s = np.where(np.arange(k.shape[0])[None, :] <= np.arange(q.shape[0])[:, None], s, -np.inf)
    m = s.max(axis=1, keepdims=True)
    p = np.exp(s - m)
    return p @ v.astype(np.float64) / p.sum(axis=1, keepdims=True), (m + np.log(p.sum(axis=1, keepdims=True)))[:, 0]


# -- a packed batch ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("cta, rnd, lane, flags", [(1, 1, 5, []), (0, 0, 30, []),
                                                   (1, 1, 5, ["--causal"])],
                         ids=["tail-block-round1", "block0-round0", "causal-tail-block"])
def test_packed_lane_sections_are_its_sequences_alone(tmp_path, cta, rnd, lane, flags):
    q, k, v = random_inputs(1, 1, sum(LENS), sum(LENS), 32, 0)  # what `fa trace --seqlens 5,70` draws (seed 0)
    lo, hi = LENS[0], sum(LENS)
    path = tmp_path / "seq1.npz"
    np.savez(path, q=q[:, :, lo:hi], k=k[:, :, lo:hi], v=v[:, :, lo:hi])
    packed = _json(["trace", "--seqlens", "5,70", "--head-dim", "32", "--sequence", "1", "--cta", str(cta),
                    "--round", str(rnd), "--lane", str(lane), "--json", *flags])
    dense = _json(["trace", "--npz", str(path), "--engine", "program", "--cta", str(cta), "--round", str(rnd),
                   "--lane", str(lane), "--json", *flags])
    assert packed["cta"] == 2 + cta and packed["packed"].startswith(f"packed batch, CTA {2 + cta}: sequence 1")
    assert set(packed["state"]) >= set(SECTIONS)
    for name in SECTIONS:
        assert _slots(packed, name) == _slots(dense, name), name
    # float64: the scores of real (query, key) pairs, and O after division by l of the real queries
    seq_q, seq_k, seq_v = (x[0, 0, lo:hi] for x in (q, k, v))
    ref_o, _ = _attention64(seq_q, seq_k, seq_v, causal="--causal" in flags)
    s64 = seq_q.astype(np.float64) @ seq_k.astype(np.float64).T
    s_real = {(r, c): x for (r, c), x in _slots(packed, "s_acc").items() if r < LENS[1] and c < LENS[1]}
    assert s_real and all(abs(x - s64[r, c]) <= 1e-5 * (1 + abs(s64[r, c])) for (r, c), x in s_real.items())
    masked = _slots(packed, "s_masked")
    assert all(x == "-inf" for (r, c), x in masked.items() if c >= LENS[1] or ("--causal" in flags and c > r))
    o_real = {(r, c): x for (r, c), x in _slots(packed, "o_final").items() if r < LENS[1]}
    assert o_real and all(abs(x - ref_o[r, c]) <= 2e-3 for (r, c), x in o_real.items())
    # the coordinates line: the lane's queries as packed rows of q, the round's keys as packed rows of k, v
    rows = sorted({r for r, _ in _slots(packed, "row_max")})
    for r in rows:
        if r < LENS[1]:
            assert f"query {r} (packed row {lo + r})" in packed["coordinates"]
    k0 = 64 * rnd
    k1 = min(k0 + 64, LENS[1]) - 1
    assert f"round {rnd}'s keys {k0}..{k1} of sequence 1 are rows {lo + k0}..{lo + k1} of the packed k, v" \
        in packed["coordinates"]


# -- split-KV decoding --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def decode_npz(tmp_path_factory):
    """One query against a cache of 300 keys, d 32, as an --npz file, and its arrays."""
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((1, 1, n, 32)).astype(np.float16) for n in (1, NK, NK))
    path = tmp_path_factory.mktemp("decode") / "decode.npz"
    np.savez(path, q=q, k=k, v=v)
    return str(path), q, k, v


@pytest.mark.parametrize("split, rnd, lane", [(1, 1, 1), (2, 0, 2)], ids=["split1-round1", "split2-tail"])
def test_split_lane_sections_are_the_dense_run_on_the_splits_keys(tmp_path, decode_npz, split, rnd, lane):
    path, q, k, v = decode_npz
    story = _json(["trace", "--npz", path, "--splits", "3", "--split", str(split), "--round", str(rnd), "--lane",
                   str(lane), "--json"])
    lo, hi = 128 * split, min(128 * (split + 1), NK)  # 2 K/V tiles of 64 per split
    alone = tmp_path / "alone.npz"
    np.savez(alone, q=q, k=k[:, :, lo:hi], v=v[:, :, lo:hi])
    dense = _json(["trace", "--npz", str(alone), "--engine", "program", "--round", str(rnd), "--lane", str(lane),
                   "--json"])
    assert story["cta"] == split and story["split"].startswith(f"split-KV, CTA {split}: split {split} of 3")
    assert set(story["state"]) >= set(SECTIONS)
    for name in SECTIONS:
        assert _slots(story, name) == _slots(dense, name, lo if name in KEYED else 0), name
    keys = {c for (_, c) in _slots(story, "s_acc")}
    assert keys and keys <= set(range(lo + 64 * rnd, lo + 64 * rnd + 64))  # the cache's keys of the round's block
    assert f"cache keys {lo + 64 * rnd}..{min(lo + 64 * rnd + 64, NK) - 1} (split {split} covers keys {lo}..{hi - 1})" \
        in story["coordinates"]

    # the combine step of the lane's row (query 0: lanes 0..3 of warp 0 hold it)
    (row,) = story["combine"]
    assert row["row"] == 0 and row["name"] == "batch 0, head 0, query 0"
    q0, kk, vv = q[0, 0], k[0, 0], v[0, 0]
    lse64 = [_attention64(q0, kk[a:min(a + 128, NK)], vv[a:min(a + 128, NK)])[1][0] for a in (0, 128, 256)]
    lse = np.array(row["lse"], np.float64)
    assert np.allclose(lse, lse64, rtol=0, atol=2e-5)
    assert row["m"] == max(row["lse"])
    w64 = np.exp(lse - lse.max())
    assert np.allclose(row["weights"], w64, rtol=1e-6, atol=0) and abs(row["l"] - w64.sum()) <= 1e-6 * w64.sum()
    normal = fa_sim.simulate(q, k, v, splits=3, engine="ptx")  # the normal build's split-KV run: O and LSE
    assert np.float32(row["lse_final"]) == np.float32(normal.lse[0, 0, 0])
    ref_o, ref_lse = _attention64(q0, kk, vv)
    assert abs(row["lse_final"] - ref_lse[0]) <= 2e-5
    own = _slots(story, "o_final")
    assert row["cols"]
    for col in row["cols"]:
        c, parts = col["col"], np.array(col["splits"], np.float32)
        assert parts[split] == np.float32(own[(0, c)])  # the split's partial O is the lane's O after division
        assert np.float16(col["o"]) == np.float16(normal.o[0, 0, 0, c])
        assert abs(col["o"] - ref_o[0, c]) <= 2e-3
        acc = np.float32(0)  # fa2_combine.cu: acc += w_s O_s in split order, then acc * rcp(l), cvt.rn to fp16
        for w, x in zip(np.array(row["weights"], np.float32), parts):
            acc = np.float32(acc + np.float32(w * x))
        assert np.float16(np.float32(acc * np.float32(np.float32(1) / np.float32(row["l"])))) == np.float16(col["o"])


def test_split_lane_of_a_gqa_packed_launch_names_each_row(capsys):
    """GQA packed (4 Q heads per K/V head, one query each): launch row r is Q head r of the group; the combine
    names it and its final O is the normal run's O of that Q head."""
    argv = ["trace", "--batch", "2", "--heads", "4", "--heads-k", "1", "--seqlen", "1", "--seqlen-k", "300",
            "--head-dim", "32", "--splits", "3", "--cache-seqlens", "300,170", "--split", "1", "--cta", "1",
            "--lane", "4", "--json"]
    story = _json(argv)
    assert story["cta"] == 3 and "row 1 (batch 1, Q head 1, query 0)" in story["coordinates"]
    (row,) = story["combine"]
    assert row["name"] == "batch 1, Q head 1, query 0 (launch row 1)" and row["lse"][2] == "-inf"
    assert row["weights"][2] == 0
    q, k, v = random_inputs(2, 4, 1, 300, 32, 0, heads_k=1)
    normal = fa_sim.simulate(q, k, v, splits=3, cache_seqlens=np.array([300, 170], np.int32), engine="ptx")
    for col in row["cols"]:
        assert np.float16(col["o"]) == np.float16(normal.o[1, 1, 0, col["col"]])


@pytest.mark.parametrize("argv, message", [
    (["--seqlens", "5,70", "--sequence", "2"], "--sequence 2 is outside the packed batch's sequences: 2 of them, "
                                               "0..1"),
    (["--seqlens", "5,70", "--sequence", "1", "--cta", "2"], "--cta 2 is outside --sequence 1's CTAs: with "
                                                             "--sequence, --cta is blockIdx.x + 2 * head (2 Q blocks "
                                                             "of the longest sequence x 1 heads), 0..1"),
    (["--seqlens", "5,70", "--sequence", "0", "--cta", "1"], "--cta 1 runs no round: CTA 1: sequence 0"),
    (["--seqlens", "5,70", "--sequence", "1", "--cta", "1", "--round", "2"], "--round 2 is not a round of CTA 3"),
    (["--sequence", "0"], "--sequence applies to a packed batch only"),
    (["--split", "0"], "--split applies to split-KV decoding only"),
    (["--seqlen", "1", "--seqlen-k", "300", "--splits", "3", "--split", "3"],
     "--split 3 is outside the split launch's splits (--splits 3): 3 of them, 0..2"),
    (["--seqlen", "1", "--seqlen-k", "300", "--splits", "3", "--split", "0", "--cta", "1"],
     "--cta 1 is outside --split 0's CTAs: with --split, --cta is blockIdx.x + 1 * (batch * H + head)"),
    (["--seqlen", "1", "--seqlen-k", "300", "--splits", "3", "--split", "1", "--round", "2"],
     "--round 2 is not a round of CTA 1: it runs rounds 0..1"),
    (["--seqlens", "5,70", "--sequence", "1", "--backward"], "does not apply with --backward"),
])
def test_sequence_and_split_refusals(capsys, argv, message):
    assert message in _refused(["trace", "--head-dim", "32", *argv], capsys)
