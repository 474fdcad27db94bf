"""A small TFDS builder whose source file a test's loopback server serves (SOURCE_URL, set by the
test): TFDS's own download_and_prepare fetches and builds it, as it would DTD's archive. TFDS
looks up a builder's checksums next to its module, so the builder lives in a package."""

import numpy as np
import tensorflow_datasets as tfds

SOURCE_URL = ""
SPLITS = ("train", "validation", "test")


class VitbenchLoopbackTiny(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        features = tfds.features.FeaturesDict(
            {"image": tfds.features.Image(shape=(8, 8, 3)), "label": tfds.features.ClassLabel(num_classes=4)}
        )
        return self.dataset_info_from_configs(features=features)

    def _split_generators(self, dl_manager):
        path = dl_manager.download(SOURCE_URL)
        return {split: self._generate_examples(path, split) for split in SPLITS}

    def _generate_examples(self, path, split):
        with np.load(path) as f:
            for i, (x, y) in enumerate(zip(f[f"{split}_x"], f[f"{split}_y"], strict=True)):
                yield i, {"image": x, "label": int(y)}
