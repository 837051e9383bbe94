"""ModelKVCache: a whole model's KV cache with boundary layers and a recent-token window.

Two policies that make 3-4 bit caches hold up in generation (FACTS.md):

* boundary layers: the first and last n layers (default 2, capped at L // 2) are stored in a
  higher-precision format (``kvkit.models.layer_formats``);
* a recent-token window: the last R tokens of every sequence are also kept in fp16, and
  decode attends to them in fp16 while older tokens come from the quantized cache; the two
  partial results are combined with ``kvkit.merge_states``.

Layout. Every token is written once to the main (per-layer-format) paged cache, whose
sequences are managed by ``PagedKVCache``'s sequence API, and once to an fp16 window cache.
A sequence's window is a run of whole pages of that cache, oldest first; after an append,
the oldest page is released while the window would still hold at least R tokens without it,
so a window holds between R and R + block_size - 1 tokens (all of them while the sequence is
shorter). Decode of a sequence of length L with a window of W tokens:

    quantized part: tokens [0, L - W) of the main cache, all visible to every query
                    (each query is decoded as a single-token query over that prefix);
    window part:    tokens [L - W, L) of the fp16 cache, with the usual causal offsets;
    result:         merge_states of the two (an empty prefix has lse = -inf).

So decode computes attention over "dequantized old tokens + fp16 recent tokens", the same
function as float64 attention over that concatenation up to float32 rounding.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from . import formats
from .cache import PagedKVCache
from .ops import decode, dequantize, merge_states, write_kv
from .sequences import BlockAllocator, OutOfBlocksError


class ModelKVCache:
    """A model's paged KV cache: per-layer formats (boundary policy) + an fp16 recent window.

    Args:
        num_layers, num_kv_heads, head_dim: the model's attention shape.
        fmt: the format name of the non-boundary layers (e.g. "turboquant_4bit_nc").
        num_blocks: pages of the main cache; block_size: tokens per page (16/32/64/128).
        boundary_layers: n first and n last layers in ``boundary_format`` (capped at L // 2).
        window: R, recent tokens per sequence kept in fp16 (0 disables the window).
        window_blocks: pages of the window cache (default: enough for 64 sequences).
        backend: None / "cpu" or "cuda".
        fmt_options: passed to ``kvkit.formats.get`` (e.g. rotation=, codebook=).
    """

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        fmt: str = "turboquant_4bit_nc",
        *,
        num_blocks: int,
        block_size: int = 16,
        boundary_layers: int = 2,
        boundary_format: str = "fp16",
        window: int = 128,
        window_blocks: int | None = None,
        backend: str | None = None,
        **fmt_options,
    ):
        from .models import layer_formats

        if isinstance(window, bool) or not isinstance(window, int) or window < 0:
            raise ValueError(f"window must be an int >= 0, got {window!r}")
        fmts = layer_formats(
            num_layers, fmt, head_dim, boundary_layers=boundary_layers,
            boundary_format=boundary_format, **fmt_options,
        )  # fmt: skip
        self.cache = PagedKVCache(fmts, num_layers, num_kv_heads, num_blocks, block_size, backend)
        self.window = window
        self.block_size = block_size
        self.num_layers = num_layers
        self.window_cache = None
        self._win_pages: dict[int, deque] = {}
        self._win_len: dict[int, int] = {}
        if window:
            per_seq = -(-window // block_size) + 1
            n_win = window_blocks if window_blocks is not None else 64 * per_seq
            self.window_cache = PagedKVCache(
                formats.get("fp16", head_dim), num_layers, num_kv_heads, n_win, block_size,
                backend,
            )  # fmt: skip
            self._win_blocks = BlockAllocator(n_win)

    @property
    def formats(self):
        return self.cache.formats

    # --- sequences --------------------------------------------------------------------------
    def add_sequence(self, seq_id: int | None = None) -> int:
        seq_id = self.cache.add_sequence(seq_id)
        self._win_pages[seq_id] = deque()
        self._win_len[seq_id] = 0
        return seq_id

    def free(self, seq_id: int) -> None:
        self.cache.free(seq_id)
        pages = self._win_pages.pop(seq_id)
        if self.window:
            self._win_blocks.decref(pages)
        self._win_len.pop(seq_id)

    def seq_len(self, seq_id: int) -> int:
        return self.cache.seq_len(seq_id)

    def window_len(self, seq_id: int) -> int:
        """Tokens of the sequence currently held in the fp16 window."""
        return self._win_len[seq_id]

    def append_tokens(self, seq_id: int, n: int):
        """Reserve n new tokens; returns (main slots (n,), window slots (n,) or None).

        Pass both to ``write`` for every layer. Raises like ``PagedKVCache.append_tokens``
        when either cache runs out of pages, and then neither cache has changed.
        """
        if not self.window:
            return self.cache.append_tokens(seq_id, n), None
        pages = self._win_pages[seq_id]
        length = self._win_len[seq_id]
        bs = self.block_size
        in_last = (-length) % bs  # free slots in the window's last page
        need = max(0, -(-(n - in_last) // bs))
        if need > self._win_blocks.num_free:
            raise OutOfBlocksError(
                f"window cache out of pages: {need} needed, {self._win_blocks.num_free} free"
            )
        main_slots = self.cache.append_tokens(seq_id, n)
        pages.extend(self._win_blocks.allocate(need))
        # Release the oldest (always full) pages the window no longer needs; a new token
        # that falls in a released page (n > R) is not written to the window (slot -1).
        total = length + n
        dropped = 0
        while total - dropped - bs >= self.window and len(pages) > 1:
            self._win_blocks.decref([pages.popleft()])
            dropped += bs
        self._win_len[seq_id] = total - dropped
        pos = np.arange(length, total) - dropped
        page_of = np.array(pages, np.int64)
        safe = np.maximum(pos, 0)
        win = np.where(pos >= 0, page_of[safe // bs] * bs + safe % bs, -1)
        return main_slots, self._as_backend(win.astype(np.int64))

    def _as_backend(self, arr: np.ndarray):
        if self.cache.backend == "cuda":
            import cupy

            return cupy.asarray(arr)
        return arr

    # --- data -------------------------------------------------------------------------------
    def write(self, layer: int, k, v, slots) -> None:
        """Store new tokens' K/V of one layer: k, v (n, Hkv, D); slots from append_tokens.

        Write every layer before the next append_tokens: an append may release window
        pages of tokens that are older than the window.
        """
        main_slots, win_slots = slots
        write_kv(self.cache.layer(layer), k, v, main_slots)
        if win_slots is not None:
            write_kv(self.window_cache.layer(layer), k, v, win_slots)

    def window_tables(self, seq_ids):
        """(tables (B, max_pages) int32, lens (B,) int32) of the sequences' fp16 windows."""
        rows = [list(self._win_pages[s]) for s in seq_ids]
        width = max(1, max(len(r) for r in rows))
        tables = np.zeros((len(rows), width), np.int32)
        for i, r in enumerate(rows):
            tables[i, : len(r)] = r
        lens = np.array([self._win_len[s] for s in seq_ids], np.int32)
        return self._as_backend(tables), self._as_backend(lens)

    def attended_kv(self, layer: int, seq_id: int):
        """What decode attends to for one sequence: k, v (T, Hkv, D) float32, the dequantized
        main-cache prefix followed by the fp16 window (arrays of the cache's backend).

        For checking decode against an exact reference; it reads every token, so it is not
        for the hot path.
        """
        xp = np if self.cache.backend == "cpu" else _cupy()
        bs = self.block_size
        total, w = self.seq_len(seq_id), self._win_len[seq_id] if self.window else 0
        tables, _ = self.cache.block_tables([seq_id])
        t = xp.arange(total)
        k, v = dequantize(
            self.cache.layer(layer), tables[0, t // bs].astype(np.int64) * bs + t % bs
        )
        if not w:
            return k, v
        w_tables, _ = self.window_tables([seq_id])
        tw = xp.arange(w)
        w_slots = w_tables[0, tw // bs].astype(np.int64) * bs + tw % bs
        kw, vw = dequantize(self.window_cache.layer(layer), w_slots)
        return xp.concatenate([k[: total - w], kw]), xp.concatenate([v[: total - w], vw])

    def decode(self, layer: int, q, seq_ids, **opts):
        """Attention of q over the quantized prefix + fp16 window of each sequence.

        q: (B, Hq, D) or (B, q_len, Hq, D) with q_len <= the window length (each sequence's
        query tokens must already be appended and written). Options as ``kvkit.decode``
        except ``window`` (the sliding-window option is not combined with the recent window).
        Returns o with q's shape, float32 (and lse with return_lse=True).
        """
        if "window" in opts:
            raise ValueError("ModelKVCache.decode does not take a sliding window")
        return_lse = opts.pop("return_lse", False)
        sinks = opts.pop("sinks", None)
        xp = np if self.cache.backend == "cpu" else _cupy()
        single = q.ndim == 3
        q4 = q[:, None] if single else q
        q_len = q4.shape[1]
        tables, lens = self.cache.block_tables(seq_ids)
        main = self.cache.layer(layer)
        if not self.window:
            o, lse = decode(q4, main, tables, lens, return_lse=True, sinks=sinks, **opts)
        else:
            w_tables, w_lens = self.window_tables(seq_ids)
            w_host = np.array([self._win_len[s] for s in seq_ids])
            if (w_host < q_len).any():
                raise ValueError(f"q_len {q_len} exceeds a sequence's window length")
            o_win, lse_win = decode(
                q4, self.window_cache.layer(layer), w_tables, w_lens, return_lse=True,
                sinks=sinks, **opts,
            )  # fmt: skip
            old = np.array([self.cache.seq_len(s) for s in seq_ids]) - w_host
            o_old = xp.zeros_like(o_win)
            lse_old = xp.full(lse_win.shape, -np.inf, dtype=np.float32)
            have = np.flatnonzero(old > 0)
            if have.size:
                # Every query sees the whole prefix: decode each as a one-token query.
                sel = xp.asarray(have)
                qs = q4[sel].reshape(have.size * q_len, 1, *q4.shape[2:])
                t_sel = xp.repeat(tables[sel], q_len, axis=0)
                l_sel = xp.asarray(np.repeat(old[have], q_len).astype(np.int32))
                o_p, lse_p = decode(qs, main, t_sel, l_sel, return_lse=True, **opts)
                o_old[sel] = o_p.reshape(have.size, q_len, *o_p.shape[2:])
                lse_old[sel] = lse_p.reshape(have.size, q_len, lse_p.shape[-1])
            o, lse = merge_states(xp.stack([o_old, o_win]), xp.stack([lse_old, lse_win]))
        if single:
            o, lse = o[:, 0], lse[:, 0]
        return (o, lse) if return_lse else o


def _cupy():
    import cupy

    return cupy
