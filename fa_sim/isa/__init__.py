"""SM80 instruction semantics, one module per family, each a pure function over lane arrays
`[..., W, 32, ...]` (PTX ISA; see docs/hardware_facts.md). Nothing here knows of attention:

  sm80        the machine's constants (warp, banks, MMA shapes, shared-memory limits)
  cp_async    cp.async.{ca,cg} with zero fill, commit_group, wait_group N (per-thread groups)
  ldmatrix    ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{.trans}.shared.b16
  mma         mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 (+ the accumulation model)
  shfl        shfl.sync.{up,down,bfly,idx}.b32
  shared      ld.shared / st.shared of 1, 2, 4, 8 and 16 bytes
  barrier     bar.sync 0

and the arithmetic the PTX engine executes for any kernel (fa_sim.ptx.ops calls them):

  integer     add sub mul mad mul24 mad24 sad div rem abs neg min max dp4a dp2a
  bits        and/or/xor/not cnot lop3 shl shr shf popc clz brev bfind bfe bfi prmt fns szext bmsk
  floating    f32/f64 add sub mul fma div rcp sqrt (exact in every rounding mode) abs neg min max
  half        f16/f16x2/bf16/bf16x2 add sub mul fma neg abs min max
  convert     cvt between all integer and floating types
  compare     setp/set comparisons and Boolean combination, bit-exact select
  sfu         the .approx forms: the fp32 ex2 lg2 rcp rsqrt sqrt sin cos (and div.approx) bit-exact
              through mufu; tanh.approx.f32, div.full.f32 and the f16/bf16/f64 approximations
              within PTX's error bound only, each warning NotBitExactWarning once
  mufu        the H200's MUFU, bit-exact: table lookup and quadratic interpolation (mufu_table,
              coefficients in mufu_data/mufu_tables.json)
  cuda_math   CUDA math-library functions as NVRTC compiles them, operation by operation
  rounding    exact rounding to f16/bf16/tf32/f32/f64 (round-to-odd), .ftz, .sat
  nans        the NaN bit patterns the H200 writes (f64 payload precedence), measured
  exact       float64 in directed rounding modes through Python integers (the slow path)
  fp32        the hand-written program's fma_rn / ex2_approx_ftz (delegating to the above)
"""

from .barrier import bar_sync
from .cp_async import commit_group, wait_group_done, zero_fill
from .ldmatrix import LdmatrixIndex, ldmatrix, ldmatrix_index
from .mma import accumulate, mma_chain, mma_m16n8k16, mma_tiles
from .shared import ld_shared, shared_units, st_shared, unit_dtype
from .shfl import FULL_MASK, bfly_source, shfl_bfly, shfl_source, shfl_sync

__all__ = ["FULL_MASK", "LdmatrixIndex", "accumulate", "bar_sync", "bfly_source", "commit_group", "ld_shared",
           "ldmatrix", "ldmatrix_index", "mma_chain", "mma_m16n8k16", "mma_tiles", "shared_units", "shfl_bfly", "shfl_source",
           "shfl_sync", "st_shared", "unit_dtype", "wait_group_done", "zero_fill"]
