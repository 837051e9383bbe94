"""kvkit: quantized paged KV caches (NVFP4, TurboQuant, FP8, fp16/bf16) and split-K decode.

Public API::

    fmt = kvkit.formats.get("turboquant_4bit_nc", head_dim=128)
    cache = kvkit.PagedKVCache(fmt, num_layers, num_kv_heads, num_blocks, block_size)
    layer = cache.layer(0)
    kvkit.write_kv(layer, k, v, slot_mapping)           # k, v: (N, Hkv, D)
    o = kvkit.decode(q, layer, block_tables, seq_lens)   # q: (B, Hq, D) -> (B, Hq, D)
    k, v = kvkit.dequantize(layer, slots)                # (N, Hkv, D) float32
"""

from . import formats
from .cache import CacheLayer, PagedKVCache
from .ops import decode, dequantize, merge_states, write_kv
from .plan import DecodePlan
from .sequences import OutOfBlocksError

__version__ = "0.1.0"

__all__ = [
    "formats",
    "PagedKVCache",
    "CacheLayer",
    "write_kv",
    "dequantize",
    "decode",
    "merge_states",
    "DecodePlan",
    "OutOfBlocksError",
    "__version__",
]
