"""Zero-copy views of user device arrays as CuPy arrays.

CuPy arrays pass through; objects exposing ``__cuda_array_interface__`` or DLPack (a torch
CUDA tensor, for one) become CuPy arrays over the same memory. bfloat16 has no CuPy dtype, so
a bf16 tensor is viewed as its uint16 bits and reported with the logical name "bfloat16".
"""

from __future__ import annotations

from typing import Any

#: DLPack device type of CUDA memory (kDLCUDA).
_DLPACK_CUDA = 2


def is_device_array(x: Any) -> bool:
    """True for CuPy arrays, CUDA-array-interface objects and CUDA DLPack tensors."""
    if hasattr(x, "__cuda_array_interface__"):
        return True
    mod = type(x).__module__
    if mod.startswith("cupy"):
        return True
    if mod.startswith("torch"):
        return bool(getattr(x, "is_cuda", False))
    dev = getattr(x, "__dlpack_device__", None)
    if dev is not None:
        try:
            return int(dev()[0]) == _DLPACK_CUDA
        except Exception:
            return False
    return False


def as_cupy(x: Any, name: str):
    """(cupy array over x's memory, logical dtype name). Raises TypeError for host arrays."""
    import cupy

    if isinstance(x, cupy.ndarray):
        return x, x.dtype.name
    if type(x).__module__.startswith("torch"):
        import torch

        if not x.is_cuda:
            raise TypeError(f"{name} is a CPU torch tensor, but the layer lives on the GPU")
        if x.dtype == torch.bfloat16:
            return cupy.from_dlpack(x.view(torch.int16)).view(cupy.uint16), "bfloat16"
        arr = cupy.from_dlpack(x)
        return arr, arr.dtype.name
    if hasattr(x, "__cuda_array_interface__"):
        arr = cupy.asarray(x)
        return arr, arr.dtype.name
    if is_device_array(x):
        arr = cupy.from_dlpack(x)
        return arr, arr.dtype.name
    raise TypeError(
        f"{name} must be a device array (CuPy, __cuda_array_interface__ or CUDA DLPack) for a "
        f"layer on the GPU, got {type(x).__name__}"
    )
