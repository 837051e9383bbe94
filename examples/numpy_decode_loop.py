"""Greedy decoding of a tiny random-weight transformer over a TurboQuant KV cache, NumPy only.

    python examples/numpy_decode_loop.py                       # 32 layers, 1,000 steps
    python examples/numpy_decode_loop.py --layers 4 --steps 50 # a quick look
    python examples/numpy_decode_loop.py --backend cuda        # the same loop on CuPy

With ``--backend cuda`` the model's arrays are CuPy arrays and the cache lives on the GPU
(``examples/cupy_decode_loop.py`` is that invocation).

The model is a pre-norm decoder with rotary positions, grouped-query attention and a small
MLP; its weights are random, so the text means nothing, but every attention call is a real
paged decode: each layer's new K/V go through ``ModelKVCache.write`` (quantize-on-write; the
first and last ``--boundary`` layers stay fp16, the last ``--window`` tokens of every
sequence are also kept in fp16), and attention runs through ``ModelKVCache.decode`` on the
CPU backend. Every ``--check-every`` steps each layer's attention output is compared with
float64 attention over exactly what the cache holds (dequantized prefix + fp16 window);
the largest relative error is printed at the end.
"""

from __future__ import annotations

import os

# The model's matrix products are tiny (batch 2): a multi-threaded BLAS spends far longer
# waking its threads than multiplying, so this example keeps BLAS on one thread.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from kvkit.model_cache import ModelKVCache  # noqa: E402
from kvkit.testing.reference import attention_f64  # noqa: E402
from kvkit.testing.tolerance import DECODE_CPU_RTOL, DECODE_GPU_RTOL, rel_error  # noqa: E402


class TinyTransformer:
    """Random-weight decoder: d_model = Hq * D, GQA with Hkv KV heads, RoPE, RMSNorm."""

    def __init__(self, layers, q_heads, kv_heads, head_dim, vocab, seed, xp=np):
        rng = np.random.default_rng(seed)
        self.xp = xp
        self.layers, self.hq, self.hkv, self.d = layers, q_heads, kv_heads, head_dim
        dm = q_heads * head_dim
        self.dm = dm

        def w(*shape):
            return xp.asarray((rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32))

        self.emb = xp.asarray(rng.standard_normal((vocab, dm)).astype(np.float32))
        self.wq = [w(dm, q_heads * head_dim) for _ in range(layers)]
        self.wk = [w(dm, kv_heads * head_dim) for _ in range(layers)]
        self.wv = [w(dm, kv_heads * head_dim) for _ in range(layers)]
        self.wo = [w(q_heads * head_dim, dm) for _ in range(layers)]
        self.w1 = [w(dm, 2 * dm) for _ in range(layers)]
        self.w2 = [w(2 * dm, dm) for _ in range(layers)]
        inv = 1.0 / 10000.0 ** (np.arange(0, head_dim, 2) / head_dim)
        self.inv_freq = xp.asarray(inv.astype(np.float64))

    def rmsnorm(self, x):
        return x / self.xp.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)

    def rope(self, x, pos):
        """x: (B, H, D) at positions pos (B,): rotate channel pairs (i, i + D/2)."""
        xp = self.xp
        ang = pos[:, None].astype(np.float64) * self.inv_freq[None, :]  # (B, D/2)
        cos, sin = xp.cos(ang)[:, None, :], xp.sin(ang)[:, None, :]
        a, b = x[..., : self.d // 2], x[..., self.d // 2 :]
        return xp.concatenate([a * cos - b * sin, a * sin + b * cos], -1).astype(np.float32)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--q-heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--format", default="turboquant_4bit_nc")
    ap.add_argument("--boundary", type=int, default=2)
    ap.add_argument("--window", type=int, default=128)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--check-every", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backend", choices=("cpu", "cuda"), default="cpu")
    args = ap.parse_args(argv)
    if args.backend == "cuda":
        import cupy as xp

        def host(a):
            return xp.asnumpy(a)
    else:
        xp = np

        def host(a):
            return a

    model = TinyTransformer(
        args.layers, args.q_heads, args.kv_heads, args.head_dim, 512, args.seed, xp
    )
    pages = -(-(args.steps + 1) // args.block_size) + 1
    cache = ModelKVCache(
        args.layers, args.kv_heads, args.head_dim, args.format,
        num_blocks=args.batch * pages, block_size=args.block_size,
        boundary_layers=args.boundary, window=args.window,
        window_blocks=args.batch * (-(-args.window // args.block_size) + 2),
        backend=args.backend,
    )  # fmt: skip
    seqs = [cache.add_sequence() for _ in range(args.batch)]
    tokens = xp.asarray(np.random.default_rng(args.seed).integers(0, 512, args.batch))
    worst, checks = 0.0, 0
    start = time.perf_counter()
    for step in range(args.steps):
        check = args.check_every > 0 and (step % args.check_every == 0 or step == args.steps - 1)
        pos = xp.full(args.batch, step)
        x = model.emb[tokens]
        slots = [cache.append_tokens(s, 1) for s in seqs]
        main_slots = xp.concatenate([s[0] for s in slots])
        win_slots = None if slots[0][1] is None else xp.concatenate([s[1] for s in slots])
        for layer in range(args.layers):
            h = model.rmsnorm(x)
            q = model.rope((h @ model.wq[layer]).reshape(args.batch, args.q_heads, -1), pos)
            k = model.rope((h @ model.wk[layer]).reshape(args.batch, args.kv_heads, -1), pos)
            v = (h @ model.wv[layer]).reshape(args.batch, args.kv_heads, -1)
            cache.write(layer, k, v, (main_slots, win_slots))
            o = cache.decode(layer, q, seqs)  # (B, Hq, D) float32
            if check:
                for i, s in enumerate(seqs):
                    kk, vv = cache.attended_kv(layer, s)
                    ref, _ = attention_f64(host(q[i][None]), host(kk), host(vv))
                    worst = max(worst, rel_error(host(o[i]), ref[0]))
                    checks += 1
            x = x + o.reshape(args.batch, -1) @ model.wo[layer]
            x = x + xp.maximum(model.rmsnorm(x) @ model.w1[layer], 0) @ model.w2[layer]
        logits = model.rmsnorm(x) @ model.emb.T
        tokens = logits.argmax(-1)
    elapsed = time.perf_counter() - start
    formats = [f.name for f in cache.formats]
    rtol = DECODE_CPU_RTOL if args.backend == "cpu" else DECODE_GPU_RTOL
    result = dict(
        worst_rel_error=worst, rtol=rtol, checks=checks, seconds=elapsed, steps=args.steps,
        layers=args.layers, last_tokens=host(tokens).tolist(),
    )  # fmt: skip
    print(
        f"{args.layers} layers ({formats.count('fp16')} fp16 boundary, "
        f"{len(formats) - formats.count('fp16')} {args.format}), window {args.window}, "
        f"{args.backend}, batch {args.batch}: {args.steps} steps in {elapsed:.1f} s "
        f"({args.steps * args.batch / elapsed:.0f} tokens/s)"
    )
    print(f"attention vs float64 over the cache's contents: worst relative error {worst:.2e} "
          f"over {checks} (layer, sequence) checks")  # fmt: skip
    return result


if __name__ == "__main__":
    out = main()
    sys.exit(0 if out["worst_rel_error"] <= out["rtol"] else 1)
