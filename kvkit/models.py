"""Model-level configuration: attention shapes of public models and per-layer format policy.

``ModelConfig`` holds the numbers of a model that size its KV cache (layers, KV heads, head
dimension; query heads for decode). ``get(name)`` returns a built-in config, ``layer_formats``
applies the boundary-layer policy and returns one ``Format`` per layer, ready for
``PagedKVCache(fmts, num_layers, ...)``.

Boundary-layer policy: the first ``n`` and last ``n`` layers are stored in a higher-precision
format (default ``n = 2`` in fp16, capped at ``num_layers // 2``; ``n = 0`` disables it). The
first and last layers of a transformer are the most sensitive to KV quantization error: vLLM's
TurboQuant integration keeps its first 2 and last 2 layers unquantized by default because
without it GSM8K accuracy on Qwen3-4B drops by about 30 points for the 3-bit presets
(/work/shared/reference/FACTS.md, "TurboQuant in vLLM"). Hybrid models (attention mixed with
other layer types) would skip none; this module models plain transformers only.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import formats
from ._checks import check_int
from .formats import Format

__all__ = [
    "ModelConfig",
    "MODELS",
    "DEFAULT_BOUNDARY_LAYERS",
    "DEFAULT_BOUNDARY_FORMAT",
    "get",
    "names",
    "boundary_layer_count",
    "is_boundary_layer",
    "layer_formats",
]

#: Layers kept in ``DEFAULT_BOUNDARY_FORMAT`` at each end of the stack (capped at L // 2).
DEFAULT_BOUNDARY_LAYERS = 2
#: Format of the boundary layers (unquantized).
DEFAULT_BOUNDARY_FORMAT = "fp16"


@dataclass(frozen=True)
class ModelConfig:
    """The attention shape of a model: everything that sizes its KV cache.

    Attributes:
        name: a label, e.g. ``"llama-3.1-8b"``.
        num_layers: L, attention layers (each holds its own K and V cache).
        num_kv_heads: Hkv, key/value heads per layer (GQA groups).
        head_dim: D, elements per head vector.
        num_q_heads: Hq, query heads per layer (a multiple of Hkv); ``None`` when unknown
            (it does not affect cache size).
    """

    name: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    num_q_heads: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("name must be a non-empty string")
        check_int("num_layers", self.num_layers, 1)
        check_int("num_kv_heads", self.num_kv_heads, 1)
        check_int("head_dim", self.head_dim, 1)
        if self.num_q_heads is not None:
            check_int("num_q_heads", self.num_q_heads, 1)
            if self.num_q_heads % self.num_kv_heads:
                raise ValueError(
                    f"num_q_heads ({self.num_q_heads}) must be a multiple of "
                    f"num_kv_heads ({self.num_kv_heads})"
                )

    def layer_formats(
        self,
        fmt_name: str,
        *,
        boundary_layers: int = DEFAULT_BOUNDARY_LAYERS,
        boundary_format: str = DEFAULT_BOUNDARY_FORMAT,
        **fmt_options: object,
    ) -> list[Format]:
        """``layer_formats(self.num_layers, fmt_name, self.head_dim, ...)``."""
        return layer_formats(
            self.num_layers,
            fmt_name,
            self.head_dim,
            boundary_layers=boundary_layers,
            boundary_format=boundary_format,
            **fmt_options,
        )


# Numbers from each model's config.json on the Hugging Face Hub:
# num_hidden_layers -> num_layers, num_key_value_heads -> num_kv_heads,
# num_attention_heads -> num_q_heads, head_dim (explicit in Qwen3; otherwise
# hidden_size / num_attention_heads).
MODELS: dict[str, ModelConfig] = {
    # meta-llama/Llama-3.1-8B: num_hidden_layers 32, num_attention_heads 32,
    # num_key_value_heads 8, hidden_size 4096 -> head_dim 4096 / 32 = 128.
    "llama-3.1-8b": ModelConfig("llama-3.1-8b", 32, 8, 128, 32),
    # meta-llama/Llama-3.3-70B-Instruct: num_hidden_layers 80, num_attention_heads 64,
    # num_key_value_heads 8, hidden_size 8192 -> head_dim 8192 / 64 = 128.
    "llama-3.3-70b": ModelConfig("llama-3.3-70b", 80, 8, 128, 64),
    # Qwen/Qwen3-8B: num_hidden_layers 36, num_attention_heads 32, num_key_value_heads 8,
    # head_dim 128 (given explicitly; hidden_size 4096).
    "qwen3-8b": ModelConfig("qwen3-8b", 36, 8, 128, 32),
    # mistralai/Mistral-7B-v0.1 (and v0.3, Instruct): num_hidden_layers 32,
    # num_attention_heads 32, num_key_value_heads 8, hidden_size 4096 -> head_dim 128.
    # v0.1's 4096-token sliding window is not modelled: the planner counts full-length caches.
    "mistral-7b": ModelConfig("mistral-7b", 32, 8, 128, 32),
}


def names() -> list[str]:
    """Names of the built-in model configs."""
    return list(MODELS)


def get(name: str) -> ModelConfig:
    """A built-in model config by name, case-insensitive (``"Llama-3.1-8B"`` works).

    A Hugging Face style ``org/`` prefix is ignored (``"meta-llama/Llama-3.1-8B"``).

    Raises:
        ValueError: unknown name (the message lists the known ones).
    """
    if not isinstance(name, str):
        raise TypeError(f"model name must be a string, got {type(name).__name__}")
    key = name.strip().lower().rsplit("/", 1)[-1]
    try:
        return MODELS[key]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}") from None


def boundary_layer_count(num_layers: int, boundary_layers: int = DEFAULT_BOUNDARY_LAYERS) -> int:
    """Layers kept in the boundary format at EACH end: ``min(boundary_layers, num_layers // 2)``.

    The total number of boundary layers is twice this.
    """
    check_int("num_layers", num_layers, 1)
    check_int("boundary_layers", boundary_layers, 0)
    return min(boundary_layers, num_layers // 2)


def is_boundary_layer(
    layer: int, num_layers: int, boundary_layers: int = DEFAULT_BOUNDARY_LAYERS
) -> bool:
    """Whether layer ``layer`` (0-based) is among the first or last ``n`` layers."""
    n = boundary_layer_count(num_layers, boundary_layers)
    check_int("layer", layer, 0)
    if layer >= num_layers:
        raise ValueError(f"layer {layer} out of range for {num_layers} layers")
    return layer < n or layer >= num_layers - n


def layer_formats(
    num_layers: int,
    fmt_name: str,
    head_dim: int,
    *,
    boundary_layers: int = DEFAULT_BOUNDARY_LAYERS,
    boundary_format: str = DEFAULT_BOUNDARY_FORMAT,
    **fmt_options: object,
) -> list[Format]:
    """One ``Format`` per layer under the boundary-layer policy.

    Layers ``0 .. n-1`` and ``L-n .. L-1`` get ``boundary_format``, every other layer
    ``fmt_name``, where ``n = min(boundary_layers, num_layers // 2)`` (so at most every layer
    is a boundary layer and the two ends never overlap); ``boundary_layers=0`` gives every layer
    ``fmt_name``. Keeping the ends unquantized is what stops 3-bit presets from collapsing on
    reasoning tasks (GSM8K on Qwen3-4B drops about 30 points without it, per vLLM).

    Args:
        num_layers: L >= 1.
        fmt_name: format of the inner layers, one of ``kvkit.formats.names()``.
        head_dim: D, shared by every layer.
        boundary_layers: n, layers at each end (>= 0; default 2).
        boundary_format: format of the boundary layers (default ``"fp16"``); built without
            options.
        fmt_options: passed to ``kvkit.formats.get`` for ``fmt_name`` only (e.g. TurboQuant's
            ``rotation`` / ``codebook``).

    Returns:
        A list of ``num_layers`` formats; equal layers share one (immutable) object.
    """
    n = boundary_layer_count(num_layers, boundary_layers)
    inner = formats.get(fmt_name, head_dim, **fmt_options)
    if n == 0:
        return [inner] * num_layers
    outer = formats.get(boundary_format, head_dim)
    return [outer if (i < n or i >= num_layers - n) else inner for i in range(num_layers)]
