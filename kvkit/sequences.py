"""Sequence management for a PagedKVCache: block allocator, sequences, fork, block tables.

The bookkeeping is host-side Python/NumPy; the planes stay where they are (NumPy for a CPU
cache, CuPy for a CUDA cache). One allocation serves every layer: ``append_tokens`` returns
one slot mapping, and the caller writes each layer with ``kvkit.write_kv(layer, k, v, slots)``.

Model (vLLM's block manager, reduced to what kvkit needs):

* ``BlockAllocator``: a free list of block ids and a reference count per block. A block is
  free exactly when its count is 0.
* A sequence is a list of block ids and a token count; token t sits in block
  ``blocks[t // block_size]`` at offset ``t % block_size`` (slot = block * block_size + offset).
* ``fork`` shares the parent's *full* blocks with the child (reference count + 1) and gives the
  child its own copy of a partially filled last block (every plane of every layer, copied on
  the cache's backend). So no sequence ever holds a partially filled block that another
  sequence also holds, and an append never writes into a shared block: a full shared block is
  never written again, new tokens go to fresh blocks. ``check_invariants`` verifies this.
* Running out of blocks raises ``OutOfBlocksError`` (a ``RuntimeError``) before anything
  changes: no block is taken, no length moves, no byte is copied.

Slots handed out here are only meaningful if nothing else writes the same pages: mixing this
manager with hand-made slot mappings on the same cache is the caller's responsibility.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from .cache import PagedKVCache

__all__ = ["OutOfBlocksError", "BlockAllocator", "SequenceManager", "copy_blocks"]


class OutOfBlocksError(RuntimeError):
    """The cache has fewer free blocks than an operation needs; nothing was changed."""


def _int(name: str, value: object) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return int(value)


class BlockAllocator:
    """Free list and reference counts over block ids ``0 .. num_blocks - 1``.

    Blocks are handed out lowest id first on a fresh allocator; freed blocks are reused
    last-freed first (a stack).

    Attributes:
        num_blocks: int, the number of blocks managed.
    """

    def __init__(self, num_blocks: int):
        num_blocks = _int("num_blocks", num_blocks)
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be > 0, got {num_blocks}")
        self.num_blocks = num_blocks
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))  # pop() gives block 0 first
        self._refcount = np.zeros(num_blocks, dtype=np.int64)

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def free_list(self) -> tuple[int, ...]:
        """The free block ids, next to be handed out last."""
        return tuple(self._free)

    def refcounts(self) -> np.ndarray:
        """(num_blocks,) int64 copy of the reference counts."""
        return self._refcount.copy()

    def refcount(self, block: int) -> int:
        return int(self._refcount[block])

    def allocate(self, n: int) -> list[int]:
        """Take n free blocks (reference count 1 each), all or none.

        Raises:
            OutOfBlocksError: fewer than n blocks are free (nothing is taken).
        """
        if n < 0:
            raise ValueError(f"cannot allocate {n} blocks")
        if n > len(self._free):
            raise OutOfBlocksError(
                f"need {n} free blocks, {len(self._free)} of {self.num_blocks} are free"
            )
        blocks = [self._free.pop() for _ in range(n)]
        self._refcount[blocks] = 1
        return blocks

    def incref(self, blocks: Iterable[int]) -> None:
        """Add one holder to each block (each must be in use)."""
        blocks = list(blocks)
        for b in blocks:
            if self._refcount[b] <= 0:
                raise RuntimeError(f"incref of free block {b}")
        for b in blocks:
            self._refcount[b] += 1

    def decref(self, blocks: Iterable[int]) -> list[int]:
        """Drop one holder from each block; blocks reaching 0 go back on the free list.

        Returns:
            the block ids that were freed.
        """
        blocks = list(blocks)
        for b in blocks:
            if self._refcount[b] <= 0:
                raise RuntimeError(f"decref of free block {b}")
        freed = []
        for b in blocks:
            self._refcount[b] -= 1
            if self._refcount[b] == 0:
                self._free.append(b)
                freed.append(b)
        return freed


def copy_blocks(layers, src: Iterable[int], dst: Iterable[int]) -> None:
    """Copy whole pages src[i] -> dst[i] in every plane of every layer (any format).

    ``plane[dst] = plane[src]`` on the planes' own array module: NumPy on the CPU, CuPy
    device-to-device on CUDA (no host round trip). dst blocks must differ from src blocks.

    Args:
        layers: iterable of ``CacheLayer``.
        src, dst: equal-length iterables of block ids.
    """
    src = np.asarray(list(src), dtype=np.int64)
    dst = np.asarray(list(dst), dtype=np.int64)
    if src.shape != dst.shape:
        raise ValueError(f"src {src.shape} and dst {dst.shape} must have one length")
    if src.size == 0:
        return
    for layer in layers:
        for plane in layer.planes.values():
            if src.size == 1:  # basic indexing: a plain slice copy on either backend
                plane[int(dst[0])] = plane[int(src[0])]
            else:
                xp_src = _like(plane, src)
                xp_dst = _like(plane, dst)
                plane[xp_dst] = plane[xp_src]


def _like(plane, idx: np.ndarray):
    """idx as an index array of the plane's array module."""
    if isinstance(plane, np.ndarray):
        return idx
    import cupy

    return cupy.asarray(idx)


class _Seq:
    __slots__ = ("blocks", "length")

    def __init__(self, blocks: list[int], length: int):
        self.blocks = blocks
        self.length = length


class SequenceManager:
    """The sequences of one ``PagedKVCache`` and the allocator of its blocks.

    Reached as ``cache.sequences``; ``PagedKVCache`` forwards ``add_sequence``,
    ``append_tokens``, ``fork``, ``free``, ``seq_len``, ``seq_slots`` and ``block_tables`` here.

    Errors: an unknown id raises ``KeyError``; a duplicate id ``ValueError``; a non-int id or
    count ``TypeError``; a negative count ``ValueError``; too few free blocks
    ``OutOfBlocksError``. Every error is raised before any state changes.
    """

    def __init__(self, cache: PagedKVCache):
        self._cache = cache
        self.block_size = cache.block_size
        self.allocator = BlockAllocator(cache.num_blocks)
        self._seqs: dict[int, _Seq] = {}
        self._next_id = 0

    # -- helpers -------------------------------------------------------------------------

    def _xp(self):
        if self._cache.backend == "cpu":
            return np
        import cupy

        return cupy

    def _get(self, seq_id: object) -> _Seq:
        sid = _int("seq_id", seq_id)
        try:
            return self._seqs[sid]
        except KeyError:
            raise KeyError(f"unknown sequence id {sid}") from None

    def _new_id(self, seq_id: object, name: str) -> int:
        if seq_id is None:
            while self._next_id in self._seqs:
                self._next_id += 1
            sid = self._next_id
        else:
            sid = _int(name, seq_id)
            if sid in self._seqs:
                raise ValueError(f"sequence id {sid} already exists")
        self._next_id = max(self._next_id, sid + 1)
        return sid

    def _pages(self, length: int) -> int:
        return -(-length // self.block_size)

    # -- queries -------------------------------------------------------------------------

    @property
    def seq_ids(self) -> list[int]:
        """Live sequence ids in creation order."""
        return list(self._seqs)

    def __len__(self) -> int:
        return len(self._seqs)

    def __contains__(self, seq_id: object) -> bool:
        return seq_id in self._seqs

    @property
    def num_free_blocks(self) -> int:
        return self.allocator.num_free

    def seq_len(self, seq_id: int) -> int:
        """Number of tokens reserved for the sequence."""
        return self._get(seq_id).length

    def seq_blocks(self, seq_id: int) -> tuple[int, ...]:
        """The sequence's block ids, in token order (ceil(seq_len / block_size) of them)."""
        return tuple(self._get(seq_id).blocks)

    def seq_slots(self, seq_id: int):
        """(seq_len,) int64 slots of all the sequence's tokens, in the cache's backend.

        Pass to ``kvkit.dequantize(layer, slots)`` to read the sequence back.
        """
        s = self._get(seq_id)
        return self._xp().asarray(self._slots(s, 0, s.length))

    def _slots(self, s: _Seq, start: int, stop: int) -> np.ndarray:
        t = np.arange(start, stop, dtype=np.int64)
        blocks = np.asarray(s.blocks, dtype=np.int64)
        if t.size == 0:
            return t
        return blocks[t // self.block_size] * self.block_size + t % self.block_size

    def block_tables(self, seq_ids: Iterable[int], max_blocks: int | None = None):
        """Block tables and lengths of a batch, as arrays of the cache's backend.

        Args:
            seq_ids: iterable of B live sequence ids (repeats allowed).
            max_blocks: width of the table; default the most pages any of the sequences
                uses (at least 1). A fixed width keeps shapes static (CUDA graphs).

        Returns:
            block_tables: (B, max_blocks) int32; row b holds sequence b's pages, then 0.
            seq_lens: (B,) int32.
        """
        if isinstance(seq_ids, (int, np.integer)):
            raise TypeError("seq_ids must be an iterable of sequence ids, not one id")
        seqs = [self._get(sid) for sid in seq_ids]
        need = max([len(s.blocks) for s in seqs], default=0)
        if max_blocks is None:
            width = max(need, 1)
        else:
            width = _int("max_blocks", max_blocks)
            if width < max(need, 1):
                raise ValueError(f"max_blocks={width} is below the {max(need, 1)} pages needed")
        tables = np.zeros((len(seqs), width), dtype=np.int32)
        lens = np.zeros(len(seqs), dtype=np.int32)
        for b, s in enumerate(seqs):
            tables[b, : len(s.blocks)] = s.blocks
            lens[b] = s.length
        xp = self._xp()
        return xp.asarray(tables), xp.asarray(lens)

    # -- mutations -----------------------------------------------------------------------

    def add(self, seq_id: int | None = None) -> int:
        """Start an empty sequence; returns its id (the smallest unused id >= every id seen
        so far when seq_id is None)."""
        sid = self._new_id(seq_id, "seq_id")
        self._seqs[sid] = _Seq([], 0)
        return sid

    def append(self, seq_id: int, n: int):
        """Reserve n more token slots, allocating blocks as needed (all or none).

        Returns:
            (n,) int64 slot mapping of the new tokens, in the cache's backend; write each
            layer with ``kvkit.write_kv(layer, k, v, slots)``.

        Raises:
            OutOfBlocksError: too few free blocks (the sequence and cache are unchanged).
        """
        s = self._get(seq_id)
        n = _int("n", n)
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        start = s.length
        tail = start % self.block_size
        # Invariant: a partially filled last block is held by this sequence alone (fork copies
        # it), so new tokens never land in a shared block.
        if tail and self.allocator.refcount(s.blocks[-1]) != 1:
            raise RuntimeError(f"internal error: sequence {seq_id}'s partial last block is shared")
        new_blocks = self.allocator.allocate(self._pages(start + n) - len(s.blocks))
        s.blocks.extend(new_blocks)
        s.length = start + n
        return self._xp().asarray(self._slots(s, start, start + n))

    def fork(self, seq_id: int, new_id: int | None = None) -> int:
        """A child sequence with the parent's tokens, copy-on-write.

        Full blocks are shared (reference count + 1); a partially filled last block is
        copied to a fresh block for the child (all layers and planes, on the backend).

        Raises:
            OutOfBlocksError: the partial block needs a free block and none is left
            (nothing changes, no id is taken).
        """
        parent = self._get(seq_id)
        if new_id is not None:
            new_id = _int("new_id", new_id)
            if new_id in self._seqs:
                raise ValueError(f"sequence id {new_id} already exists")
        full = parent.length // self.block_size
        partial = len(parent.blocks) > full
        copy = self.allocator.allocate(1) if partial else []  # raises before any change
        shared = parent.blocks[:full]
        self.allocator.incref(shared)
        if copy:
            copy_blocks(self._cache.layers, [parent.blocks[-1]], copy)
        sid = self._new_id(new_id, "new_id")
        self._seqs[sid] = _Seq(shared + copy, parent.length)
        return sid

    def free(self, seq_id: int) -> None:
        """Drop the sequence; its blocks lose a holder, those left with none become free."""
        s = self._get(seq_id)
        del self._seqs[int(seq_id)]
        self.allocator.decref(s.blocks)

    # -- checking ------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Raise ``AssertionError`` if the bookkeeping is inconsistent.

        Checks: each block's reference count equals the number of sequences holding it; the
        free list holds exactly the blocks with count 0, each once; every sequence holds
        ceil(len / block_size) distinct blocks; a partially filled last block has count 1.
        """
        alloc = self.allocator
        holders = np.zeros(alloc.num_blocks, dtype=np.int64)
        for sid, s in self._seqs.items():
            assert len(s.blocks) == self._pages(s.length), f"seq {sid}: page count"
            assert len(set(s.blocks)) == len(s.blocks), f"seq {sid}: a block twice"
            np.add.at(holders, np.asarray(s.blocks, dtype=np.int64), 1)
        assert np.array_equal(holders, alloc._refcount), "refcounts != holders"
        free = alloc.free_list()
        assert len(set(free)) == len(free), "a block is on the free list twice"
        assert set(free) == set(np.flatnonzero(holders == 0).tolist()), "free list != unheld"
        for sid, s in self._seqs.items():
            if s.length % self.block_size:
                assert alloc._refcount[s.blocks[-1]] == 1, f"seq {sid}: shared partial block"
