"""isa.cp_async: 16-byte .cg copies with zero fill, and per-thread commit/wait groups
(notes/gpu_facts.md; PTX `#data-movement-and-conversion-instructions-cp-async`)."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fa_sim.isa import as_chunks, commit_group, cp_async_cg, wait_group_done

FIXED = settings(derandomize=True, database=None, max_examples=40, deadline=None)


def _global():
    return np.arange(64 * 8, dtype=np.uint16).reshape(64, 8)  # 64 chunks of 8 halves: element ids


def test_full_copy_moves_the_16_bytes_of_the_chunk():
    data = cp_async_cg(as_chunks(_global()), np.array([[5, 63]]), np.array([[16, 16]]))
    halves = data.view(np.uint16).reshape(1, 2, 8)
    np.testing.assert_array_equal(halves[0, 0], np.arange(40, 48))
    np.testing.assert_array_equal(halves[0, 1], np.arange(504, 512))


def test_src_size_zero_fills():
    data = cp_async_cg(as_chunks(_global()), np.array([3, 3, 3]), np.array([16, 0, 6]))
    b = data.view(np.uint8).reshape(3, 16)
    assert (b[1] == 0).all()
    np.testing.assert_array_equal(b[2, :6], b[0, :6])
    assert (b[2, 6:] == 0).all()
    with pytest.raises(ValueError, match="src-size"):
        cp_async_cg(as_chunks(_global()), np.array([0]), np.array([17]))


def _oracle(program, n_threads):
    """Per-thread lists of groups; returns, after each wait, which copies are complete."""
    open_ = [[] for _ in range(n_threads)]
    committed = [[] for _ in range(n_threads)]
    done, out = set(), []
    for step in program:
        kind, arg, who = step
        for t in range(n_threads):
            if not who[t]:
                continue
            if kind == "issue":
                open_[t].append((t, arg))
            elif kind == "commit":
                committed[t].append(open_[t])
                open_[t] = []
            else:
                finished = committed[t][: max(len(committed[t]) - arg, 0)]
                done.update(c for g in finished for c in g)
        if kind == "wait":
            out.append(sorted(done))
    return out


_steps = st.lists(st.tuples(st.sampled_from(["issue", "commit", "wait"]), st.integers(0, 2),
                            st.lists(st.booleans(), min_size=3, max_size=3)), max_size=14)


@FIXED
@given(program=_steps)
def test_wait_group_completes_all_but_the_n_most_recent_groups_per_thread(program):
    n = 3
    committed = np.zeros(n, dtype=np.int64)
    copies = []  # (thread, id, group)
    done, out = set(), []
    for i, (kind, arg, who) in enumerate(program):
        who = np.array(who)
        if kind == "issue":
            copies += [(t, i, committed[t]) for t in range(n) if who[t]]
            program[i] = ("issue", i, who.tolist())
        elif kind == "commit":
            committed = commit_group(committed, who)
        else:
            for t, cid, g in copies:
                if wait_group_done(np.array([g]), committed[t:t + 1], arg, who[t:t + 1])[0]:
                    done.add((t, cid))
            out.append(sorted(done))
    assert out == _oracle(program, n)
