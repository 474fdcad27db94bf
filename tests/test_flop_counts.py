"""FLOP counts kept per machine (vitbench/models/flop_counts.py): a count is made once and read back; a
file that is damaged, the wrong shape, too large or not a regular file is only a cache (counted
again, never a wrong number); a backend that builds its own network is never kept."""

from __future__ import annotations

import json
import os

import pytest

from vitbench.catalog import registry
from vitbench.models import backend, flop_counts
from vitbench.models.backend import Backend, ModelSpec


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VITBENCH_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / flop_counts.FILE


def test_a_count_is_made_once_and_read_back(cache):
    calls = []
    assert flop_counts.counted("k", lambda: calls.append(1) or 123) == 123
    assert flop_counts.counted("k", lambda: calls.append(1) or 999) == 123 and len(calls) == 1
    assert json.loads(cache.read_text()) == {"k": 123}


@pytest.mark.parametrize(
    "content", ["not json", "[5, 6]", '{"k": -1}', '{"k": "7"}', '{"k": true}', '{"k": 1e30}', "x" * 3_000_000]
)
def test_a_damaged_or_hostile_file_is_counted_again(cache, content):
    cache.parent.mkdir(parents=True)
    cache.write_text(content)
    assert flop_counts.counted("k", lambda: 42) == 42
    assert json.loads(cache.read_text())["k"] == 42  # rewritten, whole


def test_a_fifo_or_a_read_only_cache_never_blocks_or_fails(cache, tmp_path):
    cache.parent.mkdir(parents=True)
    os.mkfifo(cache)
    assert flop_counts.counted("k", lambda: 42) == 42  # not read forever; replaced by a file
    cache.unlink()
    cache.parent.chmod(0o500)
    try:
        if os.access(cache.parent, os.W_OK):
            pytest.skip("running as root: a read-only folder is writable")
        assert flop_counts.counted("k", lambda: 43) == 43 and not cache.exists()
    finally:
        cache.parent.chmod(0o700)


def test_timm_networks_are_kept_and_a_backends_own_network_never(cache, monkeypatch):
    monkeypatch.setattr(backend, "_FLOPS", {})  # not what an earlier test of this process counted
    vit = registry.get_model("vit-ti/16")
    assert vit.backend is not None
    counted = vit.backend.flops_per_image(vit, 32)
    kept = json.loads(cache.read_text())
    assert list(kept.values()) == [counted] and "vit_tiny_patch16_224|32|torch " in next(iter(kept))

    class Own(Backend):
        def create(self, spec, num_classes, img_size, gelu="exact", dropout=0.0):
            from torch import nn

            return nn.Sequential(nn.Flatten(), nn.Linear(3 * img_size * img_size, max(num_classes, 1)))

        def features(self, model, images):
            return model(images)

    own = ModelSpec("own", "own", Own())
    assert own.backend.flops_per_image(own, 8) > 0
    assert len(json.loads(cache.read_text())) == 1  # only the timm network's count is kept
