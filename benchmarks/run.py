"""Decode and write benchmarks on a CUDA GPU: ``python benchmarks/run.py --out DIR``.

The same as ``kvkit bench``; see ``kvkit/bench.py`` for the method.
"""

from __future__ import annotations

from kvkit.bench import main

if __name__ == "__main__":
    raise SystemExit(main())
