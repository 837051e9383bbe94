"""CUDA quantize-on-write launcher: one fused kernel per format family.

``write_rows(layer, k, v, slots, in_dtype)`` scatters N tokens into a layer whose planes are
CuPy arrays. It launches on the current CuPy stream and never synchronizes: a slot beyond the
cache is skipped by the kernel and recorded in ``layer.error_flag`` (bit 1); negative slots
are padding. Kernels and their launch shapes:

========================  ========================  ==========================================
format family             kernel (entry)            launch
========================  ========================  ==========================================
fp16, bf16, fp8_e4m3      ``kvkit_write_dense``     1 thread per (token, head, 8 elements),
                          (write_dense.cu)          256 threads per CTA
nvfp4, nvfp4_4over6       ``kvkit_write_nvfp4``     1 thread per (token, head, 2 16-blocks;
                          (write_nvfp4.cu)          see nvfp4_blocks_per_thread), 128 threads
                                                    per CTA
turboquant_*              ``kvkit_write_turboquant``  4 (token, head) rows per warp (MSE keys;
                          (write_turboquant.cu)     2 at D = 512) or 2 (FP8 keys), 4 warps per
                                                    CTA (see tq_rows_per_warp, tq_warps)
========================  ========================  ==========================================

Defines: ``fmt.cuda_defines()`` + ``KV_IN_DTYPE`` (0 float32, 1 float16, 2 bfloat16 bits as
uint16) + ``KV_SLOT_T`` (``int`` / ``long long`` from the slot dtype).
"""

from __future__ import annotations

import os
from functools import cache
from typing import TYPE_CHECKING

import numpy as np

from ..formats import DenseFormat, Format, FP8Format, NVFP4Format, TurboQuantFormat
from ..formats.arch_models import (
    BKT_MAGIC,
    BKT_MAGIC_BITS,
    TQ_NEAR_KEY,
    TQ_NEAR_VALUE,
    TQ_V5_NUDGE,
    tq_bucket_table,
    tq_near_table_ok,
)
from ..formats.base import cuda_float
from .compiler import get_kernel
from .launch import launch_and_record

if TYPE_CHECKING:
    from ..cache import CacheLayer

#: in_dtype name -> (KV_IN_DTYPE code, the CuPy dtype the array must have).
IN_DTYPES = {"float32": ("0", "float32"), "float16": ("1", "float16"), "bfloat16": ("2", "uint16")}
SLOT_TYPES = {"int32": "int", "int64": "long long"}

# Launch shapes; the kernels' __launch_bounds__ match these (see the .cu files for why).
DENSE_THREADS = 256
DENSE_CHUNK = 8
NVFP4_THREADS = 128
NVFP4_BLOCK = 16
#: Warps per CTA of ``kvkit_write_turboquant`` unless ``KVKIT_WRITE_TQ_WARPS`` says otherwise
#: (tq_warps; the TurboQuant dequantize kernel has its own count, also 4).
TQ_WARPS = 4
#: The counts the write kernel builds with (``KVKIT_WRITE_TQ_WARPS``, A/B sweeps).
TQ_WARPS_CHOICES = (2, 4, 6, 8)


def tq_warps() -> int:
    """Warps per CTA of ``kvkit_write_turboquant`` (its ``TQ_WARPS`` define): 4, or
    ``KVKIT_WRITE_TQ_WARPS`` (TQ_WARPS_CHOICES) for A/B sweeps. The CTA's shared tables are
    filled once per CTA behind one barrier, so more warps share that fill; tq_min_ctas scales
    its CTA caps by 4 / warps to keep the warps per SM (and so the register cap) the same.
    Measured on the H200 (session 22, scripts/write_ab.py, 8 rounds, 4M token-heads of fp16,
    pages; ms per call, warps 4 / 6 / 8 / 2): 4bit_nc 1.238 / 1.237 / 1.283 / 1.263, 3bit_nc
    1.168 / 1.178 / 1.205 / 1.180, k3v4_nc 1.156 / 1.170 / 1.196 / 1.177, k8v4 0.969 / 0.977 /
    0.983 / 0.976: 6 level with 4, 8 and 2 slower (the write is issue-bound; the tables' barrier
    is not what it waits for), so 4 stays."""
    override = _env_int("KVKIT_WRITE_TQ_WARPS", TQ_WARPS_CHOICES)
    return TQ_WARPS if override is None else override


def nvfp4_blocks_per_thread(fmt: NVFP4Format, in_dtype: str) -> int:
    """16-element blocks per thread of ``kvkit_write_nvfp4`` (its ``KV_NVFP4_BPT`` define) for
    the KV_IN_DTYPE code ``in_dtype``: 2 where D / 16 is even (the index math, slot load and
    plane addresses serve two blocks of K and two of V), else 1; also 1 for 4over6 with float32
    inputs (their words spill under its register cap). The kernel's default is the same rule.
    2 takes more registers (fp16 inputs at sm_90: 72 instead of 59, 28 warps per SM instead of
    32); ``KVKIT_WRITE_NVFP4_BPT=1`` lowers it for A/B sweeps on a GPU."""
    if (fmt.head_dim // NVFP4_BLOCK) % 2 or (fmt.four_over_six and in_dtype == "0"):
        return 1
    override = _env_int("KVKIT_WRITE_NVFP4_BPT", (1, 2))
    return 2 if override is None else override


#: ``kvkit_write_nvfp4``'s 4over6 decision (its ``KV_NVFP4_46_VARIANT`` define;
#: KVKIT_WRITE_NVFP4_46_VARIANT). 0: session 10's fast block, both candidates' squared errors in
#: the spec's order (five instructions per element and candidate after the magnitude). 1
#: (default): the errors by two fused multiply-adds per element and candidate, within a proven
#: 2^-14 den^2 of the spec's (write_nvfp4.cu kv_nvfp4_46_sure), deciding wherever the two differ
#: by more than KV_NVFP4_46_MARGIN (den4^2 + den6^2); the rest (about 5 blocks in 10^4 on
#: Gaussian data: one warp in 15 runs it for one block) computes the spec's errors. Equal bytes
#: (kvkit.formats.arch_models nvfp4_46_fast_choice, tests/formats/test_nvfp4_46_model.py; the GPU
#: write tests compare both variants with the Numba backend). Static common path per K/V block
#: pair (fp16, D = 128, sm_90, scripts/sass_write.py): 1104 -> 944 instructions. Unmeasured.
NVFP4_46_VARIANTS = (0, 1)
NVFP4_46_VARIANT_DEFAULT = 1


#: The NVFP4 and TurboQuant writes' load order (their ``KV_WRITE_EARLY`` define;
#: KVKIT_WRITE_EARLY_LOADS): 1 issues a row's K / V loads beside its slot's load (and, in the
#: TurboQuant kernel, stages the shared tables while they are in flight); 0 keeps them behind the
#: slot's test and the tables' barrier, a memory round trip later. The same bytes either way.
#: Measured on the H200 (session 19, scripts/write_ab.py, 6 rounds, 4M token-heads of fp16, ms
#: per call 0 -> 1): 4bit_nc 1.209 -> 1.169, 3bit_nc 1.208 -> 1.189, k3v4_nc 1.194 -> 1.180,
#: nvfp4 0.734 -> 0.722, nvfp4_4over6 1.311 -> 1.311 (issue-bound), k8v4 0.941 -> 0.958 (FP8
#: keys, 16 CTAs of two-row warps per SM: no gain, so 0 there).
WRITE_EARLY_LOADS = (0, 1)


def write_early_loads(fmt: Format) -> int:
    """``KV_WRITE_EARLY`` of the NVFP4 and TurboQuant write kernels for ``fmt``:
    KVKIT_WRITE_EARLY_LOADS (0 or 1) when set, else 1 except for FP8-key TurboQuant presets."""
    override = _env_int("KVKIT_WRITE_EARLY_LOADS", WRITE_EARLY_LOADS)
    if override is not None:
        return override
    return 0 if isinstance(fmt, TurboQuantFormat) and fmt.key_kind == "fp8" else 1


def nvfp4_launch_defines(fmt: NVFP4Format, in_dtype: str) -> dict[str, str]:
    """The launch defines of ``kvkit_write_nvfp4`` beyond ``fmt.cuda_defines()`` for the
    KV_IN_DTYPE code ``in_dtype``: ``KV_NVFP4_BPT`` (nvfp4_blocks_per_thread),
    ``KV_WRITE_EARLY`` (write_early_loads), for 4over6 ``KV_NVFP4_46_VARIANT``
    (NVFP4_46_VARIANTS; plain NVFP4 builds do not depend on it), and
    ``KV_WRITE_NVFP4_MIN_CTAS`` only where ``KVKIT_WRITE_NVFP4_MIN_CTAS`` (1..16) is set."""
    d = {"KV_NVFP4_BPT": str(nvfp4_blocks_per_thread(fmt, in_dtype)),
         "KV_WRITE_EARLY": str(write_early_loads(fmt))}  # fmt: skip
    # The launch bounds' minimum CTAs (write_nvfp4.cu KV_WRITE_NVFP4_MIN_CTAS: 6 for 4over6,
    # else 1) for A/B sweeps only: ptxas caps the registers to fit, so check the build spills
    # nothing (4over6 at 8 spills with two blocks a thread on sm_90, not with one). Measured on
    # the H200 (session 22, scripts/write_ab.py, 8 rounds, 4over6 ms per call): default 1.267,
    # KVKIT_WRITE_NVFP4_BPT=1 1.272, BPT=1 with 8 CTAs (64 registers) 1.247: -1.5%, inside the
    # runs' spread (min-max 1.21-1.58), so the defaults stay.
    ctas = _env_int("KVKIT_WRITE_NVFP4_MIN_CTAS", range(1, 17))
    if ctas is not None:
        d["KV_WRITE_NVFP4_MIN_CTAS"] = str(ctas)
    if fmt.four_over_six:
        override = _env_int("KVKIT_WRITE_NVFP4_46_VARIANT", NVFP4_46_VARIANTS)
        d["KV_NVFP4_46_VARIANT"] = str(NVFP4_46_VARIANT_DEFAULT if override is None else override)
    return d


#: TurboQuant write launch choices measured on an H200 (sm_90) at 4M token-heads, fp16 inputs,
#: D = 128 (BENCHMARKS.md session 9, scripts/write_sweep.sh): the write waits on latency, so
#: rows in flight per SM beat instructions per row. MSE keys: 4 rows per warp with registers
#: capped for 8 CTAs (64 registers, 128 rows per SM) beat 6 CTAs (80 registers) by 7-9%; with
#: the inputs loaded beside the slot (KV_WRITE_EARLY, session 19, scripts/write_ab.py, 8 rounds)
#: 9 CTAs (56 registers) beat 8 by 1.8% (4bit_nc), 3.9% (3bit_nc), 3.1% (k3v4_nc); 10 (48
#: registers) by 2.0 / 2.9 / 0.8%; 2 rows per warp at 12 or 16 CTAs lost 15-26%.
#: FP8 keys (k8v4): 2 rows per warp at 16 CTAs (32 registers) beat 4 rows at 6 CTAs by 25%.
#: On other targets these caps spill a few bytes somewhere (ptxas: sm_80 / sm_86 / sm_120a
#: for MSE at 8, sm_80 / sm_90 for bf16 inputs of k8v4 at 16), so they get the next setting
#: that builds clean everywhere (unmeasured there: no such GPU here).
_TQ_MIN_CTAS_MSE = 6  # every target: 80 registers, no spill
_TQ_MIN_CTAS_MSE_SM90 = 9  # session 19, variant 5 under KV_WRITE_EARLY: 56 registers, no spill
_TQ_MIN_CTAS_MSE_SM90_BEFORE_V5 = 8  # variants 0-4 (A/B builds): variant 4 spills at 9
_TQ_MIN_CTAS_FP8K = 8  # every target, both 16-bit inputs: <= 48 registers, no spill
_TQ_MIN_CTAS_FP8K_SM90_F16 = 16


def tq_rows_per_warp(fmt: TurboQuantFormat) -> int:
    """Rows (token, head) per warp of ``kvkit_write_turboquant`` (its ``TQ_RPW`` define).

    MSE keys: 4, or 2 when a lane's share of a row, ceil(D / 32) floats per spec lane, exceeds
    8 (D = 512), where 4 rows would not fit in registers. FP8 keys: 2 (more warps per SM at
    fewer registers; see _TQ_MIN_CTAS_FP8K_SM90_F16). The kernel also builds with 8
    (row-uniform work and one FWHT shuffle stage shared by 8 rows: 947 instead of 1126 static
    warp instructions per 4 rows, turboquant_4bit_nc at sm_90), but at the 128 registers that
    needs (16 warps per SM) it measured slower on the H200 than 4 rows at 80 registers with 6
    CTAs per SM (24 warps): 2.55 vs 1.88 ms for 4M token-heads of 4bit_nc (BENCHMARKS.md,
    session 8): the write waits on latency at that occupancy. (8 also needs every packing
    group of code pieces within a row's 4 lanes, kv_tq_store_codes: not 3-bit codes at
    D = 64.) ``KVKIT_WRITE_TQ_RPW`` (1, 2 or 4) lowers the count for tuning sweeps."""
    e = -(-fmt.head_dim // 32)
    rows = 4 if e <= 8 and fmt.key_kind != "fp8" else 2
    override = _env_int("KVKIT_WRITE_TQ_RPW", (1, 2, 4))
    return rows if override is None else min(rows, override)


def tq_min_ctas(
    fmt: TurboQuantFormat, in_dtype: str, variant: int | None = None
) -> tuple[int, int]:
    """The minimum CTAs per SM in ``kvkit_write_turboquant``'s launch bounds: (every target but
    sm_90, sm_90), the ``TQ_MIN_CTAS`` and ``TQ_MIN_CTAS_SM90`` defines (the kernel picks by
    its arch, common/arch.cuh KVKIT_ARCH).

    16-bit inputs at D <= 128: the measured settings above (_TQ_MIN_CTAS_*; the codebook
    presets' sm_90 value is 9 for write variant 5, the default, and 8 for the variants before
    it, which spill at 9). Otherwise 1 (no cap): float32 inputs (twice the registers of V
    words) and D > 128 (up to 32 floats per lane and row) spill under any cap that raises
    occupancy (seen on sm_86 and sm_120a).
    ``KVKIT_WRITE_TQ_MIN_CTAS`` (1..32) sets both for tuning sweeps (ptxas caps the
    registers to fit; check the build for spills). The measured caps are for TQ_WARPS warps a
    CTA; with ``KVKIT_WRITE_TQ_WARPS`` (tq_warps) they are scaled to the same warps per SM,
    rounded down so the register cap per thread does not fall. ``variant``: tq_variant(fmt),
    when the caller has it."""
    override = _env_int("KVKIT_WRITE_TQ_MIN_CTAS", range(1, 33))
    if override is not None:
        return override, override
    if fmt.head_dim > 128 or in_dtype == "0":
        return 1, 1
    if fmt.key_kind == "fp8":
        sm90 = _TQ_MIN_CTAS_FP8K_SM90_F16 if in_dtype == "1" else _TQ_MIN_CTAS_FP8K
        others = _TQ_MIN_CTAS_FP8K
    else:
        variant = tq_variant(fmt) if variant is None else variant
        sm90 = _TQ_MIN_CTAS_MSE_SM90 if variant >= 5 else _TQ_MIN_CTAS_MSE_SM90_BEFORE_V5
        others = _TQ_MIN_CTAS_MSE
    warps = tq_warps()
    return tuple(max(1, c * TQ_WARPS // warps) for c in (others, sm90))


def _env_int(name: str, allowed) -> int | None:
    """A tuning override from the environment (sweeps on a GPU, like KVKIT_DECODE_STAGE_KB):
    None when unset; a ValueError names the allowed values otherwise."""
    text = os.environ.get(name, "")
    if not text:
        return None
    if not text.isdigit() or int(text) not in allowed:
        raise ValueError(f"{name}={text!r}: want one of {list(allowed)}")
    return int(text)


#: ``kvkit_write_dense`` bodies (write_dense.cu KV_DENSE_FAST), picked by
#: ``KVKIT_WRITE_DENSE_VARIANT``. 0: the session-9 body (one chunk per thread, K then V,
#: __fdiv_rn per fp8 element). 1 (default): the fast body (K and V loads first, host magic
#: numbers, 32 registers; fp8 with float16 inputs: the fast chunk, 537 -> 296 instructions per
#: thread on sm_90's common path, scripts/sass_write.py; its fp8 arithmetic is checked against
#: the spec on the CPU, tests/formats/test_fp8_fast_chunk.py, and against the Numba bytes on
#: the GPU). Measured on the H200 (session 10, scripts/write_ab.py, 4M token-heads, page-ordered
#: slots): fp8 1.273 -> 0.837 ms, fp16 1.154 -> 1.112, bf16 1.225 -> 1.077. fp8 with float32 /
#: bfloat16 inputs keeps body 0 under variant 1 (no fast chunk for them, and their loads-first
#: words spill at 32 registers). Two chunks per thread (KV_DENSE_CPT=2, 234 instructions per
#: chunk pair) spill 16 bytes at 32 registers on sm_90: not offered.
DENSE_VARIANTS = (0, 1)
DENSE_VARIANT_DEFAULT = 1


def dense_launch_defines(fmt: Format, in_dtype: str) -> dict[str, str]:
    """The launch defines of ``kvkit_write_dense`` beyond ``fmt.cuda_defines()`` for the
    KV_IN_DTYPE code ``in_dtype``: ``KV_DENSE_FAST`` and ``KV_DENSE_CPT`` (DENSE_VARIANTS)."""
    override = _env_int("KVKIT_WRITE_DENSE_VARIANT", DENSE_VARIANTS)
    fast = DENSE_VARIANT_DEFAULT if override is None else override
    if isinstance(fmt, FP8Format) and in_dtype != "1":
        fast = 0
    return {"KV_DENSE_FAST": str(fast), "KV_DENSE_CPT": "1"}


#: ``kvkit_write_turboquant`` variants (its ``TQ_VARIANT`` define; KVKIT_WRITE_TQ_VARIANT):
#: 0 as session 9 (fp16 inputs widened with the NaN-payload test, row / slot split by IEEE-free
#: but full 32-bit divisions); 1: fp16 inputs widened by the bare hardware conversion (every
#: TurboQuant byte depends on an input NaN only through its NaN-ness: the codes compare, the
#: fp16 norm / scale / zero write every NaN as 0x7E00) and the row / slot split by the host's
#: magic numbers (udiv_magic); 2 (default) = 1 plus key buckets and value codes decided from a
#: product by the row's reciprocal, with the exact division only for a lane that has an element
#: near a decision boundary (kvkit.formats.arch_models tq_near_key_index / tq_near_value_codes,
#: where the proof is; tests/formats/test_tq_near_models.py; the GPU write tests compare its
#: bytes with the Numba backend's, natively and through sm_80). Measured on the H200 (session
#: 10, scripts/write_ab.py, 4M token-heads, page-ordered slots), variant 0 / 1 / 2 ms: 4bit_nc
#: 1.558 / 1.468 / 1.379, 3bit_nc 1.768 / 1.681 / 1.569, k3v4 1.636 / 1.770 / 1.429, k8v4
#: 1.350 / 1.458 / 1.240 (variant 1's k3v4 / k8v4 runs spread over 1.26-2.01 ms).
#: 3 (default since session 11) = 2 with cheaper near decisions: key cells from a
#: saturating fma of t (no clamp, no product yq), the key comparison by the sign of one fma
#: RN(mid - t r) (arch_models.tq_near_key_index_v3; cells without a midpoint hold +inf, not
#: NaN), value codes as rint(a r) from one fma with the 1.5 * 2^23 magic and the near test on
#: RN(a r - rint(a r)) (tq_near_value_codes_v3), codes packed by shifted adds of the fma's bit
#: patterns (tq_pack_magic_codes), and the rotation signs XORed into the input words before
#: widening (two integer instructions per word instead of a select and a multiply per element).
#: Measured on the H200 (session 11, write_ab.py, same settings), variant 2 / 3 ms over 6
#: rounds: 4bit_nc 1.384 / 1.246, k3v4 1.446 / 1.316, k8v4 1.253 / 1.195; over 3 rounds 3bit_nc
#: 1.539 / 1.433. The GPU write tests passed under it natively and through sm_80.
#: 4 (session 11 helper) = 3 with 3-bit codes packed by windows
#: (write_turboquant.cu kv_tq_store_codes_window, arch_models.tq_window_units): where a plane's
#: 16-bit units each lie in two neighbouring lanes' pieces (3-bit codes at D = 128 / 256, 4-bit
#: at D = 64), one 32-bit shuffle down, a shifted add and a shift per row piece replace the
#: butterfly shuffles of 64-bit pieces; and the rare exact key fallback divides in place
#: (__fdiv_rn, the same bits as kv_div_by, no quotient array: no spill). Static common path
#: (sm_90, fp16, D = 128, per warp): 3bit_nc 1064 -> 901, k3v4 973 -> 891; 4bit_nc and k8v4
#: unchanged (868, 456). benchmarks/NOTES.md "tqw4". Every variant tests a row's zero
#: extremes warp-uniformly (__any_sync) before its full-mask shuffles: the per-row test was
#: undefined in warps that mix padding rows with others (it broke variant 4 on the H200).
#: Variant 4 measured faster than 3 for 3bit_nc only (session 11, call 7, scripts/write_ab.py
#: --rounds 4 kernel ms 3bit_nc 1.396 -> 1.283; k3v4 within the noise).
#: 5 (session 14 helper, branch tqw6) = 4 plus:
#: FP8 keys of float16 inputs by the dense fp8 write's fast chunk where k_scale is in
#: [2^-16, 2^16] and a lane's halves are finite (one float16x2 fma per word tests that), with one
#: multiply per element for a power-of-two k_scale such as the default 1 (any input dtype);
#: value codes from two fmas with the scale's rcp.approx nudged by +-2^-17 (equal results are
#: the near test, arch_models.tq_near_value_codes_v5); the value min / max of float16 words by
#: min / max.f16x2; key squares by one IMAD on the code (the table's (x, dl) fields,
#: _tq_bucket_defines imad_squares); the slot's float16 scalars by cvt.rn.satfinite; the sign
#: words by IMAD with immediates. Static common path (sm_90, fp16, D = 128, scripts/
#: sass_write_tq.py): 4bit_nc 864 -> 773, 3bit_nc 901 -> 812, k3v4 961 -> 795, k8v4 456 -> 332
#: (292 with a power-of-two k_scale). benchmarks/NOTES.md "tqw6".
TQ_VARIANTS = (0, 1, 2, 3, 4, 5)
#: The default for every preset: 5. Measured on the H200 (session 14; scripts/write_ab.py,
#: kernel ms at 4M token-heads, fp16 inputs, pages order; the previous default -> 5):
#: call 3 (--rounds 4) k8v4 1.247 -> 0.907 (k_scale 5/448), 1.211 -> 0.827 with unit scales;
#: call 8 (--rounds 12, twice) 4bit_nc 1.225 / 1.238 -> 1.197 / 1.198, 3bit_nc (from 4) 1.191 /
#: 1.213 -> 1.163 / 1.152, k3v4 1.275 / 1.289 -> 1.172 / 1.158. Its GPU write tests passed
#: natively and through sm_80 (218 + 218), memcheck clean (call 3).
TQ_VARIANT_DEFAULT = 5


def tq_variant(fmt: TurboQuantFormat) -> int:
    """``TQ_VARIANT`` of ``kvkit_write_turboquant``: the environment's KVKIT_WRITE_TQ_VARIANT
    (TQ_VARIANTS) or the default (TQ_VARIANT_DEFAULT); 2 and above fall back to 1 for MSE
    keys without a cell table (the near decisions need one) or whose table fails
    ``tq_near_table_ok``."""
    override = _env_int("KVKIT_WRITE_TQ_VARIANT", TQ_VARIANTS)
    v = TQ_VARIANT_DEFAULT if override is None else override
    if v >= 2 and fmt.key_kind == "mse":
        table = tq_bucket_table(fmt.midpoints, fmt.centroids)
        if table is None or not tq_near_table_ok(table):
            return 1
    return v


def tq_launch_defines(fmt: TurboQuantFormat, in_dtype: str) -> dict[str, str]:
    """The launch defines of ``kvkit_write_turboquant`` beyond ``fmt.cuda_defines()``:
    ``TQ_VARIANT`` (tq_variant), ``TQ_WARPS`` (tq_warps), ``TQ_RPW`` (rows per warp),
    ``TQ_MIN_CTAS`` / ``TQ_MIN_CTAS_SM90`` (for the KV_IN_DTYPE code ``in_dtype``),
    ``KV_WRITE_EARLY`` (write_early_loads), ``TQ_NEAR_VALUE`` and,
    for MSE keys whose codebook has a cell table
    (``kvkit.formats.arch_models.tq_bucket_table``), ``TQ_BKT=1``, the table and
    ``TQ_NEAR_KEY``; without one the kernel searches the midpoints."""
    variant = tq_variant(fmt)
    others, sm90 = tq_min_ctas(fmt, in_dtype, variant)
    d = {
        "TQ_VARIANT": str(variant),
        "TQ_WARPS": str(tq_warps()),
        "TQ_RPW": str(tq_rows_per_warp(fmt)),
        "TQ_MIN_CTAS": str(others),
        "TQ_MIN_CTAS_SM90": str(sm90),
        "KV_WRITE_EARLY": str(write_early_loads(fmt)),
        "TQ_NEAR_VALUE": cuda_float(TQ_NEAR_VALUE),
        "TQ_RINT_MAGIC": cuda_float(BKT_MAGIC),
        "TQ_RINT_MAGIC_BITS": f"0x{BKT_MAGIC_BITS:08X}u",
    }
    if variant >= 5:
        d["TQ_V5_NUDGE"] = cuda_float(TQ_V5_NUDGE)
    d.update(_tq_bucket_defines(fmt, variant >= 3, variant >= 5))
    return d


@cache
def _tq_bucket_defines(
    fmt: TurboQuantFormat, inf_gaps: bool = False, imad_squares: bool = False
) -> dict[str, str]:
    """The cell-table defines of an MSE-key format (empty without a table); cached per format,
    as the table costs host time on every write call otherwise. Callers copy, never mutate.
    inf_gaps (variant 3): a cell without a midpoint holds +inf instead of NaN, so the sign of
    RN(mid - t r) is a defined 0 there (arch_models.tq_near_key_index_v3).
    imad_squares (variant 5): the last two fields of a cell are X = bits(lo2) - base * Dl and
    Dl = bits(hi2) - bits(lo2) (uint32, mod 2^32), so the kernel's X + code * Dl is bits(lo2)
    for code = base and bits(hi2) for code = base + 1 (TQ_BKT_IMAD_SQ=1; one IMAD per key
    element instead of a comparison and a select)."""
    d: dict[str, str] = {}
    table = tq_bucket_table(fmt.midpoints, fmt.centroids) if fmt.key_kind == "mse" else None
    if table is not None:
        mid = (
            np.where(np.isnan(table.mid), np.float32(np.inf), table.mid) if inf_gaps else table.mid
        )
        mid_bits = np.asarray(mid, np.float32).view(np.uint32)
        if imad_squares:
            lo_b = [int(x) for x in np.asarray(table.sq_lo, np.float32).view(np.uint32)]
            hi_b = [int(x) for x in np.asarray(table.sq_hi, np.float32).view(np.uint32)]
            dl = [(h - lo) & 0xFFFFFFFF for lo, h in zip(lo_b, hi_b)]
            xs = [(lo - int(b) * e) & 0xFFFFFFFF for lo, b, e in zip(lo_b, table.base, dl)]
            cells = ",".join(
                f"{{0x{int(m):08X}u,{int(b)},0x{x:08X}u,0x{e:08X}u}}"
                for m, b, x, e in zip(mid_bits, table.base, xs, dl)
            )
        else:
            cells = ",".join(
                f"{{0x{int(m):08X}u,{int(b)},{cuda_float(lo)},{cuda_float(hi)}}}"
                for m, b, lo, hi in zip(mid_bits, table.base, table.sq_lo, table.sq_hi)
            )
        d.update(
            TQ_BKT="1",
            TQ_BKT_CELLS=str(table.cells),
            TQ_BKT_SCALE=cuda_float(table.scale),
            TQ_BKT_CLAMP=cuda_float(table.clamp),
            TQ_BKT_MAGIC=cuda_float(BKT_MAGIC),
            TQ_BKT_BIAS=str(BKT_MAGIC_BITS - table.half),
            TQ_BKT_UA=cuda_float(0.5 / float(table.clamp)),
            TQ_BKT_UW=cuda_float(2 * table.half),
            TQ_BKT_TABLE="{" + cells + "}",
            TQ_NEAR_KEY=cuda_float(TQ_NEAR_KEY),
        )
        if imad_squares:
            d["TQ_BKT_IMAD_SQ"] = "1"
    return d


def _family(fmt: Format) -> str:
    if isinstance(fmt, (FP8Format, DenseFormat)):
        return "dense"
    if isinstance(fmt, NVFP4Format):
        return "nvfp4"
    if isinstance(fmt, TurboQuantFormat):
        return "turboquant"
    raise TypeError(f"no CUDA kernel for {fmt!r}")


def _grid(work: int, per_cta: int) -> tuple[int]:
    return ((work + per_cta - 1) // per_cta,)


@cache
def udiv_magic(d: int) -> tuple:
    """(m, s1, s2) (uint32, int32, int32) with floor(n / d) == (t + ((n - t) >> s1)) >> s2,
    t = (m * n) >> 32, for every 32-bit n (cuda_src/common/paged.cuh kv_udiv_magic; Granlund &
    Montgomery, PLDI 1994, fig. 4.1: l = ceil(log2 d), m = floor(2**32 (2**l - d) / d) + 1).
    Cached: a layer's head count and page size repeat on every write call."""
    if not 1 <= d < 1 << 32:
        raise ValueError(f"divisor must be in [1, 2**32), got {d}")
    lg = (d - 1).bit_length()
    m = ((1 << 32) * ((1 << lg) - d)) // d + 1
    return (np.uint32(m), np.int32(min(lg, 1)), np.int32(max(lg - 1, 0)))


def plane_args(plane, name: str = "plane") -> list:
    """[plane, stride_block, stride_head, stride_token] with strides in elements (int64).

    A plane is (num_blocks, H, block_size, width) with a contiguous last axis and strides
    that are non-negative multiples of its element size (every kernel's addressing).
    """
    if plane.ndim != 4:
        raise ValueError(
            f"plane {name!r} must be (num_blocks, H, block_size, width), got {plane.shape}"
        )
    item = plane.itemsize
    strides = plane.strides
    if strides[3] != item:
        raise ValueError(f"plane {name!r}: the last axis must be contiguous, strides {strides}")
    if any(s < 0 or s % item for s in strides[:3]):
        raise ValueError(
            f"plane {name!r}: strides {strides} must be non-negative multiples of {item}"
        )
    return [plane] + [np.int64(s // item) for s in strides[:3]]


def slot_define(slots) -> str:
    name = slots.dtype.name
    if name not in SLOT_TYPES:
        raise TypeError(f"slots must be int32 or int64, got {name}")
    return SLOT_TYPES[name]


def check_slots(slots, n: int) -> None:
    if slots.shape != (n,):
        raise ValueError(f"slots must be ({n},), got {slots.shape}")
    if not slots.flags.c_contiguous:
        raise ValueError("slots must be contiguous")


def layer_head_args(layer: CacheLayer) -> list:
    return [np.int32(layer.num_kv_heads), np.int64(layer.capacity), np.int32(layer.block_size)]


def write_rows(layer: CacheLayer, k, v, slots, in_dtype: str, record: list | None = None) -> None:
    """Quantize k, v (N, H, D) into the layer's planes at ``slots`` (N,), on the current stream.

    Args:
        layer: a CacheLayer with CuPy planes ``(num_blocks, H, block_size, width)`` (strided
            views allowed, last axis contiguous) and an int32 ``error_flag`` of shape (1,).
        k, v: CuPy arrays (N, H, D), C-contiguous: float32, float16, or uint16 holding bf16
            bits (``in_dtype="bfloat16"``).
        slots: CuPy int32 or int64 (N,); negative = padding, >= capacity sets error bit 1.
        in_dtype: "float32", "float16" or "bfloat16".
        record: a list, or None; the launch is appended as ``(kernel, grid, block, args,
            shared_mem)`` (``kvkit.cuda.plain_steps`` replays it).
    """
    fmt = layer.fmt
    if in_dtype not in IN_DTYPES:
        raise ValueError(f"in_dtype must be one of {tuple(IN_DTYPES)}, got {in_dtype!r}")
    code, want = IN_DTYPES[in_dtype]
    d = fmt.head_dim
    h = layer.num_kv_heads
    for name, x in (("k", k), ("v", v)):
        if x.dtype.name != want:
            raise TypeError(f"{name} must be {want} for in_dtype={in_dtype!r}, got {x.dtype.name}")
        if x.ndim != 3 or x.shape[1:] != (h, d):
            raise ValueError(f"{name} must be (N, {h}, {d}), got {x.shape}")
        if not x.flags.c_contiguous:
            raise ValueError(f"{name} must be C-contiguous")
    if k.shape != v.shape:
        raise ValueError(f"k and v shapes differ: {k.shape} vs {v.shape}")
    n = k.shape[0]
    check_slots(slots, n)
    defines = dict(fmt.cuda_defines())
    defines["KV_IN_DTYPE"] = code
    defines["KV_SLOT_T"] = slot_define(slots)
    if n == 0:
        return
    p = layer.planes
    family = _family(fmt)
    head = [k, v, slots, np.int64(n)] + layer_head_args(layer)
    ks, vs = np.float32(layer.k_scale), np.float32(layer.v_scale)
    if family == "dense":
        defines.update(dense_launch_defines(fmt, code))
        cpt = int(defines["KV_DENSE_CPT"])
        kern = get_kernel("write_dense.cu", "kvkit_write_dense", defines)
        args = head + plane_args(p["k"]) + plane_args(p["v"]) + [ks, vs, layer.error_flag]
        args += [*udiv_magic(h), *udiv_magic(layer.block_size)]
        launch_and_record(
            record,
            kern,
            _grid(n * h * (d // (DENSE_CHUNK * cpt)), DENSE_THREADS),
            (DENSE_THREADS,),
            tuple(args),
        )
    elif family == "nvfp4":
        defines.update(nvfp4_launch_defines(fmt, code))
        bpt = int(defines["KV_NVFP4_BPT"])
        kern = get_kernel("write_nvfp4.cu", "kvkit_write_nvfp4", defines)
        planes = []
        for name in ("k_data", "k_scale", "v_data", "v_scale"):
            planes += plane_args(p[name])
        args = head + planes + [ks, vs, layer.error_flag]
        args += [*udiv_magic(h), *udiv_magic(layer.block_size)]
        launch_and_record(
            record,
            kern,
            _grid(n * h * (d // (NVFP4_BLOCK * bpt)), NVFP4_THREADS),
            (NVFP4_THREADS,),
            tuple(args),
        )
    else:
        defines.update(tq_launch_defines(fmt, code))
        rows_per_warp = int(defines["TQ_RPW"])
        warps = int(defines["TQ_WARPS"])
        kern = get_kernel("write_turboquant.cu", "kvkit_write_turboquant", defines)
        args = head + plane_args(p["slots"]) + [ks, layer.error_flag]
        args += [*udiv_magic(h), *udiv_magic(layer.block_size)]
        launch_and_record(
            record, kern, _grid(n * h, warps * rows_per_warp), (warps * 32,), tuple(args)
        )
