"""DecodePlan: a decode step of fixed shape, planned once and run many times.

In the manner of FlashInfer's plan/run: everything that depends only on shapes is settled at
plan time (the split count, the compiled kernel, the output and split-partial buffers), so
``run`` launches without allocating memory or synchronizing. On a CUDA layer that makes a
decode step capturable in a CUDA graph: capture ``plan.run(q, block_tables, seq_lens)`` once,
then change the contents of those arrays (same shapes, same memory) and replay.
"""

from __future__ import annotations

import math

from ._checks import check_int
from .cache import CacheLayer
from .cuda.plain_steps import layer_launch_state
from .ops import _check_layer, _decode_cuda, decode


class DecodePlan:
    """A reusable decode step for q of shape (batch, q_len, num_heads, D).

    Args:
        layer: the ``CacheLayer`` to decode (CPU or CUDA).
        batch, num_heads, max_blocks: B, Hq and the block-table width the step will get.
        q_len: queries per sequence (default 1; ``run`` also accepts (B, Hq, D) then).
        q_dtype: "float16", "bfloat16" or "float32": the query dtype ``run`` will get.
        scale, num_splits, window, sinks, softcap: as in ``kvkit.decode``; ``num_splits``
            None picks the same count ``kvkit.decode`` would for max_blocks * block_size.

    On a CUDA layer the first ``run`` records its kernel launches; later runs with CuPy
    arrays of the same shapes, dtypes and device (C-contiguous) on an unchanged layer (same
    planes, error flag and global scales) replay them through the driver with only the q,
    block_tables and seq_lens pointers rewritten, skipping the argument checks and
    conversions of ``kvkit.decode``; any other call (and ``validate=True``) takes the full
    path, which also re-records.

    Attributes:
        num_splits: the split count every run uses (CUDA layers; None on the CPU).
        o, lse: CUDA layers: the float32 buffers each run writes, (B, q_len, Hq, D) and
            (B, q_len, Hq); ``run`` returns views of them, overwritten by the next run.
    """

    def __init__(
        self,
        layer: CacheLayer,
        batch: int,
        num_heads: int,
        max_blocks: int,
        *,
        q_len: int = 1,
        q_dtype: str = "float16",
        scale: float | None = None,
        num_splits: int | None = None,
        window: int | None = None,
        sinks=None,
        softcap: float | None = None,
    ):
        self.layer = _check_layer(layer)
        for name, value in (("batch", batch), ("num_heads", num_heads),
                            ("max_blocks", max_blocks), ("q_len", q_len)):  # fmt: skip
            check_int(name, value, 1)
        if num_heads % layer.num_kv_heads:
            raise ValueError(f"num_heads {num_heads} is not a multiple of {layer.num_kv_heads}")
        if q_dtype not in ("float16", "bfloat16", "float32"):
            raise ValueError(f"q_dtype must be float16, bfloat16 or float32, got {q_dtype!r}")
        self.shape = (batch, q_len, num_heads, layer.head_dim)
        self.q_dtype = q_dtype
        self.scale = 1.0 / math.sqrt(layer.head_dim) if scale is None else scale
        self.window, self.sinks, self.softcap = window, sinks, softcap
        self.num_splits = num_splits
        self.workspace = None
        self._prepared = None  # CUDA: the launches of the last full run, packed
        if layer.backend == "cuda":
            from .cuda import decode as cuda_decode

            if num_splits is None:
                self.num_splits = cuda_decode.plan_splits(
                    layer, q_dtype, batch, q_len, num_heads, max_blocks, softcap
                )
            if sinks is not None:  # converted once here: run must not allocate
                import cupy

                from .cuda.arrays import as_cupy

                self.sinks = cupy.ascontiguousarray(as_cupy(sinks, "sinks")[0], dtype=cupy.float32)
            self.workspace = cuda_decode.DecodeWorkspace(batch, q_len, num_heads, layer.head_dim)
            if self.num_splits > 1 or sinks is not None:
                # Allocate now: none may happen inside a capture.
                self.workspace.partials(self.num_splits)

    @property
    def o(self):
        return None if self.workspace is None else self.workspace.o

    @property
    def lse(self):
        return None if self.workspace is None else self.workspace.lse

    def run(self, q, block_tables, seq_lens, *, return_lse: bool = False, validate: bool = False):
        """One decode step; arguments and result as ``kvkit.decode``'s.

        q must have the planned shape ((B, q_len, Hq, D), or (B, Hq, D) when q_len is 1) and
        dtype; block_tables (B, max_blocks) int32 and seq_lens (B,) int32 the planned B.
        """
        opts = dict(window=self.window, sinks=self.sinks, softcap=self.softcap)
        if self.workspace is None:
            return decode(q, self.layer, block_tables, seq_lens, scale=self.scale,
                          num_splits=self.num_splits, return_lse=return_lse,
                          validate=validate, **opts)  # fmt: skip
        shape = tuple(q.shape)
        if shape not in (self.shape, self.shape[:1] + self.shape[2:]) or (
            len(shape) == 3 and self.shape[1] != 1
        ):
            raise ValueError(f"q must have the planned shape {self.shape}, got {shape}")
        if (
            not validate
            and self._prepared is not None
            and self._prepared.matches(self.layer, q, block_tables, seq_lens)
        ):
            self._prepared.launch(q, block_tables, seq_lens)
            o, lse = self.workspace.o, self.workspace.lse
            if len(shape) == 3:
                o, lse = o[:, 0], lse[:, 0]
            return (o, lse) if return_lse else o
        record = None if validate else []
        out = _decode_cuda(
            q, self.layer, block_tables, seq_lens, self.scale, self.num_splits, return_lse,
            self.window, self.sinks, self.softcap, validate, workspace=self.workspace,
            record=record,
        )  # fmt: skip
        if record:
            self._prepared = _PreparedStep(self.layer, record, q, block_tables, seq_lens)
        return out


class _PreparedStep:
    """The launches of one full CUDA run of a plan, packed (``kvkit.cuda.launch``), and the
    conditions under which replaying them with new q / block_tables / seq_lens pointers is
    the same computation: CuPy arrays of the recorded shapes, dtypes and device,
    C-contiguous, and an unchanged layer. Anything else takes the full path again."""

    def __init__(self, layer, record, q, block_tables, seq_lens):
        from .cuda import decode as cuda_decode
        from .cuda.launch import PreparedLaunch

        self.launches = [PreparedLaunch(k, g, b, a, sm) for k, g, b, a, sm in record]
        self._args = (cuda_decode.STAGE1_Q_ARG, cuda_decode.STAGE1_TABLES_ARG,
                      cuda_decode.STAGE1_LENS_ARG)  # fmt: skip
        stage1 = self.launches[0]
        for index, array in zip(self._args, (q, block_tables, seq_lens)):
            # The recorded run used these arrays' memory (or, for non-contiguous inputs,
            # copies of it: then no prepared step, the full path keeps converting).
            if getattr(getattr(array, "data", None), "ptr", None) != stage1.slot_value(index):
                self.launches = None
                break
        self._inputs = tuple((type(a), a.shape, a.dtype) for a in (q, block_tables, seq_lens))
        self._device = q.data.device_id
        self._state = layer_launch_state(layer)
        self._current_device = None  # cupy.cuda.runtime.getDevice, bound on first use

    def matches(self, layer, q, block_tables, seq_lens) -> bool:
        if self.launches is None:
            return False
        if self._current_device is None:
            import cupy

            self._current_device = cupy.cuda.runtime.getDevice
        if self._current_device() != self._device:  # the driver launches in the current one
            return False
        for (kind, shape, dtype), a in zip(self._inputs, (q, block_tables, seq_lens)):
            if type(a) is not kind or a.shape != shape or a.dtype != dtype:
                return False
            if not a.flags.c_contiguous or a.data.device_id != self._device:
                return False
        return layer_launch_state(layer) == self._state

    def launch(self, q, block_tables, seq_lens) -> None:
        import cupy

        stage1 = self.launches[0]
        for index, array in zip(self._args, (q, block_tables, seq_lens)):
            stage1.set_pointer(index, array)
        stream = cupy.cuda.get_current_stream().ptr
        for prepared in self.launches:
            prepared(stream)
