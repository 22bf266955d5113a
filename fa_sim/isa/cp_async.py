"""cp.async.{ca,cg}.shared.global (zero fill past src-size), cp.async.commit_group, wait_group N.

PTX anchors: `#data-movement-and-conversion-instructions-cp-async`,
`#data-movement-and-conversion-instructions-cp-async-commit-group`,
`#data-movement-and-conversion-instructions-cp-async-wait-group` (docs/hardware_facts.md).
- .cg copies exactly 16 bytes, .ca 4, 8 or 16; a src-size below cp-size zero-fills the rest
  (src-size 0: all zeros, nothing is read).
- Groups are per thread: commit_group closes the thread's open group (possibly empty);
  wait_group N returns once at most N of the thread's most recent committed groups are pending.
- The bytes become visible to the issuing thread after its wait (the machine writes them then).

A copy remembers `group` = the number of groups its thread had committed when it was issued,
i.e. the index of the open group it joins. After `committed` commits, wait_group N completes
every copy with group < committed - N; copies still in the open group are not waited for.
"""

from __future__ import annotations

import numpy as np

CG_BYTES = 16
CA_BYTES = (4, 8, 16)


def check_sizes(cp_size: int, src_size: np.ndarray, cache: str) -> None:
    allowed = (CG_BYTES,) if cache == "cg" else CA_BYTES
    if cp_size not in allowed:
        raise ValueError(f"cp.async.{cache} copies {' or '.join(map(str, allowed))} bytes, not {cp_size}")
    if np.any((src_size < 0) | (src_size > cp_size)):
        raise ValueError(f"cp.async src-size must lie in 0..{cp_size}")


def zero_fill(data: np.ndarray, src_size: np.ndarray) -> np.ndarray:
    """data [..., cp_size] uint8 as read; bytes at or past each lane's src_size [...] become 0."""
    if np.all(src_size >= data.shape[-1]):
        return data
    return data * (np.arange(data.shape[-1]) < np.asarray(src_size)[..., None])


def commit_group(committed: np.ndarray, active: np.ndarray) -> np.ndarray:
    """committed, active: [C, W, L]; every active thread closes its open group."""
    return committed + active


def wait_group_done(group: np.ndarray, committed: np.ndarray, n: int, active: np.ndarray) -> np.ndarray:
    """Which pending copies the active threads' wait_group n completes.

    group: [..., C, W, L] group index of each copy; committed, active: [C, W, L] -> bool like group.
    """
    if n < 0:
        raise ValueError("cp.async.wait_group N needs N >= 0")
    return active & (group < committed - n)
