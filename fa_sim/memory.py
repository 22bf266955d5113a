"""Global memory of a launch: named buffers at 64-bit byte addresses, as a kernel sees its
pointer parameters (PTX `#state-spaces-global`; generic addresses of global memory are global
addresses, so `cvta.to.global` is the identity here).

Each buffer starts at its own 64 GiB slot (`SLOT`, from a base that looks like a device address;
more than 256-byte aligned, what cudaMalloc guarantees) and at least `GUARD` (4 GiB) of unmapped
addresses follow it, so that an index past the end of one buffer (or before its start) does not
land in its neighbour: every access names its lanes' addresses, and an active lane whose access is
not inside one buffer, or not aligned to its width, is a `KernelFault` (the hardware's illegal /
misaligned address), reported with the address and the nearest buffer. (A GPU's allocator may
pack buffers next to each other, where such a bug corrupts a neighbour silently; the simulator
reports it instead.) Accesses are vectorised: the common
case - all active addresses inside one buffer - is one gather or scatter on a typed view.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import KernelFault

BASE_ADDRESS = 0x7F00_0000_0000  # first buffer; looks like a CUDA device address
ALIGN = 256  # cudaMalloc's guarantee (every SLOT boundary is one)
SLOT = 1 << 36  # each buffer starts on a 64 GiB boundary: addresses stay readable (0x7f1000000000, ...)
GUARD = 1 << 32  # unmapped bytes at least after every buffer: a stray index faults, not corrupts
WORD_DTYPES = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


@dataclass(eq=False)
class Buffer:
    """One allocation: `data` is its bytes (a uint8 view of the array it was made from)."""

    name: str
    base: int
    data: np.ndarray  # [nbytes] uint8
    array: np.ndarray  # the array as allocated (shape and dtype kept for the caller)

    @property
    def nbytes(self) -> int:
        return self.data.size

    @property
    def end(self) -> int:
        return self.base + self.data.size


class GlobalMemory:
    """The launch's buffers; `alloc` places one and returns it (its `.base` is the pointer)."""

    def __init__(self) -> None:
        self.buffers: list[Buffer] = []
        self._next = BASE_ADDRESS

    def alloc(self, name: str, array: np.ndarray) -> Buffer:
        """Place `array` (kept, not copied, when it is C-contiguous) at the next free slot."""
        a = np.ascontiguousarray(array)
        buf = Buffer(name, self._next, a.reshape(-1).view(np.uint8), a)
        self.buffers.append(buf)
        self._next += -(-(max(a.nbytes, 1) + GUARD) // SLOT) * SLOT
        return buf

    def buffer(self, name: str) -> Buffer:
        for b in self.buffers:
            if b.name == name:
                return b
        raise KeyError(f"no global buffer named {name!r} (have: {[b.name for b in self.buffers]})")

    # -- locating addresses ------------------------------------------------------------------------
    def locate(self, addr: np.ndarray, width: int, mask: np.ndarray, what: str = "access") -> tuple[Buffer | None, np.ndarray]:
        """The one buffer every active address falls in, and the byte offsets into it.

        addr, mask: same shape; returns (buffer, offsets addr - base, also for masked-off lanes,
        whose offsets may lie outside the buffer: use `safe`). When the
        active addresses span several buffers, returns (None, offsets into a flat index of all
        buffers) - see `gather`/`scatter`. Faults on addresses outside every buffer or misaligned.
        """
        addr = np.asarray(addr, dtype=np.int64)
        on = np.asarray(mask, dtype=bool)
        if on.all():  # the common case: no lane masked off, no boolean selection needed
            if not addr.size:
                return (self.buffers[0] if self.buffers else None), np.zeros(addr.shape, np.int64)
            lo, hi = int(addr.min()), int(addr.max()) + width
        elif not on.any():
            return (self.buffers[0] if self.buffers else None), np.zeros(addr.shape, np.int64)
        else:
            lo, hi = int(addr[on].min()), int(addr[on].max()) + width
        for b in self.buffers:
            if b.base <= lo and hi <= b.end:
                self._check_align(addr, on, width, what)
                return b, addr - b.base
        return None, self._multi(addr, on, width, what)

    def _check_align(self, addr, on, width, what) -> None:
        if width & (width - 1) == 0:  # a power of two: a mask, not a division
            if not np.bitwise_and(addr, width - 1).any():
                return
        bad = on & (addr % width != 0)
        if bad.any():
            a = int(addr[bad][0])
            raise KernelFault(f"misaligned global {what}: {width}-byte access at address {a:#x}")

    def _multi(self, addr, on, width, what) -> np.ndarray:
        """Offsets into the concatenation of all buffers (for accesses spanning buffers)."""
        bases = np.array([b.base for b in self.buffers], dtype=np.int64)
        ends = np.array([b.end for b in self.buffers], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum([b.nbytes for b in self.buffers])[:-1]])
        i = np.clip(np.searchsorted(bases, addr, side="right") - 1, 0, len(bases) - 1)
        inside = (addr >= bases[i]) & (addr + width <= ends[i])
        bad = on & ~inside
        if bad.any():
            raise KernelFault(f"illegal global {what}: {self._describe(int(addr[bad][0]), width)}")
        self._check_align(addr, on, width, what)
        return np.where(on, addr - bases[i] + starts[i], 0)

    def _describe(self, a: int, width: int) -> str:
        if not self.buffers:
            return f"{width} bytes at {a:#x}, no buffer is allocated"
        near = min(self.buffers, key=lambda b: min(abs(a - b.base), abs(a - b.end)))
        side = (f"{a + width - near.end} bytes past its end" if a >= near.base
                else f"{near.base - a} bytes before its start")
        return (f"{width} bytes at {a:#x}, outside every buffer (nearest: {near.name!r} "
                f"[{near.base:#x}, {near.end:#x}) of {near.nbytes} bytes, {a - near.base:+d} bytes from its "
                f"start: {side})")

    # -- data ----------------------------------------------------------------------------------------
    def gather(self, addr: np.ndarray, width: int, mask: np.ndarray, what: str = "load") -> np.ndarray:
        """Bytes at each active address: [..., width] uint8 (zeros where masked off)."""
        buf, off = self.locate(addr, width, mask, what)
        on = np.asarray(mask, bool)
        everywhere = on.all()
        off = off if everywhere else np.where(on, off, 0)
        if buf is None:  # spanning buffers: each access lies in one (locate checked it); gather buffer by buffer
            out = np.zeros((*off.shape, width), np.uint8)  # (not from their concatenation: a copy of every
            for b, (lo, hi) in self._spans():              # buffer, gigabytes for a large problem, per access)
                sel = on & (off >= lo) & (off < hi)
                if sel.any():
                    out[sel] = b.data[(off[sel] - lo)[:, None] + np.arange(width)]
            return out
        data = buf.data
        if width == 16 and data.size % 16 == 0:  # one 16-byte row per access
            out = np.take(data.reshape(-1, 16), off // 16, axis=0)
        elif width in WORD_DTYPES and width > 1 and data.size % width == 0:  # a word view needs whole words
            words = data.view(WORD_DTYPES[width])[off // width]
            out = words.view(np.uint8).reshape(*off.shape, width)
        elif width % 8 == 0 and data.size % 8 == 0:
            idx = (off // 8)[..., None] + np.arange(width // 8)
            out = data.view(np.uint64)[idx].view(np.uint8).reshape(*off.shape, width)
        else:
            out = data[off[..., None] + np.arange(width)]
        return out if everywhere else np.where(on[..., None], out, np.uint8(0))

    def scatter(self, addr: np.ndarray, values: np.ndarray, mask: np.ndarray, what: str = "store") -> None:
        """Store values [..., width] uint8 at the active addresses (later lanes win on overlap)."""
        width = values.shape[-1]
        buf, off = self.locate(addr, width, mask, what)
        on = np.asarray(mask, bool)
        off = np.where(on, off, 0)
        if buf is None:
            for b, (lo, hi) in self._spans():
                sel = on & (off >= lo) & (off < hi)
                if sel.any():
                    self._store(b, off - lo, values, sel)
            return
        self._store(buf, off, values, on)

    def _spans(self):
        start = 0
        for b in self.buffers:
            yield b, (start, start + b.nbytes)
            start += b.nbytes

    @staticmethod
    def _store(buf: Buffer, off: np.ndarray, values: np.ndarray, on: np.ndarray) -> None:
        width = values.shape[-1]
        if width in WORD_DTYPES and width > 1 and buf.data.size % width == 0:
            words = np.ascontiguousarray(values).view(WORD_DTYPES[width])[..., 0]
            buf.data.view(WORD_DTYPES[width])[off[on] // width] = words[on]
        else:
            idx = off[..., None] + np.arange(width)
            buf.data[idx[on]] = values[on]
