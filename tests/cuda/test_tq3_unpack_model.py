"""A model of the 3-bit code unpacking in cuda_src/decode_turboquant.cu's tensor-core hooks
against the spec's bit stream (kvkit.formats.bitpack): the plans (kv_tq_kplan for keys,
kv_tq_vplan for values) are transcribed here with the word arithmetic they drive, and every
code they extract must be the code the spec packed. The GPU decode tests then check the kernel.

Keys: lane c's run of D / 4 codes in KV_TQ_RUN_WORDS little-endian words; code E's table byte
offset is UNIT(s) 128 + ((y & (7 << s)) | 4 lane) for the plan's word y and bit s, and the table
copy s holds code c at unit UNIT(s) + c 2^(s - 7) (the four copies must not overlap).
Values: lane group g's D / 8 codes, as 16-bit units per token (D = 128: three units; D = 256:
six, the KVKIT_DECODE_TQ3 build's KV_TQ_V_HALVES; its =0 build keeps packed words, whose
windows KVKIT_DECODE_TQ3_256=1 cuts by byte permutes of the words, KV_TQ_V_WINS) or, at
D = 64, as one word joined from the two 2-byte units at the even byte below the run's byte
3 g (the selector depends on g's parity); code i of tokens a (low half) and b (high half) is
bf16 (((w >> s) & (7 << S) per half) | 0x4300) * 2^-S minus (2^(7 - S) + 4), for the window w
of the plan.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvkit.formats import bitpack

UNITS = {10: 0, 9: 1, 8: 31, 7: 57}  # kv_tq_unit
TABLE_UNITS = 65  # KV_MMA_TABLE_WORDS / 32


def _kfits(w: tuple[int, int, int, int], s: int) -> bool:
    return w[0] != 0 or w[2] + s + 3 <= 32


def kplan(e: int, run_words: int) -> tuple[int, int, int, int]:
    """kv_tq_kplan: (kind, i, r, s) of run code e."""
    pl = (0, 0, 0, 0)
    have = False
    for k in range(e + 1):
        b = 3 * k
        if have and pl[3] + 3 <= 10 and _kfits(pl, pl[3] + 3):
            pl = (pl[0], pl[1], pl[2], pl[3] + 3)
            continue
        have = True
        i, p = b >> 5, b & 31
        if 7 <= p <= 10 and p + 3 <= 32:
            pl = (0, i, 0, p)
            continue
        t = b - 7
        if t < 0:
            pl = (2, 0, -t, 7)
        else:
            j, r = t >> 5, t & 31
            one = r == 0 or r + 13 <= 32 or j + 1 >= run_words
            pl = (0 if one else 1, j, r, 7)
    return pl


def _word(raw: list[int], kind: int, i: int, r: int) -> int:
    m = 0xFFFFFFFF
    if kind == 0:
        return raw[i] >> r
    if kind == 1:
        return ((raw[i] | (raw[i + 1] << 32)) >> r) & m
    return (raw[0] << r) & m


def test_key_table_copies_do_not_overlap():
    used = {}
    for s, base in UNITS.items():
        for c in range(8):
            u = base + (c << (s - 7))
            assert u not in used and u < TABLE_UNITS, (s, c, used.get(u))
            used[u] = (s, c)


@pytest.mark.parametrize("head_dim", [32, 64, 96, 128, 256])
def test_key_plan_extracts_the_spec_codes(head_dim):
    kpl = head_dim // 4
    run_bytes = kpl * 3 // 8
    run_words = (run_bytes + 3) // 4
    table = {}
    for s, base in UNITS.items():
        for c in range(8):
            table[base + (c << (s - 7))] = c
    plans = [kplan(e, run_words) for e in range(kpl)]
    rng = np.random.default_rng(head_dim)
    for _ in range(200):
        codes = rng.integers(0, 8, head_dim).astype(np.uint8)
        packed = bitpack.pack_array(codes, 3)
        for c in range(4):  # lane c's run: codes kpl c ..
            # the bytes past the run are the slot's next bytes in the kernel: any value
            run = rng.integers(0, 256, 4 * run_words).astype(np.uint8)
            run[:run_bytes] = packed[run_bytes * c : run_bytes * (c + 1)]
            raw = [int(x) for x in run.view("<u4")]
            for e, (kind, i, r, s) in enumerate(plans):
                assert kind != 0 or r + s + 3 <= 32
                y = _word(raw, kind, i, r)
                for lane in (0, 5, 31):
                    off = UNITS[s] * 128 + ((y & (7 << s)) | (4 * lane))
                    assert off & 127 == 4 * lane  # lane l reads bank l
                    assert table[off >> 7] == codes[kpl * c + e]


def vplan(i: int, run_bits: int) -> tuple[int, int, int]:
    """kv_tq_vplan: (window t, shift s, bit S) of code i."""
    last = run_bits - 16
    pl = (0, 0, 0)
    shifted_prev = False
    prev = (0, 0, 0)
    for k in range(i + 1):
        b = 3 * k
        if shifted_prev and b + 3 <= prev[0] + 16 and b - prev[0] - prev[1] <= 4:
            pl = (prev[0], prev[1], b - prev[0] - prev[1])
            shifted_prev = False
            continue
        t = min((b // 8) * 8, last)
        p = b - t
        if p <= 4:
            pl = (t, 0, p)
            shifted_prev = False
        else:
            pl = (t, p - 1, 1)
            shifted_prev = True
            prev = pl
    return pl


def _perm(x: int, y: int, sel: int) -> int:
    """__byte_perm without the sign mode."""
    src = x | (y << 32)
    return sum(((src >> (8 * ((sel >> (4 * n)) & 7))) & 0xFF) << (8 * n) for n in range(4))


def _window(ra: list[int], rb: list[int], t: int, word: bool, wins: bool = False) -> int:
    if word:  # kv_tq_vwin, D = 64: one permute of the two tokens' words
        assert t in (0, 8)
        return _perm(ra[0], rb[0], 0x5410 if t == 0 else 0x6521)
    if wins:  # KV_TQ_V_WINS (D = 256, KVKIT_DECODE_TQ3_256): windows of packed words
        o = (t % 32) // 8
        if o < 3:
            sel = o | ((o + 1) << 4) | ((o + 4) << 8) | ((o + 5) << 12)
            return _perm(ra[t // 32], rb[t // 32], sel)
    elif t % 16 == 0:
        return _perm(ra[t // 16], rb[t // 16], 0x5410)
    return _perm(_window(ra, rb, t - 8, word, wins), _window(ra, rb, t + 8, word, wins), 0x6341)


def _bf16(h: int) -> float:
    return float(np.array([h << 16], np.uint32).view(np.float32)[0])


def _vload(packed: np.ndarray, g: int, head_dim: int, tail: np.ndarray,
           wins: bool = False) -> list[int]:  # fmt: skip
    """kv_mma_vload of lane group g from a token's value codes (then the slot's next bytes);
    wins: the packed words of D = 256 (kv_tq_load_words: run bytes 4 i .. 4 i + 3 in raw[i])."""
    vb = head_dim // 8 * 3
    area = np.concatenate([packed, tail])
    if wins:
        n = vb // 8
        return [int(x) for x in area[n * g : n * g + n].view("<u4")]
    if head_dim == 64:  # the word mode: units at the even byte 3 g - (g & 1), one permute
        e = 3 * g - (g & 1)
        q0, q1 = (int(x) for x in area[e : e + 4].view("<u2"))
        return [_perm(q0, q1, 0x6541 if g & 1 else 0x5410)]
    n = vb // 8
    return [int(x) for x in area[n * g : n * g + n].view("<u2")]


@pytest.mark.parametrize(
    ("head_dim", "windows", "shifts", "wins"),
    [(64, 2, 3, False), (128, 5, 6, False), (256, 11, 12, False), (256, 11, 12, True)],
)
def test_value_plan_extracts_the_spec_codes(head_dim, windows, shifts, wins):
    off = 4  # KV_MMA_VCODE_OFFSET for 3-bit values
    vpl = head_dim // 8
    run_bits = vpl * 3
    word = head_dim == 64
    plans = [vplan(i, run_bits) for i in range(vpl)]
    assert all(0 <= s_ <= 4 and t + 16 <= run_bits for t, _, s_ in plans)
    # windows and shifts per token pair: the static count the plan is about
    assert len({t for t, _, _ in plans}) == windows
    assert len({(t, s) for t, s, _ in plans if s}) == shifts
    rng = np.random.default_rng(head_dim)
    for _ in range(300):
        ca, cb = (rng.integers(0, 8, head_dim).astype(np.uint8) for _ in range(2))
        pa, pb = bitpack.pack_array(ca, 3), bitpack.pack_array(cb, 3)
        # the slot's bytes after the codes (value scale, zero): any value
        ta, tb = (rng.integers(0, 256, 4).astype(np.uint8) for _ in range(2))
        for g in range(8):
            ra, rb = _vload(pa, g, head_dim, ta, wins), _vload(pb, g, head_dim, tb, wins)
            for i, (t, s, bit) in enumerate(plans):
                w = _window(ra, rb, t, word, wins) >> s
                x = (w & ((7 << bit) * 0x00010001)) | 0x43004300
                for half, codes in ((x & 0xFFFF, ca), (x >> 16, cb)):
                    v = _bf16(half) * 2.0**-bit - (2.0 ** (7 - bit) + off)
                    assert v == float(codes[vpl * g + i]) - off
