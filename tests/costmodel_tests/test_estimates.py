"""The columnar `Estimates` and its rows.

Oracles: the headline figures worked out by hand from the model's FLOPs (`model_flops`, whose
own oracle is Narayanan et al. 2021, tests/costmodel_tests/test_flops.py), the preset GPU's peak
and the tokens of a step; the scalar `estimate` of one layout for each row of a ranked table.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from autotune import load_config
from autotune.costmodel.estimate import FIGURES
from autotune.costmodel.estimate import Estimate
from autotune.costmodel.estimate import estimate
from autotune.costmodel.flops import model_flops
from autotune.costmodel.memory import MEMORY_PARTS
from autotune.costmodel.step_time import TIME_PARTS
from autotune.frameworks import framework_of
from autotune.space.search_space import enumerate_layouts
from autotune.space.search_space import load_space

CFG = load_config("tiny-gpt", "dgx-a100:1")


def test_headline_figures_by_hand() -> None:
    """tokens/s = tokens per step / step; TFLOP/s per GPU = model FLOPs / step / GPUs; MFU =
    that over the A100's 156 TF32 TFLOP/s (tiny-gpt trains in fp32); peak memory = the sum
    of its parts."""
    found = enumerate_layouts(CFG, load_space(None, CFG.train.framework))
    e, train = found.estimates, CFG.train
    vocab = framework_of(CFG).padded_vocab(CFG.model.vocab_size, e.table.tp)
    flops = model_flops(CFG.model, train.seq_length, train.global_batch_size, vocab)
    assert np.allclose(e.tokens_per_s, train.global_batch_size * train.seq_length / e.step_time_s)
    assert np.allclose(e.tflops_per_gpu, flops / e.step_time_s / CFG.world_size / 1e12)
    assert np.allclose(e.mfu, e.tflops_per_gpu / 156)
    assert np.allclose(e.step_time_s, sum(e.time.parts[name] for name in TIME_PARTS))
    assert np.allclose(e.peak_memory_bytes, sum(e.memory.parts[name] for name in MEMORY_PARTS))
    assert np.all(np.diff(e.tokens_per_s) <= 0)  # ranked fastest first


def test_each_row_is_the_estimate_of_its_layout() -> None:
    """Row i of the ranked columns equals the scalar estimate of layout i (figures, both
    breakdowns), and its JSON form holds every headline figure once."""
    found = enumerate_layouts(CFG, load_space(None, CFG.train.framework))
    picks = np.array([0, 3, len(found) - 1])
    taken = found.estimates.take(picks)
    for j, i in enumerate(picks):
        row: Estimate = found.estimates.row(int(i))
        alone = estimate(CFG, row.layout)
        assert row.layout == found.feasible.row(int(i)) == taken.row(j).layout
        for field in dataclasses.fields(Estimate):
            if field.name != "layout":
                assert getattr(row, field.name) == pytest.approx(getattr(alone, field.name))
        doc = row.to_dict()
        assert [name for name in doc if name in FIGURES] == list(FIGURES)
        assert doc["time"]["total"] == row.step_time_s
