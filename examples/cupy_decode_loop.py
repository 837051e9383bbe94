"""The tiny-transformer decode loop of numpy_decode_loop.py on CuPy: model arrays and the
KV cache (TurboQuant, fp16 boundary layers, fp16 recent window) on the GPU.

    python examples/cupy_decode_loop.py [--layers 32 --steps 1000 ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from numpy_decode_loop import main  # noqa: E402

if __name__ == "__main__":
    out = main(["--backend", "cuda", *sys.argv[1:]])
    sys.exit(0 if out["worst_rel_error"] <= out["rtol"] else 1)
