"""LLM-like synthetic keys, values and queries.

Real attention inputs are far from i.i.d. Gaussian, and the differences are exactly what
stresses a quantized KV cache:

* keys carry a fixed per-(head, channel) mean, and a few channels per head have a mean (and
  a spread) an order of magnitude larger than the rest ("outlier channels");
* the token-to-token variation of keys is mostly low-rank (a few directions with a decaying
  spread) plus a little isotropic noise, so the mean dominates the norm of a key;
* keys are rotated by a RoPE-like position-dependent rotation, so low-frequency channel
  pairs vary slowly and smoothly over the sequence while high-frequency pairs oscillate;
* values are centred, roughly Gaussian per channel with channel-dependent scales and mildly
  heavy (Student-t) tails;
* queries line up with the key means (so the outlier channels, which also vary from token to
  token, carry large score terms and amplify key quantization error), with the keys' shared
  content direction, and with their low-rank directions of variation, so that attention is
  peaked (a few hundred effective tokens out of thousands) rather than uniform.

One *synthetic model* is fixed by ``(num_kv_heads, head_dim, seed)`` and the shape options
(``outlier_channels``, ``outlier_scale``, ``key_offset``): the key means, outlier channels,
low-rank key directions, content directions and value scales. ``seq_id`` picks a different
sequence (different token noise) of the same model, and :func:`llm_like_queries` with the same
``seed`` and options produces queries for that model. All magnitudes stay far inside float16
range (|x| < 100).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvkit.testing.rng import derive

__all__ = ["key_outlier_channels", "llm_like_kv", "llm_like_queries"]

#: Default magnitude of an outlier channel's key mean (ordinary channels: about key_offset).
OUTLIER_SCALE = 10.0
#: Default standard deviation of the per-(head, channel) key mean on ordinary channels.
KEY_OFFSET = 1.0
#: RoPE base of the positional rotation.
ROPE_BASE = 10000.0
# Per-token key variation: a low-rank part (rank _KEY_RANK, per-direction std decaying
# geometrically from _KEY_FACTOR_STD) plus small isotropic noise. Outlier channels also spread,
# by outlier_scale / 4.
_KEY_RANK = 8
_KEY_FACTOR_STD = 4.0
_KEY_FACTOR_DECAY = 0.8
_KEY_NOISE = 0.5
# Norm of the shared pre-rotation "content" component of each head's keys.
_CONTENT_NORM = 4.0
# Value tails: Student-t degrees of freedom, and clip (in units of the channel scale).
_VALUE_DF = 6.0
_VALUE_CLIP = 12.0
# Query composition: i.i.d. part per channel, weights on the key-mean / content directions,
# and the std of its coefficients on the keys' low-rank directions.
_QUERY_NOISE = 0.5
_QUERY_MEAN_ALIGN = 3.0
_QUERY_CONTENT_ALIGN = 6.0
_QUERY_FACTOR = 6.0


@dataclass(frozen=True)
class _Model:
    key_mean: np.ndarray  # (Hkv, D) fixed per-(head, channel) key offset, outliers included
    outlier_mask: np.ndarray  # (Hkv, D) bool
    outlier_spread: float  # per-token std on outlier channels
    basis: np.ndarray  # (Hkv, D, r) orthonormal directions of the low-rank key variation
    factor_std: np.ndarray  # (r,) std of the key variation along each basis direction
    content: np.ndarray  # (Hkv, D) unit vectors, the keys' shared pre-rotation direction
    value_mean: np.ndarray  # (Hkv, D)
    value_scale: np.ndarray  # (Hkv, D)


def _check_dims(num_kv_heads: int, head_dim: int, outlier_channels: int) -> None:
    if num_kv_heads < 1:
        raise ValueError(f"num_kv_heads must be >= 1, got {num_kv_heads}")
    if head_dim < 2:
        raise ValueError(f"head_dim must be >= 2, got {head_dim}")
    if not 0 <= outlier_channels <= head_dim:
        raise ValueError(f"outlier_channels must be in [0, head_dim], got {outlier_channels}")


def key_outlier_channels(
    num_kv_heads: int, head_dim: int, *, seed: int | str = 0, outlier_channels: int = 4
) -> np.ndarray:
    """The outlier channel indices of each head: int64 array (num_kv_heads, outlier_channels),
    sorted within a head. Same model parameters as :func:`llm_like_kv`."""
    _check_dims(num_kv_heads, head_dim, outlier_channels)
    g = derive(seed, "synthetic", "outlier-channels", num_kv_heads, head_dim)
    idx = np.stack(
        [
            np.sort(g.choice(head_dim, size=outlier_channels, replace=False))
            for _ in range(num_kv_heads)
        ]
    )
    return idx.astype(np.int64).reshape(num_kv_heads, outlier_channels)


def _model(
    num_kv_heads: int,
    head_dim: int,
    seed: int | str,
    outlier_channels: int,
    outlier_scale: float,
    key_offset: float,
) -> _Model:
    h, d = num_kv_heads, head_dim
    outliers = key_outlier_channels(h, d, seed=seed, outlier_channels=outlier_channels)
    g = derive(seed, "synthetic", "model", h, d)
    key_mean = key_offset * g.standard_normal((h, d))
    # Outlier channels: mean of magnitude outlier_scale * U(0.75, 1.25), random sign.
    signs = np.where(g.random((h, outlier_channels)) < 0.5, -1.0, 1.0)
    mags = outlier_scale * g.uniform(0.75, 1.25, (h, outlier_channels))
    rows = np.arange(h)[:, None]
    key_mean[rows, outliers] = signs * mags
    mask = np.zeros((h, d), dtype=bool)
    mask[rows, outliers] = True
    r = min(_KEY_RANK, d)
    basis = np.linalg.qr(g.standard_normal((h, d, r)))[0]  # (h, d, r) orthonormal columns
    factor_std = _KEY_FACTOR_STD * _KEY_FACTOR_DECAY ** np.arange(r)
    content = g.standard_normal((h, d))
    content /= np.linalg.norm(content, axis=-1, keepdims=True)
    value_mean = 0.1 * g.standard_normal((h, d))
    value_scale = np.exp(0.3 * g.standard_normal((h, d)))
    return _Model(
        key_mean, mask, outlier_scale / 4.0, basis, factor_std, content, value_mean, value_scale
    )


def _rope(x: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """NeoX-style rotation of x (T, H, D) float64 by position: channel i pairs with i + D//2
    and turns at frequency ROPE_BASE**(-2i/D). With odd D the last channel is not rotated."""
    d = x.shape[-1]
    half = d // 2
    inv_freq = ROPE_BASE ** (-np.arange(half, dtype=np.float64) * 2.0 / (2 * half))
    ang = positions.astype(np.float64)[:, None] * inv_freq[None, :]  # (T, half)
    cos = np.cos(ang)[:, None, :]
    sin = np.sin(ang)[:, None, :]
    a = x[..., :half]
    b = x[..., half : 2 * half]
    out = x.copy()
    out[..., :half] = a * cos - b * sin
    out[..., half : 2 * half] = a * sin + b * cos
    return out


def llm_like_kv(
    n_tokens: int,
    num_kv_heads: int,
    head_dim: int,
    *,
    seed: int | str = 0,
    dtype=np.float32,
    outlier_channels: int = 4,
    outlier_scale: float = OUTLIER_SCALE,
    key_offset: float = KEY_OFFSET,
    seq_id: int = 0,
    start_pos: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Synthetic keys and values of one sequence.

    Parameters
    ----------
    n_tokens, num_kv_heads, head_dim:
        Output shape ``(n_tokens, num_kv_heads, head_dim)``.
    seed:
        Fixes the synthetic model (key means, outlier channels, value scales); int or str.
    dtype:
        Output dtype (float16, float32 or float64); computed in float64, then cast.
    outlier_channels:
        Number of outlier channels per KV head (see :func:`key_outlier_channels`).
    outlier_scale:
        Magnitude of an outlier channel's key mean (its per-token spread is a quarter of it).
    key_offset:
        Standard deviation of the per-(head, channel) key mean on ordinary channels.
    seq_id:
        Which sequence of this model: changes the token noise, not the model.
    start_pos:
        Position of the first token (for the rotary component).

    Returns
    -------
    (k, v):
        Two arrays of shape ``(n_tokens, num_kv_heads, head_dim)`` and dtype ``dtype``.
        ``k[t, h] = key_mean[h] + rope_t(c * content[h] + basis[h] @ f[t, h] + n[t, h])
        + outlier spread`` with low-rank factors f and small isotropic noise n;
        ``v[t, h] = value_mean[h] + value_scale[h] * t6[t, h]`` (Student-t, df 6, clipped).
    """
    if n_tokens < 0:
        raise ValueError(f"n_tokens must be >= 0, got {n_tokens}")
    if seq_id < 0 or start_pos < 0:
        raise ValueError("seq_id and start_pos must be >= 0")
    m = _model(num_kv_heads, head_dim, seed, outlier_channels, outlier_scale, key_offset)
    shape = (n_tokens, num_kv_heads, head_dim)
    gk = derive(seed, "synthetic", "keys", num_kv_heads, head_dim, seq_id, start_pos)
    gv = derive(seed, "synthetic", "values", num_kv_heads, head_dim, seq_id, start_pos)

    r = m.factor_std.shape[0]
    factors = gk.standard_normal((n_tokens, num_kv_heads, r)) * m.factor_std
    varying = np.einsum("hdr,thr->thd", m.basis, factors)
    varying += _KEY_NOISE * gk.standard_normal(shape)
    positions = np.arange(start_pos, start_pos + n_tokens)
    k = m.key_mean[None] + _rope(_CONTENT_NORM * m.content[None] + varying, positions)
    # Outlier channels spread on their own channel, unrotated.
    k += np.where(m.outlier_mask, m.outlier_spread, 0.0) * gk.standard_normal(shape)

    t = gv.standard_t(_VALUE_DF, shape)
    t *= np.sqrt((_VALUE_DF - 2.0) / _VALUE_DF)  # unit variance
    np.clip(t, -_VALUE_CLIP, _VALUE_CLIP, out=t)
    v = m.value_mean[None] + m.value_scale[None] * t
    return k.astype(dtype), v.astype(dtype)


def llm_like_queries(
    batch: int,
    num_heads: int,
    head_dim: int,
    *,
    seed: int | str = 0,
    q_len: int | None = None,
    num_kv_heads: int | None = None,
    dtype=np.float32,
    outlier_channels: int = 4,
    outlier_scale: float = OUTLIER_SCALE,
    key_offset: float = KEY_OFFSET,
) -> np.ndarray:
    """Queries for the synthetic model of :func:`llm_like_kv` with the same ``seed`` and options.

    Query head ``h`` reads KV head ``h // (num_heads // num_kv_heads)`` (GQA); ``num_kv_heads``
    defaults to ``num_heads``. Each query is small i.i.d. noise plus components along its KV
    head's key mean (so the outlier channels carry large score terms), the keys' content
    direction and the keys' low-rank directions of variation (so attention is peaked).

    Returns float array of dtype ``dtype``: ``(batch, num_heads, head_dim)`` when ``q_len`` is
    None, else ``(batch, q_len, num_heads, head_dim)``.
    """
    hkv = num_heads if num_kv_heads is None else num_kv_heads
    if num_heads < 1 or hkv < 1 or num_heads % hkv:
        raise ValueError(
            f"num_heads ({num_heads}) must be a positive multiple of num_kv_heads ({hkv})"
        )
    if batch < 0 or (q_len is not None and q_len < 1):
        raise ValueError("batch must be >= 0 and q_len >= 1")
    m = _model(hkv, head_dim, seed, outlier_channels, outlier_scale, key_offset)
    group = num_heads // hkv
    kv_of = np.arange(num_heads) // group
    mean_dir = m.key_mean / np.maximum(np.linalg.norm(m.key_mean, axis=-1, keepdims=True), 1e-12)
    lead = (batch,) if q_len is None else (batch, q_len)
    g = derive(seed, "synthetic", "queries", num_heads, hkv, head_dim)
    noise = g.standard_normal((*lead, num_heads, head_dim))
    # Per-(query head) weights so heads of one group differ in how peaked they are.
    w_mean = _QUERY_MEAN_ALIGN * g.uniform(0.5, 1.5, num_heads)[:, None]
    w_content = _QUERY_CONTENT_ALIGN * g.uniform(0.5, 1.5, num_heads)[:, None]
    base = w_mean * mean_dir[kv_of] + w_content * m.content[kv_of]  # (Hq, D)
    r = m.factor_std.shape[0]
    coef = _QUERY_FACTOR * g.standard_normal((*lead, num_heads, r))
    along = np.einsum("hdr,...hr->...hd", m.basis[kv_of], coef)
    q = base + along + _QUERY_NOISE * noise
    return q.astype(dtype)
