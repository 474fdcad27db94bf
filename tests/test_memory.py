"""Choosing the micro-batch and activation checkpointing from free memory (memory.py). The
measurement needs a GPU (tests/test_finetune_gpu.py); the decision is arithmetic, checked here."""

import pytest

from vitbench.engine.memory import Footprint, plan
from vitbench.errors import UserError

GIB = 2**30


def test_largest_micro_batch_is_a_divisor_that_fits():
    footprint = Footprint(fixed=2 * GIB, per_image=0.5 * GIB)
    assert footprint.largest_micro(512, 10 * GIB) == 16  # 2 + 16 x 0.5 = 10
    assert footprint.largest_micro(512, 9.9 * GIB) == 8  # 15 fits but does not divide 512
    assert footprint.largest_micro(512, 1 * GIB) == 0


def test_the_whole_batch_in_one_pass_when_it_fits():
    found = plan(64, 80 * GIB, Footprint(GIB, 0.1 * GIB), Footprint(GIB, 0.02 * GIB))
    assert (found.micro, found.checkpointing) == (64, False)


def test_accumulation_without_checkpointing_while_passes_stay_large():
    # ViT-B/16 @384-like: 0.7 GiB an image; 72 GiB usable -> 64 of 512 per pass, no recompute needed
    found = plan(512, 80 * GIB, Footprint(4 * GIB, 0.7 * GIB), Footprint(4 * GIB, 0.1 * GIB))
    assert (found.micro, found.checkpointing) == (64, False)


def test_checkpointing_when_only_small_passes_would_fit():
    # ViT-H/14 @384-like: 6 GiB an image without checkpointing (8 fit: too small), 0.6 GiB with it
    found = plan(512, 80 * GIB, Footprint(12 * GIB, 6 * GIB), Footprint(12 * GIB, 0.6 * GIB))
    assert found.checkpointing and found.micro == 64
    assert "without activation checkpointing" in found.reason


def test_nothing_fits_is_a_one_line_error():
    with pytest.raises(UserError, match="not even one image per pass fits"):
        plan(512, 8 * GIB, Footprint(10 * GIB, GIB), Footprint(10 * GIB, 0.5 * GIB))
