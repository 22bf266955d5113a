"""cp.async.cg.shared.global (16 bytes, zero-fill), cp.async.commit_group, cp.async.wait_group N.

PTX anchors: `#data-movement-and-conversion-instructions-cp-async`,
`#data-movement-and-conversion-instructions-cp-async-commit-group`,
`#data-movement-and-conversion-instructions-cp-async-wait-group` (notes/gpu_facts.md).
- .cg copies exactly 16 bytes; a src-size below 16 zero-fills the rest (src-size 0: all zeros).
- Groups are per thread: commit_group closes the thread's open group (possibly empty);
  wait_group N returns once at most N of the thread's most recent committed groups are pending.
- The bytes become visible to the issuing thread after its wait (the machine writes them then).

A copy remembers `group` = the number of groups its thread had committed when it was issued,
i.e. the index of the open group it joins. After `committed` commits, wait_group N completes
every copy with group < committed - N; copies still in the open group are not waited for.
"""

from __future__ import annotations

import numpy as np

CP_SIZE = 16  # bytes per .cg copy
CHUNK_WORDS = 2  # a 16-byte chunk as two uint64


def as_chunks(buf: np.ndarray) -> np.ndarray:
    """A contiguous buffer viewed as 16-byte chunks: [n_chunks, 2] uint64."""
    flat = np.ascontiguousarray(buf).reshape(-1)
    if flat.nbytes % CP_SIZE:
        raise ValueError(f"buffer of {flat.nbytes} bytes is not a whole number of 16-byte chunks")
    return flat.view(np.uint64).reshape(-1, CHUNK_WORDS)


def cp_async_cg(src_chunks: np.ndarray, src_chunk: np.ndarray, src_size: np.ndarray) -> np.ndarray:
    """The 16 bytes each lane copies: src_chunks [G, 2] uint64 (global memory as chunks),
    src_chunk [...] int64 chunk index per lane, src_size [...] int64 bytes read (0..16).

    Returns [..., 2] uint64: the source bytes, zero past src-size."""
    src_size = np.asarray(src_size)
    if np.any((src_size < 0) | (src_size > CP_SIZE)):
        raise ValueError("cp.async.cg src-size must lie in 0..16")
    data = np.take(src_chunks, src_chunk, axis=0)  # [..., 2] u64
    full = src_size == CP_SIZE
    if np.all(full):
        return data
    if np.all(full | (src_size == 0)):
        data[~full] = 0
        return data
    keep = np.arange(CP_SIZE) < src_size[..., None]  # [..., 16] bool
    data_bytes = data.view(np.uint8) * keep
    return np.ascontiguousarray(data_bytes, dtype=np.uint8).view(np.uint64)


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
