import json
import shutil

import numpy as np
import pytest
from conftest import DEIT_WEIGHTS, SHARED_DATA, needs_shared_data
from PIL import Image

import vitbench
from vitbench import store
from vitbench.datasets import Split
from vitbench.engine import ridge
from vitbench.engine.feature_cache import FeatureCache
from vitbench.engine.inference import Outputs
from vitbench.errors import UserError
from vitbench.protocols import fewshot as fewshot_protocol
from vitbench.views.measured.axes import with_axes


def dense_ridge_accuracy(x, y, x_test, y_test, num_classes, l2):
    """The same problem solved independently: normal equations with a dense solve."""
    mean, std = x.mean(0), x.std(0) + 1e-5
    xb = np.hstack([(x - mean) / std, np.full((len(x), 1), 100.0)])
    targets = 2 * np.eye(num_classes)[y] - 1
    w = np.linalg.solve(xb.T @ xb + l2 * np.eye(xb.shape[1]), xb.T @ targets)
    xt = np.hstack([(x_test - mean) / std, np.full((len(x_test), 1), 100.0)])
    return w, np.mean(np.argmax(xt @ w, 1) == y_test)


@pytest.mark.parametrize("many_l2", [False, True])  # direct solve for one λ, eigh for a sweep
@pytest.mark.parametrize("n, d", [(200, 16), (20, 64)])  # primal (N >= D) and kernel (N < D) branches
def test_solver_matches_dense_solve(n, d, many_l2):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(n, d)), rng.integers(0, 5, n)
    xt, yt = rng.normal(size=(300, d)), rng.integers(0, 5, 300)
    solver = ridge.RidgeSolver.fit(x, y, 5, many_l2=many_l2)
    for l2 in (2.0**-3, 1.0, 1024.0):
        w_ref, acc_ref = dense_ridge_accuracy(x, y, xt, yt, 5, l2)
        np.testing.assert_allclose(solver.weights(l2), w_ref, rtol=1e-6, atol=1e-6)
        assert solver.accuracy(xt, yt, l2) == pytest.approx(acc_ref, abs=1e-12)


def test_sampling_is_big_visions_nested_per_class_permutation():
    labels = np.repeat(np.arange(4), 30)
    one, five = (ridge.sample_indices(labels, 4, k, seed=1) for k in (1, 5))
    assert len(five) == 20 and np.bincount(labels[five]).tolist() == [5, 5, 5, 5]
    assert set(one) <= set(five)  # per-class permutations are shared across shot counts
    rng = np.random.default_rng(1)
    expected = np.concatenate([rng.permutation(np.flatnonzero(labels == c))[:5] for c in range(4)])
    np.testing.assert_array_equal(five, expected)
    assert not np.array_equal(five, ridge.sample_indices(labels, 4, 5, seed=2))


def test_sampling_of_shuffled_labels_with_images_left_out_draws_as_one_pass_per_class_did():
    """Issue 89: each class's images found by one sort draw exactly what a pass per class drew."""
    rng = np.random.default_rng(3)
    labels, present = rng.integers(0, 7, 500), rng.random(500) > 0.2
    for seed, shots in ((0, 1), (4, 25)):
        draw = np.random.default_rng(seed)
        expected = []
        for c in range(8):  # class 7 has no image: drawn from, as the reference does
            order = draw.permutation(np.flatnonzero(labels == c))
            expected.append(order[present[order]][:shots])
        np.testing.assert_array_equal(ridge.sample_indices(labels, 8, shots, seed, present), np.concatenate(expected))


def test_scoring_a_few_rows_at_a_time_gives_the_whole_tests_accuracy_and_top_classes(monkeypatch):
    """Issue 89: the test split is scored SCORED_VALUES at a time; what it gives does not depend on it."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(60, 8)), rng.integers(0, 12, 60)
    xt, yt = rng.normal(size=(101, 8)), rng.integers(0, 12, 101)
    whole_top = []
    whole = ridge.fewshot_accuracies((x, y), (xt, yt), 12, 3, 0, (1.0, 64.0), keep_top=whole_top)
    monkeypatch.setattr(ridge, "SCORED_VALUES", 12 * 7)  # 7 rows at a time, the last chunk short
    parts_top = []
    parts = ridge.fewshot_accuracies((x, y), (xt, yt), 12, 3, 0, (1.0, 64.0), keep_top=parts_top)
    assert parts == whole and whole[0][1.0] > 0
    drawn = ridge.sample_indices(y, 12, 3, 0)
    scores = ridge.RidgeSolver.fit(x[drawn], y[drawn], 12).scores(xt, 1.0)
    expected = np.argsort(-scores.float().numpy(), axis=1, kind="stable")[:, :5]
    np.testing.assert_array_equal(whole_top[0], expected)
    np.testing.assert_array_equal(parts_top[0], expected)


def test_linear_probe_separates_separable_features():
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(10, 32)) * 5
    y = np.repeat(np.arange(10), 50)
    x = centers[y] + rng.normal(size=(500, 32))
    accs, n = ridge.fewshot_accuracies((x, y), (x, y), 10, shots=5, seed=0, l2s=(1024.0,))
    assert n == 50 and accs[1024.0] > 0.9


@pytest.mark.parametrize("text, label", [("1024", "1024"), ("2^10", "1024"), ("0.5", "0.5")])
def test_parse_l2(text, label):
    assert fewshot_protocol.parse_l2(text)[0] == label


def test_parse_l2_sweep_and_errors():
    assert fewshot_protocol.parse_l2("sweep")[1] == tuple(2.0**i for i in range(-10, 20))
    for bad in ("-1", "abc", "0"):
        with pytest.raises(UserError, match="--fewshot-l2"):
            fewshot_protocol.parse_l2(bad)


def test_cache_key_covers_everything_that_changes_features(tmp_path):
    parts = dict(
        model="vit-b/16",
        arch="vit_base_patch16_224",
        weights="ab" * 32,
        res=224,
        dataset="cifar10",
        source="cifar-pickle",
        fingerprint="f00",
        split="train",
        preprocessing="resize(256)|crop(224)",
        representation="LN(CLS)",
    )
    base = FeatureCache.key(**parts)
    assert FeatureCache.key(**dict(parts)) == base
    for name in parts:
        changed = {**parts, name: str(parts[name]) + "x" if not isinstance(parts[name], int) else 384}
        assert FeatureCache.key(**changed) != base, name
    cache = FeatureCache(tmp_path / "cache" / "features")
    split = Split("d", "train", np.array([0, 9, 1, 2]), "test", "fp")
    assert cache.load(base, split) is None
    cache.save(base, Outputs(np.ones((3, 2), np.float32), np.arange(3), np.array([0, 2, 3]), ["x.jpg: corrupt"]))
    found = cache.load(base, split)
    assert found.values.shape == (3, 2) and found.labels.tolist() == [0, 1, 2]
    assert found.indices.tolist() == [0, 2, 3] and found.skipped == ["x.jpg: corrupt"]


def test_a_damaged_cache_file_is_recomputed_not_fatal(tmp_path):
    cache = FeatureCache(tmp_path / "cache" / "features")
    split = Split("d", "train", np.arange(100), "test", "fp")
    cache.save("k", Outputs(np.ones((100, 8), np.float32), np.arange(100), np.arange(100)))
    cache.path("k").write_bytes(cache.path("k").read_bytes()[:300])  # truncated
    assert cache.load("k", split) is None
    assert (tmp_path / "quarantine" / "k.npz").exists()


@pytest.mark.parametrize(
    "outputs, width, problem",
    [
        (Outputs(np.ones((100, 8), np.float32), np.arange(100), np.arange(100)), 16, "8 wide, 16 expected"),
        (Outputs(np.ones((100, 8), np.float32), np.arange(100)[::-1].copy(), np.arange(100)), None, "labelled unlike"),
        (Outputs(np.full((100, 8), np.nan, np.float32), np.arange(100), np.arange(100)), None, "not finite"),
        (Outputs(np.ones((5, 8), np.float32), np.arange(5), np.arange(200, 205)), None, "index images the split"),
    ],
)
def test_cached_outputs_that_do_not_fit_the_split_are_quarantined(tmp_path, caplog, outputs, width, problem):
    """Before: a cached feature file of the wrong width was used (`features_from_cache: True`)."""
    cache = FeatureCache(tmp_path / "cache" / "features")
    cache.save("k", outputs)
    assert cache.load("k", Split("d", "train", np.arange(100), "test", "fp"), width) is None
    assert problem in caplog.text and (tmp_path / "quarantine" / "k.npz").exists()


def test_a_swapped_cache_file_of_another_width_is_recomputed(cli, results):
    """The few-shot test features replaced by a file of another model's width: recomputed, same result."""
    run = ("run", "--model", "vit-ti/16", "--weights", "random", "--dataset", "digits", "--res", "32",
           "--workers", "0", "--shots", "1", "--seeds", "0", "--results", results)  # fmt: skip
    assert cli(*run)[0] == 0
    before = store.read_results(results).set_index("metric")["value"]["accuracy"]
    files = (results / "cache" / "features").glob("*.npz")
    test_file = next(p for p in files if len(np.load(p)["labels"]) == 797)  # digits test; train: the 10 drawn
    with np.load(test_file) as f:
        wide = Outputs(np.ones((len(f["labels"]), 7), np.float32), f["labels"], f["indices"])
    FeatureCache(test_file.parent).save(test_file.stem, wide)
    code, _, err = cli(*run, "--rerun")
    assert code == 0 and "192 wide for train, 7 for test" in err
    assert store.read_results(results).set_index("metric")["value"]["accuracy"] == before


def test_the_solve_on_tensors_equals_the_solve_on_arrays():
    """The runner hands the solver features already on the device (torch); numpy gives the same."""
    import torch

    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(300, 24)).astype(np.float32), rng.integers(0, 6, 300)
    xt, yt = rng.normal(size=(200, 24)).astype(np.float32), rng.integers(0, 6, 200)
    arrays, n = ridge.fewshot_accuracies((x, y), (xt, yt), 6, 10, 0, fewshot_protocol.L2_GRID)
    tensors, n2 = ridge.fewshot_accuracies((torch.from_numpy(x), y), (torch.from_numpy(xt), torch.from_numpy(yt)),
                                             6, 10, 0, fewshot_protocol.L2_GRID)  # fmt: skip
    assert n == n2 == 60 and arrays == pytest.approx(tensors, abs=1e-12)


def test_bf16_extraction_is_a_run_of_its_own(cli, tmp_path):
    results = tmp_path / "results"
    digits = ("--dataset", "digits", "--model", "vit-ti/16", "--weights", "random")
    args = ("run", *digits, "--res", "32", "--workers", "0", "--shots", "5", "--seeds", "0", "--results", results)
    assert cli(*args)[0] == 0
    assert cli(*args, "--precision", "bf16")[0] == 0
    df = store.read_results(results)
    assert df["run_key"].nunique() == 2  # bf16 features change the numbers: another key, another cache entry
    precisions = sorted(json.loads(h).get("precision", "fp32") for h in df["hparams"])
    assert precisions == ["bf16", "fp32"]
    assert abs(df["value"].iloc[0] - df["value"].iloc[1]) < 0.05
    assert len(list((results / "cache" / "features").glob("*.npz"))) == 4


def test_shots_come_from_the_datasets_fewshot_part_of_train_unless_full(cli, results, one_run, monkeypatch):
    """ImageNet's few-shot train is big_vision's 65,000 images (65 per class), not 1.28M: shown on
    digits with a part of 100 (10 per class), and `--fewshot-train full` for the whole split."""
    import dataclasses

    from vitbench.catalog import registry
    from vitbench.catalog.entry_points import Registry

    known = registry.datasets()
    assert known["imagenet"].per_protocol == {"fewshot": {"train_limit": 65_000}}
    with_part = [
        dataclasses.replace(d, per_protocol={"fewshot": {"train_limit": 100}}) if d.name == "digits" else d
        for d in known.values()
    ]
    monkeypatch.setattr(registry, "DATASETS_BY_NAME", Registry("dataset", lambda d: d.name, lambda: with_part))
    run = ("run", "--model", "vit-ti/16", "--weights", "random", "--dataset", "digits", "--res", "32",
           "--workers", "0", "--shots", "25", "--seeds", "0", "--results", results)  # fmt: skip
    shutil.copytree(one_run / "cache", results / "cache")
    code, _, err = cli(*run)
    assert code == 0 and "digits train has only 10 image(s) in its smallest class" in err
    part = store.read_results(results).iloc[0]
    assert json.loads(part["hparams"])["fewshot_train"].startswith("10 per class (100 images")
    assert part["n_train"] == 100 and json.loads(part["notes"])["effective_shots"] == 10
    # planning leaves the group's train split whole (it replaced it by the part); the runs draw from the part
    (group,) = vitbench.plan(model="vit-ti/16", weights="random", datasets="digits", res=32, shots=[25], seeds=[0],
                             results=results)  # fmt: skip
    assert len(group.splits["train"]) > 100 and group.specs[0].run_key == part["run_key"]
    code, _, err = cli(*run, "--fewshot-train", "full")
    assert code == 0 and "1 to run" in err
    full = store.read_results(results).drop_duplicates("run_key").set_index("run_key")
    assert sorted(full["n_train"]) == [100, 250]
    code, _, err = cli(*run, "--fewshot-train", "some")
    assert code == 2 and "--fewshot-train some: expected default or full" in err


# --- sample first: only the drawn train images are extracted (issue 15, item 11) -----------------


def _fewshot_values(results):
    df = with_axes(store.read_results(results)).query("protocol == 'fewshot' and metric == 'accuracy'")
    return {(int(r.shots), int(r.seed)): (r.value, int(r.n_train)) for r in df.itertuples()}


def _features_from_cache(results) -> set:
    df = store.read_results(results).query("protocol == 'fewshot'")
    return {json.loads(n)["features_from_cache"] for n in df["notes"]}


@needs_shared_data
def test_sampling_first_equals_extracting_everything_on_real_pets(cli, tmp_path):
    """DeiT-Ti on the shared Pets subset: few-shot that extracts only the drawn train images gives
    the numbers few-shot on a full extraction gives (here the k-NN run's, which reads every image).
    At 112 px: the equality holds at any size, and a quarter of the pixels is a quarter of the time."""
    args = ("run", "--model", "deit-ti/16", "--weights", DEIT_WEIGHTS, "--dataset", "pets", "--data-dir",
            SHARED_DATA, "--shots", "1,5", "--seeds", "0,1", "--workers", "0", "--res", "112")  # fmt: skip
    sampled, full = tmp_path / "sampled", tmp_path / "full"
    assert cli(*args, "--results", sampled)[0] == 0
    # the test split's features are the same pass either way: full starts from them, and extracts
    # the whole train split in the k-NN run (sampled holds only the drawn train images)
    shutil.copytree(sampled / "cache", full / "cache")
    assert cli(*args, "--protocol", "knn", "--results", full)[0] == 0
    assert cli(*args, "--results", full)[0] == 0
    assert _features_from_cache(sampled) == {False} and _features_from_cache(full) == {True}
    assert _fewshot_values(sampled) == _fewshot_values(full) and len(_fewshot_values(full)) == 4
    train, test = sorted(len(np.load(p)["labels"]) for p in (sampled / "cache" / "features").glob("*.npz"))
    assert 15 < train <= 30 and test == 298  # 5 shots x 3 breeds x 2 seeds drawn (1-shot inside), all of test


def test_an_unreadable_drawn_image_is_replaced_by_the_next_of_its_permutation(cli, tmp_path):
    """With --skip-corrupt, sampling first and extracting everything take the same images: the
    first readable ones of each class's permutation, so the numbers are the same."""
    root = tmp_path / "pics"
    rng = np.random.default_rng(0)
    for split, n in (("train", 12), ("test", 6)):
        for c in range(3):
            folder = root / split / f"class{c}"
            folder.mkdir(parents=True)
            for i in range(n):
                pixels = np.clip(rng.normal(60 * c + 40, 30, (20, 20, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(folder / f"{i:02d}.png")
                if split == "train" and i % 3 == 0:  # a third of train is unreadable
                    (folder / f"{i:02d}.png").write_bytes(b"not a png")
    args = ("run", "--model", "vit-ti/16", "--weights", "random", "--dataset", f"folder:{root}", "--res", "32",
            "--workers", "0", "--shots", "2,5", "--seeds", "0,1,2", "--skip-corrupt")  # fmt: skip
    sampled, full = tmp_path / "sampled", tmp_path / "full"
    assert cli(*args, "--results", sampled)[0] == 0
    assert cli(*args, "--protocol", "knn", "--results", full)[0] == 0
    assert cli(*args, "--results", full)[0] == 0
    assert _fewshot_values(sampled) == _fewshot_values(full)
    assert {n for _, n in _fewshot_values(full).values()} == {6, 15}  # 2 and 5 readable shots of 3 classes
    # a later run with more shots reads only what it lacks, from the cache entry the first one grew
    code, _, err = cli(*args[:-5], "--shots", "8", "--seeds", "0", "--skip-corrupt", "--results", sampled)
    assert code == 0, err
    assert _fewshot_values(sampled)[(8, 0)][1] == 24  # all 8 readable images of each class
