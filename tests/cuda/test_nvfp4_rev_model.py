"""Models of nvdec2's NVFP4 tensor-core tile (cuda_src/decode_nvfp4.cu KV_NVFP4_REV 1), without
a GPU:

- the block-scale operand without the 2^6 multiply (decode_codes.cuh KV_NVFP4_SF_MUL 1, sm_89+):
  every E2M1 code times every finite E4M3 scale, with the code as the fp16 half e2m1 * 2^-14,
  must be exact in fp16 (a multiple of the subnormal step 2^-24, at most 11 significant bits),
  so the HMUL2 of the kernel gives e2m1 * sf * 2^-14 exactly;
- the warp's token order (decode_mma.cuh kv_mma_tok with KV_MMA_TOKEN_SWAP) and the unpadded
  64-byte value rows: the 8-byte value loads of kv_mma_vload take 2 shared-memory wavefronts
  (4 in token order), the 16-byte key loads of kv_mma_kload stay at 4 (the least for 512 bytes).
  Wavefronts are modelled as the most distinct 4-byte words that one bank serves in one warp
  instruction (4-byte banks, 32 of them).
"""

from __future__ import annotations

import numpy as np
import pytest

from kvkit.formats import codecs


def kv_mma_tok(i: int, swap: bool = True) -> int:
    """decode_mma.cuh kv_mma_tok."""
    return i ^ ((i >> 1) & 1) if swap else i


def wavefronts(addrs: list[tuple[int, int]]) -> int:
    """(byte address, bytes) per lane -> the most distinct words one bank serves."""
    per_bank: dict[int, set[int]] = {}
    for a, n in addrs:
        for w in range(a // 4, (a + n) // 4):
            per_bank.setdefault(w % 32, set()).add(w)
    return max(len(s) for s in per_bank.values())


def test_sf_operand_without_the_multiply_is_exact_in_fp16():
    codes = np.arange(16)
    e2m1 = np.array([codecs.e2m1_decode(int(c)) for c in codes], dtype=np.float64)
    # The kernel's E2M1 operand half: e2m1 * 2^-14 (decode_codes.cuh kv_dc_e2m1x8_f16x2).
    half = e2m1 * 2.0**-14
    assert np.array_equal(half.astype(np.float16).astype(np.float64), half)
    sf_bytes = [b for b in range(256) if (b & 0x7F) != codecs.E4M3_NAN]
    sf = np.array([codecs.e4m3_decode(b) for b in sf_bytes], dtype=np.float64)
    # cvt.rn.f16x2.e4m3x2 is exact (factor 1): the scale operand is sf itself.
    assert np.array_equal(sf.astype(np.float16).astype(np.float64), sf)
    prod = np.outer(half, sf)  # exact in float64 (few significant bits)
    as16 = prod.astype(np.float16).astype(np.float64)
    assert np.array_equal(as16, prod)
    # No product is below the subnormal step unless it is 0, none near fp16's maximum.
    nz = np.abs(prod[prod != 0])
    assert nz.min() >= codecs.F16_SUBNORMAL_QUANTUM
    assert nz.max() <= 6 * 448 * 2.0**-14


def test_token_order_is_a_permutation_within_each_half_warp_tile():
    perm = [kv_mma_tok(i) for i in range(16)]
    assert sorted(perm) == list(range(16))
    # The score tokens g and g + 8 of lane group g: tokens 0..7 for g, 8..15 for g + 8.
    assert sorted(perm[:8]) == list(range(8))
    assert sorted(perm[8:]) == list(range(8, 16))


@pytest.mark.parametrize("swap, expected", [(True, 2), (False, 4)])
def test_value_loads_of_unpadded_rows(swap, expected):
    # kv_mma_vload at D = 128: lane (g, c) loads 8 bytes at byte 8 g of token 2c + e's row.
    for e in (0, 1, 8, 9):
        addrs = []
        for lane in range(32):
            g, c = lane >> 2, lane & 3
            addrs.append((64 * kv_mma_tok(2 * c + e, swap) + 8 * g, 8))
        assert wavefronts(addrs) == expected, e


@pytest.mark.parametrize("swap", [True, False])
def test_key_loads_of_unpadded_rows(swap):
    # kv_mma_kload at D = 128: lane (g, c) loads 16 bytes at byte 16 c of token g's row (then
    # of token g + 8's): 512 contiguous bytes either way.
    for tt in (0, 1):
        addrs = []
        for lane in range(32):
            g, c = lane >> 2, lane & 3
            addrs.append((64 * kv_mma_tok(g + 8 * tt, swap) + 16 * c, 16))
        assert wavefronts(addrs) == 4
