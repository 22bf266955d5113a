"""The attention kernel as a hand-written program for the SM80 machine (front end 1), with its
labels, lane plans and program text."""

from ..problem import Problem  # the public type; re-exported for the kernel programs
from .fa2_fwd import (NO_MUTATION, Mutation, Pointers, check_program_config, check_program_problem, engine_for,
                      flash_fwd, launch_info, program_refusal, wave_order)
from .labels import FA2Labels, Phase, Site, Tensor, Tile, tile_base

__all__ = ["FA2Labels", "Mutation", "NO_MUTATION", "Phase", "Pointers", "Problem", "Site", "Tensor", "Tile",
           "check_program_config", "check_program_problem", "engine_for", "program_refusal", "flash_fwd",
           "launch_info", "tile_base", "wave_order"]
