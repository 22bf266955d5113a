"""The instructions of the FlashAttention-2 forward kernel, one module per family, each a pure
function over lane arrays `[..., W, 32, ...]` (PTX ISA; see notes/gpu_facts.md):

  cp_async    cp.async.cg 16 B with zero fill, commit_group, wait_group N (per-thread groups)
  ldmatrix    ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{.trans}.shared.b16
  mma         mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 (+ the accumulation model)
  shfl        shfl.sync.bfly.b32
  shared      ld.shared / st.shared of 4, 8 and 16 bytes
  global_mem  ld.global / st.global, predicated
  barrier     bar.sync 0
"""

from .barrier import bar_sync
from .cp_async import as_chunks, commit_group, cp_async_cg, wait_group_done
from .global_mem import ld_global, st_global
from .ldmatrix import LdmatrixIndex, ldmatrix, ldmatrix_index
from .mma import accumulate, mma_m16n8k16, mma_tiles
from .shared import ld_shared, shared_words, st_shared
from .shfl import bfly_source, shfl_bfly

__all__ = ["accumulate", "as_chunks", "bar_sync", "bfly_source", "commit_group", "cp_async_cg",
           "ld_global", "ld_shared", "ldmatrix", "ldmatrix_index", "LdmatrixIndex", "mma_m16n8k16",
           "mma_tiles", "shared_words", "shfl_bfly", "st_global", "st_shared", "wait_group_done"]
