"""PagedKVCache: the planes of every layer, allocated head-major per page ("HND").

A layer's plane ``name`` has shape ``(num_blocks, num_kv_heads, block_size, width)`` with the
dtype and width from ``fmt.planes`` (uint8 for packed planes, float16 for fp16, the uint16
bits for bf16). A token's slot is ``block * block_size + offset``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ._checks import check_int
from .formats import Format, check_global_scale
from .sequences import SequenceManager

BLOCK_SIZES = (16, 32, 64, 128)
BACKENDS = ("cpu", "cuda")


class CacheLayer:
    """One layer's planes, format and per-layer global scales.

    Attributes:
        fmt: the layer's ``Format``.
        planes: dict name -> array ``(num_blocks, num_kv_heads, block_size, width)``.
        k_scale, v_scale: per-layer fp32 global scales (formats with ``has_global_scales``;
            1.0 and ignored otherwise). Setting one validates it (finite, > 0).
    """

    def __init__(
        self, fmt: Format, num_kv_heads: int, num_blocks: int, block_size: int, backend: str = "cpu"
    ):
        self.fmt = fmt
        self.num_kv_heads = num_kv_heads
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.backend = backend
        self._k_scale = 1.0
        self._v_scale = 1.0
        xp = _array_module(backend)
        self.planes = {
            name: xp.zeros((num_blocks, num_kv_heads, block_size, spec.width), dtype=spec.dtype)
            for name, spec in fmt.planes.items()
        }
        #: CUDA only: int32 (1,) device word the kernels OR error bits into (1 slot out of
        #: range, 2 block-table entry out of range, 4 seq_len out of range).
        self.error_flag = xp.zeros(1, dtype=np.int32) if backend == "cuda" else None

    @property
    def head_dim(self) -> int:
        return self.fmt.head_dim

    @property
    def capacity(self) -> int:
        """Number of token slots: num_blocks * block_size."""
        return self.num_blocks * self.block_size

    @property
    def k_scale(self) -> float:
        return self._k_scale

    @k_scale.setter
    def k_scale(self, value: float) -> None:
        self._k_scale = check_global_scale("k_scale", value)

    @property
    def v_scale(self) -> float:
        return self._v_scale

    @v_scale.setter
    def v_scale(self, value: float) -> None:
        self._v_scale = check_global_scale("v_scale", value)

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.planes.values())

    def dequantize_pages(self, pages: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """pages: (P,) block ids in range -> k, v (P, num_kv_heads, block_size, D) float32.

        CPU layers only (the CPU decode attends over dequantized pages).
        """
        from .cpu.backend import dequantize_rows

        if self.backend != "cpu":
            raise TypeError("dequantize_pages is part of the CPU decode path")
        pages = np.asarray(pages, dtype=np.int64)
        bs = self.block_size
        blocks = np.repeat(pages, bs)
        offsets = np.tile(np.arange(bs, dtype=np.int64), pages.shape[0])
        k, v = dequantize_rows(self, blocks, offsets)
        shape = (pages.shape[0], bs, self.num_kv_heads, self.head_dim)
        return (
            np.ascontiguousarray(k.reshape(shape).transpose(0, 2, 1, 3)),
            np.ascontiguousarray(v.reshape(shape).transpose(0, 2, 1, 3)),
        )

    def __repr__(self) -> str:
        return (
            f"CacheLayer({self.fmt.name}, D={self.head_dim}, kv_heads={self.num_kv_heads}, "
            f"blocks={self.num_blocks}x{self.block_size}, backend={self.backend})"
        )


def _array_module(backend: str):
    if backend == "cpu":
        return np
    try:
        import cupy
    except Exception as exc:  # ImportError, or a CUDA install that fails to load
        raise RuntimeError(
            f"backend='cuda' needs CuPy with a working CUDA device ({type(exc).__name__}: {exc}); "
            "install kvkit[cuda]"
        ) from None
    return cupy


class PagedKVCache:
    """Paged KV cache: ``num_layers`` layers of planes in one or several formats.

    Args:
        fmt: a ``Format`` for every layer, or a sequence of ``num_layers`` formats (per-layer
            formats, e.g. boundary layers kept in higher precision). All must share head_dim.
        num_layers, num_kv_heads, num_blocks: positive ints.
        block_size: tokens per page, one of 16, 32, 64, 128.
        backend: ``None`` or ``"cpu"`` (NumPy planes, Numba kernels), or ``"cuda"`` (CuPy
            planes on the current device, NVRTC-compiled kernels).
    """

    def __init__(
        self,
        fmt: Format | Sequence[Format],
        num_layers: int,
        num_kv_heads: int,
        num_blocks: int,
        block_size: int,
        backend: str | None = None,
    ):
        num_layers = check_int("num_layers", num_layers, 1)
        num_kv_heads = check_int("num_kv_heads", num_kv_heads, 1)
        num_blocks = check_int("num_blocks", num_blocks, 1)
        block_size = check_int("block_size", block_size, 1)
        if block_size not in BLOCK_SIZES:
            raise ValueError(f"block_size must be one of {BLOCK_SIZES}, got {block_size}")
        if backend is None:
            backend = "cpu"
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS} or None, got {backend!r}")
        if isinstance(fmt, str):
            raise TypeError(
                f"fmt must be a Format (kvkit.formats.get({fmt!r}, head_dim)), not a string"
            )
        fmts = [fmt] * num_layers if isinstance(fmt, Format) else list(fmt)
        if len(fmts) != num_layers:
            raise ValueError(f"got {len(fmts)} formats for {num_layers} layers")
        for f in fmts:
            if not isinstance(f, Format):
                raise TypeError(f"fmt must be a kvkit.formats.Format, got {type(f).__name__}")
        if len({f.head_dim for f in fmts}) != 1:
            raise ValueError("all layers must share one head_dim")
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.backend = backend
        self.layers = [CacheLayer(f, num_kv_heads, num_blocks, block_size, backend) for f in fmts]
        #: Sequences and the block allocator (kvkit.sequences); the methods below forward here.
        self.sequences = SequenceManager(self)

    @property
    def formats(self) -> list[Format]:
        return [layer.fmt for layer in self.layers]

    def layer(self, i: int) -> CacheLayer:
        """Layer i (0 <= i < num_layers)."""
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"layer index must be an int, got {type(i).__name__}")
        if not 0 <= i < self.num_layers:
            raise IndexError(f"layer index {i} out of range for {self.num_layers} layers")
        return self.layers[i]

    @property
    def nbytes(self) -> int:
        return sum(layer.nbytes for layer in self.layers)

    # -- sequences (kvkit.sequences.SequenceManager; errors are raised before any change) --

    def add_sequence(self, seq_id: int | None = None) -> int:
        """Start an empty sequence; returns its int id. A duplicate id raises ValueError."""
        return self.sequences.add(seq_id)

    def append_tokens(self, seq_id: int, n: int):
        """Reserve n >= 0 more tokens for a sequence -> (n,) int64 slot mapping (NumPy on the
        CPU, CuPy on CUDA), shared by all layers: ``kvkit.write_kv(layer, k, v, slots)``.

        Raises ``kvkit.sequences.OutOfBlocksError`` (a RuntimeError) when the blocks run out,
        with the cache unchanged; KeyError for an unknown id; ValueError for n < 0.
        """
        return self.sequences.append(seq_id, n)

    def fork(self, seq_id: int, new_id: int | None = None) -> int:
        """Copy-on-write child of a sequence: full blocks shared by reference count, a
        partially filled last block copied (every layer and plane). Returns the child's id."""
        return self.sequences.fork(seq_id, new_id)

    def free(self, seq_id: int) -> None:
        """Drop a sequence; blocks nobody else holds return to the free list."""
        self.sequences.free(seq_id)

    def seq_len(self, seq_id: int) -> int:
        """Tokens reserved for a sequence."""
        return self.sequences.seq_len(seq_id)

    def seq_slots(self, seq_id: int):
        """(seq_len,) int64 slots of all of a sequence's tokens, in the cache's backend."""
        return self.sequences.seq_slots(seq_id)

    def block_tables(self, seq_ids, max_blocks: int | None = None):
        """(block_tables (B, max_blocks) int32, seq_lens (B,) int32) for a batch of sequence
        ids, in the cache's backend, padded with 0 past each sequence's pages."""
        return self.sequences.block_tables(seq_ids, max_blocks)

    def __repr__(self) -> str:
        names = sorted({f.name for f in self.formats})
        return (
            f"PagedKVCache({'/'.join(names)}, layers={self.num_layers}, "
            f"kv_heads={self.num_kv_heads}, blocks={self.num_blocks}x{self.block_size})"
        )
