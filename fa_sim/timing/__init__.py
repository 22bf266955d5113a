"""Time: what the SM does cycle by cycle with the kernel's instruction stream.

`sass` - the cubin's SASS with the scheduling control information ptxas writes into every
instruction (stall counts, scoreboards, yield, operand reuse), tied to CUDA source lines.
"""
