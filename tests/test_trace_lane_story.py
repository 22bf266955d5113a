"""Lane traces of the simulated kernel against the spec's lane facts (spec sections and tables
cited per test). Inputs are integer-valued or coordinate-encoding so every check is exact."""

import json

import numpy as np
import pytest

from fa_sim.config import KernelConfig
from fa_sim.checkpoints import Checkpoint
from fa_sim.events import Op
from fa_sim.kernels.labels import Phase
from fa_sim.observers.runs import Problem, run_trace
from fa_sim.observers.story import format_story, lane_story, story_json
from fa_sim.observers.trace import TraceFilter

CFG = KernelConfig()
N = 128


def coord_inputs():
    """S(q, k) = q + 128 k exactly: Q[q] = (q, 1, 0...), K[k] = (1, 128 k, 0...); V random ints."""
    q = np.zeros((1, 1, N, 64), np.float16)
    k = np.zeros_like(q)
    q[0, 0, :, 0], q[0, 0, :, 1] = np.arange(N), 1
    k[0, 0, :, 0], k[0, 0, :, 1] = 1, 128 * np.arange(N)
    v = np.random.default_rng(1).integers(-4, 5, q.shape).astype(np.float16)
    return q, k, v


def int_inputs(seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.integers(-3, 4, (1, 1, N, 64)).astype(np.float16) for _ in range(3))


@pytest.fixture(scope="module")
def quad():
    """Lanes 0..7 of warp 0, CTA 0, round 0, integer inputs (non-causal and causal)."""
    inputs = int_inputs()
    filt = TraceFilter(ctas=(0,), warps=(0,), lanes=tuple(range(8)), rounds=(0,))
    return inputs, run_trace(CFG, filt, inputs=inputs), run_trace(CFG, filt, causal=True, inputs=inputs)


def steps(story, op, phase=None):
    return [s for s in story.steps if s.op is op and (phase is None or s.phase == phase.value)]


def test_lane0_operands_and_accumulators(quad):
    """Spec section 5, "32 lanes feed one MMA": lane 0 holds Q rows 0, 8 at d 0, 1, 8, 9, K key 0 at
    the same d, and accumulates S(0,0), S(0,1), S(8,0), S(8,1)."""
    (q, k, _), tr, _ = quad
    st = lane_story(tr, 0, 0, 0, 0)
    ldq = [s for s in steps(st, Op.LDSM) if s.matrix == "Q"][0]
    assert ldq.coords == ((0, 0), (0, 1), (8, 0), (8, 1), (0, 8), (0, 9), (8, 8), (8, 9))
    assert list(ldq.values) == [float(q[0, 0, r, c]) for r, c in ldq.coords]  # bit-exact data movement
    ldk = [s for s in steps(st, Op.LDSM) if s.matrix == "K"][0]
    assert ldk.coords[:4] == ((0, 0), (0, 1), (0, 8), (0, 9))
    assert list(ldk.values) == [float(k[0, 0, r, c]) for r, c in ldk.coords]
    mma = steps(st, Op.HMMA, Phase.QK)[0]
    assert mma.coords == ((0, 0), (0, 1), (8, 0), (8, 1))
    # lane 1: same Q rows at d 2, 3, 10, 11; lane 4: S of queries 1, 9 at keys 0, 1
    lane1 = [s for s in steps(lane_story(tr, 0, 0, 1, 0), Op.LDSM) if s.matrix == "Q"][0]
    assert sorted({c for _, c in lane1.coords}) == [2, 3, 10, 11] and {r for r, _ in lane1.coords} == {0, 8}
    assert steps(lane_story(tr, 0, 0, 4, 0), Op.HMMA, Phase.QK)[0].coords == ((1, 0), (1, 1), (9, 0), (9, 1))


def test_s_slots_sit_at_their_coordinates():
    """Spec section 5, "Any lane's coordinates": with S(q,k) = q + 128k, every S slot of lanes 0..31
    of warp 1, round 1, holds exactly its own coordinate; so does every mma output of the trace."""
    tr = run_trace(CFG, TraceFilter(ctas=(0,), warps=(1,), rounds=(1,)), inputs=coord_inputs())
    for lane in range(32):
        st = lane_story(tr, 0, 1, lane, 1)
        slots = st.slots(Checkpoint.S_ACC)
        assert len(slots) == 32 and {sl.row for sl in slots} == {16 + lane // 4, 24 + lane // 4}
        assert all(sl.value == sl.row + 128 * sl.col for sl in slots)
        last = steps(st, Op.HMMA, Phase.QK)[-8:]  # the final k-segment's 8 n8 tiles
        assert all(v == r + 128 * c for s in last for (r, c), v in zip(s.coords, s.values))


def test_table6_columns_of_lanes_0_to_3(quad):
    """Spec table 6: lane a holds keys 8j + 2a + {0, 1} of query 0 and of query 8."""
    _, tr, _ = quad
    for lane in range(4):
        st = lane_story(tr, 0, 0, lane, 0)
        for query in (0, 8):
            cols = sorted(sl.col for sl in st.slots(Checkpoint.S_ACC) if sl.row == query)
            assert cols == sorted(8 * j + 2 * lane + b for j in range(8) for b in (0, 1))


def test_table4_causal_kept_keys(quad):
    """Spec table 4 (CTA 0, round 0, warp 0): the keys each of lanes 0..3 keeps after masking."""
    _, _, causal = quad
    expect = {0: {0: [0], 8: [0, 1, 8]}, 1: {0: [], 8: [2, 3]}, 2: {0: [], 8: [4, 5]}, 3: {0: [], 8: [6, 7]}}
    for lane, kept in expect.items():
        assert lane_story(causal, 0, 0, lane, 0).kept_keys() == kept


def test_shuffle_partners_table5(quad):
    """Spec: lane 0 reads lane 2 then lane 1 (XOR 2, XOR 1), for max and then for the sum, for each
    of its two rows; lane 4's partners are 6 then 5 (table 5: the quad keeps its group)."""
    _, tr, _ = quad
    assert lane_story(tr, 0, 0, 0, 0).partners == [2, 2, 1, 1, 2, 2, 1, 1]
    assert lane_story(tr, 0, 0, 4, 0).partners == [6, 6, 5, 5, 6, 6, 5, 5]


def test_table7_quad_max_reduction():
    """Spec table 7: a query row (-4, -3, -2, -1, 0, 1, 2, 3, -5, ...): thread-local maxima -3, -1, 1,
    3; after XOR 2: 1, 3, 1, 3; after XOR 1: 3 everywhere."""
    q = np.zeros((1, 1, 64, 64), np.float16)
    k = np.zeros_like(q)
    q[0, 0, 0, 0] = 1  # S(0, key) = K[key, 0]
    k[0, 0, :, 0] = -5
    k[0, 0, :8, 0] = np.arange(-4, 4)
    tr = run_trace(CFG, TraceFilter(ctas=(0,), warps=(0,), lanes=(0, 1, 2, 3), rounds=(0,),
                                    ops=frozenset({Op.SHFL})), Problem(seqlen=64), inputs=(q, k, q))
    shfl = [r for r in tr.records if r.op is Op.SHFL]
    first, second = shfl[0], shfl[1]  # SCHEDULE.md: max XOR 2, max XOR 1, then the sum's
    row0 = (0, 0)  # instruction r = 0 is row slot 0 (query 0)
    assert np.concatenate(list(first.regs_in.values()), -1)[row0].ravel().tolist() == [-3, -1, 1, 3]
    assert np.concatenate(list(second.regs_in.values()), -1)[row0].ravel().tolist() == [1, 3, 1, 3]
    m = next(c for c in tr.checkpoints if c.checkpoint is Checkpoint.ROW_MAX)
    assert m.values[0, :, 0].view(np.float32).tolist() == [3, 3, 3, 3]
    assert first.shfl_src[0, 0].tolist() == [2, 3, 0, 1] and second.shfl_src[0, 0].tolist() == [1, 0, 3, 2]


def test_story_text_and_json(quad):
    _, tr, causal = quad
    text = format_story(lane_story(causal, 0, 0, 0, 0))
    assert "Q(0,0)=" in text and "S(8,1)=" in text and "partner lane 2" in text
    assert "kept keys after masking: query 0: 0; query 8: 0, 1, 8" in text
    js = json.loads(json.dumps(story_json(lane_story(tr, 0, 0, 0, 0)), allow_nan=False))
    assert js["partners"][:2] == [2, 2] and js["steps"][0]["op"] == "LDGSTS"
    with pytest.raises(ValueError, match="not traced"):
        lane_story(tr, 0, 1, 0, 0)
    with pytest.raises(ValueError, match="lane 40"):
        lane_story(tr, 0, 0, 40, 0)
    with pytest.raises(ValueError, match="causal CTAs stop early"):
        lane_story(causal, 0, 0, 0, 1)


def test_fa_trace_cli(capsys):
    from fa_sim.cli import main

    assert main(["trace", "--causal", "--json", "--lane", "1"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert js["lane"] == 1 and js["kept_keys"] == {"0": [], "8": [2, 3]}
    assert js["partners"][:4] == [3, 3, 0, 0]


def test_ptx_trace_names_the_shuffled_register_and_its_value():
    """On the PTX engine a shfl.sync.bfly.b32 line names its destination register with the word it
    received and that word's fp32 reading; the (partner, value) pairs are the program's (spec tables
    5-7: XOR 2, then XOR 1, for each of the lane's two rows; the PTX finishes one row before the
    other, the program does both rows at once)."""
    import re

    inputs = int_inputs()
    filt = TraceFilter(ctas=(0,), warps=(0,), lanes=(0,), rounds=(0,), ops=(Op.SHFL,))
    ptx = lane_story(run_trace(CFG, filt, inputs=inputs, engine="ptx"), 0, 0, 0, 0)
    prog = lane_story(run_trace(CFG, filt, inputs=inputs), 0, 0, 0, 0)
    got = []
    for s in ptx.steps:
        dst = s.ptx.split()[1].split("|")[0].rstrip(",")
        m = re.fullmatch(rf"{re.escape(dst)}=0x([0-9a-f]{{8}})\((\S+)\)", s.regs)
        assert m, s.regs
        word = float(np.uint32(int(m.group(1), 16)).view(np.float32))
        assert f"{word:.6g}" == m.group(2), s.regs
        got.append((s.partner, word))
    want = [(p.partner, float(v)) for p in prog.steps for v in p.values]
    assert len(got) == 8 and sorted(got) == sorted(want)
