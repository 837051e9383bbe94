"""CUDA split-K paged decode and merge_states: launch wrappers (DESIGN.md section 5).

``decode(q, q_dtype, layer, block_tables, seq_lens, ...)`` runs two kernels on the current
CuPy stream and never synchronizes (no device array is read on the host):

=====================  ===========================================  ===========================
stage                  kernel (entry)                               launch
=====================  ===========================================  ===========================
1, fp16/bf16/fp8_e4m3  ``kv_decode_dense_stage1`` (decode_dense.cu) grid (num_splits, Hkv, B),
1, nvfp4*              ``kv_decode_nvfp4_stage1`` (decode_nvfp4.cu) threads and dynamic shared
1, turboquant_*        ``kv_decode_turboquant_stage1``              bytes from the module's
                       (decode_turboquant.cu)                       ``kv_decode_launch``
2                      ``kv_decode_merge_splits`` (decode_merge.cu) grid (rows, column
                                                                    chunks), ``merge_block``
=====================  ===========================================  ===========================

Stage 1 gives one CTA to each (split, KV head, sequence): it serves all G = Hq / Hkv query
heads and all q_len queries of that KV head, so every cache byte is read once per step: tiles of
64 tokens stream through a cp.async pipeline into shared memory and are dequantized straight
from there: on tensor cores for G * q_len <= 16 at head_dim <= 128 and G * q_len <= 8 at
head_dim 256 (every format; ``cuda_src/common/decode_mma.cuh``), on the CUDA cores otherwise
(``decode_core.cuh``; ``KVKIT_DECODE_SIMT=1`` forces it; ``KVKIT_DECODE_STAGE_KB`` overrides
the staging budget per CTA and ``KVKIT_DECODE_MIN_BLOCKS`` (1-8) the resident CTAs per SM that
the register cap is set for, both for tuning sweeps; ``KVKIT_DECODE_MASK_ALL=1`` sends every tile of
the tensor-core stage 1 through the masked softmax, which fully visible tiles skip: tests
compare the two bit for bit; ``KVKIT_DECODE_BULK_RUNS=0`` copies the bulk row planes of fp16 /
bf16 per thread instead of one warp per 16-token page run; ``KVKIT_DECODE_DENSE_BULK=0`` / ``1``
picks fp16 / bf16 tile copies on sm_90+, cp.async row runs (the default below head_dim 128 on
sm_90 / sm_100) / the copy engine (the default elsewhere), same bits; and
``KVKIT_DECODE_NVFP4_UNPACK=0`` / ``1`` picks NVFP4's E2M1 unpacking in the tensor-core stage 1,
pair by pair / eight codes at once (the default), same bits; ``KVKIT_DECODE_NVFP4_BULK=0`` /
``1`` picks NVFP4's tile copies on sm_90+ at head_dim 128, cp.async pieces / per-warp slabs by
the copy engine (the default), same staged bytes; ``KVKIT_DECODE_NVFP4_REV=0`` / ``1`` picks
NVFP4's tensor-core tile, the session-10 one / nvdec2's (the default: hardware block scales
without a multiply, value codes in one copy per warp and the warp's tokens in a bank-friendly
order; float32 rounding apart,
the same attention); ``KVKIT_DECODE_ROW_RUNS=0`` / ``1`` turns the row runs of the cp.async row
copies off / on for every format (default: ``row_runs_default``; same
bits either way; no effect where the copy engine copies); ``KVKIT_DECODE_TQ_VARIANT=0`` / ``1``
picks TurboQuant's tensor-core stage 1 without / with (the default from head_dim 128, and at 64 for
the codebook presets with ``KVKIT_DECODE_TQ_PV16`` on) the packed mma columns of G * q_len <= 4
launches (the same scores bit for bit; the PV sums in another float32 order); ``KVKIT_DECODE_TQ3=0``
/ ``1`` picks TurboQuant's 3-bit unpacking in the tensor-core stage 1, the build before session 12 /
the cheaper plans (3-bit values at head_dim 256 as 16-bit units, the 3-bit key table first in shared
memory at head_dim 128 with more than 8 query rows; the default only for head_dim 128 with
G * q_len > 8, where it measured faster), same bits; ``KVKIT_DECODE_FP8_NANTILE=0`` / ``1``
turns off / on (the default) the per-tile NaN-free E4M3 conversion of the software-FP8 path
(sm_80 / sm_86: fp8_e4m3 keys and values, turboquant_k8v4 keys; tiles whose bytes hold a NaN
code keep the exact conversion; same bits; no effect where the conversion is the hardware's);
``KVKIT_DECODE_WARP_PIPE=0`` / ``1`` picks the tile loop of the warp-slab launches (sm_90+,
tensor-core core, pages of >= 16 tokens; NVFP4 at head_dim 128, G * q_len <= 16, and the
TurboQuant slab builds below): one CTA barrier per tile /
warp-independent pipelines (the default: each warp its own stage barriers and one block-table
entry per tile in registers, a warp barrier per tile; the warps meet at the end of the split),
same bits: all for A/B runs); the warp pipes' tile loop takes two tiles per iteration (one
online-softmax update over a warp's 32 tokens, 4 stages; sm_90 and sm_100, G * q_len <= 8
(TurboQuant: 4 at head_dim 128), head_dim <= 128); ``KVKIT_DECODE_TILE_PAIRS=0`` (A/B runs)
takes one (float32 operations in another order, so not the same bits). Where such a switch
is unset, the launcher may launch another build of stage 1 by the length of the step's splits
(``kvkit.cuda.split_builds``: NVFP4 splits of < 12 tiles without pairs, turboquant_k8v4
splits of >= 64 tiles with warp slabs, both at head_dim 128); a switch set in the
environment wins. On sm_90+ stage 2 is launched with programmatic stream serialization
(its CTAs are scheduled while stage 1 drains and wait for it by griddepcontrol);
``KVKIT_DECODE_PDL=0`` launches it the ordinary way and ``KVKIT_DECODE_PDL_TRIGGER=0`` / ``1``
lets it be scheduled from the start of stage 1's CTAs / from their last tile (the default)
(A/B runs). A decode without a soft-cap runs a stage-1 build without the soft-cap's tanh in
its loops (``KV_SOFTCAP=0``: smaller loop code, the same bits);
``KVKIT_DECODE_SOFTCAP_BUILDS=0`` runs the soft-cap build for every decode (A/B runs).
``KVKIT_DECODE_TQ_SLABS=0`` / ``1`` picks TurboQuant's tile copies from head_dim 128 on
sm_90+ in the tensor-core launches: per page run / per warp slab with warp pipes (the default
for the codebook-key presets; k8v4 measured slower with them), and
``KVKIT_DECODE_TQ_SLABS64=0`` / ``1`` below head_dim 128 cp.async / warp slabs (the default,
every preset); ``KVKIT_DECODE_NVFP4_SLAB_ROWS=8`` / ``16`` limits NVFP4's warp slabs to one
row tile / allows two (the default); ``KVKIT_DECODE_NVFP4_SLABS_OTHER_D=0`` / ``1`` / ``2``
picks NVFP4's tile copies on sm_90+ at head_dim 64 in the tensor-core launches: cp.async
pieces / warp slabs with warp pipes, value rows with a row's gap per 4 rows / the same,
unpadded (the default); same bits (A/B runs). At head_dim 256 (A/B runs):
``KVKIT_DECODE_TQ_TOKEN_ORDER=1`` / ``2`` takes a warp's 16 staged tokens in a bank-friendly
order (fewer shared-memory wavefronts of the key and value loads of the unpadded slots;
decode_turboquant.cu) for turboquant_3bit_nc / for turboquant_4bit_nc too (k3v4_nc keeps the
order; default ``0``, none), and ``KVKIT_DECODE_TQ_PAIRS256=0`` / ``1`` / ``2`` the warp
pipes' tile pairs (as ``KVKIT_DECODE_TILE_PAIRS``, G * q_len <= 4) for none / the 3-bit-key
presets (turboquant_3bit_nc, turboquant_k3v4_nc) / all three (the default); float32 rounding
apart, the same attention (which lane sums which token, another softmax order).
``KVKIT_DECODE_PAIR_ADDR=0`` / ``1`` picks how the tile-pair loop (sm_90 / sm_100) of NVFP4
(head_dim 64 and 128) and of TurboQuant's codebook presets (turboquant_4bit_nc, _3bit_nc,
_k3v4_nc; head_dim 64, 128 and 256) addresses its tiles: as before / per-lane row offsets
worked out once before the loop and both tiles' copies issued together (one proxy fence,
shared stage and destination arithmetic); the same loads of the same bytes, so the same bits
(A/B runs). Unset, each family's default: 1 (for turboquant_3bit_nc at head_dim 256 only with
``KVKIT_DECODE_TQ3_256=2``, the default; alone they measured 1% slower there).
``KVKIT_DECODE_NV_ISSUE=0`` / ``1`` (NVFP4 with pair addresses, head_dim 64 and 128 on sm_90 /
sm_100): as before / the tile pair's second stage and its row addresses as
offsets from the first (one stage address per pair), the common pair's copies (both pages
good, pages of <= 64 tokens) issued behind one test, and a pair whose two tiles are fully
visible tested once (the per-tile masks skipped behind it); the same loads of the same bytes,
the same copies and the same float operations, so the same bits (A/B runs). Unset: 1.
``KVKIT_DECODE_TQ_ISSUE=0`` / ``1``: the same for TurboQuant's codebook presets
(turboquant_4bit_nc, _3bit_nc, _k3v4_nc with pair addresses, head_dim 64, 128 and 256 on sm_90
/ sm_100; the value scale and zero's rows from the one stage address too): as before /
trimmed (the default), the same bits (A/B runs).
``KVKIT_DECODE_TQ3_256=0`` / ``1`` / ``2`` (TurboQuant, 3-bit values at head_dim 256, the
tensor-core stage 1): as before / the 3-bit value codes cut from the packed words by byte
windows (the halves plan's, not one shift-and-merge per code pair; the same loads and the same
bf16 operands, so the same bits) / that plus turboquant_3bit_nc's bank-friendly token order
with the tile pairs' lane offsets (``KVKIT_DECODE_TQ_TOKEN_ORDER=1``'s order with
``KVKIT_DECODE_PAIR_ADDR`` on; which lane sums which token changes: float32 rounding apart, the
same attention; the default). A/B runs.
``KVKIT_DECODE_TQ3_BANKS=0`` / ``1`` (turboquant_3bit_nc at head_dim 128, the tensor-core stage
1; A/B runs; unset: 1): tokens in order / a warp's 16 staged tokens in a bank-friendly order
(fewer shared-memory wavefronts of the key and value loads of the unpadded 102-byte slots;
decode_turboquant.cu); which lane sums which token changes: float32 rounding apart, the same
attention.
``KVKIT_DECODE_TQ4_ORDER64=0`` / ``1`` (turboquant_4bit_nc at head_dim 64, the tensor-core
stage 1; A/B runs; unset: 1): tokens in order / a warp's staged tokens in an order with fewer
shared-memory wavefronts of the value loads (decode_turboquant.cu); float32 rounding apart,
the same attention.
``KVKIT_DECODE_TQ3_ORDER64=0`` / ``1`` (turboquant_3bit_nc at head_dim 64, the tensor-core
stage 1; A/B runs; unset: 1): tokens in order / a warp's staged tokens in an order with fewer
shared-memory wavefronts of the key loads, the tile pairs reading the second key run of a lane
from a held word (decode_turboquant.cu); float32 rounding apart, the same attention.
``KVKIT_DECODE_NV_PACK=0`` / ``1`` / ``2`` (NVFP4, every arch; A/B runs; unset: 1 from head_dim
128, 2 below): 0, as before; 1, at G * q_len <= 4 the mma's padding columns 4..7 carry the
query rows again and P's fp16 lo part, so one PV mma per m-tile and tile does what two did (the
lo sums joined after the loop: float32 rounding only, not the same bits), with 2's softmax; 2,
the online softmax without its empty-row guard (the running max starts at -FLT_MAX): the same
bits unless a row's visible logits are all NaN.
``KVKIT_DECODE_K3V4=0`` / ``1`` / ``2`` (turboquant_k3v4_nc at head_dim 256 and 64, the
tensor-core stage 1): as before / at 256 each lane's 3-bit key codes as two
interleaved 12-byte chunks (fewer shared-memory bank conflicts on the 230-byte slot rows; the
query's dims permuted to match) with 4bit_nc's bank-friendly token order, at 64 a token order
for its 62-byte rows / the chunks alone (64 as before); the same products summed in another
order: float32 rounding apart, the same attention. A/B runs; unset: 1.
``KVKIT_DECODE_TQ17=0`` / ``1`` (TurboQuant's codebook presets, the tensor-core stage 1; A/B
runs; unset: 1 at head_dim 64 and 256, 0 at 128): as before / the value-code words of the staged
slot rows loaded by the rows' alignment known at compile time (whole words where a row's run is
4-byte aligned), in the tile pairs each lane's key-run alignment worked out once and held, and
the online softmax without its empty-row guard (the running max starts at -FLT_MAX): the same
loads' bits and the same float operations, so the same bits unless a row's visible logits are
all NaN.
``KVKIT_DECODE_TQ_PV16=0`` / ``1`` (TurboQuant's codebook presets, the tensor-core stage 1; A/B
runs; unset: 1): as before (value codes and W = p x scale as three bf16 parts on bf16 mma) / the
PV on fp16 mma: the value codes as fp16, W times a power of two per query row and fresh
accumulator (the row's largest |W| there to [2^14, 2^15), undone exactly in the accumulator
add) split hi + lo in fp16 (22 significant bits per term, as NVFP4's P); another float32 order,
within the float32 tolerance at any value scales.
``KVKIT_DECODE_CP_ASYNC_V2=0`` / ``1`` / ``2`` / ``3`` / ``4`` (the tensor-core builds of every
family on the targets without bulk copies: sm_80, sm_86, sm_89, and ``KVKIT_ARCH=sm_80`` PTX on
newer GPUs; A/B runs; unset: 3 for NVFP4, but 2 on GPUs where 3's CTAs fit fewer times on an
SM (``_stage1_default``), 0 for fp8_e4m3, 2 for the others; 2 and above fall back to 0 where
the core does not take V straight into registers: NVFP4 at head_dim 96, fp16 / bf16; 3 and 4
are NVFP4's, the others build 2): the tensor-core tile loop with the CTA barrier per tile /
warp-local: each warp fills its own 16 page-ring entries and, in fast launches with pages of
>= 16 tokens (whose cp.async copies are already the warp's own), meets its lanes only
(__syncwarp) per tile / that, and with power-of-two pages of >= 16 tokens no ring at all (the
warp pipes' page windows: one checked block-table entry per warp and tile, in registers); the
same copies and float operations, so the same bits / (3) that, and the tile-pair loop of the
warp pipes on its page windows (two tiles per loop iteration, one online-softmax update per
pair; up to 8 query rows at head_dim 64, 4 at 128, none at 256; it follows
``KVKIT_DECODE_TILE_PAIRS``): the pair loop's float32 order, so float32 rounding apart, not the
same bits as 2 / (4) 3 with six stages instead of four at head_dim 64 (a pair's copies two pairs
ahead of their use, not one): the same bits as 3.
sm_90+ builds are the same for every value.
With one split and no sinks stage 1 writes o and lse itself (no stage 2). Splits
follow
``kvkit.splits.page_range``; the split count comes from the shapes (``max_blocks``, never the
seq_lens on the device), so a planned step's grid and buffers are fixed; the partial buffers'
split axis is that count. Global scales fold into the softmax
scale (K) and into the partial accumulators (V), see ``stage1_scales``.

Stage-1 defines: ``fmt.cuda_defines()`` + ``KV_IN_DTYPE`` (query: 0 float32, 1 float16,
2 bfloat16 bits) + ``KV_GROUP`` (G) + ``KV_Q_LEN``. Every (format, q dtype, G, q_len) is its
own module, compiled once and cached by ``kvkit.cuda.compiler``.

Limits (ValueError): G * q_len rows must fit the register accumulators
(``check_row_limits``: ceil(R / 8) <= 16 and ceil(R / (256 // (D / 4))) <= 16, i.e. R <= 128
at D <= 128, R <= 64 at D = 256, R <= 32 at D = 512), the module's shared memory must fit
the device (``MaxSharedMemoryPerBlockOptin``), B <= 65535 and Hkv <= 65535 (grid limits).
"""

from __future__ import annotations

import math
import os

import numpy as np

from .._checks import check_int, check_positive_finite
from ..splits import MAX_SPLITS, choose_num_splits
from .compiler import get_module
from .launch import ProgrammaticKernel
from .launch import launch_and_record as _launch
from .split_builds import LOOP_BULK_COPY, LOOP_TILE_PAIRS, split_length_switches, split_tiles
from .write import plane_args

__all__ = ["decode", "merge_states", "check_row_limits", "stage1_scales"]

#: Threads of a CUDA-core stage-1 CTA (kvd::THREADS in cuda_src/common/decode_core.cuh; the
#: tensor-core kernels use 128, and every launch takes the count from its module).
STAGE1_THREADS = 256
#: Warps of a CUDA-core stage-1 CTA; score rows are dealt to them round-robin.
STAGE1_WARPS = STAGE1_THREADS // 32
#: Most score rows per warp and PV rows per thread (the kernel's static_assert).
MAX_ROWS_PER_LANE = 16
#: Rows (warps) per CTA of merge_states' kernel (KVM_WARPS in decode_merge.cu).
MERGE_WARPS = 4
#: Stage 2 of decode (kv_decode_merge_splits in decode_merge.cu): columns per thread
#: (KVD_MCOLS), splits one thread loads per pass (KVD_MSPL) and threads per CTA at most
#: (KVD_MTHREADS).
MERGE_COLS = 4
MERGE_SPLITS_PER_THREAD = 4
MERGE_THREADS = 256
# merge_block's 32 split groups take every split count up to MAX_SPLITS in one pass of the
# kernel (its later passes, which rescale, then run only in tests that force them).
assert MAX_SPLITS <= 32 * MERGE_SPLITS_PER_THREAD
#: Load-width code: the widest aligned width (16, 8, 4, 2, 1) lives in these bits
#: (KVD_VEC_MASK in cuda_src/common/decode_core.cuh).
VEC_MASK = 31
#: Load-width code bit: token-contiguous plane with 16-byte aligned slabs (KVD_SLAB_BIT).
SLAB_BIT = 32
#: Load-width code bit: the page stride and every in-page byte offset fit 31 bits, so the
#: kernel's copy addresses take 32-bit in-page arithmetic (KVD_OFF32_BIT).
OFF32_BIT = 64
#: Largest grid.y / grid.z.
_MAX_GRID_YZ = 65535

#: query dtype name -> (KV_IN_DTYPE, dtype of the array that holds it)
_Q_DTYPES = {"float32": ("0", "float32"), "float16": ("1", "float16"), "bfloat16": ("2", "uint16")}

#: format family -> (entry, stage-1 kernel, planes in kernel order)
_STAGE1 = {
    "dense": ("decode_dense.cu", "kv_decode_dense_stage1", ("k", "v")),
    "fp8": ("decode_dense.cu", "kv_decode_dense_stage1", ("k", "v")),
    "nvfp4": (
        "decode_nvfp4.cu",
        "kv_decode_nvfp4_stage1",
        ("k_data", "k_scale", "v_data", "v_scale"),
    ),
    "turboquant": ("decode_turboquant.cu", "kv_decode_turboquant_stage1", ("slots",)),
}
_MERGE_ENTRY = "decode_merge.cu"


def check_row_limits(group: int, q_len: int, head_dim: int) -> None:
    """Raise ValueError when G * q_len query rows do not fit one stage-1 CTA at head_dim."""
    rows = group * q_len
    d4 = head_dim // 4
    row_groups = STAGE1_THREADS // d4
    per_warp = -(-rows // STAGE1_WARPS)
    per_thread = -(-rows // row_groups)
    if per_warp > MAX_ROWS_PER_LANE or per_thread > MAX_ROWS_PER_LANE:
        limit = min(MAX_ROWS_PER_LANE * STAGE1_WARPS, MAX_ROWS_PER_LANE * row_groups)
        raise ValueError(
            f"CUDA decode serves at most {limit} query rows (G * q_len) per KV head at "
            f"head_dim={head_dim}; got G={group} x q_len={q_len} = {rows}. Split the queries "
            "into several decode calls"
        )


def stage1_scales(layer, scale: float) -> tuple[np.float32, np.float32]:
    """(softmax scale the kernel applies to its tile dots, factor applied to its acc).

    fp16/bf16: (scale, 1). fp8_e4m3, nvfp4: (scale * k_scale, v_scale), the tiles hold the
    codes' values without the per-layer global scales. TurboQuant FP8 keys: (scale * k_scale,
    1). TurboQuant MSE keys: (scale / sqrt(D), 1), the 1 / sqrt(D) of the rotation.
    """
    fmt = layer.fmt
    family = fmt.family
    if family == "dense":
        return np.float32(scale), np.float32(1.0)
    if family in ("fp8", "nvfp4"):
        return np.float32(scale * layer.k_scale), np.float32(layer.v_scale)
    if family == "turboquant":
        if fmt.key_kind == "fp8":
            return np.float32(scale * layer.k_scale), np.float32(1.0)
        return np.float32(scale / float(fmt.sqrt_d)), np.float32(1.0)
    raise ValueError(f"no CUDA decode for format family {family!r}")


def offsets_fit_32bit(shape, strides, itemsize: int) -> bool:
    """Whether a plane ``(num_blocks, H, block_size, width)`` with byte ``strides`` has a page
    stride and a largest in-page byte offset (last head, last token, end of its row) below
    2**31, so the stage-1 copies may form in-page offsets in 32 bits and multiply only the
    page number in 64 (``OFF32_BIT``). Negative strides never qualify."""
    if any(s < 0 for s in strides):
        return False
    limit = 1 << 31
    _, heads, block_size, width = shape
    last = max(heads - 1, 0) * strides[1] + max(block_size - 1, 0) * strides[2]
    return strides[0] < limit and last + width * itemsize < limit


def _plane_args(plane, name: str) -> list:
    """``write.plane_args`` (plane and its strides in elements) + the load width (int32).

    The load width is the largest of 16, 8, 4, 2, 1 bytes dividing the base address and
    every stride in bytes, so every row of the plane starts at such a boundary; SLAB_BIT and
    OFF32_BIT add what the copies may assume beyond it.
    """
    args = plane_args(plane, name)
    item = plane.itemsize
    strides = plane.strides
    vec = 16
    addr = int(plane.data.ptr)
    while vec > 1 and any(x % vec for x in (addr, *strides[:3])):
        vec //= 2
    # Slab bit: token rows are contiguous and every (page, head) slab starts 16-byte aligned,
    # so runs of tokens can be copied 16 bytes at a time whatever the row width.
    if strides[2] == plane.shape[3] * item and not any(x % 16 for x in (addr, *strides[:2])):
        vec |= SLAB_BIT
    if offsets_fit_32bit(plane.shape, strides, item):
        vec |= OFF32_BIT
    return args + [np.int32(vec)]


_device_info: dict[int, tuple[int, int]] = {}


def _device_limits() -> tuple[int, int]:
    """(SM count, max dynamic shared memory per block) of the current device, cached."""
    import cupy

    dev = cupy.cuda.runtime.getDevice()
    info = _device_info.get(dev)
    if info is None:
        rt = cupy.cuda.runtime
        info = (
            int(rt.deviceGetAttribute(rt.cudaDevAttrMultiProcessorCount, dev)),
            int(rt.deviceGetAttribute(rt.cudaDevAttrMaxSharedMemoryPerBlockOptin, dev)),
        )
        _device_info[dev] = info
    return info


_stage1_cache: dict[tuple, tuple[object, int, int, int, int]] = {}


def _stage1_kernel(entry: str, name: str, defines: dict[str, str]):
    """(kernel function, dynamic shared bytes, threads, tile tokens, loop flags) for one
    stage-1 module, set up once (flags: ``kvkit.cuda.split_builds`` LOOP_*)."""
    import cupy

    key = (
        cupy.cuda.runtime.getDevice(),
        os.environ.get("KVKIT_ARCH"),
        entry,
        tuple(sorted(defines.items())),
    )
    hit = _stage1_cache.get(key)
    if hit is not None:
        return hit
    module = get_module(entry, defines)
    func = module.get_function(name)
    # The kernel's own layout size and CTA size, from the module (one small copy, once).
    launch = cupy.ndarray((4,), cupy.int32, memptr=module.get_global("kv_decode_launch")).get()
    smem, threads, tile, loop = (int(x) for x in launch)
    _, smem_max = _device_limits()
    if smem > smem_max:
        raise ValueError(
            f"CUDA decode needs {smem} bytes of shared memory per CTA for this format, head_dim "
            f"and G x q_len = {defines['KV_GROUP']} x {defines['KV_Q_LEN']}; this device allows "
            f"{smem_max}. Use fewer query rows per call"
        )
    if smem > 48 * 1024:
        # CuPy's RawKernel sets CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES through this.
        func.max_dynamic_shared_size_bytes = smem
    _stage1_cache[key] = (func, smem, threads, tile, loop)
    return func, smem, threads, tile, loop


#: (device, KVKIT_ARCH, id(fmt), q define, G, q_len, ...) -> (fmt, kernel, shared bytes, threads,
#: tile tokens, loop flags). A key
#: built from the defines themselves (TurboQuant's codebook and signs as text) costs more to
#: hash than a small decode step takes on the GPU, so a step looks its kernel up by identity.
_stage1_fast: dict[tuple, tuple[object, object, int, int, int, int]] = {}

#: Narrowest cp.async row plane (bytes per token) copied as row runs by default (decode_core.cuh
#: kv_issue_plane: one copy instruction moves 512 contiguous bytes, whole rows, instead of
#: 32 bytes of each of 16 rows; a few more warp instructions per warp-tile of address math).
#: Measured on the H200 (session 11, benchmarks/NOTES.md "Session 11"), graph ms without /
#: with row runs: fp8 (64, 8192) 0.406 / 0.268, (1, 131072) 0.117 / 0.082, D = 64 0.060 /
#: 0.050; NVFP4 at D = 256 (128-byte code rows) 0.161 / 0.127, but at D = 64 (32-byte rows:
#: one chunk pair per row, nothing to gain) 0.0559 / 0.0575; through sm_80 fp16 / bf16 0.807
#: / 0.533 and NVFP4 D = 128 0.303 / 0.290. So every format whose row planes are all at least
#: this wide takes them (fp16, bf16, fp8 at every D; NVFP4 from D = 128).
ROW_RUNS_MIN_WIDTH = 64


def row_runs_default(fmt) -> bool:
    """Whether ``fmt``'s decode copies its row planes as row runs unless KVKIT_DECODE_ROW_RUNS
    says otherwise: when all of them are ROW_RUNS_MIN_WIDTH bytes or wider. Formats without
    such planes (TurboQuant slots) are unaffected either way."""
    # The kernel's row-run planes (decode_core.cuh kvd::run_plane): whole 16-byte chunks, an
    # even count of them (NVFP4's 16-byte scale rows at D = 256 keep their copies; a count
    # that is not a power of two, e.g. fp8's 96-byte rows at D = 96, under
    # KVD_ROW_RUNS_EVEN, the kernel's default).
    chunks = [p.width // 16 for p in fmt.planes.values() if p.width % 16 == 0]
    widths = [16 * c for c in chunks if c >= 2 and c % 2 == 0]
    return bool(widths) and min(widths) >= ROW_RUNS_MIN_WIDTH


def _env_choice(name: str, allowed: tuple[str, ...]) -> str:
    """An A/B build switch from the environment: "" when unset, else one of ``allowed``
    (anything else raises ValueError naming the variable)."""
    value = os.environ.get(name, "")
    if value not in ("", *allowed):
        raise ValueError(f"{name}={value!r}: want one of {', '.join(allowed)}")
    return value


# Readers of the switches that live in the shared core (decode_core.cuh).
_EVERY_FAMILY = ("nvfp4", "turboquant", "fp8", "dense")

#: A/B build switches that reach the kernels as a define of the same name: (environment
#: variable, allowed values, the format families (or names) whose stage 1 reads it). Defaults
#: and measurements live next to each define in cuda_src.
_FAMILY_SWITCHES = (
    # NVFP4's tensor-core E2M1 unpacking (decode_nvfp4.cu KV_NVFP4_UNPACK).
    ("KVKIT_DECODE_NVFP4_UNPACK", ("0", "1"), ("nvfp4",)),
    # NVFP4's tile copies on sm_90+: warp slabs by the copy engine (1) or cp.async (0)
    # (decode_nvfp4.cu KV_NVFP4_BULK).
    ("KVKIT_DECODE_NVFP4_BULK", ("0", "1"), ("nvfp4",)),
    # fp16 / bf16 tile copies on sm_90+: rows by the copy engine (1) or the cp.async path with
    # row runs (0, the default below head_dim 128 on sm_90 / sm_100) (decode_dense.cu
    # KV_DENSE_BULK).
    ("KVKIT_DECODE_DENSE_BULK", ("0", "1"), ("dense",)),
    # NVFP4's tensor-core tile: nvdec2's (1) or session 10's (0) (decode_nvfp4.cu KV_NVFP4_REV).
    ("KVKIT_DECODE_NVFP4_REV", ("0", "1"), ("nvfp4",)),
    # NVFP4's warp slabs up to 8 or 16 query rows (decode_nvfp4.cu KV_NVFP4_SLAB_ROWS).
    ("KVKIT_DECODE_NVFP4_SLAB_ROWS", ("8", "16"), ("nvfp4",)),
    # NVFP4's warp slabs (and warp pipes) at head_dim 64 too: value rows with a row's gap per
    # 4 rows (1), unpadded (2, the default), or cp.async at 64 (0) (decode_nvfp4.cu
    # KV_NVFP4_SLABS_OTHER_D).
    ("KVKIT_DECODE_NVFP4_SLABS_OTHER_D", ("0", "1", "2"), ("nvfp4",)),
    # TurboQuant's packed mma columns for G * q_len <= 4 (decode_turboquant.cu).
    ("KVKIT_DECODE_TQ_VARIANT", ("0", "1"), ("turboquant",)),
    # TurboQuant's 3-bit unpacking plans (decode_turboquant.cu).
    ("KVKIT_DECODE_TQ3", ("0", "1"), ("turboquant",)),
    # TurboQuant's copies from head_dim 128: warp slabs (1) or page runs (0)
    # (decode_turboquant.cu KV_TQ_SLABS), and below head_dim 128: warp slabs or cp.async.
    ("KVKIT_DECODE_TQ_SLABS", ("0", "1"), ("turboquant",)),
    ("KVKIT_DECODE_TQ_SLABS64", ("0", "1"), ("turboquant",)),
    # The tile loop of every warp-slab launch (NVFP4, TurboQuant): warp-independent pipelines
    # (1) or the CTA-wide tile barrier (0) (decode_core.cuh KVD_WARP_PIPE).
    ("KVKIT_DECODE_WARP_PIPE", ("0", "1"), ("nvfp4", "turboquant")),
    # The warp pipes' tile loop two tiles per iteration (1, the default) or one (0)
    # (decode_core.cuh KVD_TILE_PAIRS, decode_mma_pairs.cuh): one softmax update and one
    # fresh-accumulator add per 32 tokens of a warp.
    ("KVKIT_DECODE_TILE_PAIRS", ("0", "1"), ("nvfp4", "turboquant")),
    # TurboQuant at head_dim 256: the warp's tokens in a bank-friendly order (decode_turboquant.cu
    # KV_MMA_TOKEN_A; 0 none, the default, 1 3bit_nc, 2 4bit_nc too) and tile pairs
    # (KV_TILE_PAIRS_MAX_D; 0 none, 1 the 3-bit-key presets, 2 4bit_nc too, the default).
    ("KVKIT_DECODE_TQ_TOKEN_ORDER", ("0", "1", "2"), ("turboquant",)),
    ("KVKIT_DECODE_TQ_PAIRS256", ("0", "1", "2"), ("turboquant",)),
    # TurboQuant's codebook presets: tile pairs up to 8 query rows at head_dim 128 as well, at
    # three CTAs per SM there (1, the default), or up to 4 (0, the build before)
    # (decode_turboquant.cu KVKIT_DECODE_TQ_PAIRS8).
    ("KVKIT_DECODE_TQ_PAIRS8", ("0", "1"), ("turboquant",)),
    # The warp pipes' tile pairs up to 16 query rows (1, the default for NVFP4 and TurboQuant's
    # codebook presets), or up to 8 (0, the build before) (decode_core.cuh KVKIT_DECODE_PAIRS16).
    ("KVKIT_DECODE_PAIRS16", ("0", "1"), ("nvfp4", "turboquant")),
    # NVFP4 at head_dim 96: register key and value runs with permuted mma dims (1) or the
    # per-k-step keys and shared V tile before them (0) (decode_nvfp4.cu KVKIT_DECODE_NV96).
    ("KVKIT_DECODE_NV96", ("0", "1"), ("nvfp4",)),
    # Those runs' cp.async tile pairs up to 8 query rows (1) or 4 (0) (decode_nvfp4.cu
    # KVKIT_DECODE_NV96_PAIRS8).
    ("KVKIT_DECODE_NV96_PAIRS8", ("0", "1"), ("nvfp4",)),
    # NVFP4's cp.async launches on sm_90+: the warp-local cp.async loop and its tile pairs (1;
    # the default at head_dims 256, 96 and 32 on sm_90 / sm_100), or the CTA-barrier loop (0,
    # the build before) (decode_nvfp4.cu KVKIT_DECODE_CP_ON_BULK).
    ("KVKIT_DECODE_CP_ON_BULK", ("0", "1"), ("nvfp4",)),
    # The tile-pair loop's row addresses from per-lane offsets held over the loop and both
    # tiles' copies issued together (1), or as before (0) (decode_core.cuh KVD_PAIR_ADDR);
    # unset, the family's default: 1, but 0 for turboquant_3bit_nc at head_dim 256 under
    # KVKIT_DECODE_TQ3_256 < 2 (decode_turboquant.cu KV_PAIR_ADDR_DEFAULT).
    ("KVKIT_DECODE_PAIR_ADDR", ("0", "1"), ("nvfp4", "turboquant")),
    # NVFP4's tile-pair loop with pair addresses: instruction cuts that keep every load, copy
    # and float operation (1, the default), or as before (0) (decode_core.cuh KVD_PAIR_TRIMS).
    ("KVKIT_DECODE_NV_ISSUE", ("0", "1"), ("nvfp4",)),
    # The same trims in TurboQuant's codebook presets' tile-pair loop with pair addresses (1,
    # the default), or as before (0) (decode_core.cuh KVD_PAIR_TRIMS).
    ("KVKIT_DECODE_TQ_ISSUE", ("0", "1"), ("turboquant",)),
    # TurboQuant's 3-bit values at head_dim 256 by byte windows of the packed words (1, same
    # bits), and 3bit_nc's token order with pair addresses as well (2) (decode_turboquant.cu
    # KV_TQ_V_WINS); unset: 2 (0 is the build before).
    ("KVKIT_DECODE_TQ3_256", ("0", "1", "2"), ("turboquant",)),
    # turboquant_3bit_nc at head_dim 128: a warp's staged tokens in a bank-friendly order (1),
    # the default, or in order (0, the build before) (decode_turboquant.cu KVKIT_DECODE_TQ3_BANKS).
    ("KVKIT_DECODE_TQ3_BANKS", ("0", "1"), ("turboquant",)),
    # turboquant_4bit_nc at head_dim 64: a warp's staged tokens in an order with fewer value
    # wavefronts (1, the default), or in order (0, the build before) (decode_turboquant.cu
    # KVKIT_DECODE_TQ4_ORDER64).
    ("KVKIT_DECODE_TQ4_ORDER64", ("0", "1"), ("turboquant",)),
    # turboquant_3bit_nc at head_dim 64: a warp's staged tokens in an order with fewer key
    # wavefronts, the tile pairs' second key run from a held word (1, the default), or in order
    # (0, the build before) (decode_turboquant.cu KVKIT_DECODE_TQ3_ORDER64).
    ("KVKIT_DECODE_TQ3_ORDER64", ("0", "1"), ("turboquant",)),
    # NVFP4: P's fp16 parts in the mma's padding columns at <= 4 query rows and the unguarded
    # softmax (1, the default from head_dim 128), the softmax only (2, below), or as before
    # (0) (decode_nvfp4.cu KV_NV_PACK; decode_mma.cuh KV_MMA_PACK_F16, KV_MMA_EXP_CLAMP).
    ("KVKIT_DECODE_NV_PACK", ("0", "1", "2"), ("nvfp4",)),
    # turboquant_k3v4_nc: at head_dim 256 lane-interleaved key runs and a token order, at 64 a
    # token order (1, the default); the runs alone (2); or as before (0) (decode_turboquant.cu
    # KV_TQ_KSPLIT, KV_MMA_TOKEN_A).
    ("KVKIT_DECODE_K3V4", ("0", "1", "2"), ("turboquant",)),
    # TurboQuant's codebook presets in the tensor-core stage 1: value-code words loaded by the
    # rows' known alignment, the key runs' alignment held per lane in the tile pairs and the
    # unguarded softmax (1; default at head_dim 64 and 256), or as before (0; default at 128)
    # (decode_turboquant.cu KV_TQ17).
    ("KVKIT_DECODE_TQ17", ("0", "1"), ("turboquant",)),
    # TurboQuant's codebook presets in the tensor-core stage 1: the PV on fp16 mma, W = p x
    # scale as fp16 hi + lo after a power of two per row and accumulator (1, the default), or W
    # as three bf16 parts on bf16 mma (0) (decode_turboquant.cu KV_TQ_PV16; decode_mma.cuh
    # KV_MMA_VCODES_F16).
    ("KVKIT_DECODE_TQ_PV16", ("0", "1"), ("turboquant",)),
    # The software-FP8 path's per-tile NaN-free E4M3 conversion (decode_codes.cuh
    # KV_E4M3_NANTILE): the formats with E4M3 keys or values.
    ("KVKIT_DECODE_FP8_NANTILE", ("0", "1"), ("fp8_e4m3", "turboquant_k8v4")),
    # The cp.async path's tile loop (targets without bulk copies: sm_80 / 86 / 89, and
    # KVKIT_ARCH=sm_80 PTX): warp-local (1; ring filled per warp, __syncwarp per tile), that
    # with page windows instead of the ring (2), that with the tile-pair loop (3, NVFP4; float32
    # rounding apart from 2), 3 with six stages at head_dim 64 (4; the same bits as 3), or the
    # CTA barrier per tile (0) (decode_core.cuh KVD_CP_WARP_PIPE, KVD_CP_RINGLESS,
    # KVD_CP_PAIRS; default 2, NVFP4's 3, fp8's 0).
    ("KVKIT_DECODE_CP_ASYNC_V2", ("0", "1", "2", "3", "4"), _EVERY_FAMILY),
    # The tensor-core stage 1's prologue copies before the query rows (1, the default but for
    # TurboQuant's codebook presets at head_dim 64) or after them and the family table (0, the
    # build before) (decode_mma.cuh KVD_EARLY_ISSUE, decode_turboquant.cu).
    ("KVKIT_DECODE_EARLY_ISSUE", ("0", "1"), _EVERY_FAMILY),
)


def _stage1_for(
    fmt, entry: str, kname: str, in_define: str, group: int, q_len: int,
    auto: tuple[tuple[str, str], ...] = (), softcap: bool = True,
):  # fmt: skip
    """(kernel, shared bytes, threads, tile tokens, loop flags) of the stage-1 build for these
    shapes and the decode switches of the environment; ``auto``: (switch, value) pairs of
    ``_FAMILY_SWITCHES`` the launcher picks (``kvkit.cuda.split_builds``), each applied only
    where the environment leaves that switch unset. ``softcap``: whether the decode has a
    soft-cap; a build for one without it leaves the tanh out of its loops (``KV_SOFTCAP=0``)
    unless ``KVKIT_DECODE_SOFTCAP_BUILDS=0`` (one build for both, the build before; A/B)."""
    import cupy

    simt = os.environ.get("KVKIT_DECODE_SIMT", "") == "1"
    mask_all = os.environ.get("KVKIT_DECODE_MASK_ALL", "") == "1"
    no_runs = os.environ.get("KVKIT_DECODE_BULK_RUNS", "") == "0"
    row_runs = _env_choice("KVKIT_DECODE_ROW_RUNS", ("0", "1"))
    row_runs_even = _env_choice("KVKIT_DECODE_ROW_RUNS_EVEN", ("0", "1"))
    switches = tuple(_env_choice(name, allowed) for name, allowed, _ in _FAMILY_SWITCHES)
    if auto:
        picked = dict(auto)
        switches = tuple(
            value or picked.get(name, "")
            for (name, _, _), value in zip(_FAMILY_SWITCHES, switches, strict=True)
        )
    stage_kb = os.environ.get("KVKIT_DECODE_STAGE_KB", "")
    if stage_kb and not (stage_kb.isdigit() and 8 <= int(stage_kb) <= 200):
        raise ValueError(f"KVKIT_DECODE_STAGE_KB={stage_kb!r}: want an integer in [8, 200]")
    min_blocks = _env_choice("KVKIT_DECODE_MIN_BLOCKS", tuple("12345678"))
    pdl_trigger = _env_choice("KVKIT_DECODE_PDL_TRIGGER", ("0", "1"))
    softcap_code = softcap or _env_choice("KVKIT_DECODE_SOFTCAP_BUILDS", ("0", "1")) == "0"
    key = (
        cupy.cuda.runtime.getDevice(), os.environ.get("KVKIT_ARCH"), id(fmt), in_define,
        group, q_len, simt, stage_kb, mask_all, no_runs, row_runs, row_runs_even, min_blocks,
        pdl_trigger, switches, softcap_code,
    )  # fmt: skip
    hit = _stage1_fast.get(key)
    if hit is not None and hit[0] is fmt:
        return hit[1:]
    defines = dict(fmt.cuda_defines())
    defines.update(KV_IN_DTYPE=in_define, KV_GROUP=str(group), KV_Q_LEN=str(q_len))
    if simt:
        # Forces the CUDA-core stage 1 (A/B measurements, tests of both cores).
        defines["KVKIT_DECODE_SIMT"] = "1"
    if stage_kb:
        # The cp.async staging budget per CTA (tuning sweeps; default in decode_core.cuh).
        defines["KVD_STAGE_BUDGET_KB"] = stage_kb
    if min_blocks:
        # __launch_bounds__' resident CTAs per SM, i.e. the register cap (tuning sweeps;
        # default in decode_core.cuh).
        defines["KVKIT_DECODE_MIN_BLOCKS"] = min_blocks
    if pdl_trigger:
        # Where stage 1 lets a programmatic stage 2 be scheduled: 0 CTA start, 1 last tile
        # (the default; decode_core.cuh KVD_PDL_TRIGGER; A/B runs).
        defines["KVD_PDL_TRIGGER"] = pdl_trigger
    if not softcap_code:
        # No soft-cap: its tanh out of the score loops (decode_core.cuh KV_SOFTCAP).
        defines["KV_SOFTCAP"] = "0"
    if mask_all:
        # No fully-visible-tile fast path in the tensor-core softmax (bitwise A/B tests).
        defines["KVKIT_DECODE_MASK_ALL"] = "1"
    if no_runs:
        # Bulk row planes copied per thread instead of per warp run (A/B measurements).
        defines["KVD_BULK_WARP_RUNS_ON"] = "0"
    for (name, _, readers), value in zip(_FAMILY_SWITCHES, switches, strict=True):
        if value and (fmt.family in readers or fmt.name in readers):
            defines[name] = value
    if row_runs == "1" or (not row_runs and row_runs_default(fmt)):
        # Row planes of whole-tile copies as row runs (cp.async path; A/B with =0 / =1).
        defines["KVD_ROW_RUNS_ON"] = "1"
    if row_runs_even:
        # Row runs of rows with an even, not power-of-two count of 16-byte chunks (1, the
        # kernel's default) or not (0, the build before) (decode_core.cuh KVD_ROW_RUNS_EVEN).
        defines["KVD_ROW_RUNS_EVEN"] = row_runs_even
    build = _stage1_kernel(entry, kname, defines)
    _stage1_fast[key] = (fmt, *build)  # holds fmt, so its id is not reused
    return build


_merge_cache: dict[tuple, object] = {}


def _merge_kernel(name: str):
    """A merge kernel; stage 2 (kv_decode_merge_splits) as a ProgrammaticKernel where its build
    waits for stage 1 by griddepcontrol (sm_90+, the module's kv_merge_grid_dep) and
    KVKIT_DECODE_PDL is not "0"."""
    import cupy

    pdl = _env_choice("KVKIT_DECODE_PDL", ("0", "1"))
    key = (cupy.cuda.runtime.getDevice(), os.environ.get("KVKIT_ARCH"), name, pdl)
    func = _merge_cache.get(key)
    if func is None:
        module = get_module(_MERGE_ENTRY, {})
        func = module.get_function(name)
        if name == "kv_decode_merge_splits" and pdl != "0":
            flag = cupy.ndarray((1,), cupy.int32, memptr=module.get_global("kv_merge_grid_dep"))
            if int(flag.get()[0]) == 1:
                func = ProgrammaticKernel(func)
        _merge_cache[key] = func
    return func


_smem_info: dict[int, int] = {}


def _smem_per_sm() -> int:
    """Shared memory of an SM of the current device (H100 / H200: 228 KB, A100: 164 KB,
    sm_86 / sm_89: 100 KB; 1 KB of it reserved per resident CTA), cached."""
    import cupy

    dev = cupy.cuda.runtime.getDevice()
    n = _smem_info.get(dev)
    if n is None:
        rt = cupy.cuda.runtime
        attr = rt.cudaDevAttrMaxSharedMemoryPerMultiprocessor
        n = _smem_info[dev] = int(rt.deviceGetAttribute(attr, dev))
    return n


#: Registers of an SM, and the fewest threads any target from sm_80 to sm_120 keeps resident
#: (1536 on sm_86 / sm_89 / sm_120; sm_80 and sm_90 allow 2048).
_REGS_PER_SM = 65536
_THREADS_PER_SM = 1536


#: id(kernel) -> (kernel, resident CTAs): CuPy's ``attributes`` queries the driver for every
#: attribute on each access (tens of microseconds), too slow for every decode call.
_resident_cache: dict[int, tuple[object, int]] = {}


def _resident_ctas(func, threads: int, smem: int) -> int:
    """Stage-1 CTAs one SM holds at once, from the kernel's registers (allocated per warp in
    units of 256), its threads and its shared memory (both fixed per kernel). The split
    heuristic fills SMs x this. Computed once per kernel."""
    hit = _resident_cache.get(id(func))
    if hit is not None and hit[0] is func:
        return hit[1]
    regs = int(func.attributes["num_regs"])
    per_warp = -(-regs * 32 // 256) * 256
    by_regs = _REGS_PER_SM // (per_warp * (threads // 32))
    by_threads = _THREADS_PER_SM // threads
    n = max(1, min(by_regs, by_threads, _smem_per_sm() // (smem + 1024)))
    _resident_cache[id(func)] = (func, n)  # holds func, so its id is not reused
    return n


#: The cp.async path's build to take where NVFP4's default (its tile pairs,
#: KVKIT_DECODE_CP_ASYNC_V2=3) holds fewer CTAs per SM (``_stage1_default``).
_CP_PAIRS_FALLBACK = (("KVKIT_DECODE_CP_ASYNC_V2", "2"),)
#: id(default kernel) -> (kernel, ``_stage1_default``'s answer) on the cp.async pair path.
_cp_pairs_pick: dict[int, tuple] = {}


def _stage1_default(
    fmt, entry: str, kname: str, in_define: str, group: int, q_len: int, softcap: bool = True
):
    """(build, auto) of ``_stage1_for`` for these shapes before the split-length rule: the
    default build, or, on targets without bulk copies whose default is the tile-pair loop, the
    page-window build (``_CP_PAIRS_FALLBACK``) where the pairs' larger stages fit fewer CTAs
    on an SM of this GPU (measured faster only on the H200's 228 KB, where both fit four;
    decode_nvfp4.cu KV_CP_ASYNC_V2_DEFAULT). ``auto`` goes on to any later rebuild; ``softcap``
    as ``_stage1_for``'s."""
    build = _stage1_for(fmt, entry, kname, in_define, group, q_len, softcap=softcap)
    func, smem, threads, _, loop = build
    if not loop & LOOP_TILE_PAIRS or loop & LOOP_BULK_COPY:
        return build, ()
    # Decided once per default kernel (another environment builds another kernel).
    hit = _cp_pairs_pick.get(id(func))
    if hit is not None and hit[0] is func:
        return hit[1]
    alt = _stage1_for(fmt, entry, kname, in_define, group, q_len, _CP_PAIRS_FALLBACK, softcap)
    if _resident_ctas(func, threads, smem) < _resident_ctas(alt[0], alt[2], alt[1]):
        pick = (alt, _CP_PAIRS_FALLBACK)
    else:
        pick = (build, ())
    _cp_pairs_pick[id(func)] = (func, pick)  # holds func, so its id is not reused
    return pick


def decode(
    q,
    q_dtype,
    layer,
    block_tables,
    seq_lens,
    *,
    scale,
    num_splits=None,
    window=None,
    sinks=None,
    softcap=None,
    workspace=None,
    record=None,
    partials=None,
):
    """Split-K paged decode over one CUDA cache layer; asynchronous on the current stream.

    Query i of sequence b sits at position p = seq_lens[b] - q_len + i and attends to tokens
    t <= p (and t > p - window); token t lives in page block_tables[b, t // block_size].
    Same function as ``kvkit.cpu.decode.decode_pages`` over the dequantized layer.

    Args:
        q: CuPy (B, q_len, Hq, D), C-contiguous: float32, float16, or uint16 holding bfloat16
            bits (q_dtype "bfloat16").
        q_dtype: "float32", "float16" or "bfloat16" (None: from q.dtype).
        layer: a CUDA ``CacheLayer`` (CuPy planes, ``error_flag`` int32 (1,)).
        block_tables: CuPy int32 (B, max_blocks), C-contiguous.
        seq_lens: CuPy int32 (B,).
        scale: softmax scale, finite > 0.
        num_splits: 1..MAX_SPLITS, or None: ``choose_num_splits`` over the SM count with
            max_blocks * block_size as the length (seq_lens are not read on the host).
        window: int >= 1 or None. softcap: float > 0 or None.
        sinks: CuPy float32 (Hq,) per-head sink logits or None (-inf: no sink).
        workspace: None, or a ``DecodeWorkspace`` whose buffers receive o, lse and the split
            partials: then nothing is allocated, which is what CUDA-graph capture needs.
        record: None, or a list that receives each launch made, as (kernel, grid, block,
            args, shared_mem); stage 1's q, block_tables and seq_lens are its arguments
            STAGE1_Q_ARG, STAGE1_TABLES_ARG and STAGE1_LENS_ARG (``kvkit.DecodePlan``
            replays these through ``kvkit.cuda.launch``).
        partials: None, or (without a workspace) a function ``(rows, num_splits, head_dim)
            -> (m, l, acc)`` giving the split partial buffers, float32 (rows, S), (rows, S)
            and (rows, S, D) with S >= num_splits and acc 16-byte aligned, in place of new
            ones (``kvkit.cuda.plain_steps.SharedPartials.carve``, shared by recorded steps).

    Returns:
        (o, lse): CuPy float32 (B, q_len, Hq, D) and (B, q_len, Hq), natural log (the
        workspace's buffers when one is given).

    A block-table entry outside [0, num_blocks) in a used page is skipped and sets bit 2 of
    ``layer.error_flag``; a seq_len outside [q_len, max_blocks * block_size] makes the
    sequence empty (o = 0, lse = -inf, or the sink alone) and sets bit 4.
    """
    import cupy

    fmt = layer.fmt
    family = fmt.family
    if family not in _STAGE1:
        raise ValueError(f"no CUDA decode for format family {family!r}")
    entry, kname, plane_names = _STAGE1[family]

    if q_dtype is None:
        q_dtype = q.dtype.name
    if q_dtype not in _Q_DTYPES:
        raise TypeError(f"q_dtype must be one of {sorted(_Q_DTYPES)}, got {q_dtype!r}")
    in_define, holder = _Q_DTYPES[q_dtype]
    if q.dtype.name != holder:
        raise TypeError(f"q with q_dtype={q_dtype!r} must be a {holder} array, got {q.dtype.name}")
    if q.ndim != 4:
        raise ValueError(f"q must be (B, q_len, Hq, D), got shape {q.shape}")
    if not q.flags.c_contiguous:
        raise ValueError("q must be C-contiguous")
    batch, q_len, num_heads, head_dim = q.shape
    hkv = layer.num_kv_heads
    if head_dim != fmt.head_dim:
        raise ValueError(f"q head_dim {head_dim} does not match the layer's {fmt.head_dim}")
    if q_len < 1 or num_heads < 1 or num_heads % hkv:
        raise ValueError(f"q shape {q.shape} needs q_len >= 1 and Hq a multiple of Hkv={hkv}")
    group = num_heads // hkv
    if block_tables.dtype.name != "int32" or block_tables.ndim != 2:
        raise TypeError("block_tables must be a 2-D int32 array")
    if block_tables.shape[0] != batch:
        raise ValueError(f"block_tables must be (B={batch}, max_blocks), got {block_tables.shape}")
    if seq_lens.dtype.name != "int32" or seq_lens.shape != (batch,):
        raise ValueError(
            f"seq_lens must be int32 (B={batch},), got {seq_lens.dtype} {seq_lens.shape}"
        )
    block_tables = cupy.ascontiguousarray(block_tables)
    seq_lens = cupy.ascontiguousarray(seq_lens)
    scale = check_positive_finite("scale", scale)
    window = 0 if window is None else check_int("window", window, 1)
    softcap = 0.0 if softcap is None else check_positive_finite("softcap", softcap)
    if sinks is not None:
        if tuple(sinks.shape) != (num_heads,):
            raise ValueError(f"sinks must be (Hq={num_heads},), got {sinks.shape}")
        sinks = cupy.ascontiguousarray(sinks, dtype=cupy.float32)
    check_row_limits(group, q_len, head_dim)
    if batch > _MAX_GRID_YZ or hkv > _MAX_GRID_YZ:
        raise ValueError(f"CUDA decode supports B and Hkv up to {_MAX_GRID_YZ}")

    max_blocks = block_tables.shape[1]
    bs = layer.block_size
    if num_splits is not None:
        num_splits = check_int("num_splits", num_splits, 1)
        if num_splits > MAX_SPLITS:
            raise ValueError(f"num_splits must be <= MAX_SPLITS={MAX_SPLITS}, got {num_splits}")

    rows = batch * q_len * num_heads
    if workspace is not None:
        workspace.check(batch, q_len, num_heads, head_dim)
        o, lse = workspace.o, workspace.lse
    else:
        o = cupy.empty((batch, q_len, num_heads, head_dim), dtype=cupy.float32)
        lse = cupy.empty((batch, q_len, num_heads), dtype=cupy.float32)
    if batch == 0:
        return o, lse

    build, picked = _stage1_default(fmt, entry, kname, in_define, group, q_len, softcap > 0)
    func, smem, threads, tile, loop = build
    if num_splits is None:
        num_splits = _default_splits(layer, batch, max_blocks, func, threads, smem, tile)
    # Another build of the same kernel where the loop it was built with is the slower one
    # for splits of this length (split_builds.py has the measurements); same arguments.
    auto = split_length_switches(fmt, loop, split_tiles(max_blocks * bs, bs, num_splits, tile))
    if auto:
        auto = picked + auto
        func, smem, threads, tile, _ = _stage1_for(
            fmt, entry, kname, in_define, group, q_len, auto, softcap > 0
        )

    planes = []
    for pname in plane_names:
        planes += _plane_args(layer.planes[pname], pname)
    # Unused plane slots: a valid pointer (never read, the entry's KV_Pi_BYTES is 0).
    while len(planes) < 4 * 5:
        planes += [layer.planes[plane_names[0]], np.int64(0), np.int64(0), np.int64(0), np.int32(1)]

    k_fold, v_fold = stage1_scales(layer, scale)
    if num_splits == 1 and sinks is None:
        # One split and no sink: stage 1 writes o and lse itself (stage 2's arithmetic for a
        # single part), no partial buffers and no second launch.
        null = np.uint64(0)
        args = (
            q, *planes,
            block_tables, np.int32(max_blocks), seq_lens,
            np.int32(layer.num_blocks), np.int32(bs), np.int32(window),
            k_fold, np.float32(softcap), v_fold, np.int32(1),
            null, null, null, o, lse, layer.error_flag,
        )  # fmt: skip
        _launch(record, func, (1, hkv, batch), (threads,), args, smem)
        return o, lse

    if workspace is not None:
        m_part, l_part, acc_part = workspace.partials(num_splits)
    elif partials is not None:
        m_part, l_part, acc_part = partials(rows, num_splits, head_dim)
    else:
        m_part = cupy.empty((rows, num_splits), dtype=cupy.float32)
        l_part = cupy.empty((rows, num_splits), dtype=cupy.float32)
        acc_part = cupy.empty((rows, num_splits, head_dim), dtype=cupy.float32)
    split_stride = np.int32(m_part.shape[1])
    args = (
        q, *planes,
        block_tables, np.int32(max_blocks), seq_lens,
        np.int32(layer.num_blocks), np.int32(bs), np.int32(window),
        k_fold, np.float32(softcap), v_fold, split_stride,
        m_part, l_part, acc_part, np.uint64(0), np.uint64(0), layer.error_flag,
    )  # fmt: skip
    _launch(record, func, (num_splits, hkv, batch), (threads,), args, smem)

    # Stage 2: CTAs of (column groups) x (split groups) per row and column chunk.
    cgroups, sgroups, chunks = merge_block(num_splits, head_dim)
    merge = _merge_kernel("kv_decode_merge_splits")
    _launch(
        record, merge, (rows, chunks), (cgroups, sgroups),
        (
            m_part, l_part, acc_part,
            np.uint64(0) if sinks is None else sinks,
            np.int64(rows), np.int32(num_heads), np.int32(head_dim),
            np.int32(num_splits), split_stride, o, lse,
        ),
    )  # fmt: skip
    return o, lse


#: Positions of the per-call arrays among stage 1's arguments (q, then 4 planes x 5, then
#: block_tables, max_blocks, seq_lens): what a prepared launch rewrites per step.
STAGE1_Q_ARG = 0
STAGE1_TABLES_ARG = 21
STAGE1_LENS_ARG = 23


#: The split heuristic on CUDA (kvkit.splits.choose_num_splits' wave model): stage-1 CTAs run
#: in waves of SMs x resident CTAs, each costing its tokens plus SPLIT_OVERHEAD_TILES tiles'
#: worth of fixed work; splitting at all costs SPLIT_MERGE_TILES tiles more (the merge) where
#: B x Hkv items already give every SM a CTA; fewer CTAs than SMs scale the time by SMs / CTAs;
#: a split holds whole units of SPLIT_MIN_TILES tiles.
#: Session 25 refit (benchmarks/NOTES.md v25) to graph-replay split sweeps on the H200 (119
#: format x shape rows: fp16 / bf16 / fp8 / NVFP4 / k8v4 / 4bit_nc / 3bit_nc, B 1..96, T
#: 1024..131072, G 4 / 8 / 16, D 64 / 128 / 256, 10-14 split counts each). The earlier one-tile
#: overhead without the merge (fitted to B = 1 / 8 / 64 only) took several waves of short CTAs
#: over one wave of long ones at middle batches: B 24 T 4096 picked 8 splits (NVFP4 56.2 us;
#: 2 splits 45.4), B 48 picked 4 (92.7; 1 split 77.2), 4bit_nc at G = 8 picked 3 (86.8; 1
#: split 75.3); B 1 T 131072 took 66 splits of 125 pages, now 64 of 128 (-1 to -4%). Mean
#: time over each row's best count: 3.9% -> 2.2%. At B = 1 the whole units move counts (66 ->
#: 64; at 3 / 5 CTAs per SM e.g. 49 -> 43, 82 -> 64: measured level or faster), and at one CTA
#: per SM (fp16 / bf16 at D = 256) two waves become one (33 -> 16 from T 65536: 145.2 -> 139.2
#: us at T 65536, 272.0 -> 265.2 at 131072).
#: Overheads of 6 to 10 tiles with merges of 16 to 11 fit alike (2.2%); the overhead alone,
#: 2.6%.
SPLIT_OVERHEAD_TILES = 10
SPLIT_MERGE_TILES = 11
SPLIT_MIN_TILES = 2


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def merge_block(num_splits: int, head_dim: int) -> tuple[int, int, int]:
    """Stage 2's launch shape: (column groups CG, split groups NSG, column chunks).

    A CTA of CG x NSG threads merges MERGE_COLS * CG columns of one row: thread (cg, sg) loads
    the partial states of splits sg, sg + NSG, ... (MERGE_SPLITS_PER_THREAD per pass, all at
    once) for its MERGE_COLS columns. NSG covers the splits in one pass up to 32 groups
    (MAX_SPLITS = 128 is one pass), CG the rest of MERGE_THREADS, and whole warps (the
    kernel's shuffles need all 32 lanes): both powers of two, CG * NSG a multiple of 32.
    """
    groups = -(-head_dim // MERGE_COLS)
    nsg = min(32, _pow2_at_least(num_splits))
    cg = min(_pow2_at_least(groups), MERGE_THREADS // nsg)
    while cg * nsg < 32:
        nsg *= 2
    return cg, nsg, -(-groups // cg)


def split_count(
    batch: int, num_kv_heads: int, max_tokens: int, block_size: int, sms: int, resident: int,
    tile: int,
) -> int:  # fmt: skip
    """The CUDA split heuristic (kvkit.splits.choose_num_splits' wave model with the constants
    above) for a stage-1 build that holds ``resident`` CTAs per SM on ``sms`` SMs and works in
    tiles of ``tile`` tokens, for ``batch`` sequences of at most ``max_tokens`` tokens."""
    return choose_num_splits(
        batch, num_kv_heads, max_tokens, block_size, num_workers=sms * resident,
        max_splits=MAX_SPLITS, min_split_tokens=SPLIT_MIN_TILES * tile,
        cta_overhead_tokens=SPLIT_OVERHEAD_TILES * tile,
        merge_overhead_tokens=SPLIT_MERGE_TILES * tile, fill_items=sms,
    )  # fmt: skip


def _default_splits(
    layer, batch: int, max_blocks: int, func, threads: int, smem: int, tile: int
) -> int:
    """``split_count`` over this device: its SMs, the build's resident stage-1 CTAs, and
    max_blocks * block_size as the length (no host read of seq_lens)."""
    sms, _ = _device_limits()
    bs = layer.block_size
    return split_count(
        batch, layer.num_kv_heads, max_blocks * bs, bs, sms,
        _resident_ctas(func, threads, smem), tile,
    )  # fmt: skip


def plan_splits(
    layer, q_dtype: str, batch: int, q_len: int, num_heads: int, max_blocks: int,
    softcap: float | None = None,
):  # fmt: skip
    """The split count ``decode`` would pick for these shapes and soft-cap (compiles / loads
    the kernel it would run)."""
    fmt = layer.fmt
    entry, kname, _ = _STAGE1[fmt.family]
    in_define, _ = _Q_DTYPES[q_dtype]
    group = num_heads // layer.num_kv_heads
    check_row_limits(group, q_len, fmt.head_dim)
    has_cap = softcap is not None and softcap > 0
    (func, smem, threads, tile, _), _ = _stage1_default(
        fmt, entry, kname, in_define, group, q_len, has_cap
    )
    return _default_splits(layer, batch, max_blocks, func, threads, smem, tile)


class DecodeWorkspace:
    """Preallocated outputs and split partials for decodes of one fixed shape.

    Partials have a split axis of the largest split count asked for so far, allocated on
    first need (a one-split plan costs no partial memory); a DecodePlan asks once, at plan
    time, so its runs never allocate.
    """

    def __init__(self, batch: int, q_len: int, num_heads: int, head_dim: int):
        import cupy

        self.shape = (batch, q_len, num_heads, head_dim)
        self.o = cupy.empty(self.shape, dtype=cupy.float32)
        self.lse = cupy.empty(self.shape[:3], dtype=cupy.float32)
        self._partials = None

    def check(self, batch: int, q_len: int, num_heads: int, head_dim: int) -> None:
        got = (batch, q_len, num_heads, head_dim)
        if got != self.shape:
            raise ValueError(f"workspace is for q of shape {self.shape}, got {got}")

    def partials(self, num_splits: int):
        """(m, l, acc) float32 buffers (rows, S) / (rows, S, D) with S >= num_splits (the
        kernels take S as the split stride)."""
        import cupy

        num_splits = check_int("num_splits", num_splits, 1)
        if self._partials is None or self._partials[0].shape[1] < num_splits:
            rows = self.shape[0] * self.shape[1] * self.shape[2]
            self._partials = (
                cupy.empty((rows, num_splits), dtype=cupy.float32),
                cupy.empty((rows, num_splits), dtype=cupy.float32),
                cupy.empty((rows, num_splits, self.shape[3]), dtype=cupy.float32),
            )
        return self._partials


def merge_states(o, lse):
    """GPU twin of ``kvkit.cpu.merge.merge_states``: combine S partial attention results.

    Args:
        o: CuPy (S, *batch, D) floating, each part normalized over its own keys.
        lse: CuPy (S, *batch) floating, natural-log sum-exp of each part (-inf: empty).

    Returns:
        (o (*batch, D), lse (*batch)) CuPy float32; rows whose parts are all empty give
        o = 0, lse = -inf. Asynchronous on the current stream.

    Raises:
        TypeError for non-floating inputs; ValueError for mismatched shapes or S = 0.
    """
    import cupy

    for name, arr in (("o", o), ("lse", lse)):
        if not isinstance(arr, cupy.ndarray):
            raise TypeError(f"{name} must be a CuPy array, got {type(arr).__name__}")
        if arr.dtype.kind != "f":
            raise TypeError(f"{name} must be a floating array, got {arr.dtype}")
    if o.ndim < 2:
        raise ValueError(f"o must be (S, *batch, D), got shape {o.shape}")
    if lse.shape != o.shape[:-1]:
        raise ValueError(f"lse must be o.shape[:-1] = {o.shape[:-1]}, got {lse.shape}")
    parts = o.shape[0]
    if parts == 0:
        raise ValueError("merge_states needs at least one part (S >= 1)")
    batch_shape = o.shape[1:-1]
    head_dim = o.shape[-1]
    rows = math.prod(batch_shape)
    o32 = cupy.ascontiguousarray(o, dtype=cupy.float32)
    lse32 = cupy.ascontiguousarray(lse, dtype=cupy.float32)
    out = cupy.empty(batch_shape + (head_dim,), dtype=cupy.float32)
    out_lse = cupy.empty(batch_shape, dtype=cupy.float32)
    if rows == 0:
        return out, out_lse
    if parts > np.iinfo(np.int32).max:
        raise ValueError(f"too many parts: {parts}")
    kern = _merge_kernel("kv_merge_states")
    kern(
        (-(-rows // MERGE_WARPS),), (MERGE_WARPS * 32,),
        (o32, lse32, np.int64(rows), np.int32(head_dim), np.int32(parts), out, out_lse),
    )  # fmt: skip
    return out, out_lse
