"""Issue 81, reliability round 6: a diverged backbone, a long sweep or a signal never becomes a wrong or
lost number. One test per item, each seen failing on the main it was written against."""

from __future__ import annotations

from pathlib import Path

import pytest

from vitbench import registry, store

FEWSHOT = ("--dataset", "digits", "--res", "32", "--shots", "2", "--seeds", "0", "--workers", "0")


def _overflowing_weights(path: Path) -> Path:
    """A ViT-Ti whose final LayerNorm scales by 3e38: every feature beyond float32's range (inf) from a
    checkpoint of finite numbers (a checkpoint holding a NaN is refused as it is read)."""
    import torch
    from safetensors.torch import save_file

    spec = registry.get_model("vit-ti/16")
    model = spec.backend.create(spec, num_classes=0, img_size=224)
    with torch.no_grad():
        model.norm.weight.fill_(3e38)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


def test_item2_features_with_inf_stop_the_run_and_store_nothing(cli, tmp_path):
    """Before: 9.91 % (chance) stored, exit 0, no warning."""
    weights = _overflowing_weights(tmp_path / "diverged.safetensors")
    results = tmp_path / "results"
    for protocol in ("fewshot", "knn", "linear"):
        code, _, err = cli("run", "--model", "vit-ti/16", "--weights", str(weights), "--protocol", protocol,
                           *FEWSHOT, "--results", str(results))  # fmt: skip
        last = err.strip().splitlines()[-1]
        assert code == 2, (protocol, err[-500:])
        assert last.startswith(f"error: vit-ti/16 ({weights}) on digits ") and "have non-finite features" in last
        assert "nothing stored" in last
    assert not (results / "vitbench.duckdb").exists() or store.read_results(results).empty


def test_item2_zero_width_or_nan_features_are_refused_before_caching():
    from types import SimpleNamespace

    import numpy as np

    from vitbench.engine.features import check_features
    from vitbench.errors import UserError

    group = SimpleNamespace(model=SimpleNamespace(name="acme-cnn"), weights=SimpleNamespace(random=True, path="random"),
                            dataset=SimpleNamespace(name="digits"))  # fmt: skip
    with pytest.raises(
        UserError, match=r"acme-cnn \(random init\) on digits train: the backbone's features are \(0,\) wide"
    ):
        check_features(np.zeros((4, 0), np.float32), group, "train")
    values = np.ones((5, 3), np.float32)
    values[3, 1] = np.nan
    with pytest.raises(UserError, match=r"1 of 5 images have non-finite features \(NaN or inf\), the first at image 3"):
        check_features(values, group, "test")
    check_features(np.ones((5, 3), np.float32), group, "test")  # finite: nothing said
