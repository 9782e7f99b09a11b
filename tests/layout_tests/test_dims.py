"""One table of layout dimensions (`autotune.layout.DIMS`) that every reader iterates."""

from __future__ import annotations

import dataclasses

import numpy as np

from autotune.layout import DIMS
from autotune.layout import SEARCH_DIMS
from autotune.layout import Layout
from autotune.layout import LayoutTable
from autotune.search.proposal import family_keys
from autotune.search.surrogate import features
from autotune.space.search_space import SearchSpace


def test_the_table_names_every_field_of_a_layout_its_columns_and_the_search_space() -> None:
    """Oracle: the dataclasses' own fields. The table lists Layout's fields in order, the
    columnar table holds the same, and every searched dimension is a search-space field."""
    names = tuple(d.name for d in DIMS)
    assert names == tuple(f.name for f in dataclasses.fields(Layout))
    assert set(names) == {f.name for f in dataclasses.fields(LayoutTable)}
    assert set(SEARCH_DIMS) <= set(SearchSpace.model_fields)
    assert {d.name for d in DIMS if d.kind == "derived"} == {"dp", "gas"}


def test_moe_layouts_that_differ_only_in_ep_or_etp_are_told_apart() -> None:
    """Oracle: worked by hand. Three Mixtral-style layouts on 16 GPUs, equal but for ep and
    etp: the surrogate's features and the proposer's families must separate all three (before
    the table, the surrogate read neither ep nor etp), and a round trip through the columnar
    table keeps every field."""
    layouts = [Layout(tp=1, pp=2, dp=8, ep=8, etp=1), Layout(tp=1, pp=2, dp=8, ep=4, etp=2),
               Layout(tp=1, pp=2, dp=8, ep=1, etp=1)]
    table = LayoutTable.from_layouts(layouts)
    x = features(table)
    assert len({tuple(row) for row in np.round(x, 6)}) == 3
    assert len(set(family_keys(table).tolist())) == 3
    assert table.rows() == layouts
