"""SM80 instruction semantics, one module per family, each a pure function over lane arrays
`[..., W, 32, ...]` (PTX ISA; see notes/gpu_facts.md). Nothing here knows of attention:

  sm80        the machine's constants (warp, banks, MMA shapes, shared-memory limits)
  cp_async    cp.async.{ca,cg} with zero fill, commit_group, wait_group N (per-thread groups)
  ldmatrix    ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{.trans}.shared.b16
  mma         mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 (+ the accumulation model)
  shfl        shfl.sync.{up,down,bfly,idx}.b32
  shared      ld.shared / st.shared of 1, 2, 4, 8 and 16 bytes
  barrier     bar.sync 0
"""

from .barrier import bar_sync
from .cp_async import commit_group, wait_group_done, zero_fill
from .ldmatrix import LdmatrixIndex, ldmatrix, ldmatrix_index
from .mma import accumulate, mma_m16n8k16, mma_tiles
from .shared import ld_shared, shared_units, st_shared, unit_dtype
from .shfl import FULL_MASK, bfly_source, shfl_bfly, shfl_source, shfl_sync

__all__ = ["FULL_MASK", "LdmatrixIndex", "accumulate", "bar_sync", "bfly_source", "commit_group", "ld_shared",
           "ldmatrix", "ldmatrix_index", "mma_m16n8k16", "mma_tiles", "shared_units", "shfl_bfly", "shfl_source",
           "shfl_sync", "st_shared", "unit_dtype", "wait_group_done", "zero_fill"]
