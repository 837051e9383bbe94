"""TurboQuant KV formats (vLLM-compatible slot layout).

One slot per token-head holds K and V: ``[K | V | pad to even]``.

K, FP8 preset (k8v4): D bytes E4M3 of k / k_scale (per-layer k_scale, default 1).
K, MSE presets: packed_bytes(D, b) bytes of codebook indices (LSB-first stream), then the
  fp16 norm (little-endian). Write, float32, this order:
    n   = sqrt(sum_squares(k))               (spec-order reduction, IEEE sqrt)
    t   = FWHT(s * k)                         (sign flip exact; spec stage order)
    den = float32(sqrt(D)) * n;  y_i = t_i / den, or 0 for every i when den == 0
    idx_i = #{ j : midpoint_j <= y_i }        (a NaN goes to index 0)
    cn  = sqrt(sum_squares(c[idx]))           (norm of the centroid vector)
    stored norm = fp16_sat(n / cn), or 0 when cn == 0
  Read: k = s * (FWHT(c[idx]) * (norm / float32(sqrt(D)))).
V: packed_bytes(D, b) bytes of codes, then fp16 scale, fp16 zero. Write, float32:
    lo = min v, hi = max v (NaN-ignoring, fminf/fmaxf)
    scale = max((hi - lo) / (2^b - 1), 1e-8)       (IEEE division)
    q_i = min(max(floor((v_i - lo) / scale + 0.5), 0), 2^b - 1)   (NaN-ignoring, so NaN -> 0)
    stored scale = fp16_sat(scale), stored zero = fp16_sat(lo)
  The codes use the float32 scale and lo; the stored fp16 values are what readers use:
  Read: v = float32(q) * scale16 + zero16 (multiply, then add; no fused multiply-add).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from . import bitpack, codebook, codecs, hadamard
from .base import Format, PlaneSpec, amax_scale, cuda_float, f32

#: Lower bound on the V scale (vLLM's), keeps constant vectors from dividing by zero.
V_SCALE_FLOOR = 1e-8
FP16_BYTES = 2

#: name -> (key kind, key bits, value bits)
PRESETS = {
    "turboquant_k8v4": ("fp8", 8, 4),
    "turboquant_4bit_nc": ("mse", 4, 4),
    "turboquant_k3v4_nc": ("mse", 3, 4),
    "turboquant_3bit_nc": ("mse", 3, 3),
}


@dataclass(frozen=True, repr=False)
class TurboQuantFormat(Format):
    name: str
    head_dim: int
    key_kind: str
    key_bits: int
    value_bits: int
    rotation: str = "signed_hadamard"
    centroids_tuple: tuple[float, ...] = field(default=(), compare=True)
    family: str = "turboquant"

    # --- layout ---------------------------------------------------------------------------
    @property
    def has_global_scales(self) -> bool:  # type: ignore[override]
        return self.key_kind == "fp8"

    @property
    def key_index_bytes(self) -> int:
        if self.key_kind == "fp8":
            return self.head_dim
        return bitpack.packed_bytes(self.head_dim, self.key_bits)

    @property
    def key_norm_offset(self) -> int:
        """Byte offset of the fp16 key norm (MSE keys only)."""
        return self.key_index_bytes

    @property
    def key_bytes(self) -> int:
        return self.key_index_bytes + (FP16_BYTES if self.key_kind == "mse" else 0)

    @property
    def value_offset(self) -> int:
        return self.key_bytes

    @property
    def value_data_bytes(self) -> int:
        return bitpack.packed_bytes(self.head_dim, self.value_bits)

    @property
    def value_scale_offset(self) -> int:
        return self.value_offset + self.value_data_bytes

    @property
    def value_zero_offset(self) -> int:
        return self.value_scale_offset + FP16_BYTES

    @property
    def slot_bytes(self) -> int:
        used = self.value_zero_offset + FP16_BYTES
        return used + (used & 1)

    @property
    def planes(self) -> dict[str, PlaneSpec]:
        return {"slots": PlaneSpec(self.slot_bytes, "uint8")}

    # --- constants (computed once, read-only: they are part of the format) -----------------
    @cached_property
    def signs(self) -> np.ndarray:
        """(D,) float32 +-1, the diagonal of the rotation."""
        return _frozen(hadamard.rotation_signs(self.head_dim, self.rotation))

    @cached_property
    def centroids(self) -> np.ndarray:
        """(2**key_bits,) float32 codebook (MSE keys); empty for FP8 keys."""
        return _frozen(np.asarray(self.centroids_tuple, dtype=np.float32))

    @cached_property
    def midpoints(self) -> np.ndarray:
        """(2**key_bits - 1,) float32 bucketing thresholds (MSE keys); empty for FP8 keys."""
        mids = codebook.midpoints(self.centroids) if self.key_kind == "mse" else np.zeros(0)
        return _frozen(mids.astype(np.float32))

    @property
    def sqrt_d(self) -> np.float32:
        return f32(math.sqrt(self.head_dim))

    # --- reference quantizer --------------------------------------------------------------
    def encode(self, k, v, k_scale=1.0, v_scale=1.0):
        k, v = self._check_kv(k, v)
        slots = np.zeros(k.shape[:-1] + (self.slot_bytes,), dtype=np.uint8)
        if self.key_kind == "fp8":
            slots[..., : self.head_dim] = codecs.e4m3_encode_array(k / f32(k_scale))
        else:
            idx, norm = self.encode_keys(k)
            slots[..., : self.key_index_bytes] = bitpack.pack_array(idx, self.key_bits)
            slots[..., self.key_norm_offset : self.key_bytes] = _f16_bytes(norm)
        codes, scale, zero = self.encode_values(v)
        o = self.value_offset
        slots[..., o : o + self.value_data_bytes] = bitpack.pack_array(codes, self.value_bits)
        slots[..., self.value_scale_offset : self.value_scale_offset + 2] = _f16_bytes(scale)
        slots[..., self.value_zero_offset : self.value_zero_offset + 2] = _f16_bytes(zero)
        return {"slots": slots}

    def encode_keys(self, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """k (..., D) float32 -> (indices (..., D) uint8, stored norm (...,) float16)."""
        with np.errstate(all="ignore"):
            n = np.sqrt(hadamard.sum_squares_array(k))
            t = hadamard.fwht_array(k * self.signs)
            den = self.sqrt_d * n
            y = np.where(den[..., None] == 0, f32(0), t / den[..., None])
            idx = (y[..., None] >= self.midpoints).sum(-1).astype(np.uint8)
            cn = np.sqrt(hadamard.sum_squares_array(self.centroids[idx]))
            ratio = np.where(cn == 0, f32(0), n / cn)
        return idx, codecs.f16_sat_array(ratio)

    def encode_values(self, v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """v (..., D) float32 -> (codes (..., D) uint8, scale16 (...,), zero16 (...,))."""
        top = f32((1 << self.value_bits) - 1)
        with np.errstate(all="ignore"):
            lo = np.fmin.reduce(v, axis=-1)
            hi = np.fmax.reduce(v, axis=-1)
            scale = np.fmax((hi - lo) / top, f32(V_SCALE_FLOOR))
            q = np.floor((v - lo[..., None]) / scale[..., None] + f32(0.5))
            q = np.fmin(np.fmax(q, f32(0)), top).astype(np.uint8)
        return q, codecs.f16_sat_array(scale), codecs.f16_sat_array(lo)

    def decode(self, planes, k_scale=1.0, v_scale=1.0):
        s = np.asarray(planes["slots"], dtype=np.uint8)
        if self.key_kind == "fp8":
            k = codecs.e4m3_decode_array(s[..., : self.head_dim]) * f32(k_scale)
        else:
            idx = bitpack.unpack_array(s[..., : self.key_index_bytes], self.head_dim, self.key_bits)
            norm = _f16_from(s[..., self.key_norm_offset : self.key_bytes])
            t = hadamard.fwht_array(self.centroids[idx])
            with np.errstate(all="ignore"):
                k = (t * (norm / self.sqrt_d)[..., None]) * self.signs
        o = self.value_offset
        q = bitpack.unpack_array(
            s[..., o : o + self.value_data_bytes], self.head_dim, self.value_bits
        )
        scale = _f16_from(s[..., self.value_scale_offset : self.value_scale_offset + 2])
        zero = _f16_from(s[..., self.value_zero_offset : self.value_zero_offset + 2])
        with np.errstate(all="ignore"):
            v = q.astype(np.float32) * scale[..., None] + zero[..., None]
        return k.astype(np.float32), v.astype(np.float32)

    def calibrate(self, x: np.ndarray) -> float:
        """FP8-key presets: amax / 448 for k_scale; MSE presets have no global scale."""
        return amax_scale(x, codecs.E4M3_MAX) if self.key_kind == "fp8" else 1.0

    def _render_cuda_defines(self):
        d = super()._render_cuda_defines()
        d.update(
            KV_FORMAT_TURBOQUANT="1",
            TQ_KEY_FP8="1" if self.key_kind == "fp8" else "0",
            TQ_KEY_BITS=str(self.key_bits),
            TQ_VALUE_BITS=str(self.value_bits),
            TQ_KEY_INDEX_BYTES=str(self.key_index_bytes),
            TQ_KEY_NORM_OFFSET=str(self.key_norm_offset),
            TQ_VALUE_OFFSET=str(self.value_offset),
            TQ_VALUE_SCALE_OFFSET=str(self.value_scale_offset),
            TQ_VALUE_ZERO_OFFSET=str(self.value_zero_offset),
            TQ_SLOT_BYTES=str(self.slot_bytes),
            TQ_V_SCALE_FLOOR=cuda_float(V_SCALE_FLOOR),
            TQ_SQRT_D=cuda_float(self.sqrt_d),
        )
        if self.key_kind == "mse":
            d["TQ_CENTROIDS"] = "{" + ",".join(cuda_float(c) for c in self.centroids) + "}"
            d["TQ_MIDPOINTS"] = "{" + ",".join(cuda_float(c) for c in self.midpoints) + "}"
            d["TQ_SIGNS"] = "{" + ",".join("1" if s > 0 else "-1" for s in self.signs) + "}"
        return d


def _frozen(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


def _f16_bytes(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype="<f2").view(np.uint8).reshape(x.shape + (2,))


def _f16_from(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view("<f2")[..., 0].astype(np.float32)


def make(name: str, head_dim: int, *, rotation: str = "signed_hadamard", codebook_=None):
    """Build a TurboQuant preset; see ``kvkit.formats.get`` for the options."""
    key_kind, key_bits, value_bits = PRESETS[name]
    if key_kind == "mse":
        if head_dim not in (64, 128, 256):
            raise ValueError(
                f"{name} needs head_dim a power of two in 64..256 (MSE keys), got {head_dim}"
            )
        if rotation not in hadamard.ROTATIONS:
            raise ValueError(f"rotation must be one of {hadamard.ROTATIONS}, got {rotation!r}")
        if codebook_ is None or (isinstance(codebook_, str) and codebook_ == "lloyd_max"):
            c = codebook.lloyd_max(key_bits, head_dim)
        elif isinstance(codebook_, str):
            raise ValueError(f"codebook must be 'lloyd_max' or an array, got {codebook_!r}")
        else:
            c = codebook.check_codebook(codebook_, key_bits)
        cents = tuple(float(x) for x in c)
    else:
        if codebook_ is not None and not (isinstance(codebook_, str) and codebook_ == "lloyd_max"):
            raise ValueError(f"{name} has FP8 keys: it takes no codebook")
        cents = ()
    return TurboQuantFormat(
        name=name,
        head_dim=head_dim,
        key_kind=key_kind,
        key_bits=key_bits,
        value_bits=value_bits,
        rotation=rotation,
        centroids_tuple=cents,
    )
