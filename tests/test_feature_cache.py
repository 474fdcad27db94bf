"""One extraction per split (issue 46, goal 2): few-shot, k-NN and the linear probe share one
cache entry per (model, weights, dataset, split, preprocessing, representation) that grows with
what each needs, and an interrupted extraction resumes from its last finished chunk. Counted in
images through the model (`run_over_parts`, the real pass, a part per chunk of the cache), and in
DataLoaders made: one per split however it is chunked (issue 70, goal 3)."""

from __future__ import annotations

import pytest

from vitbench import store
from vitbench.engine import features, inference

FAST = ("--model", "vit-ti/16", "--weights", "random", "--dataset", "digits", "--res", "32", "--workers", "0")
DIGITS_TRAIN, DIGITS_TEST = 1000, 797


@pytest.fixture
def forwarded(monkeypatch):
    """The number of images each part of a pass (a chunk of the cache) sent through the model, in order."""
    seen: list[int] = []
    real = features.run_over_parts

    def counting(*args, **kwargs):
        for part in real(*args, **kwargs):
            seen.append(len(part.indices) + len(part.unreadable))
            yield part

    monkeypatch.setattr(features, "run_over_parts", counting)
    return seen


@pytest.fixture
def loaders(monkeypatch):
    """The DataLoaders made, one entry (the split's size) each."""
    made: list[int] = []
    real = inference.loader

    def counting(split, *args, **kwargs):
        made.append(len(split))
        return real(split, *args, **kwargs)

    monkeypatch.setattr(inference, "loader", counting)
    return made


def test_fewshot_knn_and_linear_in_one_command_extract_each_image_once(cli, tmp_path, forwarded):
    """Few-shot draws 50 train images first; k-NN and the linear probe then extract the other 950
    (before: all 1,000 again, few-shot's being another cache file)."""
    code, _, err = cli("run", *FAST, "--protocol", "fewshot,knn,linear", "--shots", "5", "--seeds", "0",
                       "--knn-k", "5", "--results", tmp_path / "results")  # fmt: skip
    assert code == 0, err
    assert sum(forwarded) == DIGITS_TRAIN + DIGITS_TEST
    assert len(list((tmp_path / "results" / "cache" / "features").glob("*.npz"))) == 2  # train, test
    # and the runs' FLOPs count each image once: k-NN counts the 950 it added, not few-shot's 50 again
    runs = store.read_results(tmp_path / "results").drop_duplicates("run_key")
    assert (runs["flops"] / runs["flops_per_image"]).sum() == pytest.approx(DIGITS_TRAIN + DIGITS_TEST)


def test_an_interrupted_extraction_resumes_from_its_last_finished_chunk(cli, tmp_path, forwarded, loaders,
                                                                         monkeypatch):  # fmt: skip
    """Chunks of 300 images: Ctrl-C in the third chunk of train keeps the first two; the rerun
    extracts train's other 400 and the test split, nothing twice; each split's pass is one
    DataLoader however many chunks it is kept in (before: one a chunk, its workers started anew)."""
    monkeypatch.setattr(features, "CHUNK_IMAGES", 300)
    counting = features.run_over_parts

    def interrupted_in_the_third_chunk(*args, **kwargs):
        for part in counting(*args, **kwargs):
            if len(forwarded) == 3:
                raise KeyboardInterrupt  # before the third chunk is kept
            yield part

    monkeypatch.setattr(features, "run_over_parts", interrupted_in_the_third_chunk)
    args = ("run", *FAST, "--protocol", "knn", "--knn-k", "5", "--results", tmp_path / "results")
    code, _, err = cli(*args)
    assert code == 130 and forwarded == [300, 300, 300], err
    monkeypatch.setattr(features, "run_over_parts", counting)
    forwarded.clear()
    loaders.clear()
    code, _, err = cli(*args)
    assert code == 0, err
    assert forwarded == [300, 100, 300, 300, 197]  # train's other 400, then test, in chunks: two kept
    assert loaders == [400, 797]  # one DataLoader for each split's pass, however many chunks it kept
