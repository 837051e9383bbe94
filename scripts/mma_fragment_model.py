"""NumPy model of the mma.sync m16n8k16 / ldmatrix / movmatrix fragment layouts (PTX ISA),
driven with the lane address formulas of cuda_src/common/decode_mma.cuh (v3): a check of the
index plumbing that needs no GPU. Run: ``python scripts/mma_fragment_model.py``.

Layouts (g = lane // 4, c = lane % 4): ldmatrix gives lane t the pair M[g][2c:2c+2] of each
8 x 8 matrix (``.trans``: M[2c][g], M[2c+1][g]), lane l supplying the row address l % 8 of
matrix l // 8; movmatrix.trans turns a row-fragment of X into the row-fragment of X^T.
"""

from __future__ import annotations

import numpy as np

LANES = range(32)


def gc(t: int) -> tuple[int, int]:
    return t // 4, t % 4


def ldmatrix_x4(row_of_lane, trans: bool) -> list[list[tuple[float, float]]]:
    """out[t][m]: the pair lane t receives from matrix m; row_of_lane(l) -> 8 values."""
    rows = [np.asarray(row_of_lane(lane)) for lane in LANES]
    mats = [np.array(rows[8 * m : 8 * m + 8]) for m in range(4)]
    out = []
    for t in LANES:
        g, c = gc(t)
        if trans:
            out.append([(mm[2 * c][g], mm[2 * c + 1][g]) for mm in mats])
        else:
            out.append([(mm[g][2 * c], mm[g][2 * c + 1]) for mm in mats])
    return out


def mma(a, b, acc):
    """acc + A B for per-lane fragments a[t] = [a0..a3], b[t] = [b0, b1], acc[t] = [c0..c3]."""
    am = np.zeros((16, 16))
    bm = np.zeros((16, 8))
    for t in LANES:
        g, c = gc(t)
        am[g, 2 * c : 2 * c + 2] = a[t][0]
        am[g + 8, 2 * c : 2 * c + 2] = a[t][1]
        am[g, 2 * c + 8 : 2 * c + 10] = a[t][2]
        am[g + 8, 2 * c + 8 : 2 * c + 10] = a[t][3]
        bm[2 * c : 2 * c + 2, g] = b[t][0]
        bm[2 * c + 8 : 2 * c + 10, g] = b[t][1]
    cm = am @ bm
    out = []
    for t in LANES:
        g, c = gc(t)
        out.append([acc[t][0] + cm[g, 2 * c], acc[t][1] + cm[g, 2 * c + 1],
                    acc[t][2] + cm[g + 8, 2 * c], acc[t][3] + cm[g + 8, 2 * c + 1]])  # fmt: skip
    return out


def movmatrix_trans(x):
    xm = np.zeros((8, 8))
    for t in LANES:
        g, c = gc(t)
        xm[g, 2 * c : 2 * c + 2] = x[t]
    ym = xm.T
    return [(ym[gc(t)[0]][2 * gc(t)[1]], ym[gc(t)[0]][2 * gc(t)[1] + 1]) for t in LANES]


def zeros():
    return [[0.0] * 4 for _ in LANES]


def scores_direct(q, k, d):
    """S^T = K Q^T with K and Q by ldmatrix (decode_mma.cuh, KV_MMA_K_DIRECT)."""
    sc = zeros()
    for ks in range(0, d // 16, 2):

        def q_row(lane, ks=ks):
            col = 16 * ks + 8 * (lane >> 3)
            return q[lane & 7, col : col + 8]

        qh = ldmatrix_x4(q_row, trans=False)
        for u in range(2):

            def k_row(lane, ks=ks, u=u):
                col = 16 * (ks + u) + 8 * (lane >> 4)
                return k[(lane & 7) + 8 * ((lane >> 3) & 1), col : col + 8]

            ah = ldmatrix_x4(k_row, trans=False)
            sc = mma(ah, [[qh[t][2 * u], qh[t][2 * u + 1]] for t in LANES], sc)
    return sc


def scores_registers(q, k, d):
    """S^T with the keys from kv_mma_k4 (token g -> a0, a2; token g + 8 -> a1, a3)."""
    sc = zeros()
    for ks in range(d // 16):
        a = []
        for t in LANES:
            g, c = gc(t)
            d0 = 16 * ks + 2 * c
            lo, hi = slice(d0, d0 + 2), slice(d0 + 8, d0 + 10)
            a.append([tuple(k[g, lo]), tuple(k[g + 8, lo]), tuple(k[g, hi]), tuple(k[g + 8, hi])])
        base = ks - ks % 2

        def q_row(lane, base=base):
            col = 16 * base + 8 * (lane >> 3)
            return q[lane & 7, col : col + 8]

        qh = ldmatrix_x4(q_row, trans=False)
        u = ks % 2
        sc = mma(a, [[qh[t][2 * u], qh[t][2 * u + 1]] for t in LANES], sc)
    return sc


def pv(p, v, d):
    """O^T = V^T P^T: B = movmatrix of the (token g | g + 8) x (rows 2c, 2c + 1) pairs."""
    bp = []
    for tt in range(2):
        x = [(p[2 * gc(t)[1]][gc(t)[0] + 8 * tt], p[2 * gc(t)[1] + 1][gc(t)[0] + 8 * tt])
             for t in LANES]  # fmt: skip
        bp.append(movmatrix_trans(x))
    acc = []
    for mi in range(d // 16):

        def v_row(lane, mi=mi):
            col = 16 * mi + 8 * ((lane >> 3) & 1)
            return v[(lane & 7) + 8 * (lane >> 4), col : col + 8]

        av = ldmatrix_x4(v_row, trans=True)
        acc.append(mma(av, [[bp[0][t], bp[1][t]] for t in LANES], zeros()))
    return acc


def main() -> int:
    rng = np.random.default_rng(1)
    d, rows, tokens = 128, 8, 16
    q = rng.standard_normal((16, d))
    q[rows:] = 0
    k = rng.standard_normal((tokens, d))
    v = rng.standard_normal((tokens, d))
    s = q @ k.T
    for sc in (scores_direct(q, k, d), scores_registers(q, k, d)):
        for t in LANES:
            g, c = gc(t)
            for tt in range(2):
                for j in range(2):
                    assert abs(sc[t][2 * tt + j] - s[2 * c + j, g + 8 * tt]) < 1e-9
    p = s[:8]
    o = p @ v
    acc = pv(p, v, d)
    for mi in range(d // 16):
        for t in LANES:
            g, c = gc(t)
            for j in range(2):
                assert abs(acc[mi][t][j] - o[2 * c + j, 16 * mi + g]) < 1e-9
                assert abs(acc[mi][t][2 + j] - o[2 * c + j, 16 * mi + g + 8]) < 1e-9
    print("fragment model: scores (direct and register keys) and PV match NumPy")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
