"""The inception crop is TensorFlow's: vit_jax draws it with tf.image.sample_distorted_bounding_box
(aspect ratio uniform, then the height uniform; 100 attempts, else the whole image). Over many
draws vitbench's crops and TF's own op's agree in area and aspect ratio (two-sample KS test), and
the same test tells torchvision's RandomResizedCrop (area uniform, aspect log-uniform) apart, so
it can fail. TensorFlow comes with the `tfds` extra that CI installs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import ks_2samp
from torchvision.transforms import v2

from vitbench.engine.train_data import CROP_AREA, CROP_ASPECT, inception_box

DRAWS = 5000


def tf_crops(tf, height: int, width: int) -> np.ndarray:
    """(area fraction, aspect ratio) of TF's crops, as vit_jax/input_pipeline.py asks for them."""
    out = []
    for i in range(DRAWS):
        _, size, _ = tf.image.stateless_sample_distorted_bounding_box(
            tf.constant([height, width, 3]),
            tf.zeros([0, 0, 4], tf.float32),
            seed=[i, 7],
            min_object_covered=0.0,
            area_range=CROP_AREA,
            use_image_if_no_bounding_boxes=True,
        )
        h, w = int(size[0]), int(size[1])
        out.append((h * w / (height * width), w / h))
    return np.array(out)


def torch_crops(draw, height: int, width: int) -> np.ndarray:
    """(area fraction, aspect ratio) of `draw(height, width)`'s boxes (top, left, height, width)."""
    torch.manual_seed(0)
    out = []
    for _ in range(DRAWS):
        top, left, h, w = draw(height, width)
        assert top >= 0 and top + h <= height and left >= 0 and left + w <= width
        out.append((h * w / (height * width), w / h))
    return np.array(out)


def torchvision_box(height: int, width: int) -> tuple[int, int, int, int]:
    p = v2.RandomResizedCrop(32, scale=CROP_AREA, ratio=CROP_ASPECT).make_params(
        [torch.empty((3, height, width), device="meta")]
    )
    return p["top"], p["left"], p["height"], p["width"]


@pytest.mark.parametrize("height, width", [(224, 224), (200, 300)])
def test_crops_follow_tensorflows_sampler_and_not_torchvisions(tf, height, width):
    reference = tf_crops(tf, height, width)
    ours = torch_crops(inception_box, height, width)
    torchvision = torch_crops(torchvision_box, height, width)
    for column in (0, 1):  # area fraction, aspect ratio
        assert ks_2samp(ours[:, column], reference[:, column]).pvalue > 0.01
    assert ks_2samp(torchvision[:, 0], reference[:, 0]).pvalue < 1e-6  # the test can tell them apart
    assert abs(ours[:, 0].mean() - reference[:, 0].mean()) < 0.02
    if height == width:  # the figures: mean area ~0.38 (TF) vs ~0.46 (torchvision)
        assert reference[:, 0].mean() < 0.41 < torchvision[:, 0].mean()
