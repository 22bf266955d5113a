"""What one simulated launch runs, chosen once: the front end, the RunSpec, the CTA loop and the
run's global memory. Below both fa_sim.simulate (the serial run) and fa_sim.parallel (its shards),
which share everything here and nothing else.

The front end is a typed value made in one place, `choose_front_end`, from the user's arguments
(simulate's engine=/kernel=/mutation=, or the fa command's --engine/--kernel) and passed down:

    ProgramFrontEnd(mutation)   the hand-written program (fa_sim/kernels/fa2_fwd.py), the spec's
                                schedule only, optionally mutated (tests of the checkers)
    PtxFrontEnd(kernel)         the PTX NVRTC emits for fa2_fwd.cu (kernel None) or for a variant
                                with its parameters and FA_* macros (fa_sim/ptx/fa2.py)

engine None picks the front end the config needs (fa_sim.kernels.engine_for: the PTX engine for
schedule options) or the PTX engine when a kernel is given. Every refusal is a ValueError whose
words name the arguments as the caller spelt them (`Names`: API or CLI).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable, ClassVar, Union

import numpy as np

from . import heap
from .config import KernelConfig
from .contract import KernelSource, kernel_source
from .hub import Hub
from .kernels import (NO_MUTATION, FA2Labels, Mutation, Pointers, Problem, check_program_config,
                      check_program_problem, engine_for, flash_fwd, launch_info, wave_order)
from .machine import Machine
from .memory import GlobalMemory
from .tensorcore import FusedDotModel


class Engine(enum.Enum):
    """The two front ends of the SM80 machine, by the names simulate and the fa command take."""

    PROGRAM = "program"
    PTX = "ptx"


ENGINES = tuple(e.value for e in Engine)


@dataclass(frozen=True)
class ProgramFrontEnd:
    """The hand-written program; `mutation` drops or moves its barriers and waits."""

    mutation: Mutation = NO_MUTATION
    engine: ClassVar[Engine] = Engine.PROGRAM

    def describe(self) -> str:
        return "the hand-written program" + ("" if self.mutation == NO_MUTATION else " (mutated)")


@dataclass(frozen=True)
class PtxFrontEnd:
    """The PTX engine running the PTX of `kernel` (a variant's checked source: a .cu, or a patch
    applied to fa2_fwd.cu; fa_sim.contract), or of fa2_fwd.cu when None."""

    kernel: KernelSource | None = None
    engine: ClassVar[Engine] = Engine.PTX

    def describe(self) -> str:
        return f"the PTX engine ({'fa2_fwd.cu' if self.kernel is None else self.kernel.name})"


FrontEnd = Union[ProgramFrontEnd, PtxFrontEnd]
FRONT_ENDS = (ProgramFrontEnd, PtxFrontEnd)


@dataclass(frozen=True)
class Names:
    """What the chooser's messages call its inputs: simulate's keywords or the fa command's options."""

    engine: str
    kernel: str
    keywords: bool  # name=value (simulate) or name value (the fa command)

    def engine_is(self, engine: Engine) -> str:
        return f"{self.engine}={engine.value!r}" if self.keywords else f"{self.engine} {engine.value}"

    def kernel_is(self) -> str:
        """The kernel argument before its value, as a message names it."""
        return f"{self.kernel}=" if self.keywords else self.kernel


API = Names("engine", "kernel", keywords=True)
CLI = Names("--engine", "--kernel", keywords=False)


def kernel_variant(kernel, names: Names = API) -> KernelSource:
    """The checked source of a kernel variant (fa_sim.contract.kernel_source: a .cu, or a .patch
    against fa2_fwd.cu), its errors naming the argument as `names` say."""
    return kernel_source(kernel, option=names.kernel_is())


def choose_front_end(engine, kernel, config: KernelConfig, mutation: Mutation | None = None,
                     names: Names = API, problem: Problem | None = None) -> FrontEnd:
    """The front end that runs `config` (and `problem`'s features, when given: softcap needs the
    PTX engine), from engine (None, a name of ENGINES, or a FrontEnd already chosen), kernel (None
    or the path of a variant) and mutation (None or a Mutation); every check of the choice, the
    kernel file's included, is made here and nowhere else."""
    if isinstance(engine, FRONT_ENDS):
        if kernel is not None or mutation is not None:
            raise ValueError(f"{names.engine} is a chosen front end ({engine.describe()}); give its kernel and "
                             "mutation inside it (PtxFrontEnd(kernel), ProgramFrontEnd(mutation)), not beside it")
        front = engine
        if isinstance(front, PtxFrontEnd) and front.kernel is not None:
            front = PtxFrontEnd(kernel_variant(front.kernel, names))
    else:
        front = _choose(engine, kernel, config, mutation, names, problem)
    if isinstance(front, ProgramFrontEnd):
        check_program_config(config)
        if problem is not None:
            check_program_problem(problem, names.engine_is(Engine.PTX))
    return front


def _choose(engine, kernel, config: KernelConfig, mutation, names: Names, problem: Problem | None = None) -> FrontEnd:
    if engine is not None and not isinstance(engine, Engine) and engine not in ENGINES:
        raise ValueError(f"{names.engine} must be one of {ENGINES}, got {engine!r}")
    path = None if kernel is None else kernel_variant(kernel, names)
    chosen = (Engine(engine) if engine is not None else Engine.PTX if path is not None
              else Engine(engine_for(config, problem)))
    if chosen is Engine.PROGRAM and path is not None:
        raise ValueError(f"{names.kernel} is simulated by the PTX engine; drop {names.engine_is(Engine.PROGRAM)} "
                         f"or use {names.engine_is(Engine.PTX)}")
    if mutation is not None and not isinstance(mutation, Mutation):
        raise ValueError(f"mutation must be a fa_sim.kernels.Mutation, got {type(mutation).__name__}")
    if chosen is Engine.PTX:
        if mutation is not None:
            raise ValueError("mutation= changes the hand-written program; for the PTX engine compile a mutated .cu "
                             "(kernel=) instead")
        return PtxFrontEnd(path)
    return ProgramFrontEnd(NO_MUTATION if mutation is None else mutation)


@dataclass(frozen=True)
class RunSpec:
    """What runs, besides the inputs: the problem, the front end and the machine model (all
    picklable, so a worker of fa_sim.parallel runs the same)."""

    prob: Problem
    front: FrontEnd
    mma_model: FusedDotModel
    wave_ctas: int

    def waves(self) -> list[np.ndarray]:
        """The grid's waves: linear CTA ids by decreasing K/V rounds (stable: fa_sim.kernels.wave_order),
        wave_ctas at a time. CTAs of a wave run alike: a causal wave holds a few Q-block rows of
        every head rather than every Q block of a few heads, so it runs fewer rounds, its live CTAs
        (the program) and its parts (the PTX engine's split waves, fa_sim/ptx/waves.py) are fewer.
        Values do not depend on how CTAs are grouped into waves; the order is this one everywhere
        (serial run, shards, progress)."""
        order = wave_order(self.prob, np.arange(self.prob.n_ctas, dtype=np.int64))
        return [order[lo:lo + self.wave_ctas] for lo in range(0, len(order), self.wave_ctas)]

    def cta_rounds(self, ctas: np.ndarray) -> int:
        """Progress units of CTAs (linear ids): their K/V rounds, summed."""
        return int(self.prob.rounds_per_cta(ctas).sum())

    def launch_info(self):
        """What observers learn about the launch (fa_sim.kernels.launch_info), with the shared bytes
        a PTX-engine variant declares itself (`__shared__ int flag;`) before the dynamic ones."""
        if not isinstance(self.front, PtxFrontEnd) or self.front.kernel is None:
            return launch_info(self.prob)
        from .ptx.fa2 import attention_program

        program = attention_program(self.prob.config, self.prob.causal, False, self.front.kernel, self.prob)
        return launch_info(self.prob, program.dynamic_smem_offset)


def global_memory(prob: Problem, q16, k16, v16, o=None, lse=None) -> tuple[GlobalMemory, dict, Pointers]:
    """The kernel's buffers q, o ([B*H, Nq, d] fp16 bits), k, v ([B*H_k, Nk, d]) and lse ([B*H, Nq]
    fp32); o and lse are new zeros unless given (a worker of fa_sim.parallel writes into shared ones)."""
    b, h, nq, nk, d = prob.batch, prob.heads, prob.seqlen_q, prob.seqlen_k, prob.head_dim
    hk = prob.heads_k
    if prob.varlen:  # packed (FA_VARLEN): [H, total_q, d] and [H_k, total_k, d], head-major
        b, nq, nk = 1, prob.total_q, prob.total_k
    o = np.zeros((b * h, nq, d), np.uint16) if o is None else o.reshape(b * h, nq, d).view(np.uint16)
    lse = np.zeros((b * h, nq), np.float32) if lse is None else lse.reshape(b * h, nq)
    gmem = GlobalMemory()
    bufs = {name: gmem.alloc(name, a) for name, a in (
        ("q", q16.reshape(b * h, nq, d).view(np.uint16)), ("k", k16.reshape(b * hk, nk, d).view(np.uint16)),
        ("v", v16.reshape(b * hk, nk, d).view(np.uint16)), ("o", o), ("lse", lse))}
    return gmem, bufs, Pointers(*(bufs[n].base for n in ("q", "k", "v", "o", "lse")))


def run_ctas(spec: RunSpec, gmem: GlobalMemory, ptr: Pointers, hub: Hub, waves: list[np.ndarray],
             on_rounds: Callable[[int], None]) -> None:
    """Run waves (RunSpec.waves) on the spec's front end, telling on_rounds(n) about n CTA-rounds done.
    The serial run runs them all; a worker of fa_sim.parallel runs its shard's."""
    prob, front = spec.prob, spec.front
    heap.tune()  # numpy temporaries from the heap, without a page fault per page (fa_sim/heap.py)
    if isinstance(front, PtxFrontEnd):
        from .ptx.fa2 import run_attention  # the PTX engine loads (about 0.1 s) only for runs on it

        run_attention(prob, gmem, ptr, hub, waves, kernel=front.kernel, mma_model=spec.mma_model, on_rounds=on_rounds)
        return
    cfg = prob.config
    labels = FA2Labels(cfg, {"Q": prob.seqlen_q, "K": prob.seqlen_k, "V": prob.seqlen_k, "O": prob.seqlen_q,
                             "LSE": prob.seqlen_q})
    for wave in waves:
        model = spec.mma_model.for_operand("bf16" if cfg.dtype == "bf16" else "f16")  # the MMAs' A and B type
        m = Machine(cfg.n_warps, cfg.smem_bytes, gmem, wave, hub, model, labels)
        flash_fwd(m, prob, ptr, front.mutation, on_round=on_rounds)
