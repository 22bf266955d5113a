"""CuTe's layout algebra in the spirit of pycute: integer tuples, `Layout`, `Swizzle`, `ComposedLayout`.

`Layout(shape, stride)` maps a coordinate to sum_i c_i * d_i: hierarchical coordinates are nested
tuples congruent with `shape`, an integer is a flat index unpacked colexicographically, and leaves
may be numpy arrays (one call evaluates every lane). `Swizzle(B, M, S)` is CuTe's XOR map on offsets,
`ComposedLayout` is swizzle o layout.

Pure algebra, no kernel: below fa_sim.config (whose KernelConfig.smem_offset applies the swizzle)
and fa_sim.layout (the kernel's maps built from it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

IntTuple = int | tuple


# -- integer tuples ---------------------------------------------------------------------------------
def flatten(t: IntTuple) -> tuple:
    """Leaves of a nested tuple, left to right."""
    return tuple(y for x in t for y in flatten(x)) if isinstance(t, tuple) else (t,)


def product(shape: IntTuple) -> int:
    """Number of coordinates of a shape: the product of its leaves."""
    return math.prod(flatten(shape))


def tree_map(f, t: IntTuple) -> IntTuple:
    return tuple(tree_map(f, x) for x in t) if isinstance(t, tuple) else f(t)


def _fmt(t: IntTuple) -> str:
    return "(" + ",".join(_fmt(x) for x in t) + ")" if isinstance(t, tuple) else str(t)


def _leaf(x):
    """Coordinate leaves: Python ints stay ints, anything array-like becomes int64."""
    return int(x) if isinstance(x, (int, np.integer)) else np.asarray(x, dtype=np.int64)


def compact_col_major(shape: IntTuple, current: int = 1) -> IntTuple:
    """LayoutLeft strides: exclusive prefix product; size-1 modes get stride 0, as CuTe prints."""
    if not isinstance(shape, tuple):
        return 0 if shape == 1 else current
    strides = []
    for s in shape:
        strides.append(compact_col_major(s, current))
        current *= product(s)
    return tuple(strides)


def idx2crd(idx, shape: IntTuple):
    """Colexicographic unpacking of a flat index; the last mode keeps the remainder (pycute)."""
    if not isinstance(shape, tuple):
        return idx
    crd = []
    for i, s in enumerate(shape):
        last = i == len(shape) - 1
        crd.append(idx2crd(idx if last else idx % product(s), s))
        idx = idx // product(s)
    return tuple(crd)


def crd2idx(crd, shape: IntTuple, stride: IntTuple):
    """Inner product of a (hierarchical or flat) coordinate with the stride: sum_i c_i * d_i."""
    if isinstance(crd, tuple):
        if not isinstance(shape, tuple) or len(crd) != len(shape):
            raise ValueError(f"coordinate {crd!r} is not congruent with shape {_fmt(shape)}")
        return sum((crd2idx(c, s, d) for c, s, d in zip(crd, shape, stride)), 0)
    if isinstance(shape, tuple):
        return crd2idx(idx2crd(crd, shape), shape, stride)
    return crd * stride


# -- Layout -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Layout:
    """shape:stride, a function from coordinates to indices (cute/layout.hpp); stride None = compact."""

    shape: IntTuple
    stride: IntTuple | None = None

    def __post_init__(self) -> None:
        if self.stride is None:
            object.__setattr__(self, "stride", compact_col_major(self.shape))
        if tree_map(lambda _: 0, self.shape) != tree_map(lambda _: 0, self.stride):
            raise ValueError(f"shape {_fmt(self.shape)} and stride {_fmt(self.stride)} are not congruent")
        leaves = flatten(self.shape) + flatten(self.stride)
        if any(not isinstance(x, int) for x in leaves) or min(flatten(self.shape)) < 1:
            raise ValueError(f"{_fmt(self.shape)}:{_fmt(self.stride)} needs integer leaves, positive shapes")

    def __call__(self, *crd):
        c = crd[0] if len(crd) == 1 else crd
        return crd2idx(tree_map(_leaf, c), self.shape, self.stride)

    def __len__(self) -> int:
        return len(self.shape) if isinstance(self.shape, tuple) else 1

    def __getitem__(self, i: int) -> "Layout":
        return Layout(self.shape[i], self.stride[i]) if isinstance(self.shape, tuple) else self

    def __str__(self) -> str:
        return f"{_fmt(self.shape)}:{_fmt(self.stride)}"


def size(layout) -> int:
    """|domain| = product of the shape."""
    return product(layout.shape)


def cosize(layout) -> int:
    """1 + the largest index the layout produces (its codomain span, cosize_v)."""
    if isinstance(layout, Layout) and min(flatten(layout.stride)) >= 0:
        return int(layout(size(layout) - 1)) + 1  # non-negative strides: the last coordinate is largest
    return int(np.max(layout(np.arange(size(layout))))) + 1


def _make(shapes: list, strides: list) -> Layout:
    return Layout(shapes[0], strides[0]) if len(shapes) == 1 else Layout(tuple(shapes), tuple(strides))


def concat(modes: list) -> Layout:
    return Layout(tuple(m.shape for m in modes), tuple(m.stride for m in modes))


def coalesce(layout: Layout) -> Layout:
    """The flat layout with fewest modes equal to `layout` on [0, size): merge s0:d0, s1:s0*d0."""
    shapes, strides = [], []
    for s, d in zip(flatten(layout.shape), flatten(layout.stride)):
        if s == 1:
            continue
        if shapes and shapes[-1] * strides[-1] == d:
            shapes[-1] *= s
        else:
            shapes.append(s)
            strides.append(d)
    return _make(shapes, strides) if shapes else Layout(1, 0)


def coalesce_modes(layout: Layout) -> Layout:
    """Coalesce each top-level mode separately (keeps the rank: CuTe's coalesce(L, shape))."""
    return concat([coalesce(layout[i]) for i in range(len(layout))])


def _compose_mode(a: Layout, s: int, d: int) -> Layout:
    """A o (s:d) for a coalesced A: skip the first d indices of each A mode, keep s coordinates."""
    shapes, strides = [], []
    for a_s, a_d in zip(flatten(a.shape)[:-1], flatten(a.stride)[:-1]):
        n = min(max(1, a_s // d), s)
        if (a_s % d and d % a_s) or s % n:
            raise ValueError(f"composition {a} o {s}:{d} is not defined (stride/shape divisibility)")
        if n != 1:
            shapes.append(n)
            strides.append(d * a_d)
        s, d = s // n, -(-d // a_s)
    if s != 1 or not shapes:
        shapes.append(s)
        strides.append(d * flatten(a.stride)[-1])
    return _make(shapes, strides)


def composition(a, b):
    """R = A o B, R(i) = A(B(i)) for B's image in A's domain; B's modes kept; Swizzle o L is Composed."""
    if isinstance(a, Swizzle):
        return ComposedLayout(a, b)
    if isinstance(a, ComposedLayout):
        return ComposedLayout(a.swizzle, composition(a.layout, b))
    if isinstance(b.shape, tuple):
        return concat([composition(a, b[i]) for i in range(len(b))])
    return Layout(b.shape, 0) if b.stride == 0 else _compose_mode(coalesce(a), b.shape, b.stride)


def blocked_product(a: Layout, b: Layout) -> Layout:
    """((a0,b0),(a1,b1),..): copies of the compact layout A arranged by B, B's strides times cosize(A)."""
    if cosize(a) != size(a) or len(a) != len(b):
        raise ValueError(f"blocked_product needs a compact A of B's rank, got {a} and {b}")
    n = cosize(a)
    return Layout(tuple((a[i].shape, b[i].shape) for i in range(len(a))),
                  tuple((a[i].stride, tree_map(lambda x: x * n, b[i].stride)) for i in range(len(a))))


def tile_to_shape(atom, shape: tuple):
    """Repeat the atom over `shape`, tiles in column-major order; a swizzle stays outermost."""
    if isinstance(atom, ComposedLayout):
        if cosize(atom.layout) % (1 << atom.swizzle.span_bits):
            raise ValueError(f"{atom.swizzle} reaches past the atom {atom.layout}; it would not tile")
        return ComposedLayout(atom.swizzle, tile_to_shape(atom.layout, shape))
    atom_shape = tuple(product(m) for m in atom.shape)
    if len(atom_shape) != len(shape) or any(t % s for t, s in zip(shape, atom_shape)):
        raise ValueError(f"atom {atom} does not tile shape {shape}")
    return coalesce_modes(blocked_product(atom, Layout(tuple(t // s for t, s in zip(shape, atom_shape)))))


# -- Swizzle ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Swizzle:
    """Swizzle<B, M, S>: XOR the B bits at [M+S, M+S+B) of an offset into the bits at [M, M+B)."""

    bits: int
    base: int
    shift: int

    def __post_init__(self) -> None:  # the source and target bit fields must not overlap
        if self.bits < 0 or self.base < 0 or abs(self.shift) < self.bits:
            raise ValueError(f"Swizzle<{self.bits},{self.base},{self.shift}> needs B, M >= 0 and |S| >= B")

    @property
    def yyy_mask(self) -> int:
        """The source bits (0x1c0 for Swizzle<3,3,3>)."""
        return ((1 << self.bits) - 1) << (self.base + max(0, self.shift))

    @property
    def span_bits(self) -> int:
        """Offsets agree with the swizzle outside aligned blocks of 2**span_bits."""
        return self.bits + self.base + abs(self.shift)

    def __call__(self, offset):
        p = _leaf(offset)
        y = p & self.yyy_mask  # swizzle(p) = p ^ ((p & yyy) >> S)
        return p ^ (y >> self.shift if self.shift >= 0 else y << -self.shift)

    def __str__(self) -> str:
        return f"Sw<{self.bits},{self.base},{self.shift}>"


@dataclass(frozen=True)
class ComposedLayout:
    """swizzle o layout: coordinates -> layout offset -> swizzled offset (SmemLayoutAtom)."""

    swizzle: Swizzle
    layout: Layout

    def __call__(self, *crd):
        return self.swizzle(self.layout(*crd))

    @property
    def shape(self) -> IntTuple:
        return self.layout.shape

    def __str__(self) -> str:
        return f"{self.swizzle} o {self.layout}"
