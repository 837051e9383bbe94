"""scripts/ptx_warp_sync.py on hand-made PTX (no GPU, no NVRTC)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).parents[1]


def _module():
    spec = importlib.util.spec_from_file_location(
        "ptx_warp_sync", ROOT / "scripts" / "ptx_warp_sync.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _kernel(body: str) -> str:
    return f""".version 8.0
.target sm_90
.address_size 64
.visible .entry k(
\t.param .u64 k_param_0
)
{{
\t.reg .pred \t%p<8>;
\t.reg .b32 \t%r<16>;
{body}
\tret;
}}
"""


# A row-uniform (per-lane) test around a full-mask shuffle: the write kernel's old zero-extreme
# branch. The shuffle before it and the one after the join are unconditional.
PER_LANE = """\
\tshfl.sync.bfly.b32 \t%r2|%p1, %r1, 1, 31, -1;
\tsetp.eq.f32 \t%p2, %r2, 0f00000000;
\t@%p2 bra \t$L__BB0_2;
\tbra.uni \t$L__BB0_3;
$L__BB0_2:
\tshfl.sync.bfly.b32 \t%r3|%p3, %r2, 2, 31, -1;
$L__BB0_3:
\tshfl.sync.down.b32 \t%r4|%p4, %r2, 1, 31, -1;
"""

# The same branch on a vote of the warp (and its negation): every lane takes the same side.
VOTED = """\
\tsetp.eq.f32 \t%p2, %r2, 0f00000000;
\tvote.sync.any.pred \t%p5, %p2, -1;
\tnot.pred \t%p6, %p5;
\t@%p6 bra \t$L__BB0_3;
\tshfl.sync.bfly.b32 \t%r3|%p3, %r2, 2, 31, -1;
$L__BB0_3:
\tshfl.sync.down.b32 \t%r4|%p4, %r2, 1, 31, -1;
"""

# A lane-dependent branch with no warp-synchronous instruction under it (a lane-0 store).
STORE_ONLY = """\
\tsetp.ne.s32 \t%p2, %r1, 0;
\t@%p2 bra \t$L__BB0_3;
\tst.global.u32 \t[%rd1], %r1;
$L__BB0_3:
\tshfl.sync.bfly.b32 \t%r3|%p3, %r2, 2, 31, -1;
"""


def test_a_shuffle_under_a_per_lane_branch_is_reported():
    bad = _module().divergent_syncs(_kernel(PER_LANE))
    assert len(bad) == 1
    ins, bra = bad[0]
    assert "bfly" in ins and "%r3" in ins and "%p2" in bra


def test_a_branch_on_a_vote_and_unconditional_shuffles_pass():
    mod = _module()
    assert mod.divergent_syncs(_kernel(VOTED)) == []
    assert mod.divergent_syncs(_kernel(STORE_ONLY)) == []


def test_a_vote_predicate_written_again_is_not_trusted():
    body = VOTED.replace("\tnot.pred", "\tsetp.ne.s32 \t%p5, %r1, 0;\n\tnot.pred")
    assert len(_module().divergent_syncs(_kernel(body))) == 1
