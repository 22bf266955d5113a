"""fa_sim.ptx: the second front end of the SM80 machine - the PTX that NVRTC emits for a .cu,
parsed (parser.py, ir.py) and executed every thread of every CTA of a wave at once (engine.py,
ops/, machine_ops.py). `launch` runs any kernel on numpy buffers; fa2.py runs the attention
kernel for fa_sim.simulate(engine="ptx")."""

from .launch import LaunchResult, launch

__all__ = ["LaunchResult", "launch"]
