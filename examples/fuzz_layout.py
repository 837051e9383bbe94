"""Fuzz one cache format's byte layout with Hypothesis.

    python examples/fuzz_layout.py --format turboquant_3bit_nc --head-dim 128 --examples 200

For random token counts, head counts, block sizes, slot mappings (with padding) and K/V
magnitudes, writes through ``kvkit.write_kv`` and checks that

* the bytes of every written slot equal the format's reference quantizer
  (``fmt.encode``), and every other slot stays zero;
* ``kvkit.dequantize`` returns exactly the reference reader's values (``fmt.decode``);
* with ``--cuda`` (and a GPU): the CUDA kernels write the same bytes as the CPU backend.

Exit status 0 when Hypothesis found nothing; otherwise it prints the smallest failing case.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import kvkit
from kvkit import formats


def cases(fmt):
    return st.fixed_dictionaries(
        dict(
            heads=st.integers(1, 4),
            block_size=st.sampled_from([16, 32, 64, 128]),
            num_blocks=st.integers(1, 4),
            n=st.integers(1, 64),
            magnitude=st.sampled_from([1e-3, 1.0, 100.0, 60000.0]),
            padding=st.floats(0.0, 0.5),
            seed=st.integers(0, 2**32 - 1),
        )
    )


def check(fmt, case, cuda: bool) -> None:
    rng = np.random.default_rng(case["seed"])
    bs, nb, heads = case["block_size"], case["num_blocks"], case["heads"]
    n = min(case["n"], nb * bs)
    d = fmt.head_dim
    k = (rng.standard_normal((n, heads, d)) * case["magnitude"]).clip(-60000, 60000)
    v = (rng.standard_normal((n, heads, d)) * case["magnitude"]).clip(-60000, 60000)
    k, v = k.astype(np.float32), v.astype(np.float32)
    slots = rng.permutation(nb * bs)[:n].astype(np.int64)
    slots[rng.random(n) < case["padding"]] = -1

    layer = kvkit.PagedKVCache(fmt, 1, heads, nb, bs).layer(0)
    if fmt.has_global_scales:
        layer.k_scale, layer.v_scale = fmt.calibrate(k), fmt.calibrate(v)
    kvkit.write_kv(layer, k, v, slots)

    live = slots >= 0
    ref = fmt.encode(k[live], v[live], layer.k_scale, layer.v_scale)
    blocks, offsets = np.divmod(slots[live], bs)
    written = np.zeros((nb, bs), bool)
    written[blocks, offsets] = True
    for name, plane in layer.planes.items():
        assert np.array_equal(plane[blocks, :, offsets, :], ref[name]), f"plane {name} bytes"
        assert not plane.transpose(0, 2, 1, 3)[~written].view(np.uint8).any(), f"{name} leak"
    k_hat, v_hat = kvkit.dequantize(layer, slots)
    rk, rv = fmt.decode(ref, layer.k_scale, layer.v_scale)
    assert np.array_equal(k_hat[live], rk, equal_nan=True), "dequantized K"
    assert np.array_equal(v_hat[live], rv, equal_nan=True), "dequantized V"

    if cuda:
        import cupy as cp

        gpu = kvkit.PagedKVCache(fmt, 1, heads, nb, bs, backend="cuda").layer(0)
        gpu.k_scale, gpu.v_scale = layer.k_scale, layer.v_scale
        kvkit.write_kv(gpu, cp.asarray(k), cp.asarray(v), cp.asarray(slots))
        for name, plane in gpu.planes.items():
            assert np.array_equal(plane.get(), layer.planes[name]), f"CUDA bytes of {name}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--format", default="turboquant_4bit_nc", choices=formats.names())
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--examples", type=int, default=100)
    ap.add_argument("--cuda", action="store_true", help="also compare CUDA bytes (needs a GPU)")
    args = ap.parse_args(argv)
    fmt = formats.get(args.format, args.head_dim)

    @settings(max_examples=args.examples, deadline=None, database=None)
    @given(cases(fmt))
    def fuzz(case):
        check(fmt, case, args.cuda)

    try:
        fuzz()
    except AssertionError as exc:
        print(f"{fmt.name} D={fmt.head_dim}: FAILED: {exc}")
        return 1
    print(f"{fmt.name} D={fmt.head_dim}: {args.examples} examples, no layout error found")
    return 0


if __name__ == "__main__":
    sys.exit(main())
