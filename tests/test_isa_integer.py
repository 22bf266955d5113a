"""isa.integer and isa.bits against Python integers: each oracle transcribes the PTX semantics
pseudo-code of its section (#integer-arithmetic-instructions-*, #logic-and-shift-instructions-*,
#data-movement-and-conversion-instructions-prmt), one lane at a time."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fa_sim.isa import bits as B, integer as I
from fa_sim.isa.integer import MulMode

FIXED = settings(derandomize=True, database=None, deadline=None, max_examples=80)
DTYPES = [np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64]


def width(dt) -> int:
    return np.dtype(dt).itemsize * 8


def signed(dt) -> bool:
    return np.dtype(dt).kind == "i"


def wrap(x: int, dt) -> int:
    """x reduced to dt's range (two's complement)."""
    w = width(dt)
    x &= (1 << w) - 1
    return x - (1 << w) if signed(dt) and x >> (w - 1) else x


def ints(dt):
    info = np.iinfo(dt)
    edges = [0, 1, 2, info.max, info.max - 1, info.min, info.min + 1] + ([-1, -2] if signed(dt) else [])
    return st.one_of(st.sampled_from(edges), st.integers(int(info.min), int(info.max)))


def lanes(dt, n=3):
    return st.lists(st.tuples(*[ints(dt)] * n), min_size=1, max_size=16)


def cols(rows, dt):
    return [np.array([r[i] for r in rows], dt) for i in range(len(rows[0]))]


def c_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return -q if (a < 0) != (b < 0) else q


@pytest.mark.parametrize("dt", DTYPES)
@FIXED
@given(data=st.data())
def test_arithmetic_matches_python_ints(dt, data):
    rows = data.draw(lanes(dt))
    a, b, c = cols(rows, dt)
    w = width(dt)
    for i, (x, y, z) in enumerate(rows):
        assert int(I.add(a, b)[i]) == wrap(x + y, dt)
        assert int(I.sub(a, b)[i]) == wrap(x - y, dt)
        assert int(I.mul(a, b, MulMode.LO)[i]) == wrap(x * y, dt)
        assert int(I.mul(a, b, MulMode.HI)[i]) == wrap((x * y) >> w, dt)
        assert int(I.mad(a, b, c, MulMode.LO)[i]) == wrap(x * y + z, dt)
        assert int(I.mad(a, b, c, MulMode.HI)[i]) == wrap(((x * y) >> w) + z, dt)
        assert int(I.sad(a, b, c)[i]) == wrap(z + wrap((y - x) if x < y else (x - y), dt), dt)
        assert int(I.min_(a, b)[i]) == min(x, y) and int(I.max_(a, b)[i]) == max(x, y)
        if y == 0:  # the GPU's all-ones quotient and remainder
            assert int(I.div(a, b)[i]) == wrap(-1, dt) and int(I.rem(a, b)[i]) == wrap(-1, dt)
        else:
            assert int(I.div(a, b)[i]) == wrap(c_div(x, y), dt)
            assert int(I.rem(a, b)[i]) == wrap(x - c_div(x, y) * y, dt)
        if signed(dt):
            assert int(I.abs_(a)[i]) == wrap(abs(x), dt) and int(I.neg(a)[i]) == wrap(-x, dt)
        if w <= 32:
            wide = np.dtype(f"{np.dtype(dt).kind}{2 * w // 8}")
            assert int(I.mul(a, b, MulMode.WIDE)[i]) == x * y
            assert int(I.mad(a, b, c.astype(wide), MulMode.WIDE)[i]) == wrap(x * y + z, wide)


SAT = (-(2 ** 31), 2 ** 31 - 1)


def sat32(x: int) -> int:
    return min(max(x, SAT[0]), SAT[1])


@FIXED
@given(lanes(np.int32))
def test_s32_saturation(rows):
    # #integer-arithmetic-instructions-add: .sat limits the result to MININT..MAXINT (s32 only).
    a, b, c = cols(rows, np.int32)
    for i, (x, y, z) in enumerate(rows):
        assert int(I.add(a, b, sat=True)[i]) == sat32(x + y)
        assert int(I.sub(a, b, sat=True)[i]) == sat32(x - y)
        assert int(I.mad(a, b, c, MulMode.HI, sat=True)[i]) == sat32(((x * y) >> 32) + z)
        assert int(I.min_(a, b, relu=True)[i]) == max(min(x, y), 0)


def low24(x: int, is_signed: bool) -> int:
    x &= 0xFFFFFF
    return x - (1 << 24) if is_signed and x >> 23 else x


@pytest.mark.parametrize("dt", [np.int32, np.uint32])
@FIXED
@given(data=st.data())
def test_mul24_mad24(dt, data):
    # #integer-arithmetic-instructions-mul24: the 48-bit product of the low 24 bits; .hi = t<47..16>.
    rows = data.draw(lanes(dt))
    a, b, c = cols(rows, dt)
    for i, (x, y, z) in enumerate(rows):
        t = low24(x, signed(dt)) * low24(y, signed(dt))
        assert int(I.mul24(a, b, hi=False)[i]) == wrap(t, dt)
        assert int(I.mul24(a, b, hi=True)[i]) == wrap(t >> 16, dt)
        assert int(I.mad24(a, b, c, hi=False)[i]) == wrap(t + z, dt)
        if dt is np.int32:
            assert int(I.mad24(a, b, c, hi=True, sat=True)[i]) == sat32(wrap(t >> 16, dt) + z)


@FIXED
@given(lanes(np.uint32, 2), st.booleans())
def test_simd16x2(rows, is_signed):
    a, b = cols(rows, np.uint32)
    h = np.int16 if is_signed else np.uint16
    got_add = I.simd16x2(I.add, a, b, is_signed)
    got_max = I.simd16x2(I.max_, a, b, is_signed)
    for i, (x, y) in enumerate(rows):
        xs = [wrap(x >> s, h) for s in (0, 16)]
        ys = [wrap(y >> s, h) for s in (0, 16)]
        want_add = sum((wrap(p + q, h) & 0xFFFF) << s for p, q, s in zip(xs, ys, (0, 16)))
        want_max = sum((max(p, q) & 0xFFFF) << s for p, q, s in zip(xs, ys, (0, 16)))
        assert int(got_add[i]) == want_add and int(got_max[i]) == want_max


def test_division_edge_table():
    # INT_MIN / -1 wraps, remainder 0; division by zero: all ones (see isa.integer's docstring).
    a = np.array([-(2 ** 31), 7, -7, 5], np.int32)
    b = np.array([-1, -2, 2, 0], np.int32)
    assert I.div(a, b).tolist() == [-(2 ** 31), -3, -3, -1]
    assert I.rem(a, b).tolist() == [0, 1, -1, -1]
    assert I.div(np.uint32([5]), np.uint32([0]))[0] == 0xFFFFFFFF
    assert I.rem(np.uint64([5]), np.uint64([0]))[0] == 2 ** 64 - 1


def test_dp4a_dp2a():
    # #integer-arithmetic-instructions-dp4a: four byte products plus c.
    a = np.array([0x01FF7F80], np.uint32)  # bytes 0x80, 0x7F, 0xFF, 0x01
    b = np.array([0x02030405], np.uint32)  # bytes 5, 4, 3, 2
    assert I.dp4a(a, b, np.int32([10]), True, True)[0] == 10 + (-128 * 5 + 127 * 4 - 1 * 3 + 1 * 2)
    assert I.dp4a(a, b, np.uint32([10]), False, False)[0] == 10 + 128 * 5 + 127 * 4 + 255 * 3 + 1 * 2
    # dp2a: halves of a (0x7F80 = 32640, 0x01FF = 511) times bytes 0,1 (.lo) or 2,3 (.hi) of b.
    assert I.dp2a(a, b, np.uint32([0]), False, False, False)[0] == 32640 * 5 + 511 * 4
    assert I.dp2a(a, b, np.uint32([0]), True, False, False)[0] == 32640 * 3 + 511 * 2


# --- logic, shifts, bit fields --------------------------------------------------------------------

def amounts():
    return st.lists(st.integers(0, 300), min_size=16, max_size=16)


@pytest.mark.parametrize("dt", DTYPES)
@FIXED
@given(data=st.data())
def test_shifts_clamp_to_the_width(dt, data):
    # #logic-and-shift-instructions-shl/-shr: amounts greater than the width are clamped to it.
    rows = data.draw(lanes(dt, 1))
    a = cols(rows, dt)[0]
    n = np.array(data.draw(st.lists(st.integers(0, 2 ** 32 - 1) | st.integers(0, 70),
                                    min_size=len(rows), max_size=len(rows))), np.uint32)
    w = width(dt)
    for i, (x,) in enumerate(rows):
        k = min(int(n[i]), w)
        assert int(B.shl(a, n)[i]) == wrap(x << k, dt)
        assert int(B.shr(a, n)[i]) == (x >> k if k < w else (-1 if x < 0 else 0))
    for k in (0, 1, w - 1, w, w + 1, 2 ** 32 - 1):  # an immediate amount takes the scalar path
        full = np.full(len(rows), k, np.uint32)
        assert np.array_equal(B.shl(a, np.uint32(k)), B.shl(a, full))
        assert np.array_equal(B.shr(a, np.uint32(k)), B.shr(a, full))


@FIXED
@given(lanes(np.uint32, 3), st.booleans(), st.booleans())
def test_shf(rows, left, clamp):
    # #logic-and-shift-instructions-shf: funnel shift of b:a by min(c, 32) or c & 31.
    a, b, c = cols(rows, np.uint32)
    c = c % 40 if rows[0][2] % 2 else c
    got = B.shf(a, b, c, left, clamp)
    for i in range(len(rows)):
        x, y, z = int(a[i]), int(b[i]), int(c[i])
        n = min(z, 32) if clamp else z & 31
        v = (y << 32) | x
        want = ((v << n) >> 32) if left else (v >> n)
        assert int(got[i]) == want & 0xFFFFFFFF


@pytest.mark.parametrize("dt", [np.uint32, np.uint64, np.int32, np.int64])
@FIXED
@given(data=st.data())
def test_popc_clz_brev_bfind(dt, data):
    rows = data.draw(lanes(dt, 1))
    a = cols(rows, dt)[0]
    w = width(dt)
    u = a.view(np.dtype(f"u{w // 8}"))
    for i, (x,) in enumerate(rows):
        ux = x & ((1 << w) - 1)
        assert int(B.popc(u)[i]) == bin(ux).count("1")
        assert int(B.clz(u)[i]) == w - ux.bit_length()
        assert int(B.brev(u)[i]) == int(f"{ux:0{w}b}"[::-1], 2)
        y = ~x & ((1 << w) - 1) if x < 0 else ux  # #integer-arithmetic-instructions-bfind
        pos = y.bit_length() - 1 if y else 0xFFFFFFFF
        assert int(B.bfind(a)[i]) == pos
        assert int(B.bfind(a, shiftamt=True)[i]) == (w - 1 - pos if y else 0xFFFFFFFF)


def bfe_ref(x: int, pos: int, length: int, w: int, is_signed: bool) -> int:
    """#integer-arithmetic-instructions-bfe, the pseudo-code."""
    pos, length = pos & 0xFF, length & 0xFF
    msb = w - 1
    bit = lambda i: (x >> i) & 1  # noqa: E731
    sbit = 0 if not is_signed or length == 0 else bit(min(pos + length - 1, msb))
    d = 0
    for i in range(w):
        d |= (bit(pos + i) if i < length and pos + i <= msb else sbit) << i
    return d


def bfi_ref(f: int, b: int, pos: int, length: int, w: int) -> int:
    pos, length = pos & 0xFF, length & 0xFF
    for i in range(length):
        if pos + i > w - 1:
            break
        b = (b & ~(1 << (pos + i))) | (((f >> i) & 1) << (pos + i))
    return b


@pytest.mark.parametrize("dt", [np.uint32, np.uint64, np.int32, np.int64])
@FIXED
@given(data=st.data())
def test_bfe_bfi(dt, data):
    rows = data.draw(lanes(dt, 2))
    a, f = cols(rows, dt)
    n = len(rows)
    pos = np.array(data.draw(st.lists(st.integers(0, 2 ** 32 - 1) | st.integers(0, 70), min_size=n, max_size=n)), np.uint32)
    ln = np.array(data.draw(st.lists(st.integers(0, 2 ** 32 - 1) | st.integers(0, 70), min_size=n, max_size=n)), np.uint32)
    w = width(dt)
    ud = np.dtype(f"u{w // 8}")
    got_e, got_i = B.bfe(a, pos, ln), B.bfi(f.view(ud), a.view(ud), pos, ln)
    for i in range(n):
        ux, uf = int(a.view(ud)[i]), int(f.view(ud)[i])
        assert int(got_e.view(ud)[i]) == bfe_ref(ux, int(pos[i]), int(ln[i]), w, signed(dt))
        assert int(got_i[i]) == bfi_ref(uf, ux, int(pos[i]), int(ln[i]), w)
    p0, l0 = pos[0], ln[0]  # immediates take the scalar path
    assert np.array_equal(B.bfi(f.view(ud), a.view(ud), p0, l0), B.bfi(f.view(ud), a.view(ud), np.full(n, p0), np.full(n, l0)))
    assert np.array_equal(B.bfe(a, p0, l0), B.bfe(a, np.full(n, p0), np.full(n, l0)))


PRMT_TABLE = {  # #data-movement-and-conversion-instructions-prmt: d.b3 d.b2 d.b1 d.b0 per selector
    "f4e": ["3210", "4321", "5432", "6543"], "b4e": ["5670", "6701", "7012", "0123"],
    "rc8": ["0000", "1111", "2222", "3333"], "ecl": ["3210", "3211", "3222", "3333"],
    "ecr": ["0000", "1110", "2210", "3210"], "rc16": ["1010", "3232", "1010", "3232"],
}


@FIXED
@given(lanes(np.uint32, 3))
def test_prmt_generic_and_modes(rows):
    a, b, c = cols(rows, np.uint32)
    for i in range(len(rows)):
        src = (int(b[i]) << 32) | int(a[i])
        byte = lambda k: (src >> (8 * k)) & 0xFF  # noqa: E731
        want = 0
        for k in range(4):
            sel = (int(c[i]) >> (4 * k)) & 0xF
            v = byte(sel & 7)
            want |= ((0xFF if v & 0x80 else 0) if sel & 8 else v) << (8 * k)
        assert int(B.prmt(a, b, c)[i]) == want
        for mode, table in PRMT_TABLE.items():
            picks = table[int(c[i]) & 3]  # d.b3 .. d.b0
            want = sum(byte(int(s)) << (8 * (3 - k)) for k, s in enumerate(picks))
            assert int(B.prmt(a, b, c, mode)[i]) == want, mode


@FIXED
@given(lanes(np.uint32, 3), st.integers(0, 255))
def test_lop3_truth_table(rows, lut):
    # #logic-and-shift-instructions-lop3: immLut = F(0xF0, 0xCC, 0xAA).
    a, b, c = cols(rows, np.uint32)
    got = B.lop3(a, b, c, lut)
    for i in range(len(rows)):
        want = 0
        for bit in range(32):
            idx = (((int(a[i]) >> bit) & 1) << 2) | (((int(b[i]) >> bit) & 1) << 1) | ((int(c[i]) >> bit) & 1)
            want |= ((lut >> idx) & 1) << bit
        assert int(got[i]) == want


def fns_ref(mask: int, base: int, offset: int) -> int:
    """#integer-arithmetic-instructions-fns, the pseudo-code."""
    if offset == 0:
        return base if (mask >> base) & 1 else 0xFFFFFFFF
    pos, count, inc = base, abs(offset) - 1, 1 if offset > 0 else -1
    while 0 <= pos < 32:
        if (mask >> pos) & 1:
            if count == 0:
                return pos
            count -= 1
        pos += inc
    return 0xFFFFFFFF


@FIXED
@given(st.lists(st.tuples(st.integers(0, 2 ** 32 - 1),
                          st.one_of(st.integers(0, 31), st.integers(32, 70), st.integers(0, 2 ** 32 - 1)),
                          st.integers(-33, 33)), min_size=1, max_size=16))
def test_fns(rows):
    # A base above 31 finds nothing: the pseudo-code's loop, and the H200 (alu_probe.npz: 0xffffffff
    # for every base in 32..70).
    m, base, off = (np.array([r[i] for r in rows], dt) for i, dt in enumerate((np.uint32, np.uint32, np.int32)))
    got = B.fns(m, base, off)
    assert [int(g) for g in got] == [fns_ref(*r) for r in rows]


def szext_ref(a: int, b: int, clamp: bool, is_signed: bool) -> int:
    """#integer-arithmetic-instructions-szext, the pseudo-code (32-bit)."""
    b1 = b & 0x1F
    too_large = b >= 32 and clamp
    mask = 0 if too_large else (0xFFFFFFFF << b1) & 0xFFFFFFFF
    sign_pos = (b1 - 1) & 0x1F
    sign_bit = False if (b1 == 0 or too_large or not is_signed) else (a >> sign_pos) & 1
    return (a & ~mask & 0xFFFFFFFF) | (mask if sign_bit else 0)


def bmsk_ref(a: int, b: int, clamp: bool) -> int:
    """#integer-arithmetic-instructions-bmsk, the pseudo-code."""
    a1, b1 = a & 0x1F, b & 0x1F
    mask0 = (0xFFFFFFFF << a1) & 0xFFFFFFFF
    total = a1 + b1
    mask1 = (0xFFFFFFFF << total) & 0xFFFFFFFF if total < 32 else 0
    overflow = total >= 32
    if clamp:
        if a >= 32:
            overflow, mask0 = True, 0
        if b >= 32:
            overflow = True
    if overflow:
        mask1 = 0
    elif b1 == 0:
        mask1 = 0xFFFFFFFF
    return mask0 & ~mask1 & 0xFFFFFFFF


@FIXED
@given(st.lists(st.tuples(st.integers(0, 2 ** 32 - 1), st.integers(0, 40) | st.integers(0, 2 ** 32 - 1)),
                min_size=1, max_size=16), st.booleans(), st.booleans())
def test_szext_bmsk(rows, clamp, is_signed):
    a, b = (np.array([r[i] for r in rows], np.uint32) for i in range(2))
    got = B.szext(a.view(np.int32) if is_signed else a, b, clamp, is_signed)
    assert [int(g) & 0xFFFFFFFF for g in got] == [szext_ref(x, y, clamp, is_signed) for x, y in rows]
    small = np.array([r[1] % 40 for r in rows], np.uint32)
    got = B.bmsk(small, b, clamp)
    assert [int(g) for g in got] == [bmsk_ref(int(x), y, clamp) for x, (_, y) in zip(small, rows)]


def test_cnot():
    assert B.cnot(np.uint32([0, 1, 7])).tolist() == [1, 0, 0]
