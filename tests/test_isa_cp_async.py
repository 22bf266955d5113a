"""isa.cp_async: 16-byte .cg copies with zero fill, and per-thread commit/wait groups
(docs/hardware_facts.md; PTX `#data-movement-and-conversion-instructions-cp-async`)."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fa_sim.isa import commit_group, wait_group_done, zero_fill
from fa_sim.isa.cp_async import check_sizes

FIXED = settings(derandomize=True, database=None, max_examples=40, deadline=None)


def test_src_size_zero_fills():
    data = np.tile(np.arange(1, 17, dtype=np.uint8), (3, 1))  # [3 lanes, 16 bytes] as read
    b = zero_fill(data, np.array([16, 0, 6]))
    np.testing.assert_array_equal(b[0], data[0])
    assert (b[1] == 0).all()
    np.testing.assert_array_equal(b[2, :6], data[2, :6])
    assert (b[2, 6:] == 0).all()
    assert zero_fill(data, np.full(3, 16)) is data  # nothing to fill: no copy
    with pytest.raises(ValueError, match="src-size"):
        check_sizes(16, np.array([17]), "cg")
    with pytest.raises(ValueError, match="copies 16 bytes"):
        check_sizes(8, np.array([8]), "cg")
    check_sizes(8, np.array([4]), "ca")


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
