"""SM80 constants: the numbers of the machine, in one place (PTX ISA and the CUDA programming
guide's compute-capability 8.0 tables; Nsight Compute's shared-memory model).

Everything that is a property of the hardware - warp size, register file, shared-memory banks and
limits, MMA and copy shapes - lives here; kernel shapes (fa_sim.config) and observers import it.
"""

from __future__ import annotations

WARP_SIZE = 32
FULL_MASK = 0xFFFFFFFF  # every lane of a warp (shfl.sync / bar.warp membermask)

# mma.sync.aligned.m16n8k16 (#warp-level-matrix-fragment-mma-16816-float)
MMA_M, MMA_N, MMA_K = 16, 8, 16

# ldmatrix.m8n8 (#warp-level-matrix-instructions-ldmatrix): 8 rows of 16 bytes per matrix
LDSM_ROW_BYTES = 16
LDSM_NUMS = (1, 2, 4)

# cp.async (#data-movement-and-conversion-instructions-cp-async): .ca 4/8/16 bytes, .cg 16
CP_ASYNC_CG_BYTES = 16
CP_ASYNC_CA_BYTES = (4, 8, 16)

# Shared memory: 32 banks of 4 bytes (bank = byte address / 4 mod 32)
N_BANKS = 32
BANK_BYTES = 4
SMEM_OPT_IN_BYTES = 163 * 1024  # largest dynamic shared memory per CTA on sm_80 (opt-in)
SMEM_PER_SM_BYTES = 164 * 1024  # shared memory per SM on sm_80 (sm_90: 228 KB)
SMEM_RESERVED_BYTES = 1024  # the driver's per-CTA reservation

REGISTER_FILE = 65536  # 32-bit registers per SM (sm_80 and sm_90)
MAX_THREADS_PER_CTA = 1024
MAX_BLOCK_DIM = (1024, 1024, 64)  # blockDim.x, .y, .z (and x * y * z <= MAX_THREADS_PER_CTA)
MAX_GRID_DIM = (2**31 - 1, 65535, 65535)  # gridDim.x, .y, .z

# Occupancy (CUDA programming guide, compute capability 8.0; the CUDA occupancy calculator's rules)
MAX_THREADS_PER_SM = 2048
MAX_CTAS_PER_SM = 32
MAX_REGISTERS_PER_THREAD = 255
SM_SUB_PARTITIONS = 4  # registers are allocated per warp within one of 4 sub-partitions
REGISTER_ALLOC_UNIT = 256  # registers per warp are allocated in units of 256
SMEM_ALLOC_UNIT = 128  # shared memory per CTA is allocated in units of 128 bytes
