"""CUDA split-K decode (kvkit.cuda.decode) and GPU merge_states vs float64 attention.

The GPU cache is filled by writing the data into a CPU cache with the Numba writer and copying
the planes over, so these tests do not depend on the CUDA write kernels. The reference is
``attention_f64`` over ``kvkit.dequantize`` of the CPU layer (the spec's values), and the
bound is ``DECODE_GPU_RTOL``: the kernels may add float32 rounding, nothing more. The suite
runs natively and under ``KVKIT_ARCH=sm_80`` / ``sm_89`` (PTX overrides), so nothing here
names an arch.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import kvkit
from kvkit import formats
from kvkit.cpu.merge import merge_states as cpu_merge_states
from kvkit.formats import codecs
from kvkit.splits import MAX_SPLITS
from kvkit.testing.reference import paged_attention_f64
from kvkit.testing.tolerance import (
    DECODE_GPU_RTOL,
    MERGE_RTOL,
    SPLIT_INVARIANCE_RTOL,
    lse_error,
    merge_error,
    rel_error,
)

pytestmark = pytest.mark.gpu

ALL_FORMATS = tuple(formats.names())
SPLIT_CHOICES = (1, 3, MAX_SPLITS, None)
#: Kernel launches per Hypothesis example are many (and new (format, G, q_len) variants
#: compile): keep the example counts small.
FEW = settings(max_examples=12, deadline=None)


@pytest.fixture(scope="module")
def cp():
    import cupy

    return cupy


# --- building a case ----------------------------------------------------------------------


class Case:
    """A filled CPU / GPU layer pair, block tables, queries and the float64 reference."""

    def __init__(self, name, *, head_dim, hkv, group, q_len, block_size, seq_lens, seed,
                 spare_blocks=1, window=None, sinks=False, softcap=None, peak=1.0,
                 q_dtype="float32", extra_blocks=2, kv_fn=None):  # fmt: skip
        import cupy

        rng = np.random.default_rng(seed)
        fmt = formats.get(name, head_dim)
        bs = block_size
        self.seq_lens = np.array(seq_lens, dtype=np.int32)
        batch = len(seq_lens)
        n_pages = [-(-max(int(s), 0) // bs) for s in seq_lens]
        num_blocks = sum(n_pages) + extra_blocks
        self.cpu = kvkit.PagedKVCache(fmt, 1, hkv, num_blocks, bs).layer(0)
        self.gpu = kvkit.PagedKVCache(fmt, 1, hkv, num_blocks, bs, backend="cuda").layer(0)

        # Keys with a few outlier channels (as in LLM caches), zero-mean values; every slot.
        n = num_blocks * bs
        k = rng.standard_normal((n, hkv, head_dim)).astype(np.float32)
        k[..., :4] *= 3.0
        v = rng.standard_normal((n, hkv, head_dim)).astype(np.float32)
        if kv_fn is not None:  # (a test's own keys / values, e.g. adversarial value scales)
            k, v = kv_fn(rng, k, v)
        if fmt.has_global_scales:
            for layer in (self.cpu, self.gpu):
                layer.k_scale = fmt.calibrate(k)
                layer.v_scale = fmt.calibrate(v)
        kvkit.write_kv(self.cpu, k, v, np.arange(n, dtype=np.int64))
        for pname, plane in self.cpu.planes.items():
            self.gpu.planes[pname][...] = cupy.asarray(plane)

        # Pages in a random permutation; table padding holds garbage that must never be read.
        perm = rng.permutation(num_blocks)
        max_blocks = max(max(n_pages), 1) + spare_blocks
        self.block_tables = np.full((batch, max_blocks), -7, dtype=np.int32)
        used = 0
        for b, npg in enumerate(n_pages):
            self.block_tables[b, :npg] = perm[used : used + npg]
            used += npg

        hq = hkv * group
        q = rng.standard_normal((batch, q_len, hq, head_dim)).astype(np.float32)
        if q_dtype == "float16":
            self.q_host = q.astype(np.float16)
            q_vals = self.q_host.astype(np.float32)
        elif q_dtype == "bfloat16":
            self.q_host = codecs.bf16_bits_array(q)
            q_vals = codecs.bf16_values_array(self.q_host)
        else:
            self.q_host = q
            q_vals = q
        self.q_dtype = q_dtype
        self.q_vals = q_vals
        self.sinks = rng.standard_normal(hq).astype(np.float32) + 1.0 if sinks else None
        self.opts = dict(scale=peak / math.sqrt(head_dim), window=window, sinks=self.sinks,
                         softcap=softcap)  # fmt: skip

        kd, vd = kvkit.dequantize(self.cpu, np.arange(n, dtype=np.int64))
        shape = (num_blocks, bs, hkv, head_dim)
        self.k_pages = kd.reshape(shape).transpose(0, 2, 1, 3)
        self.v_pages = vd.reshape(shape).transpose(0, 2, 1, 3)

    def reference(self):
        return paged_attention_f64(self.q_vals, self.k_pages, self.v_pages, self.block_tables,
                                   self.seq_lens, **self.opts)  # fmt: skip

    def run(self, num_splits, *, block_tables=None, seq_lens=None, record=None):
        import cupy

        from kvkit.cuda import decode as cuda_decode

        bt = self.block_tables if block_tables is None else block_tables
        sl = self.seq_lens if seq_lens is None else seq_lens
        sinks = None if self.sinks is None else cupy.asarray(self.sinks)
        o, lse = cuda_decode.decode(
            cupy.asarray(self.q_host), self.q_dtype, self.gpu, cupy.asarray(bt),
            cupy.asarray(sl), scale=self.opts["scale"], num_splits=num_splits,
            window=self.opts["window"], sinks=sinks, softcap=self.opts["softcap"],
            record=record,
        )  # fmt: skip
        assert o.dtype == cupy.float32 and lse.dtype == cupy.float32
        assert o.shape == self.q_host.shape and lse.shape == self.q_host.shape[:3]
        return cupy.asnumpy(o), cupy.asnumpy(lse)

    def flag(self):
        return int(self.gpu.error_flag.get()[0])


def check_against_reference(case, split_choices=SPLIT_CHOICES, split_rtol=SPLIT_INVARIANCE_RTOL):
    """Every split count within DECODE_GPU_RTOL of float64, and the split counts within
    split_rtol of each other (float32 reassociation of the same sums)."""
    ref_o, ref_lse = case.reference()
    results = []
    for num_splits in split_choices:
        case.gpu.error_flag.fill(0)
        o, lse = case.run(num_splits)
        assert case.flag() == 0, num_splits
        assert rel_error(o, ref_o) <= DECODE_GPU_RTOL, num_splits
        assert lse_error(lse, ref_lse) <= DECODE_GPU_RTOL, num_splits
        results.append((o, lse))
    o1, lse1 = results[0]
    for o, lse in results[1:]:
        assert rel_error(o, o1) <= split_rtol
        assert lse_error(lse, lse1) <= split_rtol


# --- every format, GQA 1/4/8/16, q_len 1 and 4 ----------------------------------------------


@pytest.mark.parametrize("name", ALL_FORMATS)
@pytest.mark.parametrize("group", [1, 4, 8, 16])
@pytest.mark.parametrize("q_len", [1, 4])
def test_every_format_and_group(cp, name, group, q_len):
    case = Case(name, head_dim=128, hkv=2, group=group, q_len=q_len, block_size=16,
                seq_lens=[37, 16 * 5, q_len], seed=group * 10 + q_len)  # fmt: skip
    check_against_reference(case)


# --- every tensor-core head_dim: the key runs per lane (KV_MMA_K_REGS) cover D / 4 elements,
# one or two NVFP4 blocks, whole or partial words of 3- and 4-bit codes ---------------------


@pytest.mark.parametrize(
    "name, head_dim",
    [(n, d) for n in ("fp8_e4m3", "nvfp4", "turboquant_k8v4") for d in (32, 64, 96)]
    + [(n, 64) for n in ("turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc")],
)
@pytest.mark.parametrize("group", [4, 16])
def test_every_tensor_core_head_dim(cp, name, head_dim, group):
    assert _stage1_threads(name, head_dim, group, 1) == 128  # the tensor-core core
    case = Case(name, head_dim=head_dim, hkv=2, group=group, q_len=1, block_size=16,
                seq_lens=[37, 16 * 5 + 3, 1], seed=head_dim + group)  # fmt: skip
    check_against_reference(case)


# --- head_dim 256: the tensor-core core for G * q_len <= 8 (one row tile; NVFP4 runs of four
# blocks, TurboQuant value runs of three or four words), the CUDA-core core above ------------


@pytest.mark.parametrize("name", ALL_FORMATS)
@pytest.mark.parametrize("group, q_len", [(4, 1), (4, 4), (16, 1), (16, 4), (8, 1), (2, 4)])
def test_head_dim_256(cp, name, group, q_len):
    threads = 128 if group * q_len <= 8 else 256
    assert _stage1_threads(name, 256, group, q_len) == threads
    # 291 tokens: five tiles, so one split reuses each of the two staging stages.
    case = Case(name, head_dim=256, hkv=2, group=group, q_len=q_len, block_size=16,
                seq_lens=[37, 16 * 18 + 3, q_len], seed=256 + group * 10 + q_len)  # fmt: skip
    check_against_reference(case)


@pytest.mark.parametrize("name", ALL_FORMATS)
def test_head_dim_256_options(cp, name):
    # Pages of two tiles (block_size 128), window, sinks, soft-cap and fp16 queries on the
    # tensor-core core at D = 256.
    assert _stage1_threads(name, 256, 8, 1) == 128
    case = Case(name, head_dim=256, hkv=1, group=8, q_len=1, block_size=128,
                seq_lens=[300, 129, 1], seed=31, window=150, sinks=True, softcap=30.0,
                q_dtype="float16")  # fmt: skip
    check_against_reference(case)


# --- the two stage-1 cores ------------------------------------------------------------------


def _stage1_threads(name, head_dim, group, q_len, q_dtype="float16"):
    """Threads per CTA of the stage-1 kernel decode would launch: 128 = tensor-core core
    (common/decode_mma.cuh), 256 = CUDA-core core."""
    from kvkit.cuda import decode as cuda_decode

    fmt = formats.get(name, head_dim)
    entry, kname, _ = cuda_decode._STAGE1[fmt.family]
    in_define, _ = cuda_decode._Q_DTYPES[q_dtype]
    return cuda_decode._stage1_for(fmt, entry, kname, in_define, group, q_len)[2]


@pytest.mark.parametrize(
    "name, head_dim, group, q_len, threads",
    [
        ("fp16", 128, 4, 1, 128),
        ("turboquant_4bit_nc", 64, 16, 1, 128),
        ("nvfp4", 128, 8, 4, 256),  # 32 rows: more than one m16 tile
        ("fp8_e4m3", 256, 4, 1, 128),  # D = 256, one row tile
        ("nvfp4", 256, 16, 1, 256),  # D = 256, two row tiles: the accumulators would spill
        ("bf16", 128, 16, 1, 128),  # bf16 values as bf16 operands (KV_MMA_BF16)
    ],
)
def test_stage1_core_choice(cp, name, head_dim, group, q_len, threads):
    assert _stage1_threads(name, head_dim, group, q_len) == threads


@pytest.mark.parametrize("name", ["fp16", "bf16", "fp8_e4m3", "nvfp4", "turboquant_4bit_nc",
                                  "turboquant_k8v4", "turboquant_3bit_nc"])  # fmt: skip
def test_forced_cuda_core_matches_float64(cp, name, monkeypatch):
    # KVKIT_DECODE_SIMT=1 keeps the CUDA-core stage 1 covered where the tensor-core one runs.
    monkeypatch.setenv("KVKIT_DECODE_SIMT", "1")
    assert _stage1_threads(name, 128, 4, 2) == 256
    case = Case(name, head_dim=128, hkv=2, group=4, q_len=2, block_size=16,
                seq_lens=[37, 16 * 5, 2], seed=3, window=40, sinks=True)  # fmt: skip
    check_against_reference(case)


@pytest.mark.parametrize("q_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("exponent", [-70, 40])
def test_bf16_cache_outside_the_fp16_range(cp, q_dtype, exponent):
    """bf16 keys and values scaled by 2^exponent (far outside fp16's range, where an fp16
    operand would flush or overflow) on the tensor-core core: float64 attention over the same
    values, up to float32 rounding. The scores are K q, so q is scaled by the inverse."""
    assert _stage1_threads("bf16", 128, 16, 1, q_dtype) == 128
    case = Case("bf16", head_dim=128, hkv=2, group=16, q_len=1, block_size=16,
                seq_lens=[70, 33], seed=11, q_dtype=q_dtype)  # fmt: skip
    f = 2.0**exponent
    for plane in case.gpu.planes.values():  # bf16 bits: scale by adding to the exponent
        bits = cp.asarray(plane).view(cp.uint16).astype(cp.int32)
        nonzero = (bits & 0x7FFF) != 0
        plane[...] = cp.where(nonzero, bits + (exponent << 7), bits).astype(cp.uint16)
    case.k_pages = case.k_pages * f
    case.v_pages = case.v_pages * f
    qs = case.q_vals / f
    if q_dtype == "bfloat16":
        case.q_host = codecs.bf16_bits_array(qs)
        qs = codecs.bf16_values_array(case.q_host)
    else:
        case.q_host = qs.astype(np.float32)
    case.q_vals = qs
    ref_o, ref_lse = case.reference()
    assert np.all(np.isfinite(ref_o)) and np.abs(ref_o).max() > f / 100
    o, lse = case.run(None)
    assert rel_error(o, ref_o) <= DECODE_GPU_RTOL
    assert lse_error(lse, ref_lse) <= DECODE_GPU_RTOL


@st.composite
def decode_cases(draw):
    name = draw(st.sampled_from(ALL_FORMATS))
    head_dim = draw(st.sampled_from([64, 128, 256]))
    block_size = draw(st.sampled_from([16, 32, 64, 128]))
    q_len = draw(st.sampled_from([1, 4]))
    group = draw(st.sampled_from([1, 4, 8, 16]))
    if head_dim == 256:
        group = min(group, 8)
    seq_lens = []
    for _ in range(draw(st.integers(1, 3))):
        full = draw(st.integers(0, 6))
        rem = draw(st.sampled_from([0, 1, block_size - 1]))
        seq_lens.append(max(full * block_size + rem, q_len))
    return dict(
        name=name, head_dim=head_dim, hkv=draw(st.sampled_from([1, 2])), group=group,
        q_len=q_len, block_size=block_size, seq_lens=seq_lens,
        spare_blocks=draw(st.integers(0, 2)),
        window=draw(st.none() | st.integers(1, 3 * block_size)),
        sinks=draw(st.booleans()),
        softcap=draw(st.none() | st.sampled_from([5.0, 30.0])),
        peak=draw(st.sampled_from([1.0, 4.0])),
        q_dtype=draw(st.sampled_from(["float32", "float16", "bfloat16"])),
        seed=draw(st.integers(0, 2**32 - 1)),
    )  # fmt: skip


def _corner(name, block_size, rem, **kw):
    case = dict(name=name, head_dim=128, hkv=2, group=4, q_len=4, block_size=block_size,
                seq_lens=[3 * block_size + rem, block_size + rem, max(rem, 4)], spare_blocks=1,
                window=None, sinks=False, softcap=None, peak=1.0, q_dtype="float32",
                seed=block_size + rem)  # fmt: skip
    case.update(kw)
    return case


@FEW
@given(case=decode_cases())
# Page-boundary corners (seq_len % block_size in {0, 1, block_size - 1}) and the options.
@example(case=_corner("nvfp4", 16, 0))
@example(case=_corner("turboquant_4bit_nc", 16, 1, window=17, sinks=True))
@example(case=_corner("turboquant_3bit_nc", 128, 127, softcap=30.0, group=8, q_len=1))
@example(case=_corner("fp8_e4m3", 64, 1, window=1, peak=4.0, q_dtype="bfloat16"))
@example(case=_corner("turboquant_k8v4", 32, 31, head_dim=64, q_dtype="float16", sinks=True))
@example(case=_corner("bf16", 16, 15, head_dim=256, group=8, window=40, softcap=5.0))
def test_decode_matches_float64_and_is_split_invariant(cp, case):
    case = dict(case)  # examples are replayed while shrinking: leave them intact
    name = case.pop("name")
    check_against_reference(Case(name, **case))


def test_sinks_with_minus_inf_and_window_one(cp):
    case = Case("turboquant_k3v4_nc", head_dim=64, hkv=1, group=4, q_len=4, block_size=16,
                seq_lens=[40, 4], seed=3, window=1, sinks=True)  # fmt: skip
    case.sinks[1] = -np.inf  # -inf means "no sink" for that head
    case.opts["sinks"] = case.sinks
    check_against_reference(case)


# Long sequences: a split sums thousands of tile partials in float32, so two split counts
# differ by more than the reassociation of a few pages; both stay within DECODE_GPU_RTOL of
# float64 (the contract), which bounds their difference as well.


def test_long_sequence(cp):
    # One 100,000-token sequence: 782 pages of 128, so every split count spans many pages.
    case = Case("turboquant_4bit_nc", head_dim=128, hkv=1, group=8, q_len=1, block_size=128,
                seq_lens=[100_000], seed=11, sinks=True)  # fmt: skip
    check_against_reference(case, split_rtol=DECODE_GPU_RTOL)


def test_long_sequence_nvfp4_multi_query(cp):
    case = Case("nvfp4", head_dim=128, hkv=2, group=4, q_len=4, block_size=64,
                seq_lens=[30_001, 5], seed=12, window=4096, softcap=30.0)  # fmt: skip
    check_against_reference(case, split_choices=(1, MAX_SPLITS, None), split_rtol=DECODE_GPU_RTOL)


def test_front_door_matches_the_cpu_backend(cp):
    case = Case("turboquant_4bit_nc", head_dim=128, hkv=2, group=4, q_len=1, block_size=16,
                seq_lens=[50, 17], seed=5, sinks=True)  # fmt: skip
    q = case.q_host[:, 0]  # (B, Hq, D): the single-token form
    args = dict(scale=case.opts["scale"], sinks=case.sinks, return_lse=True)
    o_cpu, lse_cpu = kvkit.decode(q, case.cpu, case.block_tables, case.seq_lens, **args)
    o, lse = kvkit.decode(
        cp.asarray(q), case.gpu, cp.asarray(case.block_tables), cp.asarray(case.seq_lens),
        scale=case.opts["scale"], sinks=cp.asarray(case.sinks), return_lse=True,
    )  # fmt: skip
    assert o.shape == o_cpu.shape and lse.shape == lse_cpu.shape
    assert rel_error(cp.asnumpy(o), o_cpu) <= DECODE_GPU_RTOL
    assert lse_error(cp.asnumpy(lse), lse_cpu) <= DECODE_GPU_RTOL


# --- plane layouts: strided views, unaligned rows --------------------------------------------


@pytest.mark.parametrize("name", ["fp16", "nvfp4", "turboquant_3bit_nc", "turboquant_k8v4"])
@pytest.mark.parametrize("layout", ["nhd", "padded_row"])
@pytest.mark.parametrize("head_dim", [64, 256])  # 256: the tensor-core core's longest runs
def test_strided_planes(cp, name, layout, head_dim):
    case = Case(name, head_dim=head_dim, hkv=2, group=4, q_len=2, block_size=32,
                seq_lens=[70, 33], seed=7)  # fmt: skip
    for pname, plane in list(case.gpu.planes.items()):
        nb, h, bs, w = plane.shape
        if layout == "nhd":
            # Token-major storage (num_blocks, block_size, H, width) seen as HND.
            store = cp.empty((nb, bs, h, w), dtype=plane.dtype)
            store[...] = plane.transpose(0, 2, 1, 3)
            view = store.transpose(0, 2, 1, 3)
        else:
            # Rows one element wider than the plane: every token starts at an odd offset
            # (fp16: 2-byte aligned), so the kernel must fall back to narrow loads.
            store = cp.zeros((nb, h, bs, w + 1), dtype=plane.dtype)
            store[..., 1:] = plane
            view = store[..., 1:]
        assert not view.flags.c_contiguous
        case.gpu.planes[pname] = view
    check_against_reference(case, split_choices=(1, 3))


@pytest.mark.parametrize("name", ["fp16", "fp8_e4m3", "nvfp4", "turboquant_4bit_nc"])
@pytest.mark.parametrize("block_size, group", [(16, 4), (32, 16), (128, 4)])
def test_32bit_and_64bit_copy_addresses_agree(cp, name, block_size, group, monkeypatch):
    """Planes whose offsets fit 31 bits take the 32-bit copy addresses (OFF32_BIT); without
    the bit the same copies take 64-bit addresses: the same bytes land in the same staging
    rows, so the results are identical, bit for bit. Block sizes below, at a multiple of and
    above the 64-token tile (per-tile token offsets, several tiles per page); G = 16 takes the
    CUDA-core core at q_len = 2. Single-tile loops on both sides: 64-bit offsets turn a slab
    launch (and with it the tile-pair loop, KVKIT_DECODE_TILE_PAIRS) off, which sums in
    another float32 order."""
    from kvkit.cuda import decode as cuda_decode

    case = Case(name, head_dim=128, hkv=2, group=group, q_len=2 if group == 16 else 1,
                block_size=block_size, seq_lens=[3 * block_size + 7, 70, 2],
                seed=block_size + group)  # fmt: skip
    assert all(
        int(cuda_decode._plane_args(p, n)[4]) & cuda_decode.OFF32_BIT
        for n, p in case.gpu.planes.items()
    )
    ref_o, ref_lse = case.reference()
    for num_splits in (1, 3):
        monkeypatch.undo()
        monkeypatch.setenv("KVKIT_DECODE_TILE_PAIRS", "0")
        o32, lse32 = case.run(num_splits)
        monkeypatch.setattr(cuda_decode, "offsets_fit_32bit", lambda *args: False)
        o64, lse64 = case.run(num_splits)
        assert case.flag() == 0
        np.testing.assert_array_equal(o32, o64)
        np.testing.assert_array_equal(lse32, lse64)
        assert rel_error(o32, ref_o) <= DECODE_GPU_RTOL
        assert lse_error(lse32, ref_lse) <= DECODE_GPU_RTOL


# Switches whose two values can put one build in the tile-pair loop (KVKIT_DECODE_TILE_PAIRS,
# the default, where warp pipes run on slabs) and the other in the single-tile loop: the pair
# loop sums in another float32 order, so the bit-for-bit comparisons of these switches pin
# single-tile builds on both sides (the pair loop has tests of its own, against the
# single-tile build and float64: test_tile_pairs_*).
_TILE_LOOP_SWITCHES = {
    "KVKIT_DECODE_NVFP4_BULK",
    "KVKIT_DECODE_WARP_PIPE",
    "KVKIT_DECODE_TQ_SLABS",
    "KVKIT_DECODE_TQ_SLABS64",
    "KVKIT_DECODE_NVFP4_SLABS_OTHER_D",
    "KVKIT_DECODE_BULK_RUNS",
    "KVKIT_DECODE_NVFP4_SLAB_ROWS",
    # TurboQuant's build without packed mma columns has no pairs at D >= 128
    # (decode_turboquant.cu KV_TILE_PAIRS_ROWS).
    "KVKIT_DECODE_TQ_VARIANT",
    # The cp.async path's warp-local tile loop (single-tile builds only: no bulk copies).
    "KVKIT_DECODE_CP_ASYNC_V2",
    # The prologue copies' place (both loops have the one prologue; the table test of the
    # switch runs pairs too).
    "KVKIT_DECODE_EARLY_ISSUE",
}


def assert_builds_agree(
    case, monkeypatch, var: str, new, old, exact: str = "all", pairs: bool | None = None
):
    """Run ``case`` with 1 and 3 splits under ``var=new`` and ``var=old`` (None: unset, the
    default build): no flag either way; the two agree bit for bit (``exact="all"``), in lse
    only with o within float32 reassociation (``"lse"``), or both within it (``"none"``); and
    the new build matches the float64 reference. Switches of _TILE_LOOP_SWITCHES run with
    single-tile loops on both sides, the others with tile pairs wherever the kernel has them
    (KVKIT_DECODE_TILE_PAIRS pinned: the launcher would otherwise give NVFP4's short splits
    the single-tile build, kvkit/cuda/split_builds.py, which has tests of its own); ``pairs``
    pins it either way (KVKIT_DECODE_CP_ASYNC_V2=3, whose pair loop follows it)."""
    if pairs is None:
        pairs = var not in _TILE_LOOP_SWITCHES
    monkeypatch.setenv("KVKIT_DECODE_TILE_PAIRS", "1" if pairs else "0")
    ref_o, ref_lse = case.reference()
    for num_splits in (1, 3):
        outs = []
        for value in (new, old):
            if value is None:
                monkeypatch.delenv(var, raising=False)
            else:
                monkeypatch.setenv(var, value)
            outs.append(case.run(num_splits))
            assert case.flag() == 0, (var, value, num_splits)
        (o_new, lse_new), (o_old, lse_old) = outs
        if exact in ("all", "lse"):
            np.testing.assert_array_equal(lse_new, lse_old)
        else:
            assert lse_error(lse_new, lse_old) <= SPLIT_INVARIANCE_RTOL, num_splits
        if exact == "all":
            np.testing.assert_array_equal(o_new, o_old)
        else:  # float32 reassociation only
            assert rel_error(o_new, o_old) <= SPLIT_INVARIANCE_RTOL, num_splits
        assert rel_error(o_new, ref_o) <= DECODE_GPU_RTOL
        assert lse_error(lse_new, ref_lse) <= DECODE_GPU_RTOL


def assert_bad_pages_agree(
    name, block_size, seed, monkeypatch, var: str, new: str = "1", old: str = "0", group: int = 4,
    head_dim: int = 128,
):  # fmt: skip
    """Four sequences (G = ``group``, 4 unless given; D = ``head_dim``, 128 unless given)
    whose block tables hold bad entries (one past the cache, -1, a huge entry; in sequence 3,
    72 tiles long, -1 at the first tile of the warp pipes' second page window and a bad page
    for warp 3 of tile 40) under ``var=new`` (1 unless a switch has other values) and
    ``var=old`` (0): at 1, 3 and MAX_SPLITS splits the same flag (bit 2 set) and the same
    outputs, bit for bit (single-tile loops on both sides: _TILE_LOOP_SWITCHES); for
    KVKIT_DECODE_TILE_PAIRS itself within float32 reassociation (bad pages are masked per
    tile of a pair)."""
    # KVKIT_DECODE_NV_PACK (NVFP4's packed mma columns at 1: float32 rounding only): pairs
    # on, within float32 reassociation.
    # KVKIT_DECODE_CP_ASYNC_V2=3 (the cp.async path's pair loop, float32 rounding apart from
    # 2): pairs on, within float32 reassociation.
    # KVKIT_DECODE_TQ_PAIRS8 (TurboQuant's pairs up to 8 rows at D = 128): pairs on, within
    # float32 reassociation (0 runs those rows one tile at a time).
    # KVKIT_DECODE_PAIRS16 (pairs up to 16 rows), KVKIT_DECODE_CP_ON_BULK (NVFP4's cp.async
    # pairs at head_dim 256 on sm_90+) and KVKIT_DECODE_NV96 (NVFP4's register runs at head_dim
    # 96: another mma order; KVKIT_DECODE_NV96_PAIRS8, their pairs at 5-8 rows): the same.
    pairs_on = (var == "KVKIT_DECODE_CP_ASYNC_V2" and new == "3") or var in (
        "KVKIT_DECODE_NV_PACK", "KVKIT_DECODE_TQ_PAIRS8", "KVKIT_DECODE_PAIRS16",
        "KVKIT_DECODE_CP_ON_BULK", "KVKIT_DECODE_NV96", "KVKIT_DECODE_NV96_PAIRS8")  # fmt: skip
    pairs = pairs_on or var == "KVKIT_DECODE_TILE_PAIRS"
    # KVKIT_DECODE_PAIR_ADDR changes only the pair loop's addressing: compared with pairs on,
    # bit for bit.
    # KVKIT_DECODE_NV_ISSUE / KVKIT_DECODE_TQ_ISSUE (the pair loop's issue and mask trims):
    # the same, pairs and pair addresses on.
    # KVKIT_DECODE_TQ17 (TurboQuant's aligned value words, held key-run alignment, unguarded
    # softmax): the same.
    pair_addr = var in ("KVKIT_DECODE_PAIR_ADDR", "KVKIT_DECODE_NV_ISSUE", "KVKIT_DECODE_TQ_ISSUE",
                        "KVKIT_DECODE_TQ17")  # fmt: skip
    if pairs_on:
        monkeypatch.setenv("KVKIT_DECODE_TILE_PAIRS", "1")
    if var in ("KVKIT_DECODE_NV_ISSUE", "KVKIT_DECODE_TQ_ISSUE", "KVKIT_DECODE_TQ17"):
        monkeypatch.setenv("KVKIT_DECODE_PAIR_ADDR", "1")
    assert pairs or pair_addr or var in _TILE_LOOP_SWITCHES
    if not pairs:
        # Pairs pinned on for KVKIT_DECODE_PAIR_ADDR at every split count (the launcher would
        # give NVFP4's short splits the single-tile build, kvkit/cuda/split_builds.py).
        monkeypatch.setenv("KVKIT_DECODE_TILE_PAIRS", "1" if pair_addr else "0")
    case = Case(name, head_dim=head_dim, hkv=2, group=group, q_len=1, block_size=block_size,
                seq_lens=[6 * block_size + 5, 4 * block_size, 40, 72 * 64 - 5],
                seed=seed)  # fmt: skip
    bt = case.block_tables.copy()
    bt[0, 1] = case.gpu.num_blocks  # one past the cache
    bt[0, 5] = -1
    bt[1, 0] = 2**31 - 1
    bt[3, 33 * 64 // block_size] = -1  # the first tile of window 1
    bt[3, (40 * 64 + 48) // block_size] = case.gpu.num_blocks + 3  # warp 3's page of tile 40
    for num_splits in (1, 3, MAX_SPLITS):
        outs = []
        for value in (new, old):
            monkeypatch.setenv(var, value)
            case.gpu.error_flag.fill(0)
            o, lse = case.run(num_splits, block_tables=bt)
            outs.append((o, lse, case.flag()))
        (o1, lse1, f1), (o0, lse0, f0) = outs
        assert f1 == f0 and f0 & 2, (num_splits, f1, f0)
        if pairs:
            assert rel_error(o1, o0) <= SPLIT_INVARIANCE_RTOL, num_splits
            assert lse_error(lse1, lse0) <= SPLIT_INVARIANCE_RTOL, num_splits
        else:
            np.testing.assert_array_equal(o1, o0)
            np.testing.assert_array_equal(lse1, lse0)


def store_token_major(cp, case):
    """Replace the case's planes by token-major (NHD) copies seen as HND views (strided:
    not token-contiguous, so no slab copies)."""
    for pname, plane in list(case.gpu.planes.items()):
        nb, h, bs, w = plane.shape
        store = cp.empty((nb, bs, h, w), dtype=plane.dtype)
        store[...] = plane.transpose(0, 2, 1, 3)
        case.gpu.planes[pname] = store.transpose(0, 2, 1, 3)


@pytest.mark.parametrize("name", ["fp16", "bf16"])
@pytest.mark.parametrize("block_size", [16, 32, 128])
def test_warp_run_bulk_copies_match_per_thread_copies(cp, name, block_size, monkeypatch):
    """On sm_90+ the fp16 / bf16 row planes are copied by the copy engine, one warp per
    16-token page run (decode_core.cuh kv_bulk_run); KVKIT_DECODE_BULK_RUNS=0 copies them one
    row per thread as before. Same staged bytes, so the results are identical bit for bit:
    whole runs and runs cut short by the sequence end (seq_len % 16 != 0); test_strided_planes
    covers token-major views. On GPUs without bulk copies both builds are the cp.async path."""
    case = Case(name, head_dim=128, hkv=2, group=4, q_len=1, block_size=block_size,
                seq_lens=[5 * block_size + 9, 37, 3], seed=block_size)  # fmt: skip
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_BULK_RUNS", None, "0")


@pytest.mark.parametrize("name", ["fp16", "bf16"])
@pytest.mark.parametrize("head_dim", [64, 96, 128])
@pytest.mark.parametrize("block_size", [16, 128])
def test_dense_copy_engine_and_cp_async_builds_agree(cp, name, head_dim, block_size, monkeypatch):
    """KVKIT_DECODE_DENSE_BULK: fp16 / bf16 tiles by the copy engine (1, the default from
    head_dim 128 on sm_90+) or by cp.async row runs (0, the default below 128 on sm_90 /
    sm_100). The same staged bytes and the same single-tile loop, so the same bits, with
    whole and cut-short page runs; on GPUs without bulk copies both are the cp.async build."""
    case = Case(name, head_dim=head_dim, hkv=2, group=4, q_len=1, block_size=block_size,
                seq_lens=[5 * block_size + 9, 37, 3], seed=head_dim + block_size)  # fmt: skip
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_DENSE_BULK", "0", "1")


@pytest.mark.parametrize("name", ["nvfp4", "turboquant_4bit_nc", "turboquant_3bit_nc",
                                  "turboquant_k3v4_nc", "turboquant_k8v4", "fp8_e4m3", "fp16",
                                  "bf16"])  # fmt: skip
@pytest.mark.parametrize("head_dim, group, q_len, block_size, pairs", [
    (128, 4, 1, 16, True), (128, 4, 1, 128, False), (64, 8, 1, 32, True), (256, 2, 1, 16, True),
    (128, 2, 4, 64, True), (128, 16, 1, 16, False),
])  # fmt: skip
def test_early_prologue_copies_match_the_build_before(
    cp, name, head_dim, group, q_len, block_size, pairs, monkeypatch
):
    """KVKIT_DECODE_EARLY_ISSUE=1 (the default but for the codebook presets at head_dim 64)
    issues the tensor-core stage 1's prologue tile copies before the query rows, =0 after them
    (decode_mma.cuh KVD_EARLY_ISSUE): the same
    copies into the same stages, so the same bits, with tile pairs and single-tile loops, warp
    slabs, page runs and cp.async copies, ragged and one-tile sequences, 1 and 3 splits."""
    case = Case(name, head_dim=head_dim, hkv=2, group=group, q_len=q_len, block_size=block_size,
                seq_lens=[5 * block_size + 9, 300, 37, 5],
                seed=head_dim + block_size + group)  # fmt: skip
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_EARLY_ISSUE", "1", "0", pairs=pairs)


@pytest.mark.parametrize("name", ["nvfp4", "turboquant_4bit_nc", "fp8_e4m3"])
@pytest.mark.parametrize("block_size", [16, 64])
def test_early_prologue_copies_flag_bad_pages_as_before(cp, name, block_size, monkeypatch):
    """Bad block-table entries under KVKIT_DECODE_EARLY_ISSUE=1 and =0: the same flag and the
    same outputs, bit for bit (assert_bad_pages_agree)."""
    assert_bad_pages_agree(name, block_size, 7 + block_size, monkeypatch,
                           "KVKIT_DECODE_EARLY_ISSUE")  # fmt: skip


@pytest.mark.parametrize("name", ["fp16", "bf16", "fp8_e4m3", "nvfp4"])
@pytest.mark.parametrize("block_size", [16, 32, 128])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_row_run_copies_match_per_token_copies(cp, name, block_size, head_dim, monkeypatch):
    """The cp.async row planes (fp16 / bf16 rows where the copy engine does not copy: the
    sm_80 PTX path, KVKIT_ARCH=sm_80; fp8 rows and NVFP4 code rows everywhere) of whole tiles
    are copied as row runs (decode_core.cuh kv_issue_plane: lane l takes chunks l + 32 k of its
    warp's 16 rows) with KVKIT_DECODE_ROW_RUNS=1 and per token (TPT threads per row) with =0.
    Same staged bytes, so the results are identical bit for bit: whole tiles, the tiles the
    sequence end cuts (per-token copies, zero-filled rows), pages of one tile's part, of one
    tile and of two tiles (row offsets per tile), one and three splits. 64-, 128-, 256- and
    512-byte rows (NCH = 4 .. 32 chunks; NVFP4 at D = 64: 2). On GPUs with bulk copies the
    fp16 / bf16 cases run the copy engine in both builds."""
    group = 2 if head_dim == 256 else 4
    case = Case(name, head_dim=head_dim, hkv=2, group=group, q_len=1, block_size=block_size,
                seq_lens=[5 * block_size + 9, 300, 37, 3, 128],
                seed=block_size + head_dim)  # fmt: skip
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_ROW_RUNS", "1", "0")


@pytest.mark.parametrize("name", ["fp8_e4m3", "fp16", "bf16"])
@pytest.mark.parametrize("block_size", [16, 32, 128])
def test_even_row_runs_match_per_token_copies(cp, name, block_size, monkeypatch):
    """Row runs of rows with six / twelve 16-byte chunks (head_dim 96: fp8's 96-byte rows, fp16 /
    bf16's 192-byte ones where the copy engine does not copy them) under
    KVKIT_DECODE_ROW_RUNS_EVEN=1 (decode_core.cuh: each lane's staging offsets per copy)
    against the per-token copies: the same staged bytes, so the same results bit for bit;
    whole and cut tiles, pages of part of a tile, one and two tiles, one and three splits."""
    monkeypatch.setenv("KVKIT_DECODE_ROW_RUNS_EVEN", "1")
    case = Case(name, head_dim=96, hkv=2, group=4, q_len=1, block_size=block_size,
                seq_lens=[5 * block_size + 9, 300, 37, 3, 128], seed=block_size + 96)  # fmt: skip
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_ROW_RUNS", "1", "0")


@pytest.mark.parametrize("name", ["nvfp4", "turboquant_4bit_nc", "turboquant_3bit_nc",
                                  "turboquant_k8v4", "fp8_e4m3", "fp16", "bf16"])  # fmt: skip
@pytest.mark.parametrize("group, q_len, window, sinks, softcap, block_size", [
    (4, 1, None, False, None, 16), (4, 1, 150, True, None, 16), (2, 4, None, False, 30.0, 32),
    (8, 2, 90, False, None, 128), (4, 4, None, True, None, 64),
])  # fmt: skip
def test_visible_tile_fast_path_matches_the_masked_path(
    cp, name, group, q_len, window, sinks, softcap, block_size, monkeypatch
):
    """Fully visible tiles skip the masks in the tensor-core softmax (decode_mma.cuh);
    KVKIT_DECODE_MASK_ALL=1 sends them through the masked path, whose masks are then all true:
    the same float32 operations on the same values, so the same bits. Ragged lengths (partial
    tiles, one page short of a tile), windows and causal q_len > 1 give tiles of both kinds in
    one launch."""
    case = Case(name, head_dim=128, hkv=2, group=group, q_len=q_len, block_size=block_size,
                seq_lens=[300, 129, 64, 5], window=window, sinks=sinks, softcap=softcap,
                seed=group * 100 + q_len + block_size)  # fmt: skip
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_MASK_ALL", None, "1")


@pytest.mark.parametrize("head_dim, group, q_len, window", [
    (128, 4, 1, None), (128, 4, 1, 100), (128, 8, 2, None), (128, 16, 1, None),
    (64, 4, 1, None), (32, 2, 4, None), (256, 4, 1, None), (256, 2, 4, 70),
])  # fmt: skip
def test_nvfp4_unpack_paths_agree_bit_for_bit(cp, head_dim, group, q_len, window, monkeypatch):
    """decode_nvfp4.cu KV_NVFP4_UNPACK: eight codes per word at once (1, the default) or pair
    by pair (0, KVKIT_DECODE_NVFP4_UNPACK=0) build the same fp16 operands in the same mma
    positions, so the results are the same bits. Ragged lengths and a window give partial and
    masked tiles next to fully visible ones."""
    case = Case("nvfp4", head_dim=head_dim, hkv=2, group=group, q_len=q_len, block_size=16,
                seq_lens=[300, 129, 64, 5], window=window,
                seed=head_dim + 10 * group + q_len)  # fmt: skip
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_NVFP4_UNPACK", None, "0")


@pytest.mark.parametrize("block_size", [16, 32, 128])
@pytest.mark.parametrize("group, q_len, window", [(4, 1, None), (4, 2, 90), (8, 1, None),
                                                   (16, 1, None)])  # fmt: skip
def test_nvfp4_warp_slab_copies_match_cp_async_copies(cp, block_size, group, q_len, window,
                                                      monkeypatch):  # fmt: skip
    """On sm_90+ NVFP4 at D = 128 copies its tiles by the copy engine, one warp per 16-token
    page run and plane (decode_core.cuh issue_bulk_slabs: unpadded key rows, value rows with a
    row's gap per 4 rows); KVKIT_DECODE_NVFP4_BULK=0 copies 16-byte cp.async pieces as before.
    The valid tokens' staged bytes are the same and invalid ones only reach masked arithmetic,
    so the results are identical bit for bit: ragged lengths (runs cut by the sequence end,
    warps past it copying nothing), a window with causal q_len 2, pages below, at and above the
    64-token tile (the tile's offset in its page), G * q_len = 16 (two row tiles: cp.async
    under both settings). On GPUs without bulk copies both builds are the cp.async path.
    Session 10's tile (KVKIT_DECODE_NVFP4_REV=0): nvdec2's takes the warp's tokens in another
    order with the bulk copies only (test_nvfp4_rev1_tile_matches_rev0_tile)."""
    monkeypatch.setenv("KVKIT_DECODE_NVFP4_REV", "0")
    case = Case("nvfp4", head_dim=128, hkv=2, group=group, q_len=q_len, block_size=block_size,
                seq_lens=[5 * block_size + 9, 300, 37, 3], window=window,
                seed=block_size + group)  # fmt: skip
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_NVFP4_BULK", None, "0")


@pytest.mark.parametrize("name", ["nvfp4", "nvfp4_4over6"])
@pytest.mark.parametrize("group", [1, 2, 4, 8])
@pytest.mark.parametrize("q_len", [1, 2])
@pytest.mark.parametrize("block_size", [16, 32, 64, 128])
@pytest.mark.parametrize("window", [None, 70])
def test_nvfp4_warp_pipes_match_the_cta_barrier_build(cp, name, group, q_len, block_size,
                                                       window, monkeypatch):  # fmt: skip
    """KVKIT_DECODE_WARP_PIPE=1 (decode_core.cuh KVD_WARP_PIPE): in the warp-slab launches
    (sm_90+, D = 128, G * q_len <= 16) each warp waits on its own stage barriers, keeps its own
    page-ring lanes and meets the others only at the end of the split (the default), instead
    of a CTA barrier per tile (0). Only the synchronization differs, so the results are
    the same bits: ragged lengths (37 and 3 leave warps of the last tile without a page; with
    3 splits of 37 tokens in 16-token pages each split is one partial tile), pages below, at and
    above the 64-token tile, a window with causal q_len 2. On GPUs without bulk copies both
    builds are the cp.async path."""
    case = Case(name, head_dim=128, hkv=2, group=group, q_len=q_len, block_size=block_size,
                seq_lens=[5 * block_size + 9, 300, 37, 3, 130], window=window,
                seed=block_size + 3 * group + q_len)  # fmt: skip
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_WARP_PIPE", "1", "0")


@pytest.mark.parametrize("name", ["nvfp4", "nvfp4_4over6"])
@pytest.mark.parametrize("group", [4, 8])
@pytest.mark.parametrize("block_size", [16, 64, 128])
@pytest.mark.parametrize("window", [None, 2500])
def test_nvfp4_warp_pipes_refill_their_page_windows(cp, name, group, block_size, window,
                                                     monkeypatch):  # fmt: skip
    """KVKIT_DECODE_WARP_PIPE=1 keeps a warp's pages of 32 tiles (2048 tokens at D = 128) in
    registers and loads the next 32 a window ahead (decode_core.cuh KvTilePipe::warp_page):
    splits of more than 32 (here 70 and 33) tiles refill the window once or twice, a window
    start (2500) moves the first tile off token 0, and a ragged end leaves warps of the last
    tile without a page. Same bits as the CTA-barrier build, no flag (entries past the
    sequence, the table's -7 padding, are never checked)."""
    case = Case(name, head_dim=128, hkv=1, group=group, q_len=1, block_size=block_size,
                seq_lens=[70 * 64 - 27, 33 * 64 + 16, 300], window=window,
                seed=block_size + group)  # fmt: skip
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_WARP_PIPE", "1", "0")


@pytest.mark.parametrize("name", ["nvfp4", "nvfp4_4over6"])
@pytest.mark.parametrize("block_size", [16, 64, 128])
def test_nvfp4_warp_pipes_flag_bad_pages_as_before(cp, name, block_size, monkeypatch):
    """Bad block-table entries under KVKIT_DECODE_WARP_PIPE=1: each warp checks the entry of
    its first token of each live tile (decode_core.cuh KvTilePipe::window_check), also in
    windows after the first (sequence 3: tiles 33 and 40 of a 72-tile sequence), so the flag
    (bit 2) and the outputs (bad pages masked, no copy) are those of the CTA-barrier build,
    bit for bit, at every split count."""
    assert_bad_pages_agree(name, block_size, block_size, monkeypatch, "KVKIT_DECODE_WARP_PIPE")


TQ_NAMES = ["turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc"]


@pytest.mark.parametrize("name", TQ_NAMES)
@pytest.mark.parametrize("head_dim, group, q_len", [
    (128, 1, 1), (128, 4, 1), (128, 8, 2), (128, 16, 1), (256, 4, 1), (256, 2, 4), (64, 4, 1),
])  # fmt: skip
@pytest.mark.parametrize("pages", ["hnd16", "hnd128", "nhd32"])
@pytest.mark.parametrize("window", [None, 70])
def test_turboquant_warp_slabs_match_the_page_run_build(
    cp, name, head_dim, group, q_len, pages, window, monkeypatch
):
    """KVKIT_DECODE_TQ_SLABS=1 (decode_turboquant.cu KV_BULK_WARP_SLABS): the tensor-core
    launches from head_dim 128 copy each warp's 16 slots as one slab and run warp pipes
    (decode_core.cuh KVD_WARP_PIPE), against page-run copies and the CTA barrier (0). Same
    staged bytes and arithmetic, so the same bits: one and two row tiles, head_dim 256, ragged
    lengths (37 and 4 leave warps of the last tile without a page), pages below and above the
    64-token tile, token-major (NHD) pages (not slabs: the page-run copies and the CTA barrier
    inside a warp-pipe build), a window with causal q_len > 1. head_dim 64 (no bulk copies)
    and GPUs without the copy engine build the same code either way."""
    block_size = int(pages[3:])
    case = Case(name, head_dim=head_dim, hkv=2, group=group, q_len=q_len, block_size=block_size,
                seq_lens=[5 * block_size + 9, 300, 37, 4, 130], window=window,
                seed=block_size + 3 * group + q_len + head_dim)  # fmt: skip
    if pages.startswith("nhd"):
        store_token_major(cp, case)
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_TQ_SLABS", "1", "0")


@pytest.mark.parametrize("name", TQ_NAMES)
@pytest.mark.parametrize("group, q_len", [(1, 1), (4, 1), (8, 2), (16, 1)])
@pytest.mark.parametrize("pages", ["hnd16", "hnd128", "nhd32"])
def test_turboquant_warp_slabs_at_head_dim_64(cp, name, group, q_len, pages, monkeypatch):
    """KVKIT_DECODE_TQ_SLABS64=1 (the default): warp slabs (16 x 70-byte slots at D = 64) in
    the tensor-core launches below head_dim 128, against the cp.async build (0): same bits, one and
    two row tiles, pages below and above the tile, token-major pages (no slabs: page runs)."""
    block_size = int(pages[3:])
    case = Case(name, head_dim=64, hkv=2, group=group, q_len=q_len, block_size=block_size,
                seq_lens=[5 * block_size + 9, 300, 37, 4, 130], window=None,
                seed=block_size + 3 * group + q_len)  # fmt: skip
    if pages.startswith("nhd"):
        store_token_major(cp, case)
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_TQ_SLABS64", "1", "0")


@pytest.mark.parametrize("name", ["nvfp4", "nvfp4_4over6"])
@pytest.mark.parametrize("group, q_len", [(16, 1), (8, 2), (4, 4)])
@pytest.mark.parametrize("block_size", [16, 128])
@pytest.mark.parametrize("window", [None, 70])
def test_nvfp4_warp_slabs_with_two_row_tiles(cp, name, group, q_len, block_size, window,
                                             monkeypatch):  # fmt: skip
    """KVKIT_DECODE_NVFP4_SLAB_ROWS=16 (the default): NVFP4's warp slabs and warp pipes at 9-16
    query rows (two row tiles), against the cp.async build (8): same bits."""
    case = Case(name, head_dim=128, hkv=2, group=group, q_len=q_len, block_size=block_size,
                seq_lens=[5 * block_size + 9, 300, 37, 4, 130], window=window,
                seed=block_size + 3 * group + q_len)  # fmt: skip
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_NVFP4_SLAB_ROWS", "16", "8")


@pytest.mark.parametrize("name", ["nvfp4", "nvfp4_4over6"])
@pytest.mark.parametrize("variant", ["1", "2"])
@pytest.mark.parametrize("group, q_len", [(1, 1), (4, 1), (8, 2), (16, 1)])
@pytest.mark.parametrize("pages", ["hnd16", "hnd128", "nhd32"])
@pytest.mark.parametrize("window", [None, 70])
def test_nvfp4_warp_slabs_at_head_dim_64(cp, name, variant, group, q_len, pages, window,
                                         monkeypatch):  # fmt: skip
    """KVKIT_DECODE_NVFP4_SLABS_OTHER_D=1 / 2: NVFP4's warp slabs and warp pipes at head_dim 64
    (value rows with a row's gap per 4 rows / unpadded; the tokens in their natural order)
    against the cp.async build (0): same bits. One and two row tiles, pages below and above
    the 64-token tile, a split of more than 32 tiles (the warp pipes' page window refills),
    token-major pages (not slabs: the CTA barrier and the ring inside a slab build), a window
    with causal q_len > 1. GPUs without the copy engine build the same code either way."""
    block_size = int(pages[3:])
    case = Case(name, head_dim=64, hkv=2, group=group, q_len=q_len, block_size=block_size,
                seq_lens=[5 * block_size + 9, 300, 37, 4, 130, 70 * 64 - 27], window=window,
                seed=block_size + 3 * group + q_len + int(variant))  # fmt: skip
    if pages.startswith("nhd"):
        store_token_major(cp, case)
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_NVFP4_SLABS_OTHER_D", variant, "0")


@pytest.mark.parametrize("name", ["turboquant_4bit_nc", "turboquant_k8v4"])
@pytest.mark.parametrize("block_size", [16, 64])
@pytest.mark.parametrize("window", [None, 2500])
def test_turboquant_warp_slabs_refill_their_page_windows(cp, name, block_size, window,
                                                          monkeypatch):  # fmt: skip
    """KVKIT_DECODE_TQ_SLABS=1 over splits of more than 32 tiles (the warp pipes' register
    window of pages refills; a window start moves the first tile off token 0): the same bits
    as the page-run build, no flag."""
    case = Case(name, head_dim=128, hkv=1, group=4, q_len=1, block_size=block_size,
                seq_lens=[70 * 64 - 27, 33 * 64 + 16, 300], window=window,
                seed=block_size + 11)  # fmt: skip
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_TQ_SLABS", "1", "0")


@pytest.mark.parametrize("name", ["turboquant_4bit_nc", "turboquant_k8v4"])
@pytest.mark.parametrize("block_size", [16, 64, 128])
def test_turboquant_warp_slabs_flag_bad_pages_as_before(cp, name, block_size, monkeypatch):
    """Bad block-table entries under KVKIT_DECODE_TQ_SLABS=1 (pages past the cache, -1, a
    huge entry, bad pages in a later window of the warp pipes): the flag (bit 2) and the
    outputs (bad pages masked, no copy) equal the page-run build's, bit for bit, at every
    split count."""
    assert_bad_pages_agree(name, block_size, block_size + 5, monkeypatch, "KVKIT_DECODE_TQ_SLABS")


@pytest.mark.parametrize("name, head_dim, group, q_len, q_dtype, window, softcap", [
    ("turboquant_4bit_nc", 128, 4, 1, "float16", None, None),
    ("turboquant_4bit_nc", 128, 4, 1, "float32", 90, None),
    ("turboquant_4bit_nc", 64, 2, 2, "bfloat16", None, 30.0),
    ("turboquant_3bit_nc", 256, 4, 1, "float16", None, None),
    ("turboquant_k3v4_nc", 128, 1, 4, "float16", 70, None),
    ("turboquant_k8v4", 128, 4, 1, "float16", None, None),
    ("turboquant_k8v4", 128, 3, 1, "float32", None, None),
    ("turboquant_4bit_nc", 128, 8, 1, "float16", None, None),  # R = 8: both builds unpacked
])  # fmt: skip
def test_turboquant_packed_columns_match_the_unpacked_build(cp, name, head_dim, group, q_len,
                                                            q_dtype, window, softcap,
                                                            monkeypatch):  # fmt: skip
    """decode_turboquant.cu KVKIT_DECODE_TQ_VARIANT: with G * q_len <= 4 the default build
    (1) puts the query lo parts and the W = p * scale mid parts into the mma's padding columns
    (decode_mma.cuh KV_MMA_PACK); 0 is the build before it. The scores are the same bits
    (each mma column is its own sum; hi + lo is the same float32 add), so where the softmax
    alone decides (lse) both agree bit for bit; o takes the three W parts in another float32
    order (hi + lo per tile and mid per tile, joined after the loop, where one tensor-core chain
    per tile took all three): equal to float32 rounding, and both within the float64
    reference's tolerance. Ragged lengths, 1 and 3 splits, masks (window, causal q_len > 1,
    the sequence end), soft-cap, every query dtype, FP8 keys (no q lo part: the padding
    columns repeat the hi part), and R = 8 (both builds unpacked: bit for bit)."""
    case = Case(name, head_dim=head_dim, hkv=2, group=group, q_len=q_len, block_size=16,
                seq_lens=[5 * 64 + 9, 300, 37, 4], window=window, softcap=softcap,
                q_dtype=q_dtype, seed=head_dim + 7 * group + q_len)  # fmt: skip
    # "1": the default from D = 128 only; forced here so that D = 64 is covered too.
    exact = "all" if group * q_len > 4 else "lse"  # else the PV sums reassociate in float32
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_TQ_VARIANT", "1", "0", exact)


@pytest.mark.parametrize("name", ["turboquant_3bit_nc", "turboquant_k3v4_nc"])
@pytest.mark.parametrize("head_dim, group, q_len, window", [
    (256, 4, 1, None), (256, 2, 4, 90), (128, 16, 1, None), (128, 4, 4, 70), (128, 4, 1, None),
    (64, 4, 1, None),
])  # fmt: skip
def test_turboquant_tq3_plans_match_the_build_before(cp, name, head_dim, group, q_len, window,
                                                     monkeypatch):  # fmt: skip
    """decode_turboquant.cu KVKIT_DECODE_TQ3: 3-bit values at D = 256 as 16-bit units (the
    halves plan) and the 3-bit key table first in shared memory (D = 128, G * q_len > 8)
    against the build before them (0). Both extract the same codes into the same operands and
    tables (tests/cuda/test_tq3_unpack_model.py checks the plans), so the two agree bit for
    bit; forced to 1 so that the shapes whose default is 0 (D = 64, D = 128 with <= 8 rows)
    build and run it too."""
    case = Case(name, head_dim=head_dim, hkv=2, group=group, q_len=q_len, block_size=16,
                seq_lens=[5 * 64 + 9, 300, 37, 4], window=window,
                seed=head_dim + 5 * group + q_len)  # fmt: skip
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_TQ3", "1", "0")


@pytest.mark.parametrize("block_size", [16, 32, 128])
@pytest.mark.parametrize("head_dim, group, q_len, window", [
    (128, 4, 1, None), (128, 4, 2, 90), (128, 8, 1, None), (128, 16, 1, None), (64, 4, 1, None),
    (256, 4, 1, None), (32, 2, 4, None),
])  # fmt: skip
def test_nvfp4_rev1_tile_matches_rev0_tile(cp, block_size, head_dim, group, q_len, window,
                                           monkeypatch):  # fmt: skip
    """decode_nvfp4.cu KV_NVFP4_REV: nvdec2's tile (1, the default) against session 10's (0,
    KVKIT_DECODE_NVFP4_REV=0). Hardware block scales without the 2^6 multiply change every
    operand by one power of two, undone in float32 (same bits); on sm_90+ at D = 128 the value
    codes are staged unpadded and the warp's tokens taken in the order kv_mma_tok, which
    changes which lane sums which token: float32 reassociation, nothing more. Elsewhere (sm_80
    PTX: no hardware E4M3; other head dims; two row tiles) both builds should agree bit for
    bit, which the test asserts where the 2^6 fold is the only change that can apply."""
    case = Case("nvfp4", head_dim=head_dim, hkv=2, group=group, q_len=q_len,
                block_size=block_size, seq_lens=[5 * block_size + 9, 300, 37, 4],
                window=window, seed=block_size + group + head_dim)  # fmt: skip
    # The copy-engine builds (sm_90+) of one row tile. Two row tiles (G * q_len 9-16) take the
    # swapped order too since session 13 and still gave the same bits on the H200 (call 7), so
    # they keep the strict check.
    swap = head_dim == 128 and group * q_len <= 8
    exact = "none" if swap else "all"
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_NVFP4_REV", None, "0", exact)


@pytest.mark.parametrize("name, head_dim", [("nvfp4", 128), ("nvfp4", 64), ("nvfp4", 256),
                                            ("fp8_e4m3", 128)])  # fmt: skip
def test_nan_bytes_past_the_sequence_end_are_masked(cp, name, head_dim):
    """A sequence's last page holds slots past its length; the tile copy stages them, and the
    tensor-core core must not let their values reach o (decode_mma.cuh zeroes an invalid
    token's raw V words, KV_MMA_V_REGS). Poison those slots with NaN bytes (E4M3 0x7F: the
    NVFP4 block scales, fp8 values) in K and V."""
    case = Case(name, head_dim=head_dim, hkv=2, group=4, q_len=1, block_size=16,
                seq_lens=[300, 129, 70, 5], seed=head_dim + 3)  # fmt: skip
    ref_o, ref_lse = case.reference()
    planes = ("k_scale", "v_scale") if name == "nvfp4" else ("k", "v")
    for b, n in enumerate(case.seq_lens):
        page = case.block_tables[b, (int(n) - 1) // 16]
        for pname in planes:
            case.gpu.planes[pname][page, :, int(n) % 16 or 16 :, :] = 0x7F
    for num_splits in (1, 3):
        o, lse = case.run(num_splits)
        assert case.flag() == 0
        assert rel_error(o, ref_o) <= DECODE_GPU_RTOL, num_splits
        assert lse_error(lse, ref_lse) <= DECODE_GPU_RTOL, num_splits


# --- E4M3 NaN codes in valid tokens: the software path's per-tile fast conversion -------------
# (decode_mma.cuh KV_MMA_NANTILE_K / _V; KVKIT_DECODE_FP8_NANTILE). A warp whose tile bytes
# hold no NaN code (0x7F / 0xFF) converts them without the NaN patch, one that holds one takes
# the exact conversion for that tile: the same bits either way. Natively on sm_89+ the
# conversion is the hardware's and the switch is a no-op; scripts/gpu_check.sh's KVKIT_ARCH=sm_80
# pass runs the software path.


def _poison_e4m3(case, cells):
    """Write E4M3 NaN codes into both layers and rebuild the reference pages from the CPU
    layer (kvkit.dequantize: the spec's NaN). cells: (plane, page, head, slot, byte, code);
    plane "k" / "v" (fp8_e4m3) or "slots" (k8v4: key byte d at slot byte d)."""
    for plane, page, head, slot, byte, code in cells:
        case.cpu.planes[plane][page, head, slot, byte] = code
        case.gpu.planes[plane][page, head, slot, byte] = code
    bs = case.cpu.block_size
    n = case.cpu.num_blocks * bs
    kd, vd = kvkit.dequantize(case.cpu, np.arange(n, dtype=np.int64))
    shape = (case.cpu.num_blocks, bs, case.cpu.num_kv_heads, case.cpu.head_dim)
    case.k_pages = kd.reshape(shape).transpose(0, 2, 1, 3)
    case.v_pages = vd.reshape(shape).transpose(0, 2, 1, 3)


def _nan_cells(case, name, target):
    """NaN codes in valid tokens of some tiles (64 tokens) and not others, plus NaN codes in
    the slots past sequence 3's end (masked: they must not reach o either way)."""
    d = case.cpu.head_dim
    bs = case.cpu.block_size
    kplane, vplane = ("slots", None) if name == "turboquant_k8v4" else ("k", "v")

    def at(b, tok, head, byte, code, plane):
        return (plane, int(case.block_tables[b, tok // bs]), head, tok % bs, byte, code)

    cells = []
    if "k" in target:  # keys: sequence 0 tile 1, sequence 2 tile 0 (both signs)
        cells += [at(0, 100, 1, d // 2 + 1, 0x7F, kplane), at(2, 10, 0, 3, 0xFF, kplane)]
    if "v" in target:  # values: sequence 1 tile 3, sequence 2 tile 2
        cells += [at(1, 200, 0, d - 1, 0xFF, vplane), at(2, 150, 1, 5, 0x7F, vplane)]
    n3 = int(case.seq_lens[3])
    page = int(case.block_tables[3, (n3 - 1) // bs])
    for slot in range(n3 % bs or bs, bs):
        cells += [(kplane, page, h, slot, 0, 0x7F) for h in range(2)]
        if vplane:
            cells += [(vplane, page, h, slot, d - 2, 0xFF) for h in range(2)]
    return cells


@pytest.mark.parametrize("name, head_dim, group, q_len, target", [
    ("fp8_e4m3", 128, 4, 1, "k"), ("fp8_e4m3", 128, 4, 1, "v"), ("fp8_e4m3", 128, 4, 1, "kv"),
    ("fp8_e4m3", 64, 8, 1, "kv"), ("fp8_e4m3", 256, 2, 1, "kv"), ("fp8_e4m3", 128, 2, 4, "kv"),
    ("fp8_e4m3", 128, 16, 1, "kv"),
    ("turboquant_k8v4", 128, 4, 1, "k"), ("turboquant_k8v4", 64, 2, 1, "k"),
    ("turboquant_k8v4", 256, 4, 1, "k"), ("turboquant_k8v4", 128, 8, 2, "k"),
])  # fmt: skip
def test_e4m3_nan_codes_propagate_as_in_the_reference(cp, name, head_dim, group, q_len, target,
                                                       monkeypatch):  # fmt: skip
    """E4M3 NaN codes in valid tokens of some tiles: a key's makes its KV head's rows NaN (o
    and lse), a value's makes that dim of o NaN in those rows, as in the float64 reference
    over the spec's values (kvkit.dequantize); every other entry within DECODE_GPU_RTOL; NaN
    codes past a sequence's end change nothing. The per-tile fast conversion (default) and the
    exact one everywhere (KVKIT_DECODE_FP8_NANTILE=0) give the same bits, NaN payloads
    included, with 1 and 3 splits. Sequence lengths keep every poisoned token among 15
    visible ones of its warp (so the tile's max logit is finite, as in the reference)."""
    case = Case(name, head_dim=head_dim, hkv=2, group=group, q_len=q_len, block_size=16,
                seq_lens=[300, 260, 200, 70], seed=head_dim + group + q_len)  # fmt: skip
    _poison_e4m3(case, _nan_cells(case, name, target))
    ref_o, ref_lse = case.reference()
    nan_o, nan_lse = np.isnan(ref_o), np.isnan(ref_lse)
    # The poisoning reached the reference where intended, and only there.
    assert nan_o.any() and not nan_o.all()
    assert nan_lse.any() == ("k" in target)
    assert not nan_o[3].any()
    for num_splits in (1, 3):
        outs = []
        for value in (None, "0"):
            if value is None:
                monkeypatch.delenv("KVKIT_DECODE_FP8_NANTILE", raising=False)
            else:
                monkeypatch.setenv("KVKIT_DECODE_FP8_NANTILE", value)
            case.gpu.error_flag.fill(0)
            outs.append(case.run(num_splits))
            assert case.flag() == 0, (value, num_splits)
        (o, lse), (o_old, lse_old) = outs
        np.testing.assert_array_equal(o.view(np.uint32), o_old.view(np.uint32))
        np.testing.assert_array_equal(lse.view(np.uint32), lse_old.view(np.uint32))
        np.testing.assert_array_equal(np.isnan(o), nan_o)
        np.testing.assert_array_equal(np.isnan(lse), nan_lse)
        assert rel_error(np.where(nan_o, 0.0, o), np.where(nan_o, 0.0, ref_o)) <= DECODE_GPU_RTOL
        assert lse_error(lse[~nan_lse], ref_lse[~nan_lse]) <= DECODE_GPU_RTOL


@pytest.mark.parametrize("name, head_dim, group, q_len, window", [
    ("fp8_e4m3", 128, 4, 1, None), ("fp8_e4m3", 128, 8, 2, 90), ("fp8_e4m3", 64, 4, 1, None),
    ("fp8_e4m3", 256, 2, 4, None), ("fp8_e4m3", 128, 16, 1, None),
    ("turboquant_k8v4", 128, 4, 1, None), ("turboquant_k8v4", 64, 8, 1, 70),
    ("turboquant_k8v4", 256, 4, 1, None),
])  # fmt: skip
def test_fp8_nantile_fast_path_agrees_bit_for_bit(cp, name, head_dim, group, q_len, window,
                                                  monkeypatch):  # fmt: skip
    """KVKIT_DECODE_FP8_NANTILE: the per-tile NaN-free E4M3 conversion (default on the
    software path) and the exact one everywhere (0) build the same fp16 operands in the same
    mma positions: the same bits, on ordinary data (every tile takes the fast path), ragged
    lengths and a window (masked tokens, whose value words are zeroed before the test)."""
    case = Case(name, head_dim=head_dim, hkv=2, group=group, q_len=q_len, block_size=16,
                seq_lens=[300, 129, 64, 5], window=window,
                seed=head_dim + 10 * group + q_len)  # fmt: skip
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_FP8_NANTILE", None, "0")


# --- index safety ------------------------------------------------------------------------------


def test_bad_block_table_entries_set_the_flag_and_stay_in_bounds(cp):
    case = Case("nvfp4", head_dim=64, hkv=2, group=4, q_len=1, block_size=16,
                seq_lens=[40, 40, 20], seed=9)  # fmt: skip
    planes_before = {k: p.copy() for k, p in case.gpu.planes.items()}
    bt = case.block_tables.copy()
    bt[0, 1] = case.gpu.num_blocks  # one past the cache
    bt[1, 0] = -1
    bt[1, 2] = 2**31 - 1
    ref_o, ref_lse = case.reference()
    for num_splits in (1, 3, MAX_SPLITS):
        case.gpu.error_flag.fill(0)
        o, lse = case.run(num_splits, block_tables=bt)
        assert case.flag() & 2
        assert np.all(np.isfinite(o)) and not np.any(np.isnan(lse))
        # Sequence 2 uses only valid pages: unaffected.
        assert rel_error(o[2], ref_o[2]) <= DECODE_GPU_RTOL
        assert lse_error(lse[2], ref_lse[2]) <= DECODE_GPU_RTOL
    for k, p in case.gpu.planes.items():
        assert bool((p == planes_before[k]).all()), "decode must not write the cache"


@pytest.mark.parametrize("bad_len", [-5, 0, 2, 10_000])
@pytest.mark.parametrize("sinks", [False, True])
def test_bad_seq_lens_set_the_flag_and_give_empty_rows(cp, bad_len, sinks):
    q_len = 3
    case = Case("fp8_e4m3", head_dim=64, hkv=1, group=4, q_len=q_len, block_size=16,
                seq_lens=[20, 33], seed=10, sinks=sinks)  # fmt: skip
    ref_o, ref_lse = case.reference()
    lens = case.seq_lens.copy()
    lens[0] = bad_len  # < q_len, or beyond max_blocks * block_size
    for num_splits in (1, MAX_SPLITS, None):
        case.gpu.error_flag.fill(0)
        o, lse = case.run(num_splits, seq_lens=lens)
        assert case.flag() & 4
        assert np.all(o[0] == 0)
        if sinks:
            # Only the sink is left: lse = sink, o = 0.
            np.testing.assert_allclose(lse[0], np.broadcast_to(case.sinks, lse[0].shape))
        else:
            assert np.all(lse[0] == -np.inf)
        assert rel_error(o[1], ref_o[1]) <= DECODE_GPU_RTOL
        assert lse_error(lse[1], ref_lse[1]) <= DECODE_GPU_RTOL


def test_padding_entries_are_never_read(cp):
    case = Case("turboquant_k8v4", head_dim=64, hkv=1, group=8, q_len=1, block_size=16,
                seq_lens=[16, 17], spare_blocks=3, seed=13)  # fmt: skip
    case.block_tables[:, 2:] = 2**31 - 1
    check_against_reference(case)


def test_empty_batch_and_argument_errors(cp):
    from kvkit.cuda import decode as cuda_decode

    case = Case("fp16", head_dim=64, hkv=2, group=2, q_len=1, block_size=16, seq_lens=[5],
                seed=1)  # fmt: skip
    q = cp.zeros((0, 1, 4, 64), cp.float32)
    o, lse = cuda_decode.decode(q, "float32", case.gpu, cp.zeros((0, 1), cp.int32),
                                cp.zeros(0, cp.int32), scale=0.1)  # fmt: skip
    assert o.shape == (0, 1, 4, 64) and lse.shape == (0, 1, 4)
    q = cp.zeros((1, 1, 4, 64), cp.float32)
    bt, sl = cp.zeros((1, 1), cp.int32), cp.full(1, 5, cp.int32)
    with pytest.raises(ValueError, match="num_splits"):
        cuda_decode.decode(q, "float32", case.gpu, bt, sl, scale=0.1, num_splits=MAX_SPLITS + 1)
    with pytest.raises(TypeError, match="q_dtype"):
        cuda_decode.decode(q, "int8", case.gpu, bt, sl, scale=0.1)
    big = cp.zeros((1, 16, 2 * 16, 64), cp.float32)  # G = 16, q_len = 16: 256 rows
    with pytest.raises(ValueError, match="query rows"):
        cuda_decode.decode(big, "float32", case.gpu, bt, sl, scale=0.1)


# --- decode stage 2 (the split merge) on crafted partial states --------------------------------


@pytest.mark.parametrize("num_splits", [1, 2, 3, 8, 31, 32, 33, 66, 128])
@pytest.mark.parametrize("head_dim", [32, 64, 80, 128, 256, 512])
@pytest.mark.parametrize("sinks", [False, True])
def test_decode_merge_kernel_matches_the_float64_merge(cp, num_splits, head_dim, sinks):
    """kv_decode_merge_splits against the float64 merge of the same (m, l, acc) partials, for
    every launch shape kvkit.cuda.decode.merge_block picks (one to 32 split groups, 8 to 128
    column groups, column chunks, head dims that are not powers of two). Empty splits (m =
    -inf) carry NaN accumulators (never read), one row is all empty, split_stride > S."""
    _check_decode_merge_kernel(cp, num_splits, head_dim, sinks, block=None)


@pytest.mark.parametrize("num_splits", [5, 9, 23])
@pytest.mark.parametrize("sinks", [False, True])
def test_decode_merge_kernel_in_several_passes(cp, num_splits, sinks):
    """The kernel's passes over the splits (more splits than 4 per split group: a later pass
    with a larger max rescales the sums so far), which merge_block's shapes reach only past
    128 splits: a block of one split group forces them."""
    _check_decode_merge_kernel(cp, num_splits, 128, sinks, block=(32, 1))


def _check_decode_merge_kernel(cp, num_splits, head_dim, sinks, block):
    from kvkit.cuda import decode as cuda_decode

    rng = np.random.default_rng(num_splits * 1000 + head_dim + sinks)
    num_heads, rows, stride = 4, 12, num_splits + 3
    m = np.full((rows, stride), np.nan, dtype=np.float32)  # padding splits: never read
    l_sum = np.full((rows, stride), np.nan, dtype=np.float32)
    acc = np.full((rows, stride, head_dim), np.nan, dtype=np.float32)
    m[:, :num_splits] = (rng.standard_normal((rows, num_splits)) * 4).astype(np.float32)
    l_sum[:, :num_splits] = rng.uniform(0.5, 20.0, (rows, num_splits)).astype(np.float32)
    acc[:, :num_splits] = rng.standard_normal((rows, num_splits, head_dim)).astype(np.float32)
    empty = rng.random((rows, num_splits)) < 0.3
    empty[5] = True  # a row with nothing visible
    empty[7, :] = False
    empty[0, -1] = False
    m[:, :num_splits][empty] = -np.inf
    l_sum[:, :num_splits][empty] = 0.0
    acc[:, :num_splits][empty] = np.nan
    if num_splits > 1:
        m[7, 0] = 200.0  # the other splits' weights underflow to 0 in float32
        m[0, num_splits - 1] = 50.0  # the last split (pass) holds row 0's max: a rescale
    sink = (rng.standard_normal(num_heads) + 1.0).astype(np.float32) if sinks else None

    o = cp.zeros((rows, head_dim), dtype=cp.float32)
    lse = cp.zeros((rows,), dtype=cp.float32)
    if block is None:
        cgroups, sgroups, chunks = cuda_decode.merge_block(num_splits, head_dim)
    else:
        cgroups, sgroups = block
        chunks = -(-head_dim // (cuda_decode.MERGE_COLS * cgroups))
    kern = cuda_decode._merge_kernel("kv_decode_merge_splits")
    kern(
        (rows, chunks), (cgroups, sgroups),
        (
            cp.asarray(m), cp.asarray(l_sum), cp.asarray(acc),
            np.uint64(0) if sink is None else cp.asarray(sink),
            np.int64(rows), np.int32(num_heads), np.int32(head_dim),
            np.int32(num_splits), np.int32(stride), o, lse,
        ),
    )  # fmt: skip
    out, out_lse = cp.asnumpy(o), cp.asnumpy(lse)

    # The partials as normalized parts (o_s = acc_s / l_s, lse_s = m_s + log l_s), the sink a
    # part with o = 0: merge_error's float64 merge and scale.
    live = ~empty
    with np.errstate(divide="ignore", invalid="ignore"):
        o_parts = np.where(live[..., None], acc[:, :num_splits] / l_sum[:, :num_splits, None], 0)
        lse_parts = np.where(live, m[:, :num_splits] + np.log(l_sum[:, :num_splits]), -np.inf)
    o_parts = np.moveaxis(o_parts, 1, 0)
    lse_parts = np.moveaxis(lse_parts, 1, 0)
    if sink is not None:
        o_parts = np.concatenate([o_parts, np.zeros((1, rows, head_dim))], axis=0)
        lse_parts = np.concatenate([lse_parts, sink[np.arange(rows) % num_heads][None]], axis=0)
    assert merge_error(out, o_parts, lse_parts) <= MERGE_RTOL
    big = lse_parts.max(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        ref_lse = big + np.log(np.exp(lse_parts - np.where(big == -np.inf, 0, big)).sum(axis=0))
    if sink is None:
        assert np.all(out[5] == 0) and out_lse[5] == -np.inf
    else:
        assert np.all(out[5] == 0) and out_lse[5] == sink[5 % num_heads]
    assert lse_error(out_lse, ref_lse.astype(np.float32)) <= SPLIT_INVARIANCE_RTOL
    assert np.isfinite(out).all()


# --- merge_states on the GPU -------------------------------------------------------------------


@FEW
@given(
    parts=st.integers(1, 40),
    batch=st.lists(st.integers(1, 5), min_size=1, max_size=3),
    head_dim=st.sampled_from([1, 7, 64, 128, 300]),
    empty_frac=st.sampled_from([0.0, 0.3, 1.0]),
    seed=st.integers(0, 2**32 - 1),
)
@example(parts=1, batch=[3], head_dim=64, empty_frac=1.0, seed=0)
@example(parts=33, batch=[2, 2], head_dim=128, empty_frac=0.3, seed=1)
# Found on the H200 (session 6): the parts cancel to -0.0015 in one row; GPU and CPU float32
# merges differed relatively by 1.1e-5 there (each is ~5e-8 from the float64 merge,
# relative to merge_error's scale).
@example(parts=6, batch=[4], head_dim=1, empty_frac=0.0, seed=45298118)
def test_merge_states_matches_the_cpu(cp, parts, batch, head_dim, empty_frac, seed):
    from kvkit.cuda import decode as cuda_decode

    rng = np.random.default_rng(seed)
    o = rng.standard_normal((parts, *batch, head_dim)).astype(np.float32)
    lse = (rng.standard_normal((parts, *batch)) * 3).astype(np.float32)
    empty = rng.random((parts, *batch)) < empty_frac
    lse[empty] = -np.inf
    o[empty] = np.nan  # an empty part's o is ignored
    ref_o, ref_lse = cpu_merge_states(o, lse)
    out, out_lse = cuda_decode.merge_states(cp.asarray(o), cp.asarray(lse))
    out, out_lse = cp.asnumpy(out), cp.asnumpy(out_lse)
    assert out.shape == ref_o.shape and out_lse.shape == ref_lse.shape
    assert out.dtype == np.float32 and out_lse.dtype == np.float32
    all_empty = ref_lse == -np.inf
    assert np.all(out[all_empty] == 0) and np.all(out_lse[all_empty] == -np.inf)
    # Against the float64 merge, relative to the parts' weighted magnitude: both backends
    # round in float32 in their own order, so where parts cancel (head_dim 1, 6 parts) the
    # two float32 results may differ relatively by more than 1e-5 while each is accurate.
    assert merge_error(out, o, lse) <= MERGE_RTOL
    assert merge_error(ref_o, o, lse) <= MERGE_RTOL
    assert lse_error(out_lse, ref_lse) <= SPLIT_INVARIANCE_RTOL


def test_merge_states_through_the_front_door(cp):
    rng = np.random.default_rng(4)
    o = rng.standard_normal((3, 2, 5, 64)).astype(np.float32)
    lse = rng.standard_normal((3, 2, 5)).astype(np.float32)
    ref_o, ref_lse = kvkit.merge_states(o, lse)
    out, out_lse = kvkit.merge_states(cp.asarray(o), cp.asarray(lse))
    assert rel_error(cp.asnumpy(out), ref_o) <= SPLIT_INVARIANCE_RTOL
    assert lse_error(cp.asnumpy(out_lse), ref_lse) <= SPLIT_INVARIANCE_RTOL


def test_merge_states_argument_errors(cp):
    from kvkit.cuda import decode as cuda_decode

    with pytest.raises(ValueError):
        cuda_decode.merge_states(cp.zeros((0, 2, 4), cp.float32), cp.zeros((0, 2), cp.float32))
    with pytest.raises(ValueError):
        cuda_decode.merge_states(cp.zeros((2, 2, 4), cp.float32), cp.zeros((2, 3), cp.float32))
    with pytest.raises(TypeError):
        cuda_decode.merge_states(cp.zeros((2, 2, 4), cp.int32), cp.zeros((2, 2), cp.float32))


# --- the pair loop's addressing (KVKIT_DECODE_PAIR_ADDR, decode_core.cuh KVD_PAIR_ADDR) ------
# NVFP4's tile-pair loop with per-lane row offsets held over the loop and both tiles' copies
# issued together (1, the default): the same loads of the same staged bytes and the same
# arithmetic in the same order, so the same bits as the build before (0), pairs on on both
# sides. Under KVKIT_ARCH=sm_80 / sm_89 (no pair loop) both values build the same code.
PAIR_ADDR_NAMES = ["nvfp4", "nvfp4_4over6"]


@pytest.mark.parametrize("name", PAIR_ADDR_NAMES)
@pytest.mark.parametrize("group, q_len", [(1, 1), (4, 1), (8, 1), (4, 2), (2, 4)])
@pytest.mark.parametrize("block_size", [16, 64, 128])
@pytest.mark.parametrize("window", [None, 70])
def test_pair_addr_matches_the_build_before(cp, name, group, q_len, block_size, window,
                                            monkeypatch):  # fmt: skip
    """KVKIT_DECODE_PAIR_ADDR=1 against 0, bit for bit: the tile-pair tests' lengths (a single
    partial or full tile, odd and even tile counts, ragged ends where warps of the last tile
    have no page, so one of a pair's copies or both are skipped), pages below, at and above
    the 64-token tile (issue_pair's in-page offsets), a window, causal q_len > 1, 1-8 query
    rows, 1 and 3 splits; within DECODE_GPU_RTOL of float64."""
    case = Case(name, head_dim=128, hkv=2, group=group, q_len=q_len, block_size=block_size,
                seq_lens=[*PAIR_LENS, 5 * block_size + 9, 20 * 64 + 37], window=window,
                seed=block_size + 3 * group + q_len + 1)  # fmt: skip
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_PAIR_ADDR", "1", "0")


@pytest.mark.parametrize("name", PAIR_ADDR_NAMES)
@pytest.mark.parametrize("group, q_len, window", [(4, 1, None), (4, 2, 90), (8, 1, 5)])
def test_pair_addr_at_head_dim_64(cp, name, group, q_len, window, monkeypatch):
    """The same at head_dim 64 (32-byte code rows, 4-byte scale rows: the lane offsets' XOR
    of the value row stride and the scale offsets' g / 2)."""
    case = Case(name, head_dim=64, hkv=2, group=group, q_len=q_len, block_size=16,
                seq_lens=[*PAIR_LENS, 70 * 64 - 27], window=window, seed=9 + group)  # fmt: skip
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_PAIR_ADDR", "1", "0")


@pytest.mark.parametrize("block_size", [16, 64, 128])
@pytest.mark.parametrize("window", [None, 2500])
def test_pair_addr_refills_the_page_windows(cp, block_size, window, monkeypatch):
    """Splits of 70 and 33 tiles (page-window refills between pairs; an odd last tile, whose
    issue past the end is the single-tile issue()), bit for bit against 0."""
    case = Case("nvfp4", head_dim=128, hkv=1, group=4, q_len=1, block_size=block_size,
                seq_lens=[70 * 64 - 27, 33 * 64 + 16, 300], window=window,
                seed=block_size + 5)  # fmt: skip
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_PAIR_ADDR", "1", "0")


@pytest.mark.parametrize("block_size", [16, 64, 128])
def test_pair_addr_flags_bad_pages_as_before(cp, block_size, monkeypatch):
    """Bad block-table entries (assert_bad_pages_agree: a bad page for one warp of one tile,
    so one copy of a pair is skipped) under KVKIT_DECODE_PAIR_ADDR=1 and 0: the same flag,
    the same outputs bit for bit."""
    assert_bad_pages_agree("nvfp4", block_size, block_size + 1, monkeypatch,
                           "KVKIT_DECODE_PAIR_ADDR")  # fmt: skip


@pytest.mark.parametrize("name", PAIR_ADDR_NAMES)
@pytest.mark.parametrize("group, q_len", [(4, 1), (2, 4)])
def test_pair_addr_matches_float64_at_every_split_count(cp, name, group, q_len, monkeypatch):
    """Under KVKIT_DECODE_PAIR_ADDR=1, every split count within DECODE_GPU_RTOL of float64 and
    within SPLIT_INVARIANCE_RTOL of each other, with sinks and a soft-cap."""
    monkeypatch.setenv("KVKIT_DECODE_PAIR_ADDR", "1")
    case = Case(name, head_dim=128, hkv=2, group=group, q_len=q_len, block_size=64,
                seq_lens=[*PAIR_LENS, 40 * 64 + 3], sinks=True, softcap=30.0,
                seed=13 + group)  # fmt: skip
    check_against_reference(case)


# TurboQuant's codebook presets under the same switch (decode_mma_pairs.cuh KV_MMA_LANE_SLOT:
# three lane offsets into the one slot row, halved key-row offset; default 1 but for 3bit_nc
# at head_dim 256): 1 against 0 bit for bit, pairs on on both sides, at head_dim 64 (8 rows),
# 128 and 256 (4 rows; more rows build the same code under both values).
TQ_PAIR_ADDR_NAMES = ["turboquant_4bit_nc", "turboquant_3bit_nc", "turboquant_k3v4_nc"]


@pytest.mark.parametrize("name", TQ_PAIR_ADDR_NAMES)
@pytest.mark.parametrize("group, q_len", [(1, 1), (4, 1), (1, 4)])
@pytest.mark.parametrize("block_size", [16, 64, 128])
@pytest.mark.parametrize("window", [None, 70])
def test_tq_pair_addr_matches_the_build_before(cp, name, group, q_len, block_size, window,
                                               monkeypatch):  # fmt: skip
    """TurboQuant, KVKIT_DECODE_PAIR_ADDR=1 against 0 at head_dim 128, bit for bit: the
    tile-pair tests' lengths (partial and odd last tiles, warps without a page in the last
    tile), pages below, at and above the tile, a window, causal q_len 4, 1 and 3 splits;
    within DECODE_GPU_RTOL of float64."""
    case = Case(name, head_dim=128, hkv=2, group=group, q_len=q_len, block_size=block_size,
                seq_lens=[*PAIR_LENS, 5 * block_size + 9, 20 * 64 + 37], window=window,
                seed=block_size + 3 * group + q_len + 2)  # fmt: skip
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_PAIR_ADDR", "1", "0")


@pytest.mark.parametrize("name", TQ_PAIR_ADDR_NAMES)
@pytest.mark.parametrize("head_dim, group, q_len, window",
                         [(64, 4, 1, None), (64, 8, 1, 5), (256, 2, 2, 70)])  # fmt: skip
def test_tq_pair_addr_at_head_dims_64_and_256(cp, name, head_dim, group, q_len, window,
                                              monkeypatch):  # fmt: skip
    """The same at head_dim 64 (70- / 62-byte slots; the 3-bit values' word mode, whose
    byte-permute selector still takes the lane group) and 256 (whole value words)."""
    case = Case(name, head_dim=head_dim, hkv=2, group=group, q_len=q_len, block_size=16,
                seq_lens=[*PAIR_LENS, 70 * 64 - 27], window=window,
                seed=head_dim + group + q_len)  # fmt: skip
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_PAIR_ADDR", "1", "0")


@pytest.mark.parametrize("name", ["turboquant_4bit_nc", "turboquant_3bit_nc"])
@pytest.mark.parametrize("block_size", [16, 64, 128])
def test_tq_pair_addr_refills_the_page_windows(cp, name, block_size, monkeypatch):
    """TurboQuant splits of 70 and 33 tiles (page-window refills between pairs; an odd last
    tile), with and without a window, bit for bit against 0."""
    for window in (None, 2500):
        case = Case(name, head_dim=128, hkv=1, group=4, q_len=1, block_size=block_size,
                    seq_lens=[70 * 64 - 27, 33 * 64 + 16, 300], window=window,
                    seed=block_size + 7)  # fmt: skip
        assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_PAIR_ADDR", "1", "0")


@pytest.mark.parametrize("name", TQ_PAIR_ADDR_NAMES)
@pytest.mark.parametrize("block_size", [16, 128])
def test_tq_pair_addr_flags_bad_pages_as_before(cp, name, block_size, monkeypatch):
    """TurboQuant with bad block-table entries (assert_bad_pages_agree) under
    KVKIT_DECODE_PAIR_ADDR=1 and 0: the same flag, the same outputs bit for bit."""
    assert_bad_pages_agree(name, block_size, block_size + 2, monkeypatch,
                           "KVKIT_DECODE_PAIR_ADDR")  # fmt: skip


# (Its float64 check: test_tq_pair_switches_match_float64_at_every_split_count.)


# --- TurboQuant's tile pairs up to 8 rows at head_dim 128 (KVKIT_DECODE_TQ_PAIRS8) -------------
# 1 (the default) gives 5-8 query rows the pair loop at three CTAs per SM; 0 (the build
# before) runs them one tile at a time: float32 reassociation apart (one softmax step and one
# accumulator add per pair), so within SPLIT_INVARIANCE_RTOL of each other and DECODE_GPU_RTOL
# of float64.
TQ_PAIRS8_CASES = [("turboquant_4bit_nc", 8, 1), ("turboquant_4bit_nc", 4, 2),
                   ("turboquant_3bit_nc", 8, 1), ("turboquant_3bit_nc", 2, 4),
                   ("turboquant_k3v4_nc", 8, 1)]  # fmt: skip


@pytest.mark.parametrize("name, group, q_len", TQ_PAIRS8_CASES)
@pytest.mark.parametrize("block_size, window", [(16, None), (64, 70), (128, None)])
def test_tq_pairs8_match_the_single_tile_build(cp, name, group, q_len, block_size, window,
                                               monkeypatch):  # fmt: skip
    """KVKIT_DECODE_TQ_PAIRS8=1 against 0 at 5-8 query rows: the tile-pair tests' lengths,
    70 tiles in one split (page-window refills, an odd last tile), pages below, at and above
    the tile, a window, causal q_len > 1; 1 and 3 splits."""
    case = Case(name, head_dim=128, hkv=2, group=group, q_len=q_len, block_size=block_size,
                seq_lens=[*PAIR_LENS, 70 * 64 - 27], window=window,
                seed=block_size + 3 * group + q_len)  # fmt: skip
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_TQ_PAIRS8", "1", "0", exact="none")


@pytest.mark.parametrize("name", ["turboquant_4bit_nc", "turboquant_3bit_nc"])
@pytest.mark.parametrize("block_size", [16, 128])
def test_tq_pairs8_flag_bad_pages_as_before(cp, name, block_size, monkeypatch):
    """Bad block-table entries (assert_bad_pages_agree at G = 8) under KVKIT_DECODE_TQ_PAIRS8=1
    and 0: the same flag, outputs within float32 reassociation."""
    assert_bad_pages_agree(name, block_size, block_size + 9, monkeypatch,
                           "KVKIT_DECODE_TQ_PAIRS8", group=8)  # fmt: skip


@pytest.mark.parametrize("name", ["turboquant_4bit_nc", "turboquant_k3v4_nc"])
def test_tq_pairs8_token_major_planes(cp, name, monkeypatch):
    """Token-major (strided) planes at 8 rows under 1 and 0: the single-tile loop either way
    (no slabs), the same bits."""
    case = Case(name, head_dim=128, hkv=2, group=8, q_len=1, block_size=32,
                seq_lens=[*PAIR_LENS, 40 * 32 + 5], seed=11)  # fmt: skip
    store_token_major(cp, case)
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_TQ_PAIRS8", "1", "0")


# --- NVFP4 at head_dims 256 / 32 on the warp-local cp.async loop (KVKIT_DECODE_CP_ON_BULK) ----
# 1 (the default at head_dims 256, 96 and 32 on sm_90 / sm_100) runs NVFP4's launches there on
# sm_90+ (no copy-engine tiles at those head dims) through the warp-local cp.async loop with
# its page windows and, up to 4 query rows, its tile pairs; 0 the CTA-barrier loop: float32
# reassociation apart. On targets without bulk copies both values build the same code. (Head
# dim 96: test_nv96_* under the device script's environments.)
@pytest.mark.parametrize("head_dim", [256, 32])
@pytest.mark.parametrize("group, q_len", [(4, 1), (2, 2), (8, 1), (1, 1)])
@pytest.mark.parametrize("block_size, window", [(16, None), (64, 70), (128, None)])
def test_nvfp4_cp_on_bulk_matches_the_barrier_loop(cp, head_dim, group, q_len, block_size,
                                                   window, monkeypatch):  # fmt: skip
    """KVKIT_DECODE_CP_ON_BULK=1 against 0 at head_dim 256 and 32: the tile-pair tests'
    lengths, 70 tiles in one split (page-window refills, an odd last tile), pages below, at and
    above the tile, a window, causal q_len > 1; 1 and 3 splits."""
    case = Case("nvfp4", head_dim=head_dim, hkv=2, group=group, q_len=q_len,
                block_size=block_size, seq_lens=[*PAIR_LENS, 70 * 64 - 27], window=window,
                seed=block_size + 3 * group + q_len + head_dim)  # fmt: skip
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_CP_ON_BULK", "1", "0", exact="none")


@pytest.mark.parametrize("head_dim", [256, 32])
@pytest.mark.parametrize("block_size", [16, 128])
def test_nvfp4_cp_on_bulk_flags_bad_pages_as_before(cp, head_dim, block_size, monkeypatch):
    """Bad block-table entries (assert_bad_pages_agree at head_dim 256 and 32) under
    KVKIT_DECODE_CP_ON_BULK=1 and 0: the same flag, outputs within float32 reassociation."""
    assert_bad_pages_agree("nvfp4", block_size, block_size + 17, monkeypatch,
                           "KVKIT_DECODE_CP_ON_BULK", head_dim=head_dim)  # fmt: skip


def test_nvfp4_256_cp_on_bulk_token_major_planes(cp, monkeypatch):
    """Token-major (strided) planes at head_dim 256 under 1 and 0: the single-tile loop of
    either build, the same flags, within float32 reassociation (the H200 showed 1-ulp
    differences in o, lse equal: the two builds' single-tile loops are not the same code)."""
    case = Case("nvfp4", head_dim=256, hkv=2, group=4, q_len=1, block_size=32,
                seq_lens=[*PAIR_LENS, 40 * 32 + 5], seed=19)  # fmt: skip
    store_token_major(cp, case)
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_CP_ON_BULK", "1", "0", exact="none")


# --- NVFP4 at head_dim 96 with register runs (KVKIT_DECODE_NV96, decode_nvfp4.cu) -----------
# 1 (the default) gives head_dim 96 the register keys and values of the other tensor-core head
# dims, with the mma's K and M permuted (runs of whole blocks and half blocks; the query rows
# and the output dims follow), and with them the packed mma columns and, on sm_90 / sm_100, the
# warp-local cp.async loop and its tile pairs; 0 is the build before (per-k-step key bytes,
# values through the shared V tile, the CTA-barrier loop). Another mma order: within float32
# reassociation of each other and DECODE_GPU_RTOL of float64. An environment's explicit
# KVKIT_DECODE_CP_ON_BULK / KVKIT_DECODE_NV_PACK applies to both sides.
# KVKIT_DECODE_NV96_PAIRS8 (1, the default): those runs' cp.async tile pairs up to 8 query rows
# against the single-tile loop at 5-8 rows (0); the same tolerances.
NV96_CASES = [
    ("KVKIT_DECODE_NV96", name, *rows)
    for name in ("nvfp4", "nvfp4_4over6")
    for rows in ((4, 1), (2, 2), (8, 1), (1, 1), (16, 1), (4, 4))
] + [("KVKIT_DECODE_NV96_PAIRS8", "nvfp4", *rows) for rows in ((8, 1), (4, 2), (2, 4), (6, 1))]
_NV96_SEEDS = {"KVKIT_DECODE_NV96": 96, "KVKIT_DECODE_NV96_PAIRS8": 968}


@pytest.mark.parametrize("var, name, group, q_len", NV96_CASES)
@pytest.mark.parametrize("block_size, window", [(16, None), (64, 70), (128, None)])
def test_nv96_switches_match_the_builds_before(cp, var, name, group, q_len, block_size, window,
                                               monkeypatch):  # fmt: skip
    """KVKIT_DECODE_NV96 / _PAIRS8 = 1 against 0 at head_dim 96: the tile-pair tests' lengths,
    70 tiles in one split, pages below, at and above the tile, a window, causal q_len > 1, one
    and two row tiles; 1 and 3 splits."""
    case = Case(name, head_dim=96, hkv=2, group=group, q_len=q_len, block_size=block_size,
                seq_lens=[*PAIR_LENS, 70 * 64 - 27], window=window,
                seed=block_size + 3 * group + q_len + _NV96_SEEDS[var])  # fmt: skip
    assert_builds_agree(case, monkeypatch, var, "1", "0", exact="none")


@pytest.mark.parametrize("var, group, seed", [("KVKIT_DECODE_NV96", 4, 29),
                                              ("KVKIT_DECODE_NV96_PAIRS8", 8, 31)])  # fmt: skip
@pytest.mark.parametrize("block_size", [16, 128])
def test_nv96_switches_flag_bad_pages_as_before(cp, var, group, seed, block_size, monkeypatch):
    """Bad block-table entries (assert_bad_pages_agree at head_dim 96; G = 8 for the pairs at
    5-8 rows) under each switch at 1 and 0: the same flag, outputs within float32
    reassociation."""
    assert_bad_pages_agree("nvfp4", block_size, block_size + seed, monkeypatch, var,
                           group=group, head_dim=96)  # fmt: skip


def test_nv96_token_major_planes(cp, monkeypatch):
    """Token-major (strided) planes at head_dim 96 under 1 and 0, with sinks, a soft-cap and
    float16 queries: within float32 reassociation, each within DECODE_GPU_RTOL of float64."""
    case = Case("nvfp4", head_dim=96, hkv=2, group=4, q_len=1, block_size=32,
                seq_lens=[*PAIR_LENS, 40 * 32 + 5], seed=37, sinks=True, softcap=30.0,
                q_dtype="float16")  # fmt: skip
    store_token_major(cp, case)
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_NV96", "1", "0", exact="none")


# --- tile pairs up to 16 rows (KVKIT_DECODE_PAIRS16, decode_core.cuh; default 1) --------------
# Two row tiles in the pair loop, at the two CTAs per SM of their single-tile build: against the
# single-tile loop (0, the build before) within float32 reassociation, each within
# DECODE_GPU_RTOL of float64.
PAIRS16_CASES = [("nvfp4", 128, 16, 1), ("nvfp4", 128, 4, 4), ("nvfp4", 64, 16, 1),
                 ("turboquant_4bit_nc", 128, 16, 1), ("turboquant_4bit_nc", 128, 12, 1),
                 ("turboquant_3bit_nc", 128, 8, 2), ("turboquant_k3v4_nc", 128, 16, 1),
                 ("turboquant_4bit_nc", 64, 16, 1)]  # fmt: skip


@pytest.mark.parametrize("name, head_dim, group, q_len", PAIRS16_CASES)
@pytest.mark.parametrize("block_size, window", [(16, None), (64, 70), (128, None)])
def test_pairs16_match_the_single_tile_build(cp, name, head_dim, group, q_len, block_size,
                                             window, monkeypatch):  # fmt: skip
    """KVKIT_DECODE_PAIRS16=1 against 0 at 9-16 query rows: the tile-pair tests' lengths, 70
    tiles in one split (page-window refills, an odd last tile), pages below, at and above the
    tile, a window, causal q_len > 1; 1 and 3 splits."""
    case = Case(name, head_dim=head_dim, hkv=2, group=group, q_len=q_len, block_size=block_size,
                seq_lens=[*PAIR_LENS, 70 * 64 - 27], window=window,
                seed=block_size + 3 * group + q_len + head_dim)  # fmt: skip
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_PAIRS16", "1", "0", exact="none")


@pytest.mark.parametrize("name", ["nvfp4", "turboquant_4bit_nc", "turboquant_3bit_nc"])
@pytest.mark.parametrize("block_size", [16, 128])
def test_pairs16_flag_bad_pages_as_before(cp, name, block_size, monkeypatch):
    """Bad block-table entries (assert_bad_pages_agree at G = 16) under KVKIT_DECODE_PAIRS16=1
    and 0: the same flag, outputs within float32 reassociation."""
    assert_bad_pages_agree(name, block_size, block_size + 13, monkeypatch,
                           "KVKIT_DECODE_PAIRS16", group=16)  # fmt: skip


# --- the pair loop's issue and mask trims (KVKIT_DECODE_NV_ISSUE, decode_core.cuh KVD_PAIR_TRIMS)
# On top of pair addresses (pinned on): tile ia + 1's rows from tile ia's stage address,
# issue_pair's common pair (both pages good, pages of <= 64 tokens) behind one test with t16
# and the stages' address held, the pair's two tiles fully visible tested once (the per-tile
# mask blocks behind it). The same loads, copies and float operations: the same bits as 0.
# Under KVKIT_ARCH=sm_80 / sm_89 (no pair loop) both values build the same code.


@pytest.mark.parametrize("name", PAIR_ADDR_NAMES)
@pytest.mark.parametrize("group, q_len", [(1, 1), (4, 1), (8, 1), (4, 2), (2, 4)])
@pytest.mark.parametrize("block_size", [16, 64, 128])
@pytest.mark.parametrize("window", [None, 70])
def test_nv_issue_matches_the_build_before(cp, name, group, q_len, block_size, window,
                                           monkeypatch):  # fmt: skip
    """KVKIT_DECODE_NV_ISSUE=1 against 0, bit for bit, on test_pair_addr_matches_the_build_
    before's cases: ragged ends (pairs whose second tile, or one warp's page, is missing: the
    general issue path), pages of 128 tokens (the general path every pair), a window and
    causal q_len > 1 (pairs not fully visible: the per-tile masks), 1 and 3 splits."""
    monkeypatch.setenv("KVKIT_DECODE_PAIR_ADDR", "1")
    case = Case(name, head_dim=128, hkv=2, group=group, q_len=q_len, block_size=block_size,
                seq_lens=[*PAIR_LENS, 5 * block_size + 9, 20 * 64 + 37], window=window,
                seed=block_size + 3 * group + q_len + 2)  # fmt: skip
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_NV_ISSUE", "1", "0")


@pytest.mark.parametrize("name", PAIR_ADDR_NAMES)
@pytest.mark.parametrize("group, q_len, window", [(4, 1, None), (4, 2, 90), (8, 1, 5)])
def test_nv_issue_at_head_dim_64(cp, name, group, q_len, window, monkeypatch):
    """The same at head_dim 64 (another stage size: the second tile's row immediates)."""
    monkeypatch.setenv("KVKIT_DECODE_PAIR_ADDR", "1")
    case = Case(name, head_dim=64, hkv=2, group=group, q_len=q_len, block_size=16,
                seq_lens=[*PAIR_LENS, 70 * 64 - 27], window=window, seed=10 + group)  # fmt: skip
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_NV_ISSUE", "1", "0")


@pytest.mark.parametrize("block_size", [16, 64, 128])
@pytest.mark.parametrize("window", [None, 2500])
def test_nv_issue_refills_the_page_windows(cp, block_size, window, monkeypatch):
    """Splits of 70 and 33 tiles (page-window refills between pairs, an odd last tile; the
    window start mid-split: pairs before it masked, after it fully visible), bit for bit
    against 0."""
    monkeypatch.setenv("KVKIT_DECODE_PAIR_ADDR", "1")
    case = Case("nvfp4", head_dim=128, hkv=1, group=4, q_len=1, block_size=block_size,
                seq_lens=[70 * 64 - 27, 33 * 64 + 16, 300], window=window,
                seed=block_size + 6)  # fmt: skip
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_NV_ISSUE", "1", "0")


@pytest.mark.parametrize("block_size", [16, 64, 128])
def test_nv_issue_flags_bad_pages_as_before(cp, block_size, monkeypatch):
    """Bad block-table entries (assert_bad_pages_agree: a pair with one bad page takes the
    general issue path and its tile's masks) under KVKIT_DECODE_NV_ISSUE=1 and 0: the same
    flag, the same outputs bit for bit."""
    assert_bad_pages_agree("nvfp4", block_size, block_size + 2, monkeypatch,
                           "KVKIT_DECODE_NV_ISSUE")  # fmt: skip


@pytest.mark.parametrize("name", PAIR_ADDR_NAMES)
@pytest.mark.parametrize("group, q_len", [(4, 1), (2, 4)])
def test_nv_issue_matches_float64_at_every_split_count(cp, name, group, q_len, monkeypatch):
    """Under KVKIT_DECODE_NV_ISSUE=1, every split count within DECODE_GPU_RTOL of float64 and
    within SPLIT_INVARIANCE_RTOL of each other, with sinks and a soft-cap."""
    monkeypatch.setenv("KVKIT_DECODE_PAIR_ADDR", "1")
    monkeypatch.setenv("KVKIT_DECODE_NV_ISSUE", "1")
    monkeypatch.setenv("KVKIT_DECODE_TILE_PAIRS", "1")  # (short splits too, split_builds.py)
    case = Case(name, head_dim=128, hkv=2, group=group, q_len=q_len, block_size=64,
                seq_lens=[*PAIR_LENS, 40 * 64 + 3], sinks=True, softcap=30.0,
                seed=14 + group)  # fmt: skip
    check_against_reference(case)


# --- the same trims in TurboQuant's pair loop (KVKIT_DECODE_TQ_ISSUE, KVD_PAIR_TRIMS) ---------
# The codebook presets with pair addresses (pinned on; 3bit_nc at head_dim 256 defaults them
# off): the NVFP4 trims above (one stage address per pair, the value scale and zero's rows
# too; the common pair's issue behind one test; full2 before the softmax masks, the only
# per-tile mask block of value codes). The same loads, copies and float operations: the same
# bits as 0. Under KVKIT_ARCH=sm_80 / sm_89 (no pair loop) both values build the same code.


@pytest.mark.parametrize("name", TQ_PAIR_ADDR_NAMES)
@pytest.mark.parametrize("group, q_len", [(1, 1), (4, 1), (1, 4)])
@pytest.mark.parametrize("block_size", [16, 128])
@pytest.mark.parametrize("window", [None, 70])
def test_tq_issue_matches_the_build_before(cp, name, group, q_len, block_size, window,
                                           monkeypatch):  # fmt: skip
    """KVKIT_DECODE_TQ_ISSUE=1 against 0 at head_dim 128, bit for bit: ragged ends (a pair's
    missing second tile or one warp's page: the general issue path), pages of 128 tokens (the
    general path every pair), a window and causal q_len 4 (pairs not fully visible: the
    per-tile masks), 1 and 3 splits; within DECODE_GPU_RTOL of float64."""
    monkeypatch.setenv("KVKIT_DECODE_PAIR_ADDR", "1")
    case = Case(name, head_dim=128, hkv=2, group=group, q_len=q_len, block_size=block_size,
                seq_lens=[*PAIR_LENS, 5 * block_size + 9, 20 * 64 + 37], window=window,
                seed=block_size + 3 * group + q_len + 4)  # fmt: skip
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_TQ_ISSUE", "1", "0")


@pytest.mark.parametrize("name", TQ_PAIR_ADDR_NAMES)
@pytest.mark.parametrize("head_dim, group, q_len, window",
                         [(64, 4, 1, None), (64, 8, 1, 5), (256, 4, 1, None),
                          (256, 2, 2, 70)])  # fmt: skip
def test_tq_issue_at_head_dims_64_and_256(cp, name, head_dim, group, q_len, window,
                                          monkeypatch):  # fmt: skip
    """The same at head_dim 64 (8 rows; other stage sizes: the second tile's row immediates)
    and 256 (the pair loop's kv_pair_scores; 3bit_nc with pair addresses pinned on)."""
    monkeypatch.setenv("KVKIT_DECODE_PAIR_ADDR", "1")
    case = Case(name, head_dim=head_dim, hkv=2, group=group, q_len=q_len, block_size=16,
                seq_lens=[*PAIR_LENS, 70 * 64 - 27], window=window,
                seed=head_dim + group + q_len + 1)  # fmt: skip
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_TQ_ISSUE", "1", "0")


# TurboQuant's pair-loop switches of the same bits (KVKIT_DECODE_TQ_ISSUE, KVKIT_DECODE_TQ17,
# further below): the presets each covers and a seed offset per switch.
TQ_PAIR_SWITCH_CASES = [("KVKIT_DECODE_TQ_ISSUE", "turboquant_4bit_nc", 8),
                        ("KVKIT_DECODE_TQ_ISSUE", "turboquant_3bit_nc", 8),
                        ("KVKIT_DECODE_TQ17", "turboquant_4bit_nc", 12),
                        ("KVKIT_DECODE_TQ17", "turboquant_k3v4_nc", 12)]  # fmt: skip


@pytest.mark.parametrize("switch, name, seed", TQ_PAIR_SWITCH_CASES)
@pytest.mark.parametrize("block_size", [16, 128])
def test_tq_pair_switches_refill_the_page_windows(cp, switch, name, seed, block_size,
                                                  monkeypatch):  # fmt: skip
    """Splits of 70 and 33 tiles (page-window refills between pairs, an odd last tile), with
    and without a window starting mid-split, ``switch``=1 bit for bit against 0."""
    monkeypatch.setenv("KVKIT_DECODE_PAIR_ADDR", "1")
    for window in (None, 2500):
        case = Case(name, head_dim=128, hkv=1, group=4, q_len=1, block_size=block_size,
                    seq_lens=[70 * 64 - 27, 33 * 64 + 16, 300], window=window,
                    seed=block_size + seed)  # fmt: skip
        assert_builds_agree(case, monkeypatch, switch, "1", "0")


@pytest.mark.parametrize("switch, seed", [("KVKIT_DECODE_TQ_ISSUE", 5), ("KVKIT_DECODE_TQ17", 7)])
@pytest.mark.parametrize("name", TQ_PAIR_ADDR_NAMES)
@pytest.mark.parametrize("block_size", [16, 128])
def test_tq_pair_switches_flag_bad_pages_as_before(cp, switch, seed, name, block_size,
                                                   monkeypatch):  # fmt: skip
    """TurboQuant with bad block-table entries (assert_bad_pages_agree: a pair with one bad
    page takes the general issue path and its tile's masks) under ``switch``=1 and 0: the same
    flag, the same outputs bit for bit."""
    assert_bad_pages_agree(name, block_size, block_size + seed, monkeypatch, switch)


# Each pair-loop switch at 1 against float64 (KVKIT_DECODE_PAIR_ADDR; KVKIT_DECODE_TQ_ISSUE and
# KVKIT_DECODE_TQ17, further below, on top of pair addresses): (switch, seed base, shapes).
TQ_PAIR_FLOAT64_SHAPES = [(128, 4, 1), (64, 8, 1), (256, 2, 2)]
TQ_PAIR_FLOAT64_CASES = [
    (switch, seed, *shape)
    for switch, seed, extra in (("KVKIT_DECODE_PAIR_ADDR", 17, []),
                                ("KVKIT_DECODE_TQ_ISSUE", 19, []),
                                ("KVKIT_DECODE_TQ17", 37, [(128, 8, 1)]))
    for shape in TQ_PAIR_FLOAT64_SHAPES + extra
]  # fmt: skip


@pytest.mark.parametrize("name", TQ_PAIR_ADDR_NAMES)
@pytest.mark.parametrize("switch, seed, head_dim, group, q_len", TQ_PAIR_FLOAT64_CASES)
def test_tq_pair_switches_match_float64_at_every_split_count(
    cp, name, switch, seed, head_dim, group, q_len, monkeypatch
):
    """TurboQuant with pair addresses and ``switch``=1, tile pairs pinned on: every split count
    within DECODE_GPU_RTOL of float64 and within SPLIT_INVARIANCE_RTOL of each other, with sinks
    and a soft-cap."""
    monkeypatch.setenv("KVKIT_DECODE_PAIR_ADDR", "1")
    monkeypatch.setenv(switch, "1")
    monkeypatch.setenv("KVKIT_DECODE_TILE_PAIRS", "1")  # (short splits too, split_builds.py)
    case = Case(name, head_dim=head_dim, hkv=2, group=group, q_len=q_len, block_size=64,
                seq_lens=[*PAIR_LENS, 40 * 64 + 3], sinks=True, softcap=30.0,
                seed=seed + group + head_dim)  # fmt: skip
    check_against_reference(case)


# --- NVFP4's packed mma columns and unguarded softmax (KVKIT_DECODE_NV_PACK, decode_nvfp4.cu) -
# 1: at G * q_len <= 4 the mmas' padding columns 4..7 carry the query rows again (float32
# queries: their lo part, one shuffle) and P's fp16 lo part (one PV mma per m-tile and tile;
# the lo sums joined after the loop): float32 rounding only, so compared within float32
# reassociation and to float64; above 4 rows only the softmax changes: bit for bit. 2: the
# softmax only (the running max from -FLT_MAX, no empty-row guard): bit for bit. Both loops
# (pairs and the single-tile one: odd last tiles, KVKIT_DECODE_TILE_PAIRS=0, sm_80 / sm_89).


@pytest.mark.parametrize("name", PAIR_ADDR_NAMES)
@pytest.mark.parametrize("group, q_len", [(1, 1), (4, 1), (2, 2), (8, 1)])
@pytest.mark.parametrize("block_size", [16, 128])
@pytest.mark.parametrize("window", [None, 70])
def test_nv_pack_matches_the_build_before(cp, name, group, q_len, block_size, window,
                                          monkeypatch):  # fmt: skip
    """KVKIT_DECODE_NV_PACK=1 against 0 on ragged ends, pages of 16 and 128 tokens, a window
    and causal q_len 2, 1 and 3 splits: within float32 reassociation at <= 4 query rows,
    bit for bit at 8 (no packed columns there), and within DECODE_GPU_RTOL of float64."""
    case = Case(name, head_dim=128, hkv=2, group=group, q_len=q_len, block_size=block_size,
                seq_lens=[*PAIR_LENS, 5 * block_size + 9, 20 * 64 + 37], window=window,
                seed=block_size + 3 * group + q_len + 5)  # fmt: skip
    exact = "all" if group * q_len > 4 else "none"
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_NV_PACK", "1", "0", exact=exact)


@pytest.mark.parametrize("group, q_len", [(4, 1), (2, 4)])
@pytest.mark.parametrize("block_size", [16, 64])
@pytest.mark.parametrize("window", [None, 70])
def test_nv_pack_softmax_only_matches_the_build_before(cp, group, q_len, block_size, window,
                                                       monkeypatch):  # fmt: skip
    """KVKIT_DECODE_NV_PACK=2 (the unguarded softmax alone) against 0: bit for bit (rows
    masked so far under the window and the causal offsets keep the empty state)."""
    case = Case("nvfp4", head_dim=128, hkv=2, group=group, q_len=q_len, block_size=block_size,
                seq_lens=[*PAIR_LENS, 20 * 64 + 37], window=window,
                seed=block_size + group + 7)  # fmt: skip
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_NV_PACK", "2", "0")


@pytest.mark.parametrize("name", PAIR_ADDR_NAMES)
@pytest.mark.parametrize("group, q_len, window, q_dtype", [
    (4, 1, None, "float16"), (1, 1, 5, "float32"), (2, 2, 90, "bfloat16"),
])  # fmt: skip
def test_nv_pack_at_head_dim_64(cp, name, group, q_len, window, q_dtype, monkeypatch):
    """The same at head_dim 64, with fp16 queries (no query lo part: columns 4..7 the hi part
    again), float32 and bf16 ones, and a 5-token window (splits with no visible token: the
    empty state leaves with m = -inf)."""
    case = Case(name, head_dim=64, hkv=2, group=group, q_len=q_len, block_size=16,
                seq_lens=[*PAIR_LENS, 70 * 64 - 27], window=window, seed=12 + group,
                q_dtype=q_dtype)  # fmt: skip
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_NV_PACK", "1", "0", exact="none")


@pytest.mark.parametrize("block_size", [16, 128])
@pytest.mark.parametrize("window", [None, 2500])
def test_nv_pack_refills_the_page_windows(cp, block_size, window, monkeypatch):
    """Splits of 70 and 33 tiles (page-window refills, an odd last tile in the single-tile
    loop; the window start mid-split), fp16 queries (the benchmark's), against 0."""
    case = Case("nvfp4", head_dim=128, hkv=1, group=4, q_len=1, block_size=block_size,
                seq_lens=[70 * 64 - 27, 33 * 64 + 16, 300], window=window,
                seed=block_size + 8, q_dtype="float16")  # fmt: skip
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_NV_PACK", "1", "0", exact="none")


@pytest.mark.parametrize("block_size", [16, 64, 128])
def test_nv_pack_flags_bad_pages_as_before(cp, block_size, monkeypatch):
    """Bad block-table entries under KVKIT_DECODE_NV_PACK=1 and 0: the same flag, outputs
    within float32 reassociation."""
    assert_bad_pages_agree("nvfp4", block_size, block_size + 4, monkeypatch,
                           "KVKIT_DECODE_NV_PACK")  # fmt: skip


@pytest.mark.parametrize("name", PAIR_ADDR_NAMES)
@pytest.mark.parametrize("head_dim, group, q_len", [(128, 4, 1), (128, 1, 4), (64, 4, 1)])
@pytest.mark.parametrize("pairs", ["0", "1"])
def test_nv_pack_matches_float64_at_every_split_count(cp, name, head_dim, group, q_len, pairs,
                                                      monkeypatch):  # fmt: skip
    """Under KVKIT_DECODE_NV_PACK=1, with tile pairs and single-tile loops, every split count
    within DECODE_GPU_RTOL of float64 and within SPLIT_INVARIANCE_RTOL of each other, with
    sinks and a soft-cap (fp16 queries)."""
    monkeypatch.setenv("KVKIT_DECODE_NV_PACK", "1")
    monkeypatch.setenv("KVKIT_DECODE_TILE_PAIRS", pairs)
    case = Case(name, head_dim=head_dim, hkv=2, group=group, q_len=q_len, block_size=64,
                seq_lens=[*PAIR_LENS, 40 * 64 + 3], sinks=True, softcap=30.0,
                seed=23 + group + head_dim, q_dtype="float16")  # fmt: skip
    check_against_reference(case)


# --- tile pairs (KVKIT_DECODE_TILE_PAIRS, decode_mma_pairs.cuh) ------------------------------
# The warp pipes' slab launches (sm_90+ but sm_120, G * q_len <= 8, head_dim <= 128) take two
# tiles per loop iteration: one softmax step per 32 tokens of a warp and one fresh PV
# accumulator per m-tile for both tiles, so the float32 operations come in another order and
# the builds agree within float32 reassociation (SPLIT_INVARIANCE_RTOL), not bit for bit; each
# is within DECODE_GPU_RTOL of float64. On GPUs without bulk copies (and through
# KVKIT_ARCH=sm_80 / sm_89) both values build the same code.
PAIR_NAMES = ["nvfp4", "turboquant_4bit_nc", "turboquant_3bit_nc"]
# Per split: 37 (one partial tile), 64 (one tile), 3 tiles (odd, the last one partial), 4 tiles
# (even), 6 tiles ragged (5 bs + 9 at bs 64), 300 (5 tiles, partial), 130 (3 tiles, partial).
PAIR_LENS = [37, 64, 2 * 64 + 9, 4 * 64, 300, 130]


@pytest.mark.parametrize("name", PAIR_NAMES)
@pytest.mark.parametrize("group, q_len", [(1, 1), (4, 1), (8, 1), (4, 2), (2, 4)])
@pytest.mark.parametrize("block_size", [16, 64, 128])
@pytest.mark.parametrize("window", [None, 70])
def test_tile_pairs_match_the_single_tile_build(cp, name, group, q_len, block_size, window,
                                                monkeypatch):  # fmt: skip
    """KVKIT_DECODE_TILE_PAIRS=1 against 0: odd and even tile counts per split (1 and 3
    splits), a single (partial or full) tile, ragged ends (warps of the last tile without a
    page), pages below, at and above the 64-token tile, a window, causal q_len > 1 (the masks
    per tile of a pair), 1-8 query rows (TurboQuant's 5-8 at three CTAs per SM:
    KVKIT_DECODE_TQ_PAIRS8), and 21 tiles (odd, the last partial: ten pairs and the
    single-tile tail) in one split."""
    case = Case(name, head_dim=128, hkv=2, group=group, q_len=q_len, block_size=block_size,
                seq_lens=[*PAIR_LENS, 5 * block_size + 9, 20 * 64 + 37], window=window,
                seed=block_size + 3 * group + q_len)  # fmt: skip
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_TILE_PAIRS", "1", "0", exact="none")


@pytest.mark.parametrize("name", ["nvfp4", "turboquant_4bit_nc"])
@pytest.mark.parametrize("group, q_len, window", [(4, 1, None), (4, 2, 90), (8, 1, 5)])
def test_tile_pairs_at_head_dim_64(cp, name, group, q_len, window, monkeypatch):
    """The same at head_dim 64 (NVFP4 and TurboQuant warp slabs there too)."""
    case = Case(name, head_dim=64, hkv=2, group=group, q_len=q_len, block_size=16,
                seq_lens=[*PAIR_LENS, 70 * 64 - 27], window=window, seed=7 + group)  # fmt: skip
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_TILE_PAIRS", "1", "0", exact="none")


@pytest.mark.parametrize("name", PAIR_NAMES)
@pytest.mark.parametrize("group", [4, 8])
@pytest.mark.parametrize("block_size", [16, 64, 128])
@pytest.mark.parametrize("window", [None, 2500])
def test_tile_pairs_refill_their_page_windows(cp, name, group, block_size, window,
                                              monkeypatch):  # fmt: skip
    """Splits of more than 32 tiles (70: even, 33: odd, the last tile single) refill the warp
    pipes' 32-tile page windows between pairs (decode_mma_pairs.cuh: STAGES even, so a pair's
    two issues never straddle a window); a window start moves the first tile off token 0.
    No flag; within float32 reassociation of the single-tile build and of float64."""
    case = Case(name, head_dim=128, hkv=1, group=group, q_len=1, block_size=block_size,
                seq_lens=[70 * 64 - 27, 33 * 64 + 16, 300], window=window,
                seed=block_size + group)  # fmt: skip
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_TILE_PAIRS", "1", "0", exact="none")


@pytest.mark.parametrize("name", PAIR_NAMES)
@pytest.mark.parametrize("block_size", [16, 64, 128])
def test_tile_pairs_flag_bad_pages_as_before(cp, name, block_size, monkeypatch):
    """Bad block-table entries (assert_bad_pages_agree) under KVKIT_DECODE_TILE_PAIRS=1 and 0:
    the same flag at 1, 3 and MAX_SPLITS splits, the outputs within float32 reassociation."""
    assert_bad_pages_agree(name, block_size, block_size, monkeypatch, "KVKIT_DECODE_TILE_PAIRS")


@pytest.mark.parametrize("name", PAIR_NAMES)
@pytest.mark.parametrize("group, q_len", [(4, 1), (2, 4)])
def test_tile_pairs_match_float64_at_every_split_count(cp, name, group, q_len, monkeypatch):
    """Under KVKIT_DECODE_TILE_PAIRS=1, every split count (1, 3, MAX_SPLITS, the heuristic)
    within DECODE_GPU_RTOL of float64 and within SPLIT_INVARIANCE_RTOL of each other, with
    sinks and a soft-cap (the pair's logits path)."""
    monkeypatch.setenv("KVKIT_DECODE_TILE_PAIRS", "1")
    case = Case(name, head_dim=128, hkv=2, group=group, q_len=q_len, block_size=64,
                seq_lens=[*PAIR_LENS, 40 * 64 + 3], sinks=True, softcap=30.0,
                seed=11 + group)  # fmt: skip
    check_against_reference(case)


# Which build the launcher picks by split length (kvkit/cuda/split_builds.py): the environment
# switch, its value under the rule, and the default build's value.
_SPLIT_LENGTH_SWITCH = {
    "nvfp4": ("KVKIT_DECODE_TILE_PAIRS", "0", "1"),
    "turboquant_k8v4": ("KVKIT_DECODE_TQ_SLABS", "1", "0"),
}


@pytest.mark.parametrize("name", sorted(_SPLIT_LENGTH_SWITCH))
def test_the_launcher_picks_the_build_by_split_length(cp, name, monkeypatch):
    """Sequence 0 spans 281 pages of 16 tokens (71 tiles in 1 split). At three split counts,
    one split, the most splits whose longest split reaches NVFP4's pair threshold and the
    fewest below it: NVFP4 launches its single-tile build below the threshold and k8v4 its
    warp-slab build from K8V4_SLABS_MIN_TILES (where the default build's loop flags allow:
    sm_90 / sm_100). The kernel launched is that build's, and its results equal the build
    the environment switch forces, bit for bit, and float64 within DECODE_GPU_RTOL."""
    from kvkit.cuda import decode as cuda_decode
    from kvkit.cuda import split_builds as sb

    var, picked, default_value = _SPLIT_LENGTH_SWITCH[name]
    monkeypatch.delenv(var, raising=False)
    case = Case(name, head_dim=128, hkv=2, group=4, q_len=1, block_size=16,
                seq_lens=[70 * 64 - 5, 300, 37], seed=5)  # fmt: skip
    fmt = case.gpu.fmt
    entry, kname, _ = cuda_decode._STAGE1[fmt.family]
    in_define, _ = cuda_decode._Q_DTYPES[case.q_dtype]
    # (The case has no soft-cap: the launcher runs the builds without its tanh.)
    _, _, _, tile, loop = cuda_decode._stage1_for(fmt, entry, kname, in_define, 4, 1,
                                                  softcap=False)  # fmt: skip
    max_tokens = case.block_tables.shape[1] * 16

    def tiles(num_splits):
        return sb.split_tiles(max_tokens, 16, num_splits, tile)

    # NVFP4's packed builds (G = 4 from head_dim 128) have their own threshold.
    least = sb.NVFP4_PACKED_PAIRS_MIN_TILES if loop & sb.LOOP_PACKED else sb.NVFP4_PAIRS_MIN_TILES
    short = min(s for s in range(1, 300) if tiles(s) < least)
    assert tiles(1) >= sb.K8V4_SLABS_MIN_TILES and tiles(short - 1) >= least
    ref_o, ref_lse = case.reference()
    fired = []
    for num_splits in (1, short - 1, short):
        auto = sb.split_length_switches(fmt, loop, tiles(num_splits))
        assert auto in ((), ((var, picked),))
        fired.append(bool(auto))
        want = cuda_decode._stage1_for(fmt, entry, kname, in_define, 4, 1, auto, False)[0]
        record = []
        o, lse = case.run(num_splits, record=record)
        assert record[0][0] is want and case.flag() == 0, num_splits
        monkeypatch.setenv(var, picked if auto else default_value)
        o_env, lse_env = case.run(num_splits)
        monkeypatch.delenv(var)
        np.testing.assert_array_equal(o, o_env)
        np.testing.assert_array_equal(lse, lse_env)
        assert rel_error(o, ref_o) <= DECODE_GPU_RTOL
        assert lse_error(lse, ref_lse) <= DECODE_GPU_RTOL
    if name == "nvfp4" and loop & sb.LOOP_TILE_PAIRS:
        assert fired == [False, False, True]
    if name == "turboquant_k8v4" and loop & sb.LOOP_BULK_COPY:
        assert fired == [True, False, False]


@pytest.mark.parametrize("name, head_dim, group, q_len, pages", [
    (name, *shape) for name in ("nvfp4", "turboquant_4bit_nc")
    for shape in ((128, 4, 1, "nhd32"), (128, 16, 1, "hnd16"), (128, 8, 2, "hnd64"))
] + [("nvfp4", 256, 4, 1, "hnd16"),
     ("turboquant_4bit_nc", 256, 8, 1, "hnd16"),
     ("turboquant_4bit_nc", 128, 8, 1, "hnd16"),
     ("turboquant_3bit_nc", 128, 2, 4, "hnd64")])  # fmt: skip
def test_tile_pairs_leave_other_launches_alone(cp, name, head_dim, group, q_len, pages,
                                               monkeypatch):  # fmt: skip
    """Where pairs do not apply the arithmetic is the single-tile loop's, bit for bit:
    token-major pages (not slabs: the single-tile loop inside a pair build, with its 4
    stages), TurboQuant above 4 rows at head_dim 256; 16 query rows, TurboQuant's 5-8 at 128
    and NVFP4 at 256 in the builds before KVKIT_DECODE_PAIRS16, KVKIT_DECODE_TQ_PAIRS8 and
    KVKIT_DECODE_CP_ON_BULK (all 0, pinned here: no pair build there)."""
    monkeypatch.setenv("KVKIT_DECODE_TQ_PAIRS8", "0")
    monkeypatch.setenv("KVKIT_DECODE_PAIRS16", "0")
    monkeypatch.setenv("KVKIT_DECODE_CP_ON_BULK", "0")
    block_size = int(pages[3:])
    case = Case(name, head_dim=head_dim, hkv=2, group=group, q_len=q_len, block_size=block_size,
                seq_lens=[5 * block_size + 9, 300, 37, 4, 130], window=None,
                seed=block_size + group)  # fmt: skip
    if pages.startswith("nhd"):
        store_token_major(cp, case)
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_TILE_PAIRS", "1", "0")


# --- TurboQuant at head_dim 256: token order and tile pairs ----------------------------------
# KVKIT_DECODE_TQ_TOKEN_ORDER (the warp's 16 tokens in a bank-friendly order, decode_mma.cuh
# KV_MMA_TOKEN_PERM) and KVKIT_DECODE_TQ_PAIRS256 (the warp pipes' tile pairs at head_dim 256,
# G * q_len <= 4): 1 for the 3-bit-key presets, 2 for 4bit_nc too (decode_turboquant.cu). Either
# changes which lane sums which token (and pairs the softmax order), so the builds agree within
# float32 reassociation, each within DECODE_GPU_RTOL of float64. Pairs need sm_90 / sm_100
# warp pipes (through KVKIT_ARCH=sm_80 both values build the same code); the token order
# applies on every target.
TQ256_NAMES = ["turboquant_3bit_nc", "turboquant_k3v4_nc", "turboquant_4bit_nc"]
TQ256_SWITCHES = ["KVKIT_DECODE_TQ_TOKEN_ORDER", "KVKIT_DECODE_TQ_PAIRS256"]


@pytest.mark.parametrize("name", TQ256_NAMES)
@pytest.mark.parametrize("var", TQ256_SWITCHES)
@pytest.mark.parametrize("group, q_len, block_size, window", [
    (4, 1, 16, None), (4, 1, 64, 70), (1, 1, 128, None), (2, 2, 16, None), (2, 4, 64, 90),
    (8, 1, 16, None),
])  # fmt: skip
def test_turboquant_256_switches_match_the_build_before(cp, name, var, group, q_len, block_size,
                                                        window, monkeypatch):  # fmt: skip
    """Value 2 against 0 at head_dim 256: a single partial or full tile, odd and even tile
    counts, ragged ends, pages below, at and above the tile, a window, causal q_len > 1, 1-8
    query rows (pairs up to 4; the token order at every tensor-core shape), 1 and 3 splits."""
    case = Case(name, head_dim=256, hkv=2, group=group, q_len=q_len, block_size=block_size,
                seq_lens=[*PAIR_LENS, 5 * block_size + 9, 20 * 64 + 37], window=window,
                seed=block_size + 3 * group + q_len)  # fmt: skip
    assert_builds_agree(case, monkeypatch, var, "2", "0", exact="none")


@pytest.mark.parametrize("var", TQ256_SWITCHES)
def test_turboquant_256_switches_at_1_leave_4bit_nc_alone(cp, var, monkeypatch):
    """Value 1 is for the 3-bit-key presets only: turboquant_4bit_nc bit for bit as 0."""
    case = Case("turboquant_4bit_nc", head_dim=256, hkv=2, group=4, q_len=1, block_size=16,
                seq_lens=[*PAIR_LENS, 20 * 64 + 37], window=None, seed=5)  # fmt: skip
    assert_builds_agree(case, monkeypatch, var, "1", "0")


@pytest.mark.parametrize("name", TQ256_NAMES)
@pytest.mark.parametrize("block_size", [16, 64])
def test_turboquant_256_pairs_refill_their_page_windows(cp, name, block_size, monkeypatch):
    """Splits of more than 32 tiles (70 even, 33 odd) at head_dim 256 with pairs and the token
    order, against the build before: the 32-tile page windows refill between pairs."""
    monkeypatch.setenv("KVKIT_DECODE_TQ_TOKEN_ORDER", "2")
    case = Case(name, head_dim=256, hkv=1, group=4, q_len=1, block_size=block_size,
                seq_lens=[70 * 64 - 27, 33 * 64 + 16, 300], window=None,
                seed=block_size + 1)  # fmt: skip
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_TQ_PAIRS256", "2", "0", exact="none")


@pytest.mark.parametrize("name", TQ256_NAMES)
@pytest.mark.parametrize("group, q_len", [(4, 1), (2, 2), (8, 1)])
def test_turboquant_256_token_order_and_pairs_match_float64(cp, name, group, q_len,
                                                            monkeypatch):  # fmt: skip
    """Both switches at 2: every split count (1, 3, MAX_SPLITS, the heuristic) within
    DECODE_GPU_RTOL of float64 and SPLIT_INVARIANCE_RTOL of each other, with sinks and a
    soft-cap (the pair's logits path)."""
    monkeypatch.setenv("KVKIT_DECODE_TQ_TOKEN_ORDER", "2")
    monkeypatch.setenv("KVKIT_DECODE_TQ_PAIRS256", "2")
    case = Case(name, head_dim=256, hkv=2, group=group, q_len=q_len, block_size=64,
                seq_lens=[*PAIR_LENS, 40 * 64 + 3], sinks=True, softcap=30.0,
                seed=13 + group)  # fmt: skip
    check_against_reference(case)


# --- 3-bit values at head_dim 256 (KVKIT_DECODE_TQ3_256, decode_turboquant.cu KV_TQ_V_WINS) ---
# 1: the value codes cut from the packed words by the halves plan's byte windows (the same
# word loads, the same bf16 operands): bit for bit against 0, in the tile pairs (<= 4 query
# rows on sm_90 / sm_100) and the single-tile loop (8 rows, and every build through
# KVKIT_ARCH=sm_80). 2: that plus 3bit_nc's token order (KVKIT_DECODE_TQ_TOKEN_ORDER=1's) with
# the pair loop's lane offsets: which lane sums which token changes, so within float32
# reassociation. Only 3bit_nc has 3-bit values; k3v4_nc (4-bit values) builds the same code
# under every value. The order and pair-address switches are left unset (value 2 picks them).
TQ3_256_CASES = [
    # (group, q_len, block_size, window): pages below, at and above the 16-token tile, pairs
    # (<= 4 rows) and the single-tile loop (8 rows), causal q_len > 1, a window.
    (4, 1, 16, None), (4, 1, 64, 70), (4, 1, 128, None), (1, 1, 16, None), (1, 1, 128, 200),
    (2, 2, 64, None), (1, 4, 16, 90), (2, 4, 128, None), (8, 1, 16, None), (8, 1, 64, 70),
]  # fmt: skip


def _tq3_256_env(monkeypatch):
    for var in ("KVKIT_DECODE_TQ_TOKEN_ORDER", "KVKIT_DECODE_PAIR_ADDR"):
        monkeypatch.delenv(var, raising=False)


@pytest.mark.parametrize("value, exact", [("1", "all"), ("2", "none")])
@pytest.mark.parametrize("group, q_len, block_size, window", TQ3_256_CASES)
def test_tq3_256_matches_the_build_before(cp, value, exact, group, q_len, block_size, window,
                                          monkeypatch):  # fmt: skip
    """turboquant_3bit_nc at head_dim 256, KVKIT_DECODE_TQ3_256=1 (bit for bit) and 2 (float32
    reassociation) against 0: ragged lengths (partial and odd last tiles, warps without a page
    in the last tile), 1 and 3 splits; within DECODE_GPU_RTOL of float64."""
    _tq3_256_env(monkeypatch)
    case = Case("turboquant_3bit_nc", head_dim=256, hkv=2, group=group, q_len=q_len,
                block_size=block_size, seq_lens=[*PAIR_LENS, 5 * block_size + 9, 20 * 64 + 37],
                window=window, seed=block_size + 3 * group + q_len + 11)  # fmt: skip
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_TQ3_256", value, "0", exact=exact)


@pytest.mark.parametrize("value, exact", [("1", "all"), ("2", "none")])
@pytest.mark.parametrize("block_size", [16, 64])
def test_tq3_256_refills_the_page_windows(cp, value, exact, block_size, monkeypatch):
    """Splits of 70 (even) and 33 (odd) tiles at head_dim 256 (page-window refills between
    pairs), with and without a window, against 0."""
    _tq3_256_env(monkeypatch)
    for window in (None, 2500):
        case = Case("turboquant_3bit_nc", head_dim=256, hkv=1, group=4, q_len=1,
                    block_size=block_size, seq_lens=[70 * 64 - 27, 33 * 64 + 16, 300],
                    window=window, seed=block_size + 23)  # fmt: skip
        assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_TQ3_256", value, "0", exact=exact)


@pytest.mark.parametrize("value", ["1", "2"])
def test_tq3_256_leaves_k3v4_alone(cp, value, monkeypatch):
    """k3v4_nc (4-bit values) at head_dim 256: the same code under every value, bit for bit."""
    _tq3_256_env(monkeypatch)
    case = Case("turboquant_k3v4_nc", head_dim=256, hkv=2, group=4, q_len=1, block_size=16,
                seq_lens=[*PAIR_LENS, 20 * 64 + 37], window=None, seed=31)  # fmt: skip
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_TQ3_256", value, "0")


@pytest.mark.parametrize("value", ["1", "2"])
@pytest.mark.parametrize("group, q_len", [(4, 1), (2, 2), (8, 1)])
def test_tq3_256_matches_float64_at_every_split_count(cp, value, group, q_len, monkeypatch):
    """turboquant_3bit_nc at head_dim 256 under KVKIT_DECODE_TQ3_256=1 / 2: every split count
    (1, 3, MAX_SPLITS, the heuristic) within DECODE_GPU_RTOL of float64 and
    SPLIT_INVARIANCE_RTOL of each other, with sinks and a soft-cap."""
    _tq3_256_env(monkeypatch)
    monkeypatch.setenv("KVKIT_DECODE_TQ3_256", value)
    monkeypatch.setenv("KVKIT_DECODE_TILE_PAIRS", "1")
    case = Case("turboquant_3bit_nc", head_dim=256, hkv=2, group=group, q_len=q_len,
                block_size=64, seq_lens=[*PAIR_LENS, 40 * 64 + 3], sinks=True, softcap=30.0,
                seed=19 + group + int(value))  # fmt: skip
    check_against_reference(case)


# --- k3v4_nc at head_dim 256 and 64 (KVKIT_DECODE_K3V4, decode_turboquant.cu KV_TQ_KSPLIT) ---
# 1: at 256 each lane's 3-bit key codes as two interleaved 12-byte chunks (the query's dims
# permuted to match, kv_mma_kdim) with 4bit_nc's token order, at 64 a token order of its own;
# 2: the chunks alone (64 as 0). Both sum the same products in another order (the score mma's
# k order; which lane sums which token): within float32 reassociation of 0, in the tile pairs
# (<= 4 query rows at 256 on sm_90 / sm_100, <= 8 at 64) and the single-tile loop (8 rows at
# 256, and every build through KVKIT_ARCH=sm_80). The other presets and head_dim 128 build the
# same code under every value.
K3V4_CASES = [(256, *c) for c in TQ3_256_CASES] + [
    (64, 4, 1, 16, None), (64, 8, 1, 64, 70), (64, 2, 2, 16, None), (64, 1, 1, 128, 200),
    (64, 16, 1, 16, None),
]  # fmt: skip


@pytest.mark.parametrize("value", ["1", "2"])
@pytest.mark.parametrize("head_dim, group, q_len, block_size, window", K3V4_CASES)
def test_k3v4_matches_the_build_before(cp, value, head_dim, group, q_len, block_size, window,
                                       monkeypatch):  # fmt: skip
    """turboquant_k3v4_nc at head_dim 256 and 64, KVKIT_DECODE_K3V4=1 / 2 against 0 (float32
    reassociation; 2 at 64 is 0's code): ragged lengths (partial and odd last tiles, warps
    without a page in the last tile), 1 and 3 splits; within DECODE_GPU_RTOL of float64."""
    _tq3_256_env(monkeypatch)
    case = Case("turboquant_k3v4_nc", head_dim=head_dim, hkv=2, group=group, q_len=q_len,
                block_size=block_size, seq_lens=[*PAIR_LENS, 5 * block_size + 9, 20 * 64 + 37],
                window=window, seed=block_size + 3 * group + q_len + 41)  # fmt: skip
    exact = "all" if (head_dim, value) == (64, "2") else "none"
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_K3V4", value, "0", exact=exact)


@pytest.mark.parametrize(
    "value, head_dim", [("1", 256), ("2", 256), ("1", 64)]
)  # fmt: skip
@pytest.mark.parametrize("block_size", [16, 64])
def test_k3v4_refills_the_page_windows(cp, value, head_dim, block_size, monkeypatch):
    """Splits of 70 (even) and 33 (odd) tiles of k3v4_nc at head_dim 256 and 64 (page-window
    refills between pairs), with and without a window, against 0."""
    _tq3_256_env(monkeypatch)
    for window in (None, 2500):
        case = Case("turboquant_k3v4_nc", head_dim=head_dim, hkv=1, group=4, q_len=1,
                    block_size=block_size, seq_lens=[70 * 64 - 27, 33 * 64 + 16, 300],
                    window=window, seed=block_size + 53)  # fmt: skip
        assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_K3V4", value, "0", exact="none")


@pytest.mark.parametrize(
    "name, head_dim", [("turboquant_k3v4_nc", 128), ("turboquant_3bit_nc", 256),
                       ("turboquant_4bit_nc", 256), ("turboquant_4bit_nc", 64)]
)  # fmt: skip
def test_k3v4_leaves_the_others_alone(cp, name, head_dim, monkeypatch):
    """KVKIT_DECODE_K3V4=1 builds the same code for k3v4_nc at head_dim 128 and for the other
    presets: bit for bit against 0."""
    _tq3_256_env(monkeypatch)
    case = Case(name, head_dim=head_dim, hkv=2, group=4, q_len=1, block_size=16,
                seq_lens=[*PAIR_LENS, 20 * 64 + 37], window=None, seed=head_dim + 7)  # fmt: skip
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_K3V4", "1", "0")


@pytest.mark.parametrize(
    "value, head_dim", [("1", 256), ("2", 256), ("1", 64)]
)  # fmt: skip
@pytest.mark.parametrize("group, q_len", [(4, 1), (2, 2), (8, 1)])
def test_k3v4_matches_float64_at_every_split_count(cp, value, head_dim, group, q_len,
                                                   monkeypatch):  # fmt: skip
    """turboquant_k3v4_nc at head_dim 256 under KVKIT_DECODE_K3V4=1 / 2 and at 64 under 1:
    every split count (1, 3, MAX_SPLITS, the heuristic) within DECODE_GPU_RTOL of float64 and
    SPLIT_INVARIANCE_RTOL of each other, with sinks and a soft-cap."""
    _tq3_256_env(monkeypatch)
    monkeypatch.setenv("KVKIT_DECODE_K3V4", value)
    monkeypatch.setenv("KVKIT_DECODE_TILE_PAIRS", "1")
    case = Case("turboquant_k3v4_nc", head_dim=head_dim, hkv=2, group=group, q_len=q_len,
                block_size=64, seq_lens=[*PAIR_LENS, 40 * 64 + 3], sinks=True, softcap=30.0,
                seed=29 + group + int(value))  # fmt: skip
    check_against_reference(case)


# --- TurboQuant token orders from the bank model (decode_turboquant.cu KV_MMA_TOKEN_A) --------
# KVKIT_DECODE_TQ3_BANKS=1 (the default): 3bit_nc at head_dim 128, a(c) = 2 c, B = 8, K = 1.
# KVKIT_DECODE_TQ4_ORDER64=1 (the default): 4bit_nc at head_dim 64, a(c) = 4 c, B = 1, K = 2.
# KVKIT_DECODE_TQ3_ORDER64=1 (the default since session 22): 3bit_nc at head_dim 64, a(c) = 4 c,
# B = 2, K = 1, the tile pairs' K-row key runs from a held word (KV_MMA_KLOAD_AL2).
# Each takes a warp's 16 staged tokens in another order in the single-tile loop (more rows,
# and every build through KVKIT_ARCH=sm_80) and in the tile pairs (<= 4 rows on sm_90 /
# sm_100, their lane offsets): which lane sums which token changes, so within float32
# reassociation of 0 and within DECODE_GPU_RTOL of float64. Other presets and head sizes
# build the same code under 1: bit for bit.
#: order -> (switch, preset, head_dim, seed offsets: build-before cases, refills, others)
TOKEN_ORDERS = {
    "tq3_banks": ("KVKIT_DECODE_TQ3_BANKS", "turboquant_3bit_nc", 128, (61, 67, 71)),
    "tq4_order64": ("KVKIT_DECODE_TQ4_ORDER64", "turboquant_4bit_nc", 64, (83, 85, 92)),
    "tq3_order64": ("KVKIT_DECODE_TQ3_ORDER64", "turboquant_3bit_nc", 64, (97, 101, 103)),
}
#: (order, group, q_len, block_size, window): pairs (<= 4 rows), the single-tile loop (8, 16,
#: 32 rows), pages below and above the 16-token tile, causal q_len 2, windows.
TOKEN_ORDER_CASES = [
    *(("tq3_banks", *c) for c in [
        (1, 1, 16, None), (4, 1, 16, None), (4, 1, 64, 70), (8, 1, 64, None), (8, 1, 16, 90),
        (16, 1, 16, None), (16, 1, 64, 70), (1, 2, 64, None), (4, 2, 16, 90), (8, 2, 64, None),
        (16, 2, 16, None), (16, 2, 64, 200)]),
    *(("tq4_order64", *c) for c in [
        (1, 1, 16, None), (4, 1, 16, None), (4, 1, 64, 70), (8, 1, 16, 90), (16, 1, 64, None),
        (1, 2, 64, None), (2, 2, 16, 90), (8, 2, 64, 200)]),
    *(("tq3_order64", *c) for c in [
        (1, 1, 16, None), (4, 1, 16, None), (4, 1, 64, 70), (2, 1, 64, None), (8, 1, 16, 90),
        (16, 1, 64, None), (1, 2, 64, None), (2, 2, 16, 90), (1, 4, 16, None),
        (8, 2, 64, 200)]),
]  # fmt: skip


@pytest.mark.parametrize("order, group, q_len, block_size, window", TOKEN_ORDER_CASES)
def test_token_order_matches_the_build_before(cp, order, group, q_len, block_size, window,
                                              monkeypatch):  # fmt: skip
    """The order's switch at 1 against 0 (float32 reassociation): ragged lengths (partial and
    odd last tiles, warps without a page in the last tile), 1 and 3 splits; within
    DECODE_GPU_RTOL of float64."""
    var, name, head_dim, (seed, _, _) = TOKEN_ORDERS[order]
    case = Case(name, head_dim=head_dim, hkv=2, group=group, q_len=q_len,
                block_size=block_size, seq_lens=[*PAIR_LENS, 5 * block_size + 9, 20 * 64 + 37],
                window=window, seed=block_size + 3 * group + q_len + seed)  # fmt: skip
    assert_builds_agree(case, monkeypatch, var, "1", "0", exact="none")


@pytest.mark.parametrize("block_size", [16, 64])
@pytest.mark.parametrize(
    "order, group",
    [("tq3_banks", 4), ("tq3_banks", 16), ("tq4_order64", 4), ("tq3_order64", 4),
     ("tq3_order64", 16)],
)  # fmt: skip
def test_token_order_refills_the_page_windows(cp, order, group, block_size, monkeypatch):
    """Splits of 70 (even) and 33 (odd) tiles (page-window refills between pairs; the
    single-tile loop at 16 rows), with and without a window, against 0."""
    var, name, head_dim, (_, seed, _) = TOKEN_ORDERS[order]
    for window in (None, 2500):
        case = Case(name, head_dim=head_dim, hkv=1, group=group, q_len=1, block_size=block_size,
                    seq_lens=[70 * 64 - 27, 33 * 64 + 16, 300], window=window,
                    seed=block_size + group + seed)  # fmt: skip
        assert_builds_agree(case, monkeypatch, var, "1", "0", exact="none")


@pytest.mark.parametrize(
    "order, name, head_dim, group, q_len",
    [("tq3_banks", n, d, g, q)
     for n, d in [("turboquant_3bit_nc", 64), ("turboquant_3bit_nc", 256),
                  ("turboquant_4bit_nc", 128), ("turboquant_k3v4_nc", 128)]
     for g, q in [(4, 1), (16, 1), (8, 2)]]
    + [("tq4_order64", n, d, 4, 1)
       for n, d in [("turboquant_4bit_nc", 128), ("turboquant_3bit_nc", 64),
                    ("turboquant_k3v4_nc", 64)]]
    + [("tq3_order64", n, d, 4, 1)
       for n, d in [("turboquant_4bit_nc", 64), ("turboquant_k3v4_nc", 64),
                    ("turboquant_3bit_nc", 128), ("turboquant_3bit_nc", 256)]],
)  # fmt: skip
def test_token_order_leaves_the_others_alone(cp, order, name, head_dim, group, q_len, monkeypatch):
    """The order's switch at 1 builds the same code for the other presets and head sizes: bit
    for bit against 0."""
    var, _, _, (_, _, seed) = TOKEN_ORDERS[order]
    case = Case(name, head_dim=head_dim, hkv=2, group=group, q_len=q_len, block_size=16,
                seq_lens=[*PAIR_LENS, 20 * 64 + 37], window=None,
                seed=head_dim + group + q_len + seed)  # fmt: skip
    assert_builds_agree(case, monkeypatch, var, "1", "0")


@pytest.mark.parametrize(
    "order, group, q_len, block_size",
    [("tq3_banks", g, q, b) for g, q in [(1, 1), (4, 1), (8, 1), (16, 1), (2, 2), (16, 2)]
     for b in (16, 64)]
    + [("tq4_order64", g, q, 16) for g, q in [(1, 1), (4, 1), (8, 1), (2, 2)]]
    + [("tq3_order64", g, q, b) for g, q in [(1, 1), (4, 1), (8, 1), (2, 2)] for b in (16, 64)],
)  # fmt: skip
def test_token_order_matches_float64_at_every_split_count(cp, order, group, q_len, block_size,
                                                          monkeypatch):  # fmt: skip
    """Under the order's switch at 1: every split count (1, 3, MAX_SPLITS, the heuristic)
    within DECODE_GPU_RTOL of float64 and SPLIT_INVARIANCE_RTOL of each other, with sinks and a
    soft-cap."""
    var, name, head_dim, _ = TOKEN_ORDERS[order]
    monkeypatch.setenv(var, "1")
    monkeypatch.setenv("KVKIT_DECODE_TILE_PAIRS", "1")
    case = Case(name, head_dim=head_dim, hkv=2, group=group, q_len=q_len,
                block_size=block_size, seq_lens=[*PAIR_LENS, 40 * 64 + 3], sinks=True,
                softcap=30.0, seed=37 + group + q_len + block_size)  # fmt: skip
    check_against_reference(case)


@pytest.mark.parametrize(
    "order, group, seed",
    [("tq3_banks", 4, 79), ("tq3_banks", 16, 79),
     ("tq3_order64", 4, 107), ("tq3_order64", 16, 107)],
)  # fmt: skip
def test_token_order_token_major_planes(cp, order, group, seed, monkeypatch):
    """Token-major (NHD) slot planes (no slab copies: padded staging rows, 112 bytes at
    head_dim 128 and 80 at 64, and the single-tile loop, where the order costs wavefronts
    instead) under the order's switch at 1: within DECODE_GPU_RTOL of float64 at 1 and 3
    splits."""
    var, name, head_dim, _ = TOKEN_ORDERS[order]
    monkeypatch.setenv(var, "1")
    case = Case(name, head_dim=head_dim, hkv=2, group=group, q_len=1, block_size=32,
                seq_lens=[70, 33, 300], seed=group + seed)  # fmt: skip
    store_token_major(cp, case)
    check_against_reference(case, split_choices=(1, 3))


# --- TurboQuant's pair-loop cuts (KVKIT_DECODE_TQ17, decode_turboquant.cu KV_TQ17) ----------
# The codebook presets: value-code words loaded by the staged rows' alignment known at compile
# time (kv_mma_vload_at4; the tile pairs with pair addresses), each lane's key-run alignment
# held over the pair loop (kv_mma_kload_al), and the softmax without its empty-row guard
# (KV_MMA_EXP_CLAMP; every loop and arch). The same loaded bits and float operations: the
# same bits as 0 (no NaN logits here). Pair addresses pinned on (3bit_nc's head_dim-256
# default is on only through KVKIT_DECODE_TQ3_256=2, the default; pinned anyway). The
# single-tile loop (odd last tiles, KVKIT_ARCH=sm_80) changes in its softmax only.
TQ17_CASES = [(1, 1, 16, None), (4, 1, 16, None), (4, 1, 128, 70), (1, 4, 16, 70),
              (2, 2, 64, None), (8, 1, 16, None)]  # fmt: skip


@pytest.mark.parametrize("name", TQ_PAIR_ADDR_NAMES)
@pytest.mark.parametrize("group, q_len, block_size, window", TQ17_CASES)
def test_tq17_matches_the_build_before(cp, name, group, q_len, block_size, window, monkeypatch):
    """KVKIT_DECODE_TQ17=1 against 0 at head_dim 128, bit for bit: ragged ends (a pair's
    missing second tile, an odd last tile), pages of 128 tokens, windows and causal q_len 4
    (masked pairs; splits with no visible token), 8 rows (no pairs at 128: the softmax only),
    1 and 3 splits; within DECODE_GPU_RTOL of float64."""
    monkeypatch.setenv("KVKIT_DECODE_PAIR_ADDR", "1")
    case = Case(name, head_dim=128, hkv=2, group=group, q_len=q_len, block_size=block_size,
                seq_lens=[*PAIR_LENS, 5 * block_size + 9, 20 * 64 + 37], window=window,
                seed=block_size + 3 * group + q_len + 17)  # fmt: skip
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_TQ17", "1", "0")


@pytest.mark.parametrize("name", TQ_PAIR_ADDR_NAMES)
@pytest.mark.parametrize("head_dim, group, q_len, window",
                         [(64, 4, 1, None), (64, 8, 1, 5), (64, 2, 2, None), (256, 4, 1, None),
                          (256, 2, 2, 70)])  # fmt: skip
def test_tq17_at_head_dims_64_and_256(cp, name, head_dim, group, q_len, window, monkeypatch):
    """The same at head_dim 64 (70-, 54- and 62-byte rows; k3v4_nc's token order there keeps
    the value loads as before) and 256 (four-word value runs; k3v4_nc's key chunks)."""
    monkeypatch.setenv("KVKIT_DECODE_PAIR_ADDR", "1")
    case = Case(name, head_dim=head_dim, hkv=2, group=group, q_len=q_len, block_size=16,
                seq_lens=[*PAIR_LENS, 70 * 64 - 27], window=window,
                seed=head_dim + group + q_len + 23)  # fmt: skip
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_TQ17", "1", "0")


@pytest.mark.parametrize("name, order", [("turboquant_4bit_nc", "2"), ("turboquant_3bit_nc", "1")])
def test_tq17_with_the_token_orders_at_head_dim_256(cp, name, order, monkeypatch):
    """KVKIT_DECODE_TQ_TOKEN_ORDER at head_dim 256: 4bit_nc's order (TK = 1 row on 262-byte
    rows: the key runs keep their per-run alignment) and 3bit_nc's, bit for bit against 0."""
    monkeypatch.setenv("KVKIT_DECODE_PAIR_ADDR", "1")
    monkeypatch.setenv("KVKIT_DECODE_TQ_TOKEN_ORDER", order)
    case = Case(name, head_dim=256, hkv=2, group=4, q_len=1, block_size=16,
                seq_lens=[*PAIR_LENS, 40 * 64 + 3], window=None, seed=31 + int(order))  # fmt: skip
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_TQ17", "1", "0")


# (Its page-window refills, bad pages and float64 check: test_tq_pair_switches_*, with
# KVKIT_DECODE_TQ_ISSUE.)


# --- TurboQuant's PV on fp16 mma (KVKIT_DECODE_TQ_PV16, decode_turboquant.cu KV_TQ_PV16) -----
# The codebook presets' value codes as fp16 and W = p x scale_t, times a power of two per query
# row and fresh accumulator (decode_mma.cuh kv_w16_pow2: the row's largest |W| there to
# [2^14, 2^15)), as fp16 hi + lo instead of three bf16 parts. Another float32 order: checked
# against float64 (DECODE_GPU_RTOL) and across split counts, not bit for bit against 0. The
# adversarial cases put value scales ~1e6 (and ~1e8) apart inside one page, so that one warp
# tile's W spans far more than fp16's 2^-24 .. 65504 without the power of two.
TQ_PV16_CASES = [(1, 1, 16, None), (4, 1, 16, None), (4, 1, 128, 70), (1, 4, 16, 70),
                 (2, 2, 64, None), (8, 1, 16, None), (16, 1, 16, None), (4, 4, 64, 33)]  # fmt: skip


@pytest.mark.parametrize("name", TQ_PAIR_ADDR_NAMES)
@pytest.mark.parametrize("group, q_len, block_size, window", TQ_PV16_CASES)
def test_tq_pv16_matches_float64(cp, name, group, q_len, block_size, window, monkeypatch):
    """KVKIT_DECODE_TQ_PV16=1 at head_dim 128 (tile pairs pinned on; 8 and 16 rows and 4 x 4
    take the single-tile loop): ragged ends, pages of 16 / 64 / 128 tokens, windows, causal
    q_len (splits with no visible token), 1 / 3 / MAX_SPLITS / the heuristic's splits within
    DECODE_GPU_RTOL of float64 and SPLIT_INVARIANCE_RTOL of each other."""
    monkeypatch.setenv("KVKIT_DECODE_TQ_PV16", "1")
    monkeypatch.setenv("KVKIT_DECODE_TILE_PAIRS", "1")
    case = Case(name, head_dim=128, hkv=2, group=group, q_len=q_len, block_size=block_size,
                seq_lens=[*PAIR_LENS, 5 * block_size + 9, 20 * 64 + 37], window=window,
                seed=block_size + 3 * group + q_len + 41)  # fmt: skip
    check_against_reference(case)


@pytest.mark.parametrize("name", TQ_PAIR_ADDR_NAMES)
@pytest.mark.parametrize("head_dim, group, q_len, window",
                         [(64, 4, 1, None), (64, 8, 1, 5), (64, 2, 2, None), (64, 16, 1, None),
                          (256, 4, 1, None), (256, 2, 2, 70), (256, 8, 1, None)])  # fmt: skip
def test_tq_pv16_at_head_dims_64_and_256(cp, name, head_dim, group, q_len, window, monkeypatch):
    """The same at head_dim 64 and 256 (256 at 8 rows: the CUDA-core core, unchanged)."""
    monkeypatch.setenv("KVKIT_DECODE_TQ_PV16", "1")
    monkeypatch.setenv("KVKIT_DECODE_TILE_PAIRS", "1")
    case = Case(name, head_dim=head_dim, hkv=2, group=group, q_len=q_len, block_size=16,
                seq_lens=[*PAIR_LENS, 70 * 64 - 27], window=window,
                seed=head_dim + group + q_len + 43)  # fmt: skip
    check_against_reference(case)


@pytest.mark.parametrize("name", TQ_PAIR_ADDR_NAMES)
@pytest.mark.parametrize("head_dim, group, q_len", [(128, 4, 1), (64, 8, 1), (256, 2, 2),
                                                    (128, 8, 1), (64, 4, 1)])  # fmt: skip
@pytest.mark.parametrize("pairs", ["0", "1"])
def test_tq_pv16_with_sinks_and_softcap(cp, name, head_dim, group, q_len, pairs, monkeypatch):
    """Sinks and a soft-cap, tile pairs on and off (the single-tile loop everywhere), long
    splits (page-window refills): every split count within DECODE_GPU_RTOL of float64."""
    monkeypatch.setenv("KVKIT_DECODE_TQ_PV16", "1")
    monkeypatch.setenv("KVKIT_DECODE_TILE_PAIRS", pairs)
    case = Case(name, head_dim=head_dim, hkv=2, group=group, q_len=q_len, block_size=64,
                seq_lens=[*PAIR_LENS, 40 * 64 + 3, 70 * 64 - 27], sinks=True, softcap=30.0,
                seed=47 + group + head_dim + int(pairs))  # fmt: skip
    check_against_reference(case)


def _tq_pv16_adversarial(name, head_dim, group, q_len, seed, kind):
    """A case whose value scales span ~1e6 or more inside every page. Slot offsets within a
    page (block_size 16) pick the tokens; keys get a component along unit vectors u_j and the
    query heads j of each KV head a component along u_j, which shifts those tokens' scores by a
    chosen amount (in natural-log units) for the chosen heads.
    kind "huge_light": values x 1e-3 everywhere (scales ~4e-4) but slot 5 of each page x 1e3
    (~400) whose score is 14 below the rest for every head (weight ~1e-6: its W = p x scale is
    the tile's largest or near it, the rest at ~2^-20 of it).
    kind "tiny_dominant": head 0 of each group dominated (+25) by slot 5, whose values are
    x 1e-5 (scale ~4e-6, fp16 subnormal); head 1 by slot 9, values x 1e3 (scale ~400), in
    the same pages and warp tiles (W ~1e8 apart between rows: a power of two per warp alone
    would leave head 0's hi + lo at fp16 subnormals); the rest x 1."""
    bs, a = 16, 8.0
    rng_u = np.random.default_rng(seed + 1000)
    u = np.linalg.qr(rng_u.standard_normal((head_dim, 2)))[0].T.astype(np.float32)  # 2 x D
    shift = lambda s: s * math.sqrt(head_dim) / a  # noqa: E731  (key length along u_j)

    def kv_fn(rng, k, v):
        slot = np.arange(k.shape[0]) % bs
        if kind == "huge_light":
            v *= 1e-3
            v[slot == 5] *= 1e6
            k[slot == 5] -= shift(14.0) * u[0]
        else:
            v[slot == 5] *= 1e-5
            v[slot == 9] *= 1e3
            k[slot == 5] += shift(25.0) * u[0]
            k[slot == 9] += shift(25.0) * u[1]
        return k, v

    case = Case(name, head_dim=head_dim, hkv=2, group=group, q_len=q_len, block_size=bs,
                seq_lens=[*PAIR_LENS, 20 * 64 + 37], seed=seed, kv_fn=kv_fn)  # fmt: skip
    q = case.q_vals.copy()  # (B, q_len, Hq, D), float32 queries
    for h in range(q.shape[2]):
        j = h % group
        if kind == "huge_light":
            q[:, :, h] += a * u[0]
        elif j < 2:
            q[:, :, h] += a * u[j]
    case.q_host = case.q_vals = q.astype(np.float32)
    return case


@pytest.mark.parametrize("name", TQ_PAIR_ADDR_NAMES)
@pytest.mark.parametrize("kind", ["huge_light", "tiny_dominant"])
@pytest.mark.parametrize("head_dim, group, q_len", [(128, 4, 1), (128, 8, 1), (64, 4, 1),
                                                    (256, 4, 1), (128, 2, 2)])  # fmt: skip
@pytest.mark.parametrize("value", ["0", "1"])
def test_tq_pv16_value_scales_far_apart_in_one_page(cp, name, kind, head_dim, group, q_len,
                                                    value, monkeypatch):  # fmt: skip
    """Adversarial value scales (_tq_pv16_adversarial) under KVKIT_DECODE_TQ_PV16=1 (and 0, the
    bf16 parts, for comparison): every split count within DECODE_GPU_RTOL of float64, tile
    pairs on and the single-tile loop."""
    monkeypatch.setenv("KVKIT_DECODE_TQ_PV16", value)
    for pairs in ("1", "0"):
        monkeypatch.setenv("KVKIT_DECODE_TILE_PAIRS", pairs)
        case = _tq_pv16_adversarial(name, head_dim, group, q_len, 53 + head_dim + group, kind)
        ref_o, _ = case.reference()
        assert np.all(np.isfinite(ref_o))
        if kind == "tiny_dominant":  # head 0's rows ~1e-4, head 1's ~1e3: as intended
            r0 = np.abs(ref_o[:, :, 0::group]).max()
            r1 = np.abs(ref_o[:, :, 1::group]).max()
            assert r0 < 1e-5 * r1 and r1 > 10.0, (r0, r1)
        check_against_reference(case)


@pytest.mark.parametrize("name", TQ_PAIR_ADDR_NAMES)
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_tq_pv16_masks_nan_bytes_past_the_sequence_end(cp, name, head_dim, monkeypatch):
    """Slots past a sequence's length in its last page all 0xFF bytes (NaN value scale, zero
    and key norm): under KVKIT_DECODE_TQ_PV16=1 their W is 0 (p = 0, scale not read) and the
    row maxima skip nothing real: within DECODE_GPU_RTOL of float64."""
    monkeypatch.setenv("KVKIT_DECODE_TQ_PV16", "1")
    case = Case(name, head_dim=head_dim, hkv=2, group=4, q_len=1, block_size=16,
                seq_lens=[300, 129, 70, 5], seed=head_dim + 59)  # fmt: skip
    ref_o, ref_lse = case.reference()
    for b, n in enumerate(case.seq_lens):
        page = case.block_tables[b, (int(n) - 1) // 16]
        case.gpu.planes["slots"][page, :, int(n) % 16 or 16 :, :] = 0xFF
    for num_splits in (1, 3):
        o, lse = case.run(num_splits)
        assert case.flag() == 0
        assert rel_error(o, ref_o) <= DECODE_GPU_RTOL, num_splits
        assert lse_error(lse, ref_lse) <= DECODE_GPU_RTOL, num_splits


@pytest.mark.parametrize("name", TQ_PAIR_ADDR_NAMES)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_tq_pv16_nan_query_rows_as_before(cp, name, head_dim, monkeypatch):
    """A NaN query head: its rows NaN and every other row as the bf16 build's (within
    float32 reassociation), 1 and 3 splits: a NaN W is skipped by the rows' maxima and poisons
    only its own row."""
    case = Case(name, head_dim=head_dim, hkv=2, group=4, q_len=1, block_size=16,
                seq_lens=[*PAIR_LENS, 20 * 64 + 37], seed=head_dim + 61)  # fmt: skip
    q = case.q_vals.copy()
    q[:, :, 1, 3] = np.nan
    case.q_host = case.q_vals = q
    for num_splits in (1, 3):
        outs = []
        for value in ("1", "0"):
            monkeypatch.setenv("KVKIT_DECODE_TQ_PV16", value)
            outs.append(case.run(num_splits)[0])
            assert case.flag() == 0
        o_new, o_old = outs
        np.testing.assert_array_equal(np.isnan(o_new), np.isnan(o_old))
        keep = ~np.isnan(o_old).any(axis=-1)
        assert keep.sum() >= o_old.shape[0] * (o_old.shape[2] - 1)
        assert rel_error(o_new[keep], o_old[keep]) <= SPLIT_INVARIANCE_RTOL


# --- the cp.async path's warp-local tile loop (KVKIT_DECODE_CP_ASYNC_V2, decode_core.cuh
# KVD_CP_WARP_PIPE, KVD_CP_RINGLESS) ------------------------------------------------------------
# At 1 each warp fills its own 16 page-ring entries and, in fast launches (pages of >= 16
# tokens), meets only its own lanes per tile (__syncwarp) instead of the CTA barrier; at 2 the
# same, and power-of-two pages of >= 16 tokens (every kvkit.cache launch) keep no ring: the
# warp pipes' page windows in registers. The same copies and float operations: the same bits
# as 0. Only targets without bulk copies build them (sm_80 / sm_86 / sm_89): run these with
# KVKIT_ARCH=sm_80 on newer GPUs. Natively on sm_90+ every value builds the same kernel (a
# plumbing check there).


@pytest.mark.parametrize("value", ["1", "2"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("block_size, window", [(16, None), (64, 70), (128, None), (16, 70)])
def test_cp_async_v2_matches_the_build_before(cp, value, head_dim, block_size, window,
                                              monkeypatch):  # fmt: skip
    """KVKIT_DECODE_CP_ASYNC_V2=1 / 2 against 0, bit for bit: ragged ends (a split's last
    tile cut inside a warp's 16 tokens, warps without tokens), pages of 16 / 64 / 128 tokens
    (a warp's 16 tokens from one page; several tiles a page), a window (masked tiles before
    it), 1 and 3 splits; 20 * 64 + 37 tokens: page windows refilled (2)."""
    case = Case("nvfp4", head_dim=head_dim, hkv=2, group=4, q_len=1, block_size=block_size,
                seq_lens=[*PAIR_LENS, 5 * block_size + 9, 70 * 64 - 27], window=window,
                seed=block_size + head_dim + 5)  # fmt: skip
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_CP_ASYNC_V2", value, "0")


@pytest.mark.parametrize("name", PAIR_ADDR_NAMES)
@pytest.mark.parametrize("group, q_len, window", [(1, 1, None), (8, 1, 5), (2, 4, 90)])
def test_cp_async_v2_query_rows(cp, name, group, q_len, window, monkeypatch):
    """KVKIT_DECODE_CP_ASYNC_V2=2 against 0 at head_dim 64 (the sm_80 ratio it is for) for
    other query rows: one row, eight, causal q_len 4 with a window; NVFP4 and 4over6."""
    case = Case(name, head_dim=64, hkv=2, group=group, q_len=q_len, block_size=16,
                seq_lens=[*PAIR_LENS, 70 * 64 - 27], window=window,
                seed=40 + group + q_len)  # fmt: skip
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_CP_ASYNC_V2", "2", "0")


@pytest.mark.parametrize("value", ["1", "2"])
@pytest.mark.parametrize("block_size", [16, 128])
def test_cp_async_v2_flags_bad_pages_as_before(cp, value, block_size, monkeypatch):
    """Bad block-table entries (assert_bad_pages_agree: a bad first tile of page window 1,
    warp 3's page of one tile bad, whose entries warp 3 now checks itself) under
    KVKIT_DECODE_CP_ASYNC_V2=1 / 2 and 0: the same flag, the same outputs bit for bit."""
    assert_bad_pages_agree("nvfp4", block_size, block_size + 4, monkeypatch,
                           "KVKIT_DECODE_CP_ASYNC_V2", value)  # fmt: skip


CP_ASYNC_V2_OTHERS = ("turboquant_4bit_nc", "turboquant_3bit_nc", "turboquant_k3v4_nc",
                      "turboquant_k8v4", "fp8_e4m3", "fp16", "bf16")  # fmt: skip


@pytest.mark.parametrize("value", ["1", "2"])
@pytest.mark.parametrize("name", CP_ASYNC_V2_OTHERS)
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_cp_async_v2_other_families(cp, value, name, head_dim, monkeypatch):
    """The other tensor-core families under KVKIT_DECODE_CP_ASYNC_V2=1 / 2 against 0, bit for
    bit (fp16 / bf16 build 0 under 2: their core reads V through the ring): pages of 16 with
    a window, a ragged 40 * 64 + 37 tokens (page windows refilled), 1 and 3 splits."""
    case = Case(name, head_dim=head_dim, hkv=2, group=4, q_len=1, block_size=16,
                seq_lens=[*PAIR_LENS, 40 * 64 + 37], window=70 if head_dim == 128 else None,
                seed=61 + head_dim + len(name))  # fmt: skip
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_CP_ASYNC_V2", value, "0")


@pytest.mark.parametrize("value", ["1", "2"])
@pytest.mark.parametrize("name", ["turboquant_4bit_nc", "fp8_e4m3"])
def test_cp_async_v2_other_families_flag_bad_pages(cp, value, name, monkeypatch):
    """Bad block-table entries under KVKIT_DECODE_CP_ASYNC_V2=1 / 2 and 0 for TurboQuant and
    fp8: the same flag, the same outputs bit for bit."""
    assert_bad_pages_agree(name, 16, 23, monkeypatch, "KVKIT_DECODE_CP_ASYNC_V2", value)


@pytest.mark.parametrize("value", ["1", "2"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_cp_async_v2_matches_float64_at_every_split_count(cp, value, head_dim, monkeypatch):
    """Under KVKIT_DECODE_CP_ASYNC_V2=1 / 2, every split count within DECODE_GPU_RTOL of
    float64 and within SPLIT_INVARIANCE_RTOL of each other, with sinks and a soft-cap."""
    monkeypatch.setenv("KVKIT_DECODE_CP_ASYNC_V2", value)
    case = Case("nvfp4", head_dim=head_dim, hkv=2, group=4, q_len=1, block_size=64,
                seq_lens=[*PAIR_LENS, 40 * 64 + 3], sinks=True, softcap=30.0,
                seed=23 + head_dim)  # fmt: skip
    check_against_reference(case)


# --- the cp.async path's tile-pair loop (KVKIT_DECODE_CP_ASYNC_V2=3 / 4, decode_core.cuh
# KVD_CP_PAIRS, decode_mma_pairs.cuh) ------------------------------------------------------------
# =2's page windows with the warp pipes' pair loop: two tiles per iteration, one online-softmax
# update per pair, both tiles' P into one fresh PV accumulator; cp.async groups waited per
# thread instead of bulk barriers. The pair loop's float32 order: against =2 within float32
# reassociation (SPLIT_INVARIANCE_RTOL) and against float64, not bit for bit. Pairs only at
# G * q_len <= 8 (head_dim 64) / <= 4 (128), not at 256, and only in slab launches (pages of a
# power of two >= 16 tokens); other launches and shapes of a =3 build take the single-tile
# loop: bit for bit with =2 there. KVKIT_DECODE_TILE_PAIRS pinned to 1 (the launcher's short-
# split rule would give NVFP4 at head_dim 128 the single-tile build). Run with KVKIT_ARCH=sm_80
# on sm_90+ GPUs (natively there =3 builds the default kernel: a plumbing check). =4: =3 with
# six stages at head_dim 64 (the same bits as =3; at 128 the same build).
CP_PAIR_LENS = [*PAIR_LENS, 33 * 64 - 5, 70 * 64 - 27]


@pytest.mark.parametrize("value, head_dim", [("3", 64), ("3", 128), ("4", 64)])
@pytest.mark.parametrize("block_size, window", [(16, None), (64, 70), (128, None), (16, 70)])
def test_cp_async_pairs_match_the_ring_less_build(cp, value, head_dim, block_size, window,
                                                  monkeypatch):  # fmt: skip
    """=3 (=4: six stages, head_dim 64) against =2: odd and even tile counts per split (1 and 3
    splits of CP_PAIR_LENS and 5 * block_size + 9: one partial tile, 1-5 tiles, 33 tiles, odd,
    the last single after a page-window refill, 70 tiles, even, two refills), ragged ends
    (warps of the last tile without tokens), pages of 16 / 64 / 128 tokens, a window (masked
    tiles of a pair)."""
    case = Case("nvfp4", head_dim=head_dim, hkv=2, group=4, q_len=1, block_size=block_size,
                seq_lens=[*CP_PAIR_LENS, 5 * block_size + 9], window=window,
                seed=block_size + head_dim + 61)  # fmt: skip
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_CP_ASYNC_V2", value, "2", exact="none",
                        pairs=True)  # fmt: skip


@pytest.mark.parametrize("block_size", [16, 128])
@pytest.mark.parametrize("group, q_len, window", [(4, 1, None), (8, 1, 70), (2, 4, 90)])
def test_cp_async_pairs_six_stages_match_four(cp, block_size, group, q_len, window,
                                              monkeypatch):  # fmt: skip
    """=4 (six stages at head_dim 64: each pair's copies issued two pairs ahead) against =3,
    bit for bit: the same copies and float operations, only the group waits move."""
    case = Case("nvfp4", head_dim=64, hkv=2, group=group, q_len=q_len, block_size=block_size,
                seq_lens=[*CP_PAIR_LENS, 5 * block_size + 9], window=window,
                seed=block_size + group + q_len + 3)  # fmt: skip
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_CP_ASYNC_V2", "4", "3", pairs=True)


@pytest.mark.parametrize("name", PAIR_ADDR_NAMES)
@pytest.mark.parametrize("group, q_len, window", [(1, 1, None), (8, 1, 5), (2, 4, 90),
                                                  (4, 2, None)])  # fmt: skip
def test_cp_async_pairs_query_rows(cp, name, group, q_len, window, monkeypatch):
    """=3 against =2 at head_dim 64 for other query rows (one, eight: the most with pairs,
    causal q_len 2 and 4 with and without a window); NVFP4 and 4over6."""
    case = Case(name, head_dim=64, hkv=2, group=group, q_len=q_len, block_size=16,
                seq_lens=CP_PAIR_LENS, window=window, seed=70 + group + q_len)  # fmt: skip
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_CP_ASYNC_V2", "3", "2", exact="none",
                        pairs=True)  # fmt: skip


@pytest.mark.parametrize("head_dim, group, token_major", [(128, 8, False), (256, 4, False),
                                                          (64, 4, True)])  # fmt: skip
def test_cp_async_pairs_leave_other_launches_alone(cp, head_dim, group, token_major,
                                                   monkeypatch):  # fmt: skip
    """Where =3 has no pairs, bit for bit with =2: 8 query rows at head_dim 128 and head_dim
    256 (no pair code: =2's PTX; on sm_90 / sm_100 the head_dim-256 pairs come with
    KVKIT_DECODE_CP_ON_BULK, pinned to 0 here), and token-major pages (strided planes: no
    slabs, so the pair build's single-tile loop, with its four stages)."""
    monkeypatch.setenv("KVKIT_DECODE_CP_ON_BULK", "0")
    case = Case("nvfp4", head_dim=head_dim, hkv=2, group=group, q_len=1, block_size=16,
                seq_lens=CP_PAIR_LENS, seed=80 + head_dim + group)  # fmt: skip
    if token_major:
        store_token_major(cp, case)
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_CP_ASYNC_V2", "3", "2", pairs=True)


@pytest.mark.parametrize("block_size", [16, 64, 128])
def test_cp_async_pairs_flag_bad_pages_as_before(cp, block_size, monkeypatch):
    """Bad block-table entries (assert_bad_pages_agree, head_dim 128, 4 rows: pairs) under =3
    and =2: the same flag at 1, 3 and MAX_SPLITS splits, the outputs within float32
    reassociation (bad pages are masked per tile of a pair)."""
    assert_bad_pages_agree("nvfp4", block_size, block_size + 9, monkeypatch,
                           "KVKIT_DECODE_CP_ASYNC_V2", "3", old="2")  # fmt: skip


@pytest.mark.parametrize("value, head_dim", [("3", 64), ("3", 128), ("4", 64)])
@pytest.mark.parametrize("group, q_len", [(4, 1), (2, 2)])
def test_cp_async_pairs_match_float64_at_every_split_count(cp, value, head_dim, group, q_len,
                                                           monkeypatch):  # fmt: skip
    """Under =3 / =4 (pairs pinned on), every split count (1, 3, MAX_SPLITS, the heuristic)
    within DECODE_GPU_RTOL of float64 and within SPLIT_INVARIANCE_RTOL of each other, with
    sinks and a soft-cap (the pair's logits path)."""
    monkeypatch.setenv("KVKIT_DECODE_CP_ASYNC_V2", value)
    monkeypatch.setenv("KVKIT_DECODE_TILE_PAIRS", "1")
    case = Case("nvfp4", head_dim=head_dim, hkv=2, group=group, q_len=q_len, block_size=64,
                seq_lens=[*CP_PAIR_LENS, 40 * 64 + 3], sinks=True, softcap=30.0,
                seed=90 + head_dim + group)  # fmt: skip
    check_against_reference(case)


# --- Builds without the soft-cap's tanh (KV_SOFTCAP=0; KVKIT_DECODE_SOFTCAP_BUILDS) ---------
@pytest.mark.parametrize("name", ["nvfp4", "turboquant_4bit_nc", "turboquant_3bit_nc",
                                  "turboquant_k8v4", "fp8_e4m3", "fp16"])  # fmt: skip
@pytest.mark.parametrize("head_dim, group, q_len, window", [
    (128, 4, 1, None), (64, 4, 1, 70), (128, 2, 2, None), (128, 8, 2, 90),
])  # fmt: skip
@pytest.mark.parametrize("pairs", [False, True])
def test_no_softcap_build_matches_the_softcap_build(cp, name, head_dim, group, q_len, window,
                                                    pairs, monkeypatch):  # fmt: skip
    """A decode without a soft-cap runs the build without the tanh (the default) or the
    soft-cap build (KVKIT_DECODE_SOFTCAP_BUILDS=0): the same bits, in the tensor-core stage 1's
    single-tile and tile-pair loops (the CUDA-core loop: the next test)."""
    case = Case(name, head_dim=head_dim, hkv=2, group=group, q_len=q_len, block_size=16,
                seq_lens=[*PAIR_LENS, 20 * 64 + 37], window=window, seed=head_dim + group + 3,
                q_dtype="float16")  # fmt: skip
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_SOFTCAP_BUILDS", None, "0",
                        pairs=pairs)  # fmt: skip


@pytest.mark.parametrize("name", ["nvfp4", "turboquant_4bit_nc", "fp16"])
def test_no_softcap_build_matches_on_the_cuda_cores(cp, name, monkeypatch):
    """The same on the CUDA-core stage 1 (KVKIT_DECODE_SIMT=1), and a soft-capped decode (which
    always takes the soft-cap build) still matches float64."""
    monkeypatch.setenv("KVKIT_DECODE_SIMT", "1")
    case = Case(name, head_dim=128, hkv=2, group=4, q_len=1, block_size=16,
                seq_lens=[*PAIR_LENS, 9 * 64 + 5], seed=41)  # fmt: skip
    assert_builds_agree(case, monkeypatch, "KVKIT_DECODE_SOFTCAP_BUILDS", None, "0",
                        pairs=False)  # fmt: skip
    capped = Case(name, head_dim=128, hkv=2, group=4, q_len=1, block_size=16,
                  seq_lens=[*PAIR_LENS, 9 * 64 + 5], seed=41, softcap=7.5)  # fmt: skip
    ref_o, ref_lse = capped.reference()
    for num_splits in (1, 3):
        o, lse = capped.run(num_splits)
        assert capped.flag() == 0
        assert rel_error(o, ref_o) <= DECODE_GPU_RTOL
        assert lse_error(lse, ref_lse) <= DECODE_GPU_RTOL
