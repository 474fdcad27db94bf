import numpy as np
import pytest
import torch

from vitbench.catalog import registry
from vitbench.errors import UserError
from vitbench.models.backend import count_parameters


@pytest.mark.parametrize("name, table1_millions", [("vit-b/16", 86), ("vit-l/16", 307), ("vit-h/14", 632)])
def test_parameter_counts_match_table_1(name, table1_millions):
    params = count_parameters(registry.get_model(name), num_classes=1000)  # on the meta device
    assert abs(params / 1e6 - table1_millions) / table1_millions < 0.01


def test_every_runnable_model_builds_with_a_head_of_the_requested_size():  # values: see the real-tensor tests
    for spec in registry.models().values():
        if spec.reference_only:
            continue
        with torch.device("meta"):
            model = spec.backend.create(spec, num_classes=7, img_size=224)
        head = model.get_classifier()
        assert getattr(head, "out_features", getattr(head, "out_channels", None)) == 7, spec.name


@pytest.mark.parametrize("name", ["deit-ti/16", "deit-s/16", "deit-b/16"])
def test_deit_preprocessing_written_out_is_timms_pretrained_config(name):
    """plugins/vit.py writes DeiT's recipe out (listing models must not import timm): it must stay timm's."""
    from vitbench.models.preprocessing import Preprocessing

    spec = registry.get_model(name)
    assert spec.preprocessing == Preprocessing.from_timm(spec.arch)


def test_zero_head_and_features_on_real_tensors():
    spec = registry.get_model("vit-ti/16")
    model = spec.backend.create(spec, num_classes=10, img_size=32).eval()
    assert torch.count_nonzero(model.head.weight) == 0 and torch.count_nonzero(model.head.bias) == 0
    images = torch.randn(2, 3, 32, 32)
    with torch.inference_mode():
        feats = spec.backend.features(model, images)
        tokens = model.forward_features(images)  # (B, 1 + N, D), final LayerNorm applied
    assert feats.shape == (2, 192)
    torch.testing.assert_close(feats, tokens[:, 0])  # LN(CLS)


def test_bit_features_are_pooled_pre_head():
    spec = registry.get_model("bit-m-r50x1")
    model = spec.backend.create(spec, num_classes=3, img_size=64).eval()
    assert torch.count_nonzero(model.head.fc.weight) == 0 and torch.count_nonzero(model.head.fc.bias) == 0
    with torch.inference_mode():
        feats = spec.backend.features(model, torch.randn(1, 3, 64, 64))
    assert feats.shape == (1, 2048)


def test_flops_per_image_of_vit_b16_at_224():
    spec = registry.get_model("vit-b/16")
    gflops = spec.backend.flops_per_image(spec, 224) / 1e9
    assert 34.5 < gflops < 35.5  # 17.6 GMACs, the standard figure for ViT-B/16 at 224


def test_image_size_must_fit_the_patch_grid():
    spec = registry.get_model("vit-b/32")
    with pytest.raises(UserError, match="--res 100: vit-b/32 needs .* multiple of 32"):
        spec.backend.check_img_size(spec, 100)


def test_unknown_model_suggests_the_closest_names():
    with pytest.raises(UserError, match=r"unknown model 'vit-b16'; did you mean vit-b/16"):
        registry.get_model("vit-b16")


@pytest.mark.parametrize("name", ["bit-l", "vit-h/14-jft", "vit-l/16-jft", "noisy-student"])
def test_reference_only_names_are_listed_but_refused(name):
    assert name in registry.models()
    with pytest.raises(UserError, match="paper reference only.*never released|no EfficientNet"):
        registry.get_model(name)


@pytest.mark.parametrize("model", ["vit-b/16", "deit-ti/16", "bit-m-r50x1"])
@pytest.mark.parametrize("res", [224, 384])
def test_uint8_batches_normalised_later_equal_the_per_image_transform_bit_for_bit(model, res):
    """Workers ship uint8 and the batch is normalised on the device: it must not change one bit."""
    from PIL import Image

    rng = np.random.default_rng(res)
    images = [Image.fromarray(rng.integers(0, 255, (300 + 7 * i, 420 - 9 * i, 3), dtype=np.uint8)) for i in range(4)]
    pre = registry.get_model(model).preprocessing.at(res)
    per_image = torch.stack([pre.transform()(img) for img in images])
    uint8 = torch.stack([pre.transform(uint8=True)(img) for img in images])
    assert uint8.dtype == torch.uint8 and torch.equal(pre.normalize(uint8), per_image)
