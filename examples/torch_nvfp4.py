"""torch interop through DLPack with an NVFP4 cache on the GPU.

    python examples/torch_nvfp4.py

torch CUDA tensors (bf16 K/V, int64 slots, fp16 queries, int32 tables) go straight into
``kvkit.write_kv`` / ``kvkit.decode`` without a copy; the CuPy output comes back to torch
through DLPack, again without a copy. The result is checked against
``torch.nn.functional.scaled_dot_product_attention`` on the dequantized cache.
"""

from __future__ import annotations

import sys

import cupy as cp
import numpy as np
import torch
import torch.nn.functional as F

import kvkit
from kvkit import formats
from kvkit.testing.tolerance import DECODE_GPU_RTOL


def main(batch: int = 4, seq_len: int = 1000, hq: int = 32, hkv: int = 8, d: int = 128) -> float:
    torch.manual_seed(0)
    fmt = formats.get("nvfp4", d)
    bs = 16
    pages = -(-seq_len // bs)
    cache = kvkit.PagedKVCache(fmt, 1, hkv, batch * pages, bs, backend="cuda")
    layer = cache.layer(0)
    seqs = [cache.add_sequence() for _ in range(batch)]

    k = torch.randn(batch, seq_len, hkv, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(batch, seq_len, hkv, d, device="cuda", dtype=torch.bfloat16)
    # Per-layer global scales, decode convention amax / (6 * 448), from torch's amax.
    layer.k_scale = formats.calibrate(np.array([k.float().abs().max().item()]))
    layer.v_scale = formats.calibrate(np.array([v.float().abs().max().item()]))
    for b, s in enumerate(seqs):
        slots = torch.from_dlpack(cache.append_tokens(s, seq_len))  # CuPy -> torch, no copy
        kvkit.write_kv(layer, k[b], v[b], slots)  # torch bf16 in, no copy

    tables_cp, lens_cp = cache.block_tables(seqs)
    tables, lens = torch.from_dlpack(tables_cp), torch.from_dlpack(lens_cp)
    q = torch.randn(batch, hq, d, device="cuda", dtype=torch.float16)
    o = torch.from_dlpack(kvkit.decode(q, layer, tables, lens))  # (B, Hq, D) float32

    # Reference: SDPA (float32) over what the cache holds, read back through kvkit.dequantize.
    worst = 0.0
    for b, s in enumerate(seqs):
        kd, vd = (torch.from_dlpack(x) for x in kvkit.dequantize(layer, cache.seq_slots(s)))
        ref = F.scaled_dot_product_attention(
            q[b].float()[:, None], kd.transpose(0, 1), vd.transpose(0, 1), enable_gqa=True
        )[:, 0]
        err = ((o[b] - ref).abs().amax(-1) / ref.abs().amax(-1)).max().item()
        worst = max(worst, err)
    print(
        f"nvfp4 cache, {batch} x {seq_len} tokens in {layer.nbytes:,} bytes; "
        f"decode vs SDPA over the dequantized cache: worst relative error {worst:.2e}"
    )
    cp.cuda.Device().synchronize()
    return worst


if __name__ == "__main__":
    sys.exit(0 if main() <= DECODE_GPU_RTOL else 1)
