"""The functional front door: write_kv, dequantize, decode, merge_states.

The layer decides the backend: a CPU layer takes NumPy arrays and runs the Numba kernels; a
CUDA layer takes device arrays (CuPy, ``__cuda_array_interface__`` or CUDA DLPack objects such
as torch tensors, all zero-copy) and runs the NVRTC kernels. Argument shapes and dtypes are
checked on the host before anything runs, with the same errors on both backends and without a
device synchronization. Index contents (slots, block tables, seq_lens) are checked on the host
by the CPU backend, where nothing is written when a check fails; the CUDA kernels never follow
an out-of-range index, skip it and record it in ``layer.error_flag``, and ``validate=True``
synchronizes and raises the CPU backend's error for it.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from types import SimpleNamespace

import numpy as np

from .cache import CacheLayer
from .cpu import backend as cpu_backend
from .cpu.decode import decode_pages
from .cpu.merge import merge_states as _merge_states_cpu
from .cuda import plain_steps
from .cuda.arrays import as_cupy, is_device_array
from .decode_args import check_decode_args, check_decode_indices, check_decode_shapes

__all__ = ["write_kv", "dequantize", "decode", "merge_states"]

_KV_DTYPES = ("float16", "float32", "bfloat16")
_INDEX_DTYPES = ("int32", "int64")


def _dtype_name(x: object) -> str:
    return getattr(getattr(x, "dtype", None), "name", type(x).__name__)


def _host_array(name: str, x: object) -> np.ndarray:
    """The CPU backend takes NumPy arrays; a device array gets a clear error, not a copy."""
    if isinstance(x, np.ndarray):
        return x
    if is_device_array(x):
        raise TypeError(
            f"{name} is a device array, but this layer's planes live on the CPU "
            "(build the cache with backend='cuda')"
        )
    raise TypeError(f"{name} must be a NumPy array, got {type(x).__name__}")


def _meta(arr: object, dtype_name: str) -> SimpleNamespace:
    """Shape and logical dtype of a device array, for the shared host-side checks."""
    shape = tuple(arr.shape)  # type: ignore[attr-defined]
    return SimpleNamespace(shape=shape, ndim=len(shape), dtype=SimpleNamespace(name=dtype_name))


def _contiguous(name: str, arr: object) -> None:
    if not arr.flags.c_contiguous:  # type: ignore[attr-defined]
        raise ValueError(f"{name} must be C-contiguous on the GPU path (got strides {arr.strides})")


def _raise_device_errors(layer: CacheLayer, host_check) -> None:
    """validate=True: synchronize, and turn the kernels' error bits into the CPU error."""
    flag = int(layer.error_flag.get()[0])
    if flag:
        layer.error_flag.fill(0)
        host_check()
        raise RuntimeError(f"a kernel reported out-of-range indices (error bits {flag:#x})")


def _check_layer(layer: object) -> CacheLayer:
    if not isinstance(layer, CacheLayer):
        raise TypeError(
            f"layer must be a kvkit CacheLayer (cache.layer(i)), got {type(layer).__name__}"
        )
    # Scales can only be set through the validating properties, but a check here keeps the
    # "non-finite or non-positive global scale" error at the call that would use it.
    for name in ("k_scale", "v_scale"):
        s = getattr(layer, name)
        if not (math.isfinite(s) and s > 0):
            raise ValueError(f"layer.{name} must be finite and > 0, got {s}")
    return layer


def _check_kv_meta(layer: CacheLayer, k, v) -> None:
    for name, x in (("k", k), ("v", v)):
        if x.dtype.name not in _KV_DTYPES:
            raise TypeError(f"{name} must be float16, float32 or bfloat16, got {x.dtype.name}")
        if x.ndim != 3:
            raise ValueError(f"{name} must be (N, num_kv_heads, head_dim), got shape {x.shape}")
        if x.shape[1] != layer.num_kv_heads:
            raise ValueError(
                f"{name} has {x.shape[1]} KV heads, the layer has {layer.num_kv_heads}"
            )
        if x.shape[2] != layer.head_dim:
            raise ValueError(f"{name} head_dim {x.shape[2]} != the layer's {layer.head_dim}")
    if k.shape != v.shape:
        raise ValueError(f"k {k.shape} and v {v.shape} must have the same shape")


def _check_kv(layer: CacheLayer, k: object, v: object) -> tuple[np.ndarray, np.ndarray]:
    k = _host_array("k", k)
    v = _host_array("v", v)
    _check_kv_meta(layer, k, v)
    # fp16 and bf16 widen to float32 exactly, so the kernels see only float32.
    return (
        np.ascontiguousarray(k, dtype=np.float32),
        np.ascontiguousarray(v, dtype=np.float32),
    )


def _check_slots_meta(name: str, slots, n: int) -> None:
    if slots.dtype.name not in _INDEX_DTYPES:
        raise TypeError(f"{name} must be int32 or int64, got {slots.dtype.name}")
    if tuple(slots.shape) != (n,):
        raise ValueError(f"{name} must be ({n},), got shape {tuple(slots.shape)}")


def _check_slots(name: str, slots: object, n: int, capacity: int) -> np.ndarray:
    slots = _host_array(name, slots)
    _check_slots_meta(name, slots, n)
    slots = slots.astype(np.int64)
    too_big = np.flatnonzero(slots >= capacity)
    if too_big.size:
        i = int(too_big[0])
        raise ValueError(
            f"{name}[{i}] = {slots[i]} is beyond the cache (capacity {capacity} slots)"
        )
    return slots


def write_kv(
    layer: CacheLayer,
    k: np.ndarray,
    v: np.ndarray,
    slot_mapping: np.ndarray,
    *,
    validate: bool = False,
) -> None:
    """Quantize and store N token-heads into the layer's planes.

    Args:
        layer: a ``CacheLayer`` (``cache.layer(i)``).
        k, v: (N, num_kv_heads, head_dim) float16, bfloat16 or float32 (NumPy for a CPU
            layer; device arrays, C-contiguous, for a CUDA layer).
        slot_mapping: (N,) int32 or int64; slot = block * block_size + offset. Negative
            slots are padding and skipped. Non-negative slots must be < capacity and
            distinct (the CPU path checks both; the CUDA kernels skip and flag a slot beyond
            the cache, and do not check distinctness).
        validate: CUDA layers only: synchronize and raise the CPU path's error if a kernel
            met an out-of-range slot. CPU layers always validate.

    Raises:
        TypeError / ValueError naming the argument; on the CPU nothing is written when one
        is raised.
    """
    layer = _check_layer(layer)
    if layer.backend == "cuda":
        _write_kv_cuda(layer, k, v, slot_mapping, validate)
        return
    k32, v32 = _check_kv(layer, k, v)
    slots = _check_slots("slot_mapping", slot_mapping, k32.shape[0], layer.capacity)
    live = slots[slots >= 0]
    if np.unique(live).size != live.size:
        raise ValueError("slot_mapping holds the same slot twice; each token needs its own slot")
    if live.size:
        cpu_backend.write_rows(layer, k32, v32, slots)


def _write_kv_cuda(layer: CacheLayer, k, v, slot_mapping, validate: bool) -> None:
    import cupy

    from .cuda import write as cuda_write

    kc, k_dtype = as_cupy(k, "k")
    vc, v_dtype = as_cupy(v, "v")
    sc, s_dtype = as_cupy(slot_mapping, "slot_mapping")
    # As for decode (kvkit.cuda.plain_steps): a repeated signature replays its launch.
    replay_key = None
    if not validate and kc.flags.c_contiguous and vc.flags.c_contiguous and sc.flags.c_contiguous:
        replay_key = (
            "write", id(layer), cupy.cuda.runtime.getDevice(),
            cupy.cuda.get_current_stream().ptr, plain_steps.kernel_choice_env(),
            kc.shape, k_dtype, vc.shape, v_dtype, sc.shape, s_dtype,
        )  # fmt: skip
        step = plain_steps.lookup(replay_key, layer)
        if step is not None:
            step.run(cupy.cuda.get_current_stream().ptr, dict(k=kc, v=vc, slots=sc))
            return
    _check_kv_meta(layer, _meta(kc, k_dtype), _meta(vc, v_dtype))
    if k_dtype != v_dtype:
        raise TypeError(f"k and v must share one dtype on the GPU path, got {k_dtype}, {v_dtype}")
    _check_slots_meta("slot_mapping", _meta(sc, s_dtype), kc.shape[0])
    for name, arr in (("k", kc), ("v", vc), ("slot_mapping", sc)):
        _contiguous(name, arr)
    if kc.shape[0] == 0:
        return
    if validate:
        layer.error_flag.fill(0)
    record = [] if replay_key is not None and plain_steps.worth_recording(replay_key) else None
    cuda_write.write_rows(layer, kc, vc, sc, k_dtype, record=record)
    if record:
        arrays = dict(k=kc, v=vc, slots=sc)
        plain_steps.store(replay_key, plain_steps.PlainStep(layer, record, arrays))
    if validate:
        n = kc.shape[0]
        _raise_device_errors(
            layer, lambda: _check_slots("slot_mapping", sc.get(), n, layer.capacity)
        )


def dequantize(
    layer: CacheLayer, slots: np.ndarray, *, validate: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Read N token-heads back as float32, K in the original (un-rotated) space.

    Args:
        layer: a ``CacheLayer``.
        slots: (N,) int32 or int64 slot ids < capacity; a negative slot is padding and
            reads as zeros (NumPy for a CPU layer, a device array for a CUDA layer).
        validate: CUDA layers only: synchronize and raise if a slot was beyond the cache
            (the kernels read such a slot as zeros).

    Returns:
        k, v: (N, num_kv_heads, head_dim) float32 arrays of the layer's backend, global
        scales applied.
    """
    layer = _check_layer(layer)
    if layer.backend == "cuda":
        from .cuda import dequant as cuda_dequant

        sc, s_dtype = as_cupy(slots, "slots")
        n = sc.shape[0] if sc.ndim == 1 else -1
        _check_slots_meta("slots", _meta(sc, s_dtype), n)
        _contiguous("slots", sc)
        if validate:
            layer.error_flag.fill(0)
        k, v = cuda_dequant.dequantize_rows(layer, sc)
        if validate:
            _raise_device_errors(layer, lambda: _check_slots("slots", sc.get(), n, layer.capacity))
        return k, v
    arr = _host_array("slots", slots)
    n = arr.shape[0] if arr.ndim == 1 else -1
    slots64 = _check_slots("slots", arr, n, layer.capacity)
    live = slots64 >= 0
    blocks, offsets = np.divmod(slots64[live], layer.block_size)
    shape = (slots64.shape[0], layer.num_kv_heads, layer.head_dim)
    k = np.zeros(shape, np.float32)
    v = np.zeros(shape, np.float32)
    if live.any():
        k[live], v[live] = cpu_backend.dequantize_rows(layer, blocks, offsets)
    return k, v


def decode(
    q: np.ndarray,
    layer: CacheLayer,
    block_tables: np.ndarray,
    seq_lens: np.ndarray,
    *,
    scale: float | None = None,
    num_splits: int | None = None,
    return_lse: bool = False,
    window: int | None = None,
    sinks: np.ndarray | None = None,
    softcap: float | None = None,
    validate: bool = False,
):
    """Paged decode attention (split-K) over one layer's cache.

    Query i of sequence b sits at position seq_lens[b] - q_len + i and attends causally to
    the cached tokens (which already include the query tokens). Query head h reads KV head
    h // (Hq // Hkv).

    Args:
        q: (B, Hq, D) or (B, q_len, Hq, D) float16, bfloat16 or float32.
        layer: a ``CacheLayer``.
        block_tables: (B, max_blocks) int32 page ids; only the first
            ceil(seq_len / block_size) entries of a row are read.
        seq_lens: (B,) int32, q_len <= seq_len <= max_blocks * block_size.
        scale: softmax scale, default 1 / sqrt(D).
        num_splits: split-K pieces per sequence (1..kvkit.splits.MAX_SPLITS); default
            from ``kvkit.splits.choose_num_splits``.
        return_lse: also return the natural-log sum-exp of the logits (sinks included).
        window: sliding window length (tokens, the query's own included) or None.
        sinks: (Hq,) per-head sink logits (they join the softmax denominator only) or None.
        softcap: logit soft-cap c > 0: s -> c * tanh(s / c), or None.
        validate: CUDA layers only: synchronize and raise the CPU path's error if a kernel
            met an out-of-range block-table entry or seq_len (it treats them as empty).

    Returns:
        o with q's leading shape and D, float32; with return_lse also lse (q's shape
        without D) float32; arrays of the layer's backend.
    """
    layer = _check_layer(layer)
    if scale is None:
        scale = 1.0 / math.sqrt(layer.head_dim)
    if layer.backend == "cuda":
        return _decode_cuda(
            q, layer, block_tables, seq_lens, scale, num_splits, return_lse, window, sinks,
            softcap, validate,
        )  # fmt: skip
    q = _host_array("q", q)
    block_tables = _host_array("block_tables", block_tables)
    seq_lens = _host_array("seq_lens", seq_lens)
    if sinks is not None:
        sinks = _host_array("sinks", sinks)
    check_decode_args(
        q, block_tables, seq_lens,
        num_kv_heads=layer.num_kv_heads, head_dim=layer.head_dim,
        num_blocks=layer.num_blocks, block_size=layer.block_size, scale=scale,
        num_splits=num_splits, window=window, sinks=sinks, softcap=softcap,
    )  # fmt: skip
    single = q.ndim == 3
    q4 = np.ascontiguousarray(q[:, None] if single else q, dtype=np.float32)

    # Dequantize each page the batch uses once, then attend over the dense pages.
    n_pages = (seq_lens.astype(np.int64) + layer.block_size - 1) // layer.block_size
    used = np.arange(block_tables.shape[1])[None, :] < n_pages[:, None]
    pages, inverse = np.unique(block_tables[used], return_inverse=True)
    local_tables = np.zeros(block_tables.shape, np.int32)
    local_tables[used] = inverse.astype(np.int32)
    k_pages, v_pages = layer.dequantize_pages(pages)
    o, lse = decode_pages(
        q4, k_pages, v_pages, local_tables, seq_lens,
        scale=scale, num_splits=num_splits, window=window,
        sinks=None if sinks is None else sinks.astype(np.float32), softcap=softcap,
    )  # fmt: skip
    if single:
        o, lse = o[:, 0], lse[:, 0]
    return (o, lse) if return_lse else o


def _decode_cuda(
    q, layer, block_tables, seq_lens, scale, num_splits, return_lse, window, sinks, softcap,
    validate, workspace=None, record=None,
):  # fmt: skip
    import cupy

    from .cuda import decode as cuda_decode

    qc, q_dtype = as_cupy(q, "q")
    tc, t_dtype = as_cupy(block_tables, "block_tables")
    lc, l_dtype = as_cupy(seq_lens, "seq_lens")
    sc, s_dtype = (None, None) if sinks is None else as_cupy(sinks, "sinks")
    # A plain call whose signature ran before replays that call's launches (kvkit.cuda.
    # plain_steps): same checks passed, same arguments but for the per-call arrays.
    replay_key = None
    if workspace is None and record is None and not validate:
        if qc.flags.c_contiguous and tc.flags.c_contiguous and lc.flags.c_contiguous:
            device, stream = cupy.cuda.runtime.getDevice(), cupy.cuda.get_current_stream().ptr
            replay_key = (
                id(layer), device, stream, plain_steps.kernel_choice_env(),
                qc.shape, q_dtype, tc.shape, t_dtype, lc.shape, l_dtype,
                None if sc is None else (sc.shape, s_dtype), float(scale), num_splits, window,
                softcap,
            )  # fmt: skip
            step = plain_steps.lookup(replay_key, layer)
            if step is not None:
                return _replay_plain(step, qc, tc, lc, sc, return_lse)
    q_meta = _meta(qc, q_dtype)
    _, q_len, _ = check_decode_shapes(
        q_meta, _meta(tc, t_dtype), _meta(lc, l_dtype),
        num_kv_heads=layer.num_kv_heads, head_dim=layer.head_dim,
        num_blocks=layer.num_blocks, block_size=layer.block_size, scale=scale,
        num_splits=num_splits, window=window,
        sinks=None if sc is None else _meta(sc, s_dtype), softcap=softcap,
    )  # fmt: skip
    for name, arr in (("q", qc), ("block_tables", tc), ("seq_lens", lc)):
        _contiguous(name, arr)
    single = qc.ndim == 3
    q4 = qc.reshape(qc.shape[0], 1, *qc.shape[1:]) if single else qc
    sinks32 = None if sc is None else cupy.ascontiguousarray(sc, dtype=cupy.float32)
    if validate:
        layer.error_flag.fill(0)
    partials = None
    if replay_key is not None and plain_steps.worth_recording(replay_key):
        # A repeated signature: record this call, its split partials in the buffer that the
        # steps of this stream share, enqueued under the lock that keeps a step's stage 1 and
        # merge adjacent on the stream (kvkit.cuda.plain_steps).
        record = []
        partials = plain_steps.shared_partials(device, stream)
    with plain_steps.enqueue_lock if partials is not None else nullcontext():
        o, lse = cuda_decode.decode(
            q4, q_dtype, layer, tc, lc, scale=float(scale), num_splits=num_splits,
            window=window, sinks=sinks32, softcap=softcap, workspace=workspace, record=record,
            partials=None if partials is None else partials.carve,
        )  # fmt: skip
    if replay_key is not None and record:  # recorded above (a repeated signature)
        arrays = dict(q=q4, tables=tc, lens=lc, sinks=sinks32, o=o, lse=lse)
        step = plain_steps.PlainStep(layer, record, arrays, partials=partials)
        plain_steps.store(replay_key, step)
    if validate:
        _raise_device_errors(
            layer,
            lambda: check_decode_indices(
                tc.get(),
                lc.get(),
                q_len=q_len,
                num_blocks=layer.num_blocks,
                block_size=layer.block_size,
            ),  # fmt: skip
        )
    if single:
        o, lse = o[:, 0], lse[:, 0]
    return (o, lse) if return_lse else o


def _replay_plain(step, qc, tc, lc, sc, return_lse: bool):
    import cupy

    o = cupy.empty(step.o_shape, dtype=cupy.float32)
    lse = cupy.empty(step.lse_shape, dtype=cupy.float32)
    single = qc.ndim == 3
    q4 = qc.reshape(qc.shape[0], 1, *qc.shape[1:]) if single else qc
    sinks32 = None if sc is None else cupy.ascontiguousarray(sc, dtype=cupy.float32)
    arrays = dict(q=q4, tables=tc, lens=lc, o=o, lse=lse)
    if sinks32 is not None:
        arrays["sinks"] = sinks32
    step.run(cupy.cuda.get_current_stream().ptr, arrays)
    if single:
        o, lse = o[:, 0], lse[:, 0]
    return (o, lse) if return_lse else o


def merge_states(o, lse):
    """Combine S attention results over disjoint key sets (cascade / shared prefixes).

    Args:
        o: (S, *batch, D) float32, each part normalized over its own keys.
        lse: (S, *batch) float32 natural-log sum-exp of each part (-inf: empty part).

    Returns:
        o (*batch, D), lse (*batch) float32, NumPy or device arrays like the inputs.
    """
    if is_device_array(o) or is_device_array(lse):
        import cupy

        from .cuda import decode as cuda_decode

        def f32(x, name):
            arr, dtype = as_cupy(x, name)
            if dtype == "bfloat16":  # uint16 bits -> float32, exactly
                return (arr.astype(cupy.uint32) << 16).view(cupy.float32)
            return arr

        return cuda_decode.merge_states(f32(o, "o"), f32(lse, "lse"))
    return _merge_states_cpu(o, lse)
