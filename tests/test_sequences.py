"""Sequence management on PagedKVCache (kvkit.sequences), CPU backend.

Unit tests for add_sequence / append_tokens / fork / free / seq_len / block_tables and their
errors, decode through the tables against float64 attention, and a Hypothesis state machine
over random add / append (+ writes on every layer) / fork / free that checks after every step
that no sequence's bytes change because of another sequence's writes, that the allocator's
bookkeeping is consistent, and that running out of blocks changes nothing.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import kvkit
from kvkit import formats
from kvkit.sequences import BlockAllocator, OutOfBlocksError, copy_blocks
from kvkit.testing.reference import attention_f64
from kvkit.testing.rng import rng as make_rng
from kvkit.testing.synthetic import llm_like_kv, llm_like_queries
from kvkit.testing.tolerance import DECODE_CPU_RTOL, DECODE_GPU_RTOL, rel_error

HEAD_DIM = 64
HKV = 2
HQ = 4
BS = 16


def make_cache(name="fp16", num_blocks=8, num_layers=2, backend=None):
    fmt = formats.get(name, HEAD_DIM)
    return kvkit.PagedKVCache(fmt, num_layers, HKV, num_blocks, BS, backend=backend)


def write_all(cache, slots, seed):
    """Random K/V for the slots, written on every layer; returns [(k, v)] per layer."""
    out = []
    for i, layer in enumerate(cache.layers):
        k, v = llm_like_kv(len(slots), HKV, HEAD_DIM, seed=seed * 31 + i)
        kvkit.write_kv(layer, k, v, slots)
        out.append((k, v))
    return out


def state(cache):
    """Everything a failed operation must leave alone: bookkeeping and plane bytes."""
    seqs = cache.sequences
    return (
        {sid: (seqs.seq_len(sid), seqs.seq_blocks(sid)) for sid in seqs.seq_ids},
        seqs.allocator.free_list(),
        seqs.allocator.refcounts().tolist(),
        [{n: p.copy() for n, p in layer.planes.items()} for layer in cache.layers],
    )


def assert_same_state(a, b):
    assert a[:3] == b[:3]
    for pa, pb in zip(a[3], b[3]):
        for name in pa:
            assert np.array_equal(pa[name], pb[name]), name


# ---------------------------------------------------------------------------------------
# BlockAllocator


def test_allocator_all_or_none_and_refcounts():
    a = BlockAllocator(4)
    assert a.allocate(3) == [0, 1, 2]
    assert a.num_free == 1 and a.num_used == 3
    with pytest.raises(OutOfBlocksError, match="need 2 free blocks, 1 of 4"):
        a.allocate(2)
    assert a.num_free == 1
    a.incref([1])
    assert a.refcount(1) == 2
    assert a.decref([0, 1]) == [0]
    assert a.refcount(1) == 1 and a.refcount(0) == 0
    assert a.allocate(1) == [0]  # last freed, first reused
    with pytest.raises(RuntimeError, match="decref of free block 3"):
        a.decref([3])
    with pytest.raises(RuntimeError, match="incref of free block 3"):
        a.incref([3])
    with pytest.raises(ValueError):
        BlockAllocator(0)
    assert issubclass(OutOfBlocksError, RuntimeError)


# ---------------------------------------------------------------------------------------
# add_sequence


def test_add_sequence_ids():
    cache = make_cache()
    assert cache.add_sequence() == 0
    assert cache.add_sequence() == 1
    assert cache.add_sequence(10) == 10
    assert cache.add_sequence() == 11
    assert cache.add_sequence(np.int64(5)) == 5
    assert cache.seq_len(5) == 0 and isinstance(cache.add_sequence(), int)
    with pytest.raises(ValueError, match="sequence id 10 already exists"):
        cache.add_sequence(10)
    with pytest.raises(TypeError, match="seq_id must be an int"):
        cache.add_sequence("a")
    with pytest.raises(TypeError, match="seq_id must be an int"):
        cache.add_sequence(True)
    assert sorted(cache.sequences.seq_ids) == [0, 1, 5, 10, 11, 12]
    cache.sequences.check_invariants()


# ---------------------------------------------------------------------------------------
# append_tokens


def test_append_tokens_slots_and_blocks():
    cache = make_cache(num_blocks=8)
    a = cache.add_sequence()
    b = cache.add_sequence()
    s = cache.append_tokens(a, 20)
    assert isinstance(s, np.ndarray) and s.dtype == np.int64 and s.shape == (20,)
    assert s.tolist() == list(range(20))  # blocks 0 and 1
    s = cache.append_tokens(b, 3)
    assert s.tolist() == [32, 33, 34]  # block 2
    s = cache.append_tokens(a, 13)  # fills block 1 (12 left), then one token in block 3
    assert s.tolist() == list(range(20, 32)) + [48]
    assert cache.seq_len(a) == 33
    assert cache.sequences.seq_blocks(a) == (0, 1, 3)
    assert cache.seq_slots(a).tolist() == list(range(32)) + [48]
    empty = cache.append_tokens(b, 0)
    assert empty.shape == (0,) and empty.dtype == np.int64
    assert cache.seq_len(b) == 3 and cache.sequences.num_free_blocks == 4
    cache.sequences.check_invariants()


def test_append_tokens_errors():
    cache = make_cache()
    a = cache.add_sequence()
    with pytest.raises(ValueError, match="n must be >= 0"):
        cache.append_tokens(a, -1)
    with pytest.raises(TypeError, match="n must be an int"):
        cache.append_tokens(a, 2.0)
    with pytest.raises(KeyError, match="unknown sequence id 7"):
        cache.append_tokens(7, 1)
    with pytest.raises(TypeError, match="seq_id must be an int"):
        cache.append_tokens(None, 1)
    assert cache.seq_len(a) == 0 and cache.sequences.num_free_blocks == 8


def test_out_of_blocks_leaves_cache_unchanged():
    cache = make_cache(num_blocks=4)
    a = cache.add_sequence()
    b = cache.add_sequence()
    write_all(cache, cache.append_tokens(a, 40), seed=1)  # 3 blocks, last one partial
    before = state(cache)
    with pytest.raises(OutOfBlocksError, match="need 2 free blocks, 1 of 4 are free"):
        cache.append_tokens(b, 17)
    with pytest.raises(OutOfBlocksError):
        cache.append_tokens(a, 8 + 2 * BS)  # fills a's tail, then needs 2 blocks
    assert_same_state(before, state(cache))
    assert cache.append_tokens(a, 8 + BS).shape == (24,)  # exactly fits
    assert cache.sequences.num_free_blocks == 0
    assert cache.fork(a) not in (a, b)  # a's last block is full: sharing needs no block
    cache.sequences.check_invariants()


# ---------------------------------------------------------------------------------------
# fork


@pytest.mark.parametrize("name", ["fp16", "nvfp4", "turboquant_4bit_nc"])
def test_fork_shares_full_blocks_and_copies_partial(name):
    cache = make_cache(name, num_blocks=8)
    a = cache.add_sequence()
    write_all(cache, cache.append_tokens(a, 37), seed=2)  # blocks 0, 1 full; 2 partial
    c = cache.fork(a)
    alloc = cache.sequences.allocator
    pa, pc = cache.sequences.seq_blocks(a), cache.sequences.seq_blocks(c)
    assert pa[:2] == pc[:2] and pa[2] != pc[2]
    assert [alloc.refcount(b) for b in pa] == [2, 2, 1] and alloc.refcount(pc[2]) == 1
    assert cache.seq_len(c) == 37
    for layer in cache.layers:  # the copy holds the parent's bytes in every plane
        for plane in layer.planes.values():
            assert np.array_equal(plane[pc[2]], plane[pa[2]])
        ka, va = kvkit.dequantize(layer, cache.seq_slots(a))
        kc, vc = kvkit.dequantize(layer, cache.seq_slots(c))
        assert np.array_equal(ka, kc) and np.array_equal(va, vc)
    # Appends now go to private blocks: the child's write leaves the parent alone.
    before = [kvkit.dequantize(layer, cache.seq_slots(a)) for layer in cache.layers]
    sc = cache.append_tokens(c, 5)
    assert set((sc // BS).tolist()) == {pc[2]}
    write_all(cache, sc, seed=3)
    for layer, (k, v) in zip(cache.layers, before):
        ka, va = kvkit.dequantize(layer, cache.seq_slots(a))
        assert np.array_equal(ka, k) and np.array_equal(va, v)
    cache.sequences.check_invariants()


def test_fork_full_last_block_then_append_both():
    cache = make_cache(num_blocks=6)
    a = cache.add_sequence()
    cache.append_tokens(a, 2 * BS)
    free = cache.sequences.num_free_blocks
    c = cache.fork(a, new_id=42)
    assert c == 42 and cache.sequences.num_free_blocks == free  # nothing copied
    sa = cache.append_tokens(a, 1)
    sc = cache.append_tokens(c, 1)
    assert sa[0] // BS != sc[0] // BS
    assert not set((sa // BS).tolist()) & set(cache.sequences.seq_blocks(c))
    cache.sequences.check_invariants()


def test_fork_errors_and_empty():
    cache = make_cache(num_blocks=2)
    a = cache.add_sequence()
    e = cache.fork(a)  # an empty sequence forks to an empty sequence
    assert cache.seq_len(e) == 0 and cache.sequences.seq_blocks(e) == ()
    with pytest.raises(KeyError, match="unknown sequence id 5"):
        cache.fork(5)
    with pytest.raises(ValueError, match="sequence id 1 already exists"):
        cache.fork(a, new_id=e)
    with pytest.raises(TypeError, match="new_id must be an int"):
        cache.fork(a, new_id="x")
    cache.append_tokens(a, BS + 1)  # both blocks used, the last one partial
    before = state(cache)
    with pytest.raises(OutOfBlocksError):
        cache.fork(a)
    assert_same_state(before, state(cache))
    assert sorted(cache.sequences.seq_ids) == [a, e]


# ---------------------------------------------------------------------------------------
# free, seq_len


def test_free_returns_blocks_when_last_holder_goes():
    cache = make_cache(num_blocks=6)
    a = cache.add_sequence()
    cache.append_tokens(a, 2 * BS + 3)  # 3 blocks
    c = cache.fork(a)  # shares 2, copies 1
    assert cache.sequences.num_free_blocks == 2
    cache.free(a)
    assert cache.sequences.num_free_blocks == 3  # a's private tail only
    assert cache.seq_len(c) == 2 * BS + 3
    with pytest.raises(KeyError, match="unknown sequence id 0"):
        cache.free(a)
    with pytest.raises(KeyError):
        cache.seq_len(a)
    cache.free(c)
    assert cache.sequences.num_free_blocks == 6 and len(cache.sequences) == 0
    cache.sequences.check_invariants()


# ---------------------------------------------------------------------------------------
# block_tables


def test_block_tables():
    cache = make_cache(num_blocks=8)
    a, b, e = cache.add_sequence(), cache.add_sequence(), cache.add_sequence()
    cache.append_tokens(a, 40)
    cache.append_tokens(b, 5)
    tables, lens = cache.block_tables([b, a, e, a])
    assert tables.dtype == np.int32 and lens.dtype == np.int32
    assert tables.tolist() == [[3, 0, 0], [0, 1, 2], [0, 0, 0], [0, 1, 2]]
    assert lens.tolist() == [5, 40, 0, 40]
    tables, lens = cache.block_tables(np.array([b]), max_blocks=4)
    assert tables.shape == (1, 4) and tables.tolist() == [[3, 0, 0, 0]]
    tables, lens = cache.block_tables([])
    assert tables.shape == (0, 1) and lens.shape == (0,)
    with pytest.raises(ValueError, match="max_blocks=2 is below the 3 pages"):
        cache.block_tables([a], max_blocks=2)
    with pytest.raises(TypeError, match="iterable of sequence ids"):
        cache.block_tables(a)
    with pytest.raises(KeyError, match="unknown sequence id 9"):
        cache.block_tables([a, 9])


def test_copy_blocks_many():
    cache = make_cache("nvfp4", num_blocks=6)
    rng = make_rng("copy_blocks")
    for layer in cache.layers:
        for plane in layer.planes.values():
            plane[...] = rng.integers(0, 256, plane.shape).astype(plane.dtype)
    before = [{n: p.copy() for n, p in layer.planes.items()} for layer in cache.layers]
    copy_blocks(cache.layers, [0, 3], [4, 1])
    for layer, old in zip(cache.layers, before):
        for name, plane in layer.planes.items():
            want = old[name].copy()
            want[[4, 1]] = old[name][[0, 3]]
            assert np.array_equal(plane, want)
    with pytest.raises(ValueError):
        copy_blocks(cache.layers, [0], [1, 2])


# ---------------------------------------------------------------------------------------
# decode through the tables


@pytest.mark.parametrize("name", ["fp16", "turboquant_4bit_nc"])
def test_decode_with_block_tables(name):
    cache = make_cache(name, num_blocks=12, num_layers=1)
    layer = cache.layer(0)
    a = cache.add_sequence()
    write_all(cache, cache.append_tokens(a, 45), seed=4)
    c = cache.fork(a)
    b = cache.add_sequence()
    write_all(cache, cache.append_tokens(b, 20), seed=5)
    write_all(cache, cache.append_tokens(c, 30), seed=6)
    write_all(cache, cache.append_tokens(a, 1), seed=7)
    ids = [a, b, c]
    tables, lens = cache.block_tables(ids)
    q = llm_like_queries(len(ids), HQ, HEAD_DIM, seed=8, num_kv_heads=HKV)
    o = kvkit.decode(q, layer, tables, lens)
    for i, sid in enumerate(ids):
        k, v = kvkit.dequantize(layer, cache.seq_slots(sid))
        ref, _ = attention_f64(q[i][None], k, v)
        assert rel_error(o[i], ref[0]) <= DECODE_CPU_RTOL


# ---------------------------------------------------------------------------------------
# State machine


#: Token counts for appends: small, across a block, or None = fill to the next block boundary
#: (so that forks of sequences with a full last block happen often).
APPEND_N = st.one_of(st.integers(0, 40), st.none())
#: At most this many live sequences, so that steps go to appends, forks and frees.
MAX_LIVE = 5


class SequenceMachine(RuleBasedStateMachine):
    """Random add / append (+ writes on every layer) / fork / free against a shadow model.

    The model keeps, per live sequence and layer, the dequantized K/V rows of its tokens as
    read right after they were written (for fp16, also checked against fp16 rounding of the
    input). Writes are deterministic, so every later read must give the same values exactly.
    """

    FORMAT = "fp16"
    NUM_BLOCKS = 12

    def __init__(self):
        super().__init__()
        self.cache = make_cache(self.FORMAT, num_blocks=self.NUM_BLOCKS)
        self.model: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}

    def _pick(self, i):
        ids = sorted(self.model)
        return ids[i % len(ids)]

    def _empty_rows(self):
        z = np.zeros((0, HKV, HEAD_DIM), np.float32)
        return [(z, z) for _ in self.cache.layers]

    @precondition(lambda self: len(self.model) < MAX_LIVE)
    @rule(explicit=st.booleans(), sid=st.integers(0, 12), n=APPEND_N, seed=st.integers(0, 2**16))
    def add(self, explicit, sid, n, seed):
        if explicit and sid in self.model:
            before = state(self.cache)
            with pytest.raises(ValueError):
                self.cache.add_sequence(sid)
            assert_same_state(before, state(self.cache))
            return
        new = self.cache.add_sequence(sid if explicit else None)
        assert new not in self.model and (not explicit or new == sid)
        assert self.cache.seq_len(new) == 0
        self.model[new] = self._empty_rows()
        self._append(new, n, seed)

    @precondition(lambda self: self.model)
    @rule(i=st.integers(0, 100), n=APPEND_N, seed=st.integers(0, 2**16))
    def append(self, i, n, seed):
        self._append(self._pick(i), n, seed)

    def _append(self, sid, n, seed):
        """Append n tokens (None: up to the next block boundary) and write every layer."""
        cache = self.cache
        if n is None:
            n = -cache.seq_len(sid) % BS or BS
        length = cache.seq_len(sid)
        need = -(-(length + n) // BS) - -(-length // BS)
        if need > cache.sequences.num_free_blocks:
            before = state(cache)
            with pytest.raises(OutOfBlocksError):
                cache.append_tokens(sid, n)
            assert_same_state(before, state(cache))
            return
        slots = cache.append_tokens(sid, n)
        assert slots.shape == (n,) and slots.dtype == np.int64
        assert cache.seq_len(sid) == length + n
        written = write_all(cache, slots, seed)
        rows = []
        for layer, (k, v), (mk, mv) in zip(cache.layers, written, self.model[sid]):
            kd, vd = kvkit.dequantize(layer, slots)
            if self.FORMAT == "fp16":
                assert np.array_equal(kd, k.astype(np.float16).astype(np.float32))
                assert np.array_equal(vd, v.astype(np.float16).astype(np.float32))
            rows.append((np.concatenate([mk, kd]), np.concatenate([mv, vd])))
        self.model[sid] = rows

    @precondition(lambda self: self.model)
    @rule(i=st.integers(0, 100), extra=st.integers(1, 20))
    def append_too_many(self, i, extra):
        sid = self._pick(i)
        cache = self.cache
        room = -cache.seq_len(sid) % BS + cache.sequences.num_free_blocks * BS
        before = state(cache)
        with pytest.raises(OutOfBlocksError):
            cache.append_tokens(sid, room + extra)
        assert_same_state(before, state(cache))

    @precondition(lambda self: 0 < len(self.model) < MAX_LIVE)
    @rule(i=st.integers(0, 100))
    def fork(self, i):
        sid = self._pick(i)
        cache = self.cache
        if cache.seq_len(sid) % BS and cache.sequences.num_free_blocks == 0:
            before = state(cache)
            with pytest.raises(OutOfBlocksError):
                cache.fork(sid)
            assert_same_state(before, state(cache))
            return
        new = cache.fork(sid)
        assert new not in self.model
        self.model[new] = [(k.copy(), v.copy()) for k, v in self.model[sid]]

    @precondition(lambda self: self.model)
    @rule(i=st.integers(0, 100))
    def free(self, i):
        sid = self._pick(i)
        self.cache.free(sid)
        del self.model[sid]
        with pytest.raises(KeyError):
            self.cache.seq_len(sid)

    @precondition(lambda self: any(rows[0][0].shape[0] for rows in self.model.values()))
    @rule(layer_i=st.integers(0, 1), seed=st.integers(0, 2**16))
    def decode(self, layer_i, seed):
        ids = [sid for sid in sorted(self.model) if self.model[sid][0][0].shape[0]][:2]
        layer = self.cache.layer(layer_i)
        tables, lens = self.cache.block_tables(ids)
        q = llm_like_queries(len(ids), HQ, HEAD_DIM, seed=seed, num_kv_heads=HKV)
        o = kvkit.decode(q, layer, tables, lens)
        for b, sid in enumerate(ids):
            k, v = self.model[sid][layer_i]
            ref, _ = attention_f64(q[b][None], k, v)
            assert rel_error(o[b], ref[0]) <= DECODE_CPU_RTOL

    @invariant()
    def bytes_match_model(self):
        for sid, rows in self.model.items():
            slots = self.cache.seq_slots(sid)
            assert slots.shape == (rows[0][0].shape[0],)
            for layer, (k, v) in zip(self.cache.layers, rows):
                kd, vd = kvkit.dequantize(layer, slots)
                assert np.array_equal(kd, k) and np.array_equal(vd, v), f"seq {sid} changed"

    @invariant()
    def allocator_consistent(self):
        seqs = self.cache.sequences
        alloc = seqs.allocator
        assert sorted(seqs.seq_ids) == sorted(self.model)
        holders = np.zeros(alloc.num_blocks, np.int64)
        for sid in seqs.seq_ids:
            blocks = seqs.seq_blocks(sid)
            assert len(blocks) == -(-seqs.seq_len(sid) // BS)
            assert len(set(blocks)) == len(blocks)
            holders[list(blocks)] += 1
        assert np.array_equal(alloc.refcounts(), holders)
        free = alloc.free_list()
        assert len(free) == len(set(free)), "a block is on the free list twice"
        used = set(np.flatnonzero(holders).tolist())
        assert not used & set(free) and used | set(free) == set(range(alloc.num_blocks))
        seqs.check_invariants()


class QuantizedSequenceMachine(SequenceMachine):
    FORMAT = "turboquant_4bit_nc"


TestSequenceMachine = SequenceMachine.TestCase
TestSequenceMachine.settings = settings(stateful_step_count=40)

TestQuantizedSequenceMachine = QuantizedSequenceMachine.TestCase
TestQuantizedSequenceMachine.settings = settings(max_examples=30, stateful_step_count=25)


# ---------------------------------------------------------------------------------------
# CUDA caches: same bookkeeping, device arrays out, device-to-device block copies


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["fp16", "nvfp4", "turboquant_4bit_nc"])
def test_cuda_sequences_match_cpu(name):
    import cupy as cp

    caches = {be: make_cache(name, num_blocks=8, backend=be) for be in ("cpu", "cuda")}
    for be, cache in caches.items():
        a = cache.add_sequence()
        slots = cache.append_tokens(a, 37)
        assert isinstance(slots, cp.ndarray if be == "cuda" else np.ndarray)
        assert slots.dtype == np.int64
        for i, layer in enumerate(cache.layers):
            k, v = llm_like_kv(37, HKV, HEAD_DIM, seed=10 + i)
            if be == "cuda":
                k, v = cp.asarray(k), cp.asarray(v)
            kvkit.write_kv(layer, k, v, slots, validate=be == "cuda")
        c = cache.fork(a)  # copies the partial third block
        s2 = cache.append_tokens(c, 4)
        for i, layer in enumerate(cache.layers):
            k, v = llm_like_kv(4, HKV, HEAD_DIM, seed=20 + i)
            if be == "cuda":
                k, v = cp.asarray(k), cp.asarray(v)
            kvkit.write_kv(layer, k, v, s2, validate=be == "cuda")
        tables, lens = cache.block_tables([a, c])
        assert tables.dtype == np.int32 and lens.dtype == np.int32
        assert isinstance(tables, cp.ndarray if be == "cuda" else np.ndarray)
        cache.sequences.check_invariants()
    cpu, gpu = caches["cpu"], caches["cuda"]
    for lc, lg in zip(cpu.layers, gpu.layers):  # same pages, same bytes (writes bit-exact)
        for pname, plane in lc.planes.items():
            assert np.array_equal(plane, lg.planes[pname].get()), pname
    q = llm_like_queries(2, HQ, HEAD_DIM, seed=30, num_kv_heads=HKV)
    tables, lens = gpu.block_tables([0, 1])
    o = kvkit.decode(cp.asarray(q), gpu.layer(0), tables, lens, validate=True).get()
    for b, sid in enumerate([0, 1]):
        k, v = kvkit.dequantize(cpu.layer(0), cpu.seq_slots(sid))
        ref, _ = attention_f64(q[b][None], k, v)
        assert rel_error(o[b], ref[0]) <= DECODE_GPU_RTOL
