import os
import pickle

import numpy as np
import pytest
from conftest import SHARED_DATA, needs_shared_data, write_cifar_batch, write_image

from vitbench.datasets import DATASETS, find_status, imagenet_synsets
from vitbench.errors import UserError


def test_cifar_pickle_reads_images_in_hwc_order(cifar10_dir):
    split = DATASETS["cifar10"].load_split(cifar10_dir, "test")
    assert split.images.shape == (40, 32, 32, 3) and split.images.dtype == np.uint8  # in memory, as one array
    with open(cifar10_dir / "cifar-10-batches-py" / "test_batch", "rb") as f:
        raw = pickle.load(f, encoding="latin1")  # our own test file: trusted
    np.testing.assert_array_equal(split.images[3][:, :, 1].ravel(), raw["data"][3][1024:2048])  # green plane
    assert split.labels.tolist() == raw["labels"] and split.source == "cifar-pickle"
    assert split.is_subset  # 40 of the official 10,000


class Payload:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


def test_malicious_pickle_is_refused_not_executed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    (folder / "test_batch").write_bytes(pickle.dumps({"data": Payload(), "labels": [0]}))
    with pytest.raises(UserError, match=r"test_batch: refusing to unpickle (posix|os)\.system"):
        DATASETS["cifar10"].load_split(tmp_path, "test")
    assert not (tmp_path / "PWNED").exists()


def test_missing_and_corrupt_cifar_files_are_named(tmp_path):
    with pytest.raises(UserError, match="missing cifar10 folder: .*cifar-10-batches-py"):
        DATASETS["cifar10"].load_split(tmp_path, "train")
    write_cifar_batch(tmp_path / "cifar-10-batches-py" / "data_batch_1", 10, 10, "labels")
    with pytest.raises(UserError, match="missing cifar10 test batch: .*test_batch"):
        DATASETS["cifar10"].load_split(tmp_path, "test")
    (tmp_path / "cifar-10-batches-py" / "test_batch").write_bytes(b"\x80\x02garbage")
    with pytest.raises(UserError, match="test_batch: not a readable CIFAR batch"):
        DATASETS["cifar10"].load_split(tmp_path, "test")


def test_cifar100_uses_fine_labels(tmp_path):
    write_cifar_batch(tmp_path / "cifar-100-python" / "train", 200, 100, "fine_labels")
    split = DATASETS["cifar100"].load_split(tmp_path, "train")
    assert split.labels.max() == 99 and len(split) == 200


def test_imagenet_class_index_is_the_canonical_synset_order(imagenet_dir):
    split = DATASETS["imagenet"].load_split(imagenet_dir, "val")
    assert split.labels.tolist() == [0, 0, 0, 999, 999]  # not 0/1 from the two folders present
    assert split.image(0).mode == "RGB" and split.image(0).size == (48, 40)


def test_imagenet_rejects_unknown_synset_and_empty_class(imagenet_dir):
    write_image(imagenet_dir / "imagenet" / "val" / "n99999999" / "x.JPEG")
    with pytest.raises(UserError, match="n99999999.*not one of the 1000"):
        DATASETS["imagenet"].load_split(imagenet_dir, "val")
    (imagenet_dir / "imagenet" / "val" / "n99999999" / "x.JPEG").unlink()
    (imagenet_dir / "imagenet" / "val" / "n99999999").rmdir()
    (imagenet_dir / "imagenet" / "val" / "n01443537").mkdir()
    with pytest.raises(UserError, match="n01443537: empty class folder"):
        DATASETS["imagenet"].load_split(imagenet_dir, "val")


def test_imagenet_train_missing_is_named(imagenet_dir):
    with pytest.raises(UserError, match=r"missing ImageNet 'train' folder: .*imagenet/train"):
        DATASETS["imagenet"].load_split(imagenet_dir, "train")


def test_synset_file_beside_the_data_wins(tmp_path):
    synsets = imagenet_synsets(tmp_path)  # timm's bundled copy
    (tmp_path / "synset_words.txt").write_text("\n".join(f"{s} name" for s in reversed(synsets)))
    assert imagenet_synsets(tmp_path)[0] == synsets[-1]


def test_digits_is_real_and_split_deterministically():
    train, test = (DATASETS["digits"].load_split(None, s) for s in ("train", "test"))
    assert len(train) == 1000 and len(test) == 797 and not train.is_subset
    assert train.images.shape[1:] == (8, 8, 3) and train.images.max() == 255
    assert sorted(set(train.labels.tolist())) == list(range(10))


def _digits_here(cache) -> str:
    """What a fresh process reads of the digits with VITBENCH_CACHE=cache: whether it imported
    scikit-learn, and a digest of every split it loads (images, labels, fingerprint)."""
    import subprocess
    import sys

    code = (
        "import hashlib, sys\n"
        "from vitbench.datasets import DATASETS\n"
        "h = hashlib.sha256()\n"
        "for name in ('digits', 'digits0-4', 'digits5-9'):\n"
        "    for split in ('train', 'test'):\n"
        "        s = DATASETS[name].load_split(None, split)\n"
        "        h.update(s.images.tobytes() + s.labels.tobytes() + s.fingerprint.encode())\n"
        "print('sklearn' in sys.modules, h.hexdigest())"
    )
    env = {**os.environ, "VITBENCH_CACHE": str(cache)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_digits_kept_in_the_cache_are_scikit_learns_and_spare_its_import(tmp_path):
    """A process that finds the digits kept for the installed scikit-learn reads exactly what scikit-learn
    gives (images, labels, the fingerprint that keys runs) without importing it (1.4 s of a core); a
    damaged or altered file is only a cache: read from scikit-learn again, and rewritten."""
    cache = tmp_path / "cache"
    first = _digits_here(cache)
    assert first.startswith("True ")  # nothing kept yet: read from scikit-learn, and kept
    [kept] = cache.glob("digits-scikit-learn-*.npz")
    assert _digits_here(cache) == first.replace("True", "False", 1)
    kept.write_bytes(kept.read_bytes()[:-100])  # truncated
    assert _digits_here(cache) == first
    assert _digits_here(cache) == first.replace("True", "False", 1)  # rewritten whole
    with np.load(kept) as arrays:
        altered = dict(arrays)
    altered["scans"] = altered["scans"].copy()
    altered["scans"][0, 0, 0] = 17  # beyond scikit-learn's 0..16: not what this file holds
    np.savez(kept, **altered)
    assert _digits_here(cache) == first


def test_fingerprint_changes_with_the_files(cifar10_dir):
    before = DATASETS["cifar10"].load_split(cifar10_dir, "train").fingerprint
    write_cifar_batch(cifar10_dir / "cifar-10-batches-py" / "data_batch_1", 60, 10, "labels", seed=9)
    assert DATASETS["cifar10"].load_split(cifar10_dir, "train").fingerprint != before


def test_find_status(cifar10_dir, tmp_path):
    # the fixture has data_batch_1 only: incomplete, naming the first missing batch and the count
    assert find_status(DATASETS["cifar10"], cifar10_dir) == (
        "incomplete: missing cifar-10-batches-py/data_batch_2 (4 of 6 key files missing)"
    )
    for i in range(2, 6):
        write_cifar_batch(cifar10_dir / "cifar-10-batches-py" / f"data_batch_{i}", 10, 10, "labels")
    assert find_status(DATASETS["cifar10"], cifar10_dir) == "found"
    assert find_status(DATASETS["cifar100"], cifar10_dir) == "absent"
    assert find_status(DATASETS["digits"], None) == "embedded"
    (cifar10_dir / "cifar-10-batches-py" / "test_batch").unlink()
    assert find_status(DATASETS["cifar10"], cifar10_dir).startswith("incomplete: missing")


@needs_shared_data
def test_shared_cifar_subsets_load_with_a_subset_warning(caplog):
    split = DATASETS["cifar10"].load_split(SHARED_DATA, "train")
    assert len(split) == 1102 and split.is_subset
    assert "subset" in caplog.text
    assert len(DATASETS["cifar100"].load_split(SHARED_DATA, "test")) == 916
