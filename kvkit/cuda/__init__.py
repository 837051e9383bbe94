"""CUDA backend: NVRTC-compiled raw kernels launched through CuPy.

Importing this package does not import CuPy; the compile layer and the launchers import it
when they run. ``compile_only(arch)`` builds every kernel for a target without a GPU.
"""

from .compiler import TARGETS, CompileError, CompileResult, compile_only

__all__ = ["TARGETS", "CompileError", "CompileResult", "compile_only"]
