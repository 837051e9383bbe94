"""Launch one write, one dequantize and one decode per format, with bad indices mixed in.

Run under ``compute-sanitizer --tool memcheck``: any out-of-bounds access is reported there.
The script itself checks that the kernels flagged the bad indices and that validate=True
raises the CPU path's error. Exit code 0 when every expectation held.

    python scripts/sanitize_targets.py [HEAD_DIM [GROUP]]    (default 128 and 4; e.g. 256, 64;
                                                             GROUP: query heads per KV head)
"""

from __future__ import annotations

import sys

import cupy as cp
import numpy as np

import kvkit
from kvkit import formats
from kvkit.testing.synthetic import llm_like_kv, llm_like_queries


def main() -> int:
    failures = []
    hkv, bs, nb = 2, 16, 6
    d = int(sys.argv[1]) if len(sys.argv) > 1 else 128
    hq = hkv * (int(sys.argv[2]) if len(sys.argv) > 2 else 4)
    for name in formats.names():
        try:
            fmt = formats.get(name, d)
        except ValueError as exc:  # e.g. MSE keys at a head_dim that is not a power of two
            print(f"{name}: not at head_dim {d} ({exc})")
            continue
        layer = kvkit.PagedKVCache(fmt, 1, hkv, nb, bs, backend="cuda").layer(0)
        k, v = llm_like_kv(40, hkv, d, seed=1)
        if layer.fmt.has_global_scales:
            layer.k_scale, layer.v_scale = layer.fmt.calibrate(k), layer.fmt.calibrate(v)
        slots = np.arange(40, dtype=np.int64)
        slots[3] = -1
        slots[5] = nb * bs + 1000  # beyond the cache: skipped and flagged
        kd, vd = cp.asarray(k.astype(np.float16)), cp.asarray(v.astype(np.float16))
        kvkit.write_kv(layer, kd, vd, cp.asarray(slots))
        try:
            kvkit.write_kv(layer, kd, vd, cp.asarray(slots), validate=True)
            failures.append(f"{name}: write with a slot beyond the cache did not raise")
        except ValueError:
            pass
        kvkit.dequantize(layer, cp.asarray(slots))
        q = cp.asarray(llm_like_queries(2, hq, d, seed=1, num_kv_heads=hkv))
        tables = cp.asarray(np.array([[0, 1, 2], [3, 4, 99]], np.int32))  # 99: out of range
        lens = cp.asarray(np.array([40, 40], np.int32))
        o = kvkit.decode(q, layer, tables, lens)
        cp.cuda.Device().synchronize()
        if not bool(cp.isfinite(o).all()):
            failures.append(f"{name}: decode with a bad table entry gave non-finite output")
        try:
            kvkit.decode(q, layer, tables, lens, validate=True)
            failures.append(f"{name}: decode with a bad table entry did not raise")
        except ValueError:
            pass
        bad_lens = cp.asarray(np.array([40, 10_000], np.int32))  # beyond the table
        kvkit.decode(q, layer, cp.ascontiguousarray(tables[:, :2]), bad_lens, num_splits=4)
        cp.cuda.Device().synchronize()
        print(f"{name}: ok")
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
