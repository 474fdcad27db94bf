"""One extraction per split (issue 46, goal 2): few-shot, k-NN and the linear probe share one
cache entry per (model, weights, dataset, split, preprocessing, representation) that grows with
what each needs, and an interrupted extraction resumes from its last finished chunk. Counted in
images through the model (`run_over`), the real pass."""

from __future__ import annotations

import pytest

from vitbench import store
from vitbench.engine import features

FAST = ("--model", "vit-ti/16", "--weights", "random", "--dataset", "digits", "--res", "32", "--workers", "0")
DIGITS_TRAIN, DIGITS_TEST = 1000, 797


@pytest.fixture
def forwarded(monkeypatch):
    """The number of images each pass sends through the model, in order."""
    seen: list[int] = []
    real = features.run_over

    def counting(fn, model, split, *args, **kwargs):
        seen.append(len(split))
        return real(fn, model, split, *args, **kwargs)

    monkeypatch.setattr(features, "run_over", counting)
    return seen


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


def test_an_interrupted_extraction_resumes_from_its_last_finished_chunk(cli, tmp_path, forwarded, monkeypatch):
    """Chunks of 300 images: Ctrl-C in the third chunk of train keeps the first two; the rerun
    extracts train's other 400 and the test split, nothing twice."""
    monkeypatch.setattr(features, "CHUNK_IMAGES", 300)
    counting = features.run_over

    def interrupted_in_the_third_chunk(*args, **kwargs):
        if len(forwarded) == 2:
            raise KeyboardInterrupt
        return counting(*args, **kwargs)

    monkeypatch.setattr(features, "run_over", interrupted_in_the_third_chunk)
    args = ("run", *FAST, "--protocol", "knn", "--knn-k", "5", "--results", tmp_path / "results")
    code, _, err = cli(*args)
    assert code == 130 and forwarded == [300, 300], err
    monkeypatch.setattr(features, "run_over", counting)
    forwarded.clear()
    code, _, err = cli(*args)
    assert code == 0, err
    assert forwarded == [300, 100, 300, 300, 197]  # train's other 400, then test, in chunks
