"""Calibration against the H200: the probes that measured it and the fits that turned the
measurements into the simulator's models, and the commands that regenerate every recorded file
under tests/data and traces/golden (tests/data/README.md lists them).

Modules (each a command: `python -m fa_sim.calibrate.NAME --help`):
- sfu_ops, sfu_probe, sfu_device, sfu_results: the exhaustive MUFU measurement (run 1) and the
  candidate-model check (run 2); sfu_fit: the interpolator tables fitted to run 1 and the compact
  replay set; sfu_model_gen: the CUDA twin of the model (sfu_model.cu); sfu_binding: the inputs
  that pin every table coefficient, and their recorded outputs.
- alu_probe (with lanes, single PTX instructions through the handlers), mma_probe, ldgsts_probe:
  ALU forms, tensor-core accumulation, cp.async shared-memory wavefronts under Nsight Compute.
- seed_sass: the SASS hashes of the seed kernel; golden_traces: traces/golden; recordings: the
  table of recorded files and the comparison of a regenerated file with the committed one.

The GPU parts need the hw extra and cupy; everything else runs on the CPU.
"""
