"""A model of NVFP4's tensor-core E2M1 unpacking (cuda_src/common/decode_codes.cuh
kv_dc_e2m1x8_f16x2, used by cuda_src/decode_nvfp4.cu kv_mma_kstep / kv_mma_vpair with
KV_NVFP4_UNPACK 1) against the spec (kvkit.formats.codecs): the word arithmetic is transcribed
here on uint32, and every code in every nibble position, next to any other nibbles, must give
the fp16 half e2m1 * 2^-14, and times every E4M3 block scale (sf * 2^6 in fp16, the scale
operand) exactly e2m1 * sf * 2^-8. The hooks' index maps (which nibble lands in which operand
half) are checked against the run positions the mma core expects. The GPU decode tests then
check the kernel.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvkit.formats import codecs
from kvkit.formats.arch_models import prmt

U32 = np.uint32
MASK = U32(0x8E008E00)


def bitsel(m: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """kv_bitsel<M>(a, b): (a & M) | (b & ~M)."""
    m = U32(m)
    return (a & m) | (b & ~m)


def e2m1x8_f16x2(x: np.ndarray) -> list[np.ndarray]:
    """kv_dc_e2m1x8_f16x2: out[k] = fp16x2 bits of nibbles k (low half) and k + 4 (high)."""
    x = np.asarray(x, dtype=U32)
    wo = bitsel(0x80808080, x, x >> U32(3))
    we = bitsel(0x80808080, x << U32(4), x << U32(1))
    return [(we << U32(8)) & MASK, (wo << U32(8)) & MASK, we & MASK, wo & MASK]


def _halves(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    w = np.asarray(w, dtype=U32)
    lo = (w & U32(0xFFFF)).astype(np.uint16).view(np.float16)
    hi = (w >> U32(16)).astype(np.uint16).view(np.float16)
    return lo, hi


def _spec(code: np.ndarray) -> np.ndarray:
    """e2m1 * 2^-14 as float64 (the operand before the scale), signed zero kept."""
    return codecs.E2M1_VALUES[np.asarray(code, dtype=np.int64)].astype(np.float64) * 2.0**-14


def _same(got: np.ndarray, want: np.ndarray) -> bool:
    got = np.asarray(got, dtype=np.float64)
    return bool(np.all(got == want) and np.all(np.signbit(got) == np.signbit(want)))


def _words(rng: np.random.Generator, k: int, fill: str) -> tuple[np.ndarray, np.ndarray]:
    """Every (nibble k, nibble k + 4) pair of codes, the other six nibbles `fill`."""
    a, b = np.meshgrid(np.arange(16, dtype=U32), np.arange(16, dtype=U32), indexing="ij")
    a, b = a.ravel(), b.ravel()
    if fill == "zeros":
        other = np.zeros(a.shape, U32)
    elif fill == "ones":
        other = np.full(a.shape, 0xFFFFFFFF, U32)
    else:
        other = rng.integers(0, 1 << 32, size=a.shape, dtype=np.uint64).astype(U32)
    keep = ~U32((0xF << (4 * k)) | (0xF << (4 * k + 16)))
    x = (other & keep) | (a << U32(4 * k)) | (b << U32(4 * k + 16))
    return x, np.stack([a, b])


@pytest.mark.parametrize("fill", ["zeros", "ones", "random0", "random1", "random2"])
@pytest.mark.parametrize("k", range(4))
def test_every_code_pair_in_every_position(k, fill):
    rng = np.random.default_rng(1000 * k + sum(map(ord, fill)))
    x, codes = _words(rng, k, fill)
    lo, hi = _halves(e2m1x8_f16x2(x)[k])
    assert _same(lo, _spec(codes[0])), k
    assert _same(hi, _spec(codes[1])), k


def test_the_scaled_operand_is_exact_for_every_code_and_scale_byte():
    """out[k] times the scale operand (hmul2, fp16, sf * 2^6) is e2m1 * sf * 2^-8 exactly, for
    all 16 codes x all 256 E4M3 bytes (NaN scales stay NaN)."""
    codes = np.arange(16, dtype=U32)
    x = codes | (codes << U32(16))  # code c in nibbles 0 and 4
    lo, hi = _halves(e2m1x8_f16x2(x)[0])
    sf = codecs.e4m3_decode_array(np.arange(256, dtype=np.uint8)).astype(np.float64)
    sf16 = (sf * 64.0).astype(np.float16)
    assert np.array_equal(sf16.astype(np.float64), sf * 64.0, equal_nan=True)
    for half in (lo, hi):
        got = (half[:, None] * sf16[None, :]).astype(np.float64)
        want = codecs.E2M1_VALUES[codes.astype(np.int64)][:, None].astype(np.float64)
        want = want * sf[None, :] * 2.0**-8
        nan = np.isnan(want)
        assert np.array_equal(np.isnan(got), nan)
        assert _same(got[~nan], want[~nan])


def kpos(ks: int, j: int) -> int:
    """decode_nvfp4.cu kv_mma_kpos."""
    return 8 * (ks >> 1) + 2 * (ks & 1) + 4 * (j & 1) + (j >> 1)


@pytest.mark.parametrize("head_dim", [32, 64, 128, 256])
def test_key_steps_put_run_elements_where_kpos_says(head_dim):
    """kv_mma_kstep: k-step ks takes word ks / 2 and its pairs 2 (ks % 2), + 1 as h0, h1; the
    halves must hold run elements kpos(ks, 0..3) (element 2 i in the low nibble of byte i)."""
    kpl = head_dim // 4
    rng = np.random.default_rng(head_dim)
    run = rng.integers(0, 16, size=(64, kpl), dtype=np.uint32)  # 64 random runs of codes
    words = [
        np.bitwise_or.reduce([run[:, 8 * w + n] << U32(4 * n) for n in range(8)], axis=0)
        for w in range(kpl // 8)
    ]
    for ks in range(kpl // 4):
        out = e2m1x8_f16x2(words[ks >> 1])
        h0, h1 = out[2 * (ks & 1)], out[2 * (ks & 1) + 1]
        for j, half in enumerate((*_halves(h0), *_halves(h1))):
            assert _same(half, _spec(run[:, kpos(ks, j)])), (ks, j)


@pytest.mark.parametrize("head_dim", [32, 64, 128, 256])
def test_value_pairs_take_dims_2j_and_2j_plus_1_of_both_tokens(head_dim):
    """kv_mma_vpair: e = byte_perm of word j / 4 of tokens a and b (bytes 2 q, 2 q + 1 of each,
    q = (j / 2) % 2); w0, w1 = pairs 2 (j % 2), + 1 of e: dims 2 j, 2 j + 1 of the lane's run,
    token a in the low half and token b in the high half."""
    vpl = head_dim // 8
    rng = np.random.default_rng(7 + head_dim)
    for _ in range(32):
        ta = rng.integers(0, 16, size=vpl)
        tb = rng.integers(0, 16, size=vpl)

        def raw(t):
            b = [int(t[2 * i]) | (int(t[2 * i + 1]) << 4) for i in range(vpl // 2)]
            b += [0] * (-len(b) % 4)  # D = 32: one 16-bit load, the word's upper half 0
            return [
                int.from_bytes(bytes(b[4 * w : 4 * w + 4]), "little") for w in range(len(b) // 4)
            ]

        ra, rb = raw(ta), raw(tb)
        for j in range(vpl // 2):
            e = prmt(ra[j >> 2], rb[j >> 2], 0x7632 if j & 2 else 0x5410)
            out = e2m1x8_f16x2(np.array([e], dtype=U32))
            for h, dim in ((0, 2 * j), (1, 2 * j + 1)):
                lo, hi = _halves(out[2 * (j & 1) + h])
                assert _same(lo, _spec([ta[dim]])), (j, h)
                assert _same(hi, _spec([tb[dim]])), (j, h)


def test_scale_byte_joins():
    """kv_dc_nvfp4_sf2_f16x2 joins two scale bytes by byte_perm(lo, hi, 0x0040) and the
    D = 256 value pairs take byte b of both tokens' scale words by byte_perm(ra, rb, b | (4 +
    b) << 4): bits 0..15 must be lo | hi << 8 (kv_dc_nvfp4_sfw_f16x2 ignores the rest)."""
    rng = np.random.default_rng(5)
    for lo, hi in rng.integers(0, 256, size=(64, 2)):
        assert prmt(int(lo), int(hi), 0x0040) & 0xFFFF == int(lo) | (int(hi) << 8)
    for ra, rb in rng.integers(0, 1 << 32, size=(64, 2), dtype=np.uint64):
        for b in range(4):
            want = ((int(ra) >> (8 * b)) & 0xFF) | (((int(rb) >> (8 * b)) & 0xFF) << 8)
            assert prmt(int(ra), int(rb), b | ((4 + b) << 4)) & 0xFFFF == want
