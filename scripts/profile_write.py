"""One write_kv of 4M token-heads (fp16 K and V in), repeated: a target for Nsight Compute,
with the inputs of ``kvkit bench``'s write rows (``kvkit.bench.write_inputs``) in one slot
order of WRITE_SLOT_ORDERS (default "scatter", the order this script always used).

    ncu --kernel-name regex:kvkit_write --launch-skip 2 --launch-count 1 \\
        python scripts/profile_write.py turboquant_4bit_nc [pages|scatter|sorted]
"""

from __future__ import annotations

import sys

import cupy as cp

import kvkit
from kvkit import formats
from kvkit.bench import WRITE_SLOT_ORDERS, write_inputs, write_layer


def main(argv: list[str]) -> int:
    name = argv[0] if argv else "turboquant_4bit_nc"
    order = argv[1] if len(argv) > 1 else "scatter"
    if order not in WRITE_SLOT_ORDERS:
        raise SystemExit(f"slot order must be one of {WRITE_SLOT_ORDERS}, got {order!r}")
    heads, head_dim = 8, 128
    k, v, slots = write_inputs(head_dim, heads, slot_order=order)
    layer = write_layer(formats.get(name, head_dim), heads, int(slots.shape[0]))
    for _ in range(5):
        kvkit.write_kv(layer, k, v, slots)
    cp.cuda.Device().synchronize()
    print(name, k.shape[0] * heads, "token-heads,", order)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
