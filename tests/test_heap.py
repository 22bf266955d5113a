"""fa_sim/heap.py: glibc takes the simulator's malloc thresholds, once per process."""

import platform
import sys

import pytest

from fa_sim import heap


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
                    reason="mallopt is glibc's")
def test_glibc_takes_the_thresholds_once():
    assert heap.tune() is True
    assert heap.tune() is True  # the second call changes nothing and says so


def test_the_thresholds_stay_within_glibcs_range():
    assert 128 << 10 <= heap.MMAP_THRESHOLD <= 32 << 20  # glibc refuses a larger mmap threshold on 64 bits
    assert heap.TRIM_THRESHOLD >= heap.MMAP_THRESHOLD
