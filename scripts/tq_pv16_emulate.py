"""NumPy emulation of KVKIT_DECODE_TQ_PV16's W operand (decode_mma.cuh kv_w16_pow2), no GPU.

    python scripts/tq_pv16_emulate.py [--trials N]

Two query rows x 32 tokens (one pair's fresh accumulator), 4-bit centred codes, value scales
~4e-6 and ~400 mixed in one tile (fp16-rounded), half the trials with row 0 on the tiny-scale
tokens and row 1 on the large ones. W = p x scale (float32) times 2^k (the row's largest |W| to
[2^14, 2^15), or one k for both rows: "warp"), split hi + lo in fp16 as kv_split_f16x2_packed,
summed exactly (float64) and scaled back. Prints the worst error over trials relative to the
row's largest |W x code| term: the per-row powers stay at ~2^-22, one power per warp does not.
"""

from __future__ import annotations

import argparse

import numpy as np


def _split(x: np.ndarray) -> np.ndarray:
    """hi + lo in fp16 of float32 x (lo the fp16 rounding of the exact x - hi), as float64."""
    x = x.astype(np.float32)
    hi = x.astype(np.float16)
    lo = (x - hi.astype(np.float32)).astype(np.float16)
    return hi.astype(np.float64) + lo.astype(np.float64)


def _pow2(m: float) -> tuple[np.float32, float]:
    """(2^(141 - e), 2^(e - 141)) for m's biased float32 exponent e (m floored at 2^-100)."""
    e = int((np.float32(max(m, 2.0**-100)).view(np.uint32) >> 23) & 0xFF)
    return np.float32(2.0 ** (141 - e)), 2.0 ** (e - 141)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=2000)
    args = ap.parse_args()
    rng = np.random.default_rng(1)
    worst = {"row": 0.0, "warp": 0.0}
    for trial in range(args.trials):
        codes = rng.integers(-8, 8, size=(32, 16)).astype(np.float64)
        p = np.exp(-rng.exponential(3.0, size=(2, 32))).astype(np.float32)
        scale = np.where(rng.random(32) < 0.5, 4e-6, 400.0) * np.exp(rng.standard_normal(32))
        scale = scale.astype(np.float16).astype(np.float32)
        if trial % 2:
            p[0, scale > 1] *= np.float32(1e-9)
            p[1, scale < 1] *= np.float32(1e-9)
        w = (p * scale[None]).astype(np.float32)
        exact = w.astype(np.float64) @ codes
        big = np.abs(w.astype(np.float64)[:, :, None] * codes[None]).max(axis=(1, 2))
        for mode in worst:
            out = np.zeros_like(exact)
            for r in range(2):
                s, inv = _pow2(float(np.abs(w[r] if mode == "row" else w).max()))
                out[r] = (_split(w[r] * s) @ codes) * inv
            err = float((np.abs(out - exact).max(axis=1) / big).max())
            worst[mode] = max(worst[mode], err)
    for mode, err in worst.items():
        print(
            f"{mode}: worst error / the row's largest |W x code| = {err:.2e}",
            f"(2^{np.log2(err):.1f})",
        )


if __name__ == "__main__":
    main()
