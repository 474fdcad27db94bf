"""The Google recipes resize as TensorFlow does: big_vision's few-shot `resize(256)` is
`tf.image.resize(bilinear, antialias=False)` then a clip and a truncating cast to uint8
(big_vision/pp/ops_image.py::get_resize). vitbench's TF-style resize is compared with TF's own
op on real photos from ../shared/data (and on a synthetic photo where those are absent); PIL's
antialiased resize, which vitbench used before (fewshot-lsr/2), fails the same comparison."""

from __future__ import annotations

import numpy as np
import torch
from conftest import SHARED_DATA
from PIL import Image

from vitbench.models.preprocessing import BIG_VISION_FEWSHOT, Preprocessing, resize_like_tf

REAL = (
    sorted(SHARED_DATA.glob("oxford-iiit-pet/images/*.jpg"))[:3] + sorted(SHARED_DATA.glob("flowers-102/jpg/*.jpg"))[:3]
)


def synthetic_photo() -> Image.Image:
    """Smooth shapes, fine texture and noise, at an odd size: what a photo asks of a resampler."""
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:375, 0:500]
    pixels = np.stack([127 + 100 * np.sin(x / 7.0 + c) * np.cos(y / 11.0) for c in range(3)], -1)
    pixels += rng.normal(0, 25, pixels.shape)
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def photos() -> list[Image.Image]:
    return [Image.open(p).convert("RGB") for p in REAL] or [synthetic_photo()]


def tf_big_vision(tf, image: Image.Image, resize: int = 256, crop: int = 224) -> np.ndarray:
    """big_vision's `decode|resize(256)|central_crop(224)` on decoded pixels, transcribed from
    pp/ops_image.py (get_resize: tf.image.resize, clip, cast; get_central_crop: (H - h) // 2)."""
    pixels = tf.constant(np.asarray(image))
    resized = tf.image.resize(pixels, [resize, resize], method="bilinear", antialias=False)
    resized = tf.cast(tf.clip_by_value(resized, 0, 255), tf.uint8)
    top = (resize - crop) // 2
    return tf.image.crop_to_bounding_box(resized, top, top, crop, crop).numpy()


def agreement(ours: np.ndarray, reference: np.ndarray) -> tuple[int, float]:
    """(largest difference in grey levels, share of values that differ at all)."""
    diff = np.abs(ours.astype(np.int32) - reference.astype(np.int32))
    return int(diff.max()), float((diff > 0).mean())


def test_resize_like_tf_equals_tensorflows_resize(tf):
    for image in photos():
        pixels = torch.from_numpy(np.array(image)).permute(2, 0, 1)
        for size in ((256, 256), (224, 300), (600, 600)):  # down, mixed, up
            ours = resize_like_tf(pixels, size).permute(1, 2, 0).numpy()
            reference = tf.image.resize(np.asarray(image), size, method="bilinear", antialias=False)
            reference = tf.cast(tf.clip_by_value(reference, 0, 255), tf.uint8).numpy()
            worst, share = agreement(ours, reference)
            # float32 rounding can put a value on the other side of an integer before truncation
            assert worst <= 1 and share < 0.002, (size, worst, share)


def test_fewshot_preprocessing_is_big_visions(tf):
    transform = BIG_VISION_FEWSHOT.transform(uint8=True)
    assert "no_antialias" in BIG_VISION_FEWSHOT.describe()
    for image in photos():
        ours = transform(image).permute(1, 2, 0).numpy()
        worst, share = agreement(ours, tf_big_vision(tf, image))
        assert ours.shape == (224, 224, 3) and worst <= 1 and share < 0.002, (worst, share)


def test_the_antialiased_resize_vitbench_used_before_is_not_big_visions(tf):
    """fewshot-lsr/2's recipe (PIL's antialiased bilinear): the comparison above tells it apart."""
    before = Preprocessing(antialias=True).transform(uint8=True)
    for image in photos():
        worst, share = agreement(before(image).permute(1, 2, 0).numpy(), tf_big_vision(tf, image))
        assert worst > 1 and share > 0.2, (worst, share)


def test_a_batch_of_one_size_is_resized_in_one_call_as_image_by_image(tmp_path):
    """The extraction loader's worker resizes a batch of same-sized images in one call (issue 46,
    goal 4): the same uint8 pixels and normalised values as one call per image, through the real
    DataLoader, for a folder of same-sized JPEGs and one of mixed sizes."""
    from vitbench.datasets.base import Split
    from vitbench.engine.inference import loader

    rng = np.random.default_rng(0)
    for name, sizes in (("same", [(32, 32)] * 6), ("mixed", [(32, 32), (40, 28), (32, 32), (17, 50), (64, 64)])):
        paths = []
        for i, (w, h) in enumerate(sizes):
            paths.append(str(tmp_path / f"{name}{i}.jpg"))
            Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(paths[-1], quality=90)
        split = Split("folder", "test", np.zeros(len(paths), np.int64), "folder", name, paths=paths)
        for uint8 in (True, False):
            transform = BIG_VISION_FEWSHOT.at(32).transform(uint8=uint8)
            one_by_one = torch.stack([transform(Image.open(p)) for p in paths])
            (images, labels, indices, bad), *_ = list(loader(split, transform, 8, 1, torch.device("cpu")))
            assert not bad and indices.tolist() == list(range(len(paths)))
            assert images.dtype == one_by_one.dtype and torch.equal(images, one_by_one), (name, uint8)
