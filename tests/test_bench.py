"""kvkit bench: pieces that run without a GPU (byte model, shape set, table, plot)."""

from __future__ import annotations

import numpy as np
import pytest

from kvkit import bench, formats
from kvkit.bench import WRITE_SLOT_ORDERS, write_slots


def test_shape_set_is_the_published_one():
    shapes = bench.shape_set()
    assert [(s.B, s.T) for s in shapes[:5]] == [
        (1, 32768),
        (8, 8192),
        (32, 4096),
        (64, 8192),
        (1, 131072),
    ]
    extra = {(s.B, s.T, s.Hq, s.Hkv, s.D) for s in shapes[5:]}
    assert extra == {
        (32, 4096, 32, 8, 64), (32, 4096, 32, 8, 256), (32, 4096, 128, 8, 128),
        (32, 4096, 64, 8, 128), (32, 4096, 32, 8, 96),  # GQA 8, head_dim 96
        (1, 4096, 32, 8, 128), (8, 4096, 32, 8, 128),  # CUDA-graph decode steps
    }  # fmt: skip


def test_shape_labels_name_only_what_differs_from_the_main_set():
    assert bench.shape_label(64, 8192) == "B64 T8192"
    assert bench.shape_label(32, 4096, Hq=128, D=64) == "B32 T4096 D64 Hq128"
    assert bench.shape_label(1, 4096, Hkv=4, eq="=") == "B=1 T=4096 Hkv=4"
    assert bench.Shape(32, 4096, D=256).label() == "B32 T4096 D256"
    row = dict(B=524288, T=1, Hq=None, Hkv=8, D=128)  # a write row: no query heads
    assert bench.row_label(row) == "B524288 T1"


def test_shapes_option_parses_short_and_full_forms():
    shapes = bench.parse_shapes("64x8192, 1x131072,32x4096x32x8x256")
    assert [(s.B, s.T, s.Hq, s.Hkv, s.D) for s in shapes] == [
        (64, 8192, 32, 8, 128), (1, 131072, 32, 8, 128), (32, 4096, 32, 8, 256),
    ]  # fmt: skip


@pytest.mark.parametrize(
    "text", ["", "64", "64x", "64x8192x32", "0x8192", "-1x8", "8x8192x30x8x128", "ax1"]
)
def test_shapes_option_rejects_malformed_text(text):
    with pytest.raises(ValueError):
        bench.parse_shapes(text)


def test_decode_byte_model_counts_planes_tables_q_and_o():
    fmt = formats.get("turboquant_4bit_nc", 128)
    # FACTS.md: the 4bit_nc floor at B=64, T=8192 is 562 MB of cache.
    n = bench.decode_bytes(fmt, bench.Shape(64, 8192))
    cache = 64 * 8192 * 8 * 134
    assert cache == 562_036_736
    assert n == cache + 64 * 512 * 4 + 64 * 32 * 128 * 6


def test_table_and_plot_from_rows(tmp_path, capsys):
    rows = [
        dict(op="decode", format=f, B=8, T=8192, Hq=32, Hkv=8, D=128, kvkit_ms=ms,
             sdpa_fp16_ms=0.07, bytes=10**8, effective_TBps=1.0, copy_TBps=4.0, graph=False)
        for f, ms in (("fp16", 0.2), ("nvfp4", 0.1))
    ]  # fmt: skip
    bench.print_table(rows)
    out = capsys.readouterr().out
    assert "nvfp4" in out and "0.70x" in out
    assert bench.plot(rows, tmp_path / "b.png")
    assert (tmp_path / "b.png").stat().st_size > 1000


def test_plot_draws_graph_times_where_rows_have_them(tmp_path):
    base = dict(op="decode", B=1, T=4096, Hq=32, Hkv=8, D=128, bytes=4 * 10**8, copy_TBps=4.0)
    rows = [
        dict(base, format="nvfp4", kvkit_ms=0.25, sdpa_fp16_ms=0.05, effective_TBps=1.6,
             graph=False),
        dict(base, format="nvfp4", kvkit_ms=0.125, sdpa_fp16_ms=0.04, effective_TBps=3.2,
             graph=True),
        dict(base, format="fp8_e4m3", kvkit_ms=0.5, sdpa_fp16_ms=0.05, effective_TBps=0.8,
             graph=False),
    ]  # fmt: skip
    shape = bench.plot_points(rows)[(1, 4096, 32, 128)]
    # The bar is the graph replay (the targets' time); a format without one keeps its plain time.
    assert shape["formats"]["nvfp4"] == {"ms": 0.125, "plain_ms": 0.25, "floor_ms": 0.1}
    assert shape["formats"]["fp8_e4m3"] == {"ms": 0.5, "plain_ms": 0.5, "floor_ms": 0.1}
    assert (shape["sdpa_ms"], shape["sdpa_plain_ms"]) == (0.04, 0.05)
    assert bench.plot(rows, tmp_path / "g.png")


def test_markdown_tables_pair_plain_and_graph_rows():
    base = dict(op="decode", format="nvfp4", B=1, T=4096, Hq=32, Hkv=8, D=64, bytes=10**6,
                copy_TBps=4.0)  # fmt: skip
    rows = [
        dict(base, kvkit_ms=0.25, sdpa_fp16_ms=0.04, effective_TBps=0.004, graph=False),
        dict(base, kvkit_ms=0.03, sdpa_fp16_ms=0.012, effective_TBps=0.2, graph=True),
        dict(op="write", format="nvfp4", B=524288, T=1, Hq=None, Hkv=8, D=128, kvkit_ms=3.0,
             sdpa_fp16_ms=None, bytes=10**9, effective_TBps=1.0, copy_TBps=4.0, graph=False),
    ]  # fmt: skip
    md = bench.markdown_tables(rows).splitlines()
    decode_rows = [line for line in md if line.startswith("| nvfp4 | B=1")]
    # One line for the pair: plain 0.25 / graph 0.03 ms, SDPA 0.04 / 0.012, ratio 0.012 / 0.03.
    assert decode_rows == [
        "| nvfp4 | B=1 T=4096 D=64 | 0.2500 | 0.0300 | 0.0400 | 0.0120 | 0.20 | 5.0 | 0.40x |"
    ]
    assert "| nvfp4 | 4194304 | scatter | 3.000 | 1.00 | 25.0 |" in md  # no "slots": old rows


def test_cli_without_a_gpu_says_why(capsys, monkeypatch):
    import kvkit.cli

    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            pytest.skip("a GPU is present: the real benchmark would run")
    except Exception:
        pass
    assert kvkit.cli.main(["bench", "--out", "/tmp/kvkit_bench_test"]) == 2
    assert "needs CuPy and a CUDA GPU" in capsys.readouterr().out


def test_ab_compare_lines_up_runs_and_ratios(tmp_path):
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "ab_compare", Path(__file__).parents[1] / "scripts" / "ab_compare.py"
    )
    ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ab)
    row = dict(op="decode", B=1, T=4096, Hq=32, Hkv=8, D=128, graph=True)
    a = [dict(row, format="nvfp4", kvkit_ms=0.04), dict(row, format="fp16", kvkit_ms=0.03)]
    b = [dict(row, format="nvfp4", kvkit_ms=0.03), dict(row, graph=False, format="fp16",
                                                          kvkit_ms=9.0)]  # fmt: skip
    for name, rows in (("a", a), ("b", b)):
        (tmp_path / f"{name}.json").write_text(__import__("json").dumps(rows))
    out = ab.compare([ab.load(f"a={tmp_path / 'a.json'}"), ab.load(f"b={tmp_path / 'b.json'}")])
    lines = out.splitlines()
    assert lines[1].split() == ["nvfp4", "B1", "T4096", "0.0400", "0.0300", "0.750"]
    # fp16 has no graph row in b: shown as missing, not as the plain time.
    assert lines[2].split() == ["fp16", "B1", "T4096", "0.0300", "-", "-"]


@pytest.mark.parametrize("order", WRITE_SLOT_ORDERS)
def test_write_slots_is_a_permutation(order):
    slots = write_slots(4096, order)
    assert slots.dtype == np.int64
    assert np.array_equal(np.sort(slots), np.arange(4096))


def test_write_slots_pages_keep_tokens_in_page_order():
    slots = write_slots(4096, "pages", block_size=16)
    pages = slots.reshape(-1, 16)
    # each run of 16 tokens fills one page, offsets 0..15 in order
    assert np.array_equal(pages % 16, np.tile(np.arange(16), (256, 1)))
    assert np.all(pages // 16 == (pages[:, :1] // 16))
    # and the pages are not in order (seeded permutation of 256 pages)
    assert not np.array_equal(pages[:, 0] // 16, np.arange(256))


def test_write_slots_scatter_splits_pages():
    slots = write_slots(4096, "scatter")
    same_page_neighbours = np.mean(slots[1:] // 16 == slots[:-1] // 16)
    assert same_page_neighbours < 0.05


def test_write_slots_rejects_bad_arguments():
    with pytest.raises(ValueError, match="slot order"):
        write_slots(64, "random")
    with pytest.raises(ValueError, match="multiple of block_size"):
        write_slots(100, "pages", block_size=16)
