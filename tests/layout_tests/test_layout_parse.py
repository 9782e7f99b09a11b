"""`Layout.parse`: the --layout text, with dp and gas derived and every key read once."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from autotune.exceptions import AutotuneError
from autotune.frameworks import get_framework
from autotune.layout import Layout

KEYS = ("tp", "pp", "cp", "vpp", "zero", "offload", "mbs", "recompute", "sp", "dp", "gas")


@st.composite
def grids(draw: st.DrawFn) -> tuple[int, int, int, int, int, int]:
    """(world, global batch, tp, pp, cp, mbs) where tp·pp·cp divides the world and mbs·dp
    divides the batch."""
    tp, pp, cp = (2 ** draw(st.integers(0, 3)) for _ in range(3))
    dp = draw(st.integers(1, 12))
    mbs = draw(st.integers(1, 4))
    gas = draw(st.integers(1, 16))
    return tp * pp * cp * dp, mbs * dp * gas, tp, pp, cp, mbs


@settings(max_examples=80, deadline=None)
@given(grid=grids(), framework=st.sampled_from(["megatron", "deepspeed"]))
def test_dp_and_gas_follow_from_the_grid(grid: tuple[int, ...], framework: str) -> None:
    """Oracle: world = tp·pp·cp·dp and global batch = mbs·dp·gas, solved here by hand; sp
    defaults to on for Megatron with tp > 1 (the README's layout rule); stating the derived dp
    and gas changes nothing."""
    world, gbs, tp, pp, cp, mbs = grid
    layout = Layout.parse(f"tp={tp}, pp={pp},cp={cp} ,mbs={mbs}", world, gbs,
        get_framework(framework))
    dp = world // (tp * pp * cp)
    assert (layout.dp, layout.gas) == (dp, gbs // (mbs * dp))
    assert layout.sp == (framework == "megatron" and tp > 1)
    stated = Layout.parse(f"tp={tp},pp={pp},cp={cp},mbs={mbs},dp={dp},gas={layout.gas}", world,
                          gbs, get_framework(framework))
    assert stated == layout


@settings(max_examples=40, deadline=None)
@given(key=st.sampled_from(KEYS), first=st.sampled_from(["1", "2", "none", "on"]),
       second=st.sampled_from(["1", "2", "full", "off"]))
def test_a_key_given_twice_is_refused(key: str, first: str, second: str) -> None:
    """Oracle: `tp=8,tp=4` names two tensor-parallel degrees; which one was meant is unknown
    (the last used to win silently)."""
    with pytest.raises(AutotuneError, match=f"--layout: {key} is given twice"):
        Layout.parse(f"{key}={first},{key}={second}", 8, 64, get_framework("megatron"))


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("gas=3", r"gas=3 contradicts the global batch 64 = mbs·dp·gas = 1·8·gas.*derived: 8"),
        ("tp=16", r"tp=16 exceeds 8 \(the cluster's GPUs\)"),
        ("mbs=128", r"mbs=128 exceeds 64 \(the global batch\)"),
        ("vpp=16385", r"vpp=16,385 exceeds 16,384 \(a virtual stage holds one layer at least\)"),
        ("zero=4", r"zero=4 exceeds 3 \(ZeRO stages are 0 to 3\)"),
        ("tp=-2", r"tp='-2' must be an integer from 1 to 8"),
        ("tp=0", r"tp=0 must be positive"),
        ("recompute=some", r"recompute='some' must be one of none, selective, full"),
        ("tp", r"cannot read 'tp'"),
    ],
)
def test_numbers_are_whole_and_bounded(text: str, match: str) -> None:
    """Oracle: worked by hand for 8 GPUs and a global batch of 64 (dp = 8 at tp=1, so gas = 8)."""
    with pytest.raises(AutotuneError, match=match):
        Layout.parse(text, 8, 64, get_framework("megatron"))


def test_the_expert_grid_is_owned_by_the_layout() -> None:
    """Oracle: Megatron's expert grid worked by hand: 64 GPUs as tp2·pp2·dp16 with ep8, etp1:
    one expert replica spans etp·ep·pp = 16 GPUs, so edp = 64/16 = 4 ranks hold the same
    experts; the scalar and the columnar forms agree."""
    from autotune.layout import LayoutTable

    layout = Layout(tp=2, pp=2, dp=16, ep=8, etp=1, mbs=1, gas=1)
    table = LayoutTable.from_layouts([layout])
    assert layout.expert_grid == int(table.expert_grid[0]) == 16
    assert layout.expert_data_parallel == int(table.expert_data_parallel[0]) == 4
