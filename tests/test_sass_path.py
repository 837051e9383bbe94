"""scripts/sass_path.py on a hand-made nvdisasm -gi listing (no GPU, no CUDA tools)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).parents[1]

# A loop at 0x10 .. 0x70: a decided branch over two instructions, an inner loop run N + 1
# times (0x50 back to 0x40), the back edge at 0x70.
LISTING = """\
        /*0000*/                   MOV R0, RZ ;
\t//## File "k.cu", line 3
.L_x_1:
        /*0010*/                   DEPBAR.LE SB0, 0x0 ;
\t//## File "k.cu", line 4
        /*0020*/              @!P0 BRA `(.L_x_2) ;
        /*0030*/                   IADD3 R1, R1, 0x1, RZ ;
.L_x_2:
        /*0040*/                   IADD3 R2, R2, 0x1, RZ ;
        /*0050*/               @P1 BRA `(.L_x_2) ;
\t//## File "k.cu", line 5
        /*0060*/                   FADD R3, R3, R4 ;
        /*0070*/               @P2 BRA `(.L_x_1) ;
        /*0080*/                   EXIT ;
"""


def _module():
    spec = importlib.util.spec_from_file_location("sass_path", ROOT / "scripts" / "sass_path.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_walk_counts_the_decided_path(tmp_path):
    mod = _module()
    path = tmp_path / "k.sass"
    path.write_text(LISTING)
    ins, labels = mod.parse(path)
    assert labels == {".L_x_1": 0x10, ".L_x_2": 0x40}
    assert ins[2]["pred"] == "@!P0" and ins[2]["chain"] == [4]
    head = mod.loop_head(ins)
    assert head == 0x0  # the instruction before the first DEPBAR
    back = {0x70: True}
    # From 0x10: DEPBAR, BRA (falls through), IADD3, IADD3, BRA (not taken), FADD, BRA = 7.
    assert mod.walk(ins, labels, 0x10, back) == 7
    # The first branch taken skips one instruction; the inner loop taken twice adds 2 x 2.
    assert mod.walk(ins, labels, 0x10, {**back, 0x20: True, 0x50: 2}) == 6 + 4
    # A decision map can be reused: the counted loop starts over on the next walk.
    assert mod.walk(ins, labels, 0x10, {**back, 0x50: 1}) == 7 + 2
