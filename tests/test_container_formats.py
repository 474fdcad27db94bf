"""`hf:`, `wds:` and `tfds:`: the same JPEG bytes as an ImageFolder tree, a Hub-style parquet
folder, a `save_to_disk` folder, WebDataset shards and a TFDS build give the same predictions and
accuracy in every protocol; bad containers are one line naming the file and member."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest
from container_data import samples, write_folder, write_parquet, write_saved, write_shards, write_tfds

from vitbench import store
from vitbench.catalog.registry import get_dataset
from vitbench.errors import UserError
from vitbench.store.predictions import read_predictions
from vitbench.store.query import json_field
from vitbench.views.measured.axes import with_axes

pytest.importorskip("datasets")
pytest.importorskip("webdataset")

FORMATS = ("folder", "parquet", "saved", "wds", "tfds")


@pytest.fixture(scope="module")
def same_bytes(tmp_path_factory) -> dict[str, str]:
    """Every format of one set of 3 classes x (16 train, 8 test) JPEGs: format -> --dataset value."""
    root = tmp_path_factory.mktemp("same-bytes")
    data = samples({"train": 16, "test": 8})
    made = {
        "folder": f"folder:{write_folder(data, root / 'folder')}",
        "parquet": f"hf:{write_parquet(data, root / 'parquet')}",
        "saved": f"hf:{write_saved(data, root / 'saved')}",
        "wds": f"wds:{write_shards(data, root / 'shards')}",
    }
    if _has_tfds():
        made["tfds"] = f"tfds:{write_tfds(data, root / 'tfds')}"
    return made


def _has_tfds() -> bool:
    try:
        import tensorflow_datasets  # noqa: F401
    except ImportError:
        return False
    return True


def test_every_format_reads_the_same_images_labels_and_classes(same_bytes):
    reference = get_dataset(same_bytes["folder"])
    for fmt, name in same_bytes.items():
        spec = get_dataset(name)
        assert spec.num_classes == 3 and spec.split_names == ("train", "test", "subtrain", "dev"), fmt
        if fmt != "folder":
            assert spec.class_names == ("ant", "bee", "cat") or fmt == "wds", fmt  # shards name no classes
        for split in ("train", "test", "dev"):
            ours, theirs = spec.load_split(None, split), reference.load_split(None, split)
            assert ours.labels.tolist() == theirs.labels.tolist(), (fmt, split)
            assert all(ours.encoded(i) == theirs.encoded(i) for i in range(len(ours))), (fmt, split)
            if fmt != "folder":
                assert ours.paths is None and ours.images is None and ours.records is not None  # nothing listed
    # a split's fingerprint comes from the container's files, not from reading images: stable, and distinct
    fingerprints = {fmt: get_dataset(n).load_split(None, "test").fingerprint for fmt, n in same_bytes.items()}
    assert len(set(fingerprints.values())) == len(fingerprints)
    assert get_dataset(same_bytes["wds"]).load_split(None, "test").fingerprint == fingerprints["wds"]


def _outcomes(results: Path) -> dict[tuple[str, str], tuple[float, list[int]]]:
    """(protocol and shots, data source) -> (accuracy, top-1 prediction of each test image in order)."""
    runs = with_axes(store.read_results(results))
    runs = runs[runs["metric"] == "accuracy"]
    found = {}
    for run in runs.itertuples():
        kept = read_predictions(results, run.run_key, json_field(run.notes)["predictions"])
        source = str(run.dataset).split(":")[0] + (":saved" if "saved@" in str(run.dataset) else "")
        found[(f"{run.protocol} {run.shots}", source)] = (float(run.value), kept["top1"].tolist())
    return found


def test_same_bytes_give_the_same_predictions_in_every_protocol(same_bytes, tmp_path):
    import vitbench

    results = tmp_path / "results"
    common = dict(model="vit-ti/16", weights=["random"], res=32, workers=0, seeds=[0], results=results)
    vitbench.run(datasets=list(same_bytes.values()), protocol=["fewshot", "knn", "linear"], shots=[2], **common)
    vitbench.run(datasets=list(same_bytes.values()), protocol=["finetune"], smoke=True, steps=3, batch=8, lr=0.01,
                 **common)  # fmt: skip
    found = _outcomes(results)
    settings = {setting for setting, _ in found}
    assert {s.split()[0] for s in settings} == {"fewshot", "knn", "linear", "finetune"}
    for setting in settings:
        by_source = {source: found[(setting, source)] for s, source in found if s == setting}
        assert len(by_source) == len(same_bytes), setting
        reference = by_source["folder"]
        assert len(set(reference[1])) > 1, setting  # a backbone that predicts one class would prove nothing
        for source, outcome in by_source.items():
            assert outcome == reference, (setting, source)
    runs = store.read_results(results)
    assert {r.split(":")[0] for r in runs["dataset"]} >= {"folder", "hf", "wds"}
    assert set(runs["data_source"]) >= {"imagefolder", "hf", "wds"}


# --- bad input: one line naming the file and member -------------------------------------------


def _tar(path: Path, members: list[tuple[str, bytes]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _shards(root: Path, train: list[tuple[str, bytes]], test: list[tuple[str, bytes]]) -> str:
    _tar(root / "train-000000.tar", train)
    _tar(root / "test-000000.tar", test)
    return f"wds:{root}"


def _good(n: int, start: int = 0, classes: int = 2) -> list[tuple[str, bytes]]:
    data = samples({"x": n}, seed=start)["x"]
    members = []
    for i, (_, _, raw) in enumerate(data):
        members += [(f"s{start + i:04d}.jpg", raw), (f"s{start + i:04d}.cls", str(i % classes).encode())]
    return members


def test_bad_shards_are_one_line_naming_shard_and_member(tmp_path, cli):
    def error(name: str) -> str:
        with pytest.raises(UserError) as e:
            spec = get_dataset(name)
            for split in ("train", "test"):
                spec.load_split(None, split)
        assert "\n" not in str(e.value)
        return str(e.value)

    root = tmp_path / "unlabelled"
    message = error(_shards(root, _good(4) + [("s9999.jpg", b"\xff\xd8")], _good(2)))
    assert (
        message
        == f"{root / 'train-000000.tar'}: member 's9999.jpg' has no label (.cls or .json member with its key s9999)"
    )
    root = tmp_path / "escape"
    message = error(_shards(root, _good(4) + [("../x.jpg", b"\xff\xd8"), ("../x.cls", b"0")], _good(2)))
    assert "member '../x.jpg' names a path outside the shard; refused" in message
    assert not (tmp_path / "x.jpg").exists()
    root = tmp_path / "truncated"
    _shards(root, _good(6), _good(2))
    shard = root / "train-000000.tar"
    shard.write_bytes(shard.read_bytes()[:1500])
    assert error(f"wds:{root}").startswith(f"{shard}: truncated")
    root = tmp_path / "other-classes"  # a test label that no training image has
    message = error(
        _shards(root, _good(4, classes=2), _good(2, 100, classes=2)[:2] + [("t.jpg", _good(1)[0][1]), ("t.cls", b"5")])
    )
    assert message.startswith(
        f"{root / 'test-000000.tar'}:t.jpg: label 5 of the test split is not one of train's classes 0..1"
    )
    assert (
        error(f"wds:{tmp_path}/nothing-{{000..003}}.tar")
        == f"wds:{tmp_path}/nothing-{{000..003}}.tar: matches no .tar shard"
    )
    root = tmp_path / "text-label"
    message = error(_shards(root, _good(2) + [("s5.jpg", b"x"), ("s5.cls", b"cat")], _good(2)))
    assert message == f"{root / 'train-000000.tar'}:s5.cls: label 'cat' is not a class index"


def test_bad_parquet_labels_and_images_are_named(tmp_path, cli):
    import datasets

    data = samples({"train": 3, "test": 2})
    folder = write_parquet(data, tmp_path / "pq")
    test_file = folder / "data" / "test-00000-of-00001.parquet"
    ds = datasets.Dataset.from_parquet(str(test_file))
    rows = ds.to_dict()
    rows["label"][1] = 7  # not a class of the three ClassLabel names; written without the ClassLabel check
    loose = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    plain = datasets.Dataset.from_dict(rows, features=loose)
    plain.to_parquet(str(test_file))
    with pytest.raises(UserError, match=r"test-00000-of-00001.parquet:row 1: label 7 of the test split is not one of"):
        get_dataset(f"hf:{folder}").load_split(None, "test")
    # undecodable bytes: one line naming the file and row, or counted under --skip-corrupt
    rows["label"][1] = 1
    rows["image"][1] = {"bytes": b"not a jpeg", "path": "broken.jpg"}
    datasets.Dataset.from_dict(rows, features=ds.features).to_parquet(str(test_file))
    args = ("run", "--model", "vit-ti/16", "--weights", "random", "--dataset", f"hf:{folder}", "--res", "32",
            "--workers", "0", "--protocol", "knn", "--results", str(tmp_path / "results"))  # fmt: skip
    code, _, err = cli(*args)
    assert code == 2 and err.strip().splitlines()[-1].startswith(
        f"error: {test_file}:row 1: corrupt or truncated image"
    )
    assert not (tmp_path / "results" / "vitbench.duckdb").exists() or store.read_results(tmp_path / "results").empty
    code, _, err = cli(*args, "--skip-corrupt")
    assert code == 0, err
    row = store.read_results(tmp_path / "results").iloc[0]
    assert row["skipped_images"] == 1 and f"{test_file}:row 1" in row["notes"]


def test_hf_needs_a_label_column_it_can_tell(tmp_path):
    import datasets

    rows = {"image": [{"bytes": b"x", "path": "a.jpg"}] * 4, "coarse": [0, 1, 0, 1], "fine": [0, 1, 2, 3]}
    features = datasets.Features({"image": datasets.Image(), "coarse": datasets.Value("int64"),
                                  "fine": datasets.Value("int64")})  # fmt: skip
    for split in ("train", "test"):
        datasets.Dataset.from_dict(rows, features=features).to_parquet(str(tmp_path / f"{split}-00000.parquet"))
    with pytest.raises(UserError, match=r"2 label columns \(coarse, fine\); name one: hf:<folder>#coarse"):
        get_dataset(f"hf:{tmp_path}")
    assert get_dataset(f"hf:{tmp_path}#fine").num_classes == 4
    assert get_dataset(f"hf:{tmp_path}#coarse").num_classes == 2
    with pytest.raises(UserError, match=r"no label column 'finest' \(columns: image, coarse, fine\)"):
        get_dataset(f"hf:{tmp_path}#finest")


def test_a_hub_repo_id_reads_the_local_hub_cache_only(tmp_path, monkeypatch):
    """`hf:owner/name` finds a snapshot in the Hub cache (HF_HUB_CACHE) without the network; a repo
    not there is one line saying how to fetch it."""
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.delenv("VITBENCH_DOWNLOAD", raising=False)
    repo = cache / "datasets--someone--tiny"
    snapshot = repo / "snapshots" / ("a" * 40)
    write_parquet(samples({"train": 2, "test": 1}), snapshot)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("a" * 40)
    spec = get_dataset("hf:someone/tiny")
    assert spec.class_names == ("ant", "bee", "cat") and len(spec.load_split(None, "train")) == 6
    with pytest.raises(UserError, match=r"hf:someone/absent: not in the local Hub cache; add --download"):
        get_dataset("hf:someone/absent")


def test_shard_indexes_are_kept_in_the_cache_and_the_shards_untouched(tmp_path, monkeypatch):
    monkeypatch.setenv("VITBENCH_CACHE", str(tmp_path / "cache"))
    root = write_shards(samples({"train": 4, "test": 2}), tmp_path / "shards", per_shard=5)
    before = {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in root.iterdir()}
    spec = get_dataset(f"wds:{root}")
    train = spec.load_split(None, "train")
    assert len(train) == 12 and len(list((tmp_path / "cache" / "wds-index").glob("*.npz"))) == 3
    assert {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in root.iterdir()} == before
    assert train.location(5).endswith("train-000001.tar:bee/train_001.jpg")
    # a pattern names the same shards
    pattern = get_dataset(f"wds:{root}/{{train-{{000000..000002}},test-{{000000..000001}}}}.tar")
    assert pattern.load_split(None, "train").labels.tolist() == train.labels.tolist()
    # _info.json's split sizes and class names, where a writer left one
    (root / "_info.json").write_text(json.dumps({"splits": {"train": {"num_samples": 12}}, "classes": ["a", "b", "c"]}))
    assert get_dataset(f"wds:{root}").class_names == ("a", "b", "c")
    assert np.array_equal(get_dataset(f"wds:{root}").load_split(None, "test").labels, [0, 0, 1, 1, 2, 2])


# --- an object store: shards and parquet read in ranges from an S3 server on 127.0.0.1 ------------


def test_shards_and_parquet_on_an_object_store_read_as_the_local_ones(s3, tmp_path, monkeypatch):
    monkeypatch.setenv("VITBENCH_CACHE", str(tmp_path / "cache"))
    data = samples({"train": 5, "test": 3})
    local = {"wds": write_shards(data, tmp_path / "shards", per_shard=6), "hf": write_parquet(data, tmp_path / "pq")}
    s3.put(str(local["wds"]), "data/shards", recursive=True)
    s3.put(str(local["hf"]), "data/pq", recursive=True)
    for prefix, remote in (("wds", "s3://data/shards"), ("hf", "s3://data/pq")):
        spec, reference = get_dataset(f"{prefix}:{remote}"), get_dataset(f"{prefix}:{local[prefix]}")
        for split in ("train", "test"):
            ours, theirs = spec.load_split(None, split), reference.load_split(None, split)
            assert ours.labels.tolist() == theirs.labels.tolist()
            assert [ours.encoded(i) for i in range(len(ours))] == [theirs.encoded(i) for i in range(len(theirs))]
            assert ours.location(0).startswith(f"{remote}/")
        assert spec.name != reference.name  # where the data lives is part of its identity
    assert not list(tmp_path.glob("cache/**/*.tar")) and not list(tmp_path.glob("cache/**/*.parquet"))  # no copies
    with pytest.raises(UserError, match=r"s3://data/none: matches no .tar shard"):
        get_dataset("wds:s3://data/none")


# --- the paper's datasets from the containers: --data-source hf | wds | tfds ----------------------


def test_cifar10_from_the_hub_shards_and_tfds_is_the_pickles_cifar10(cifar10_dir, tmp_path, monkeypatch, cli):
    """The same CIFAR-10 images (PNG, lossless, as the Hub's uoft-cs/cifar10 keeps them) under
    <data-dir>/hf/cifar10, <data-dir>/wds/cifar10 and a TFDS `cifar10` build: the same labels and
    pixels as the pickles, and the same few-shot and k-NN numbers, each source in the result's key."""
    import io as _io

    from PIL import Image

    from vitbench.datasets import DATASETS

    monkeypatch.setenv("VITBENCH_CACHE", str(tmp_path / "cache"))
    spec = DATASETS["cifar10"]
    pickles = {s: spec.load_split(cifar10_dir, s) for s in ("train", "test")}

    def png(pixels) -> bytes:
        out = _io.BytesIO()
        Image.fromarray(pixels).save(out, format="PNG")
        return out.getvalue()

    data = {s: [(f"{i:05d}", int(split.labels[i]), png(split.images[i])) for i in range(len(split))]
            for s, split in pickles.items()}  # fmt: skip
    names = [f"class{i}" for i in range(10)]
    write_parquet(data, cifar10_dir / "hf" / "cifar10", classes=names)
    write_shards(data, cifar10_dir / "wds" / "cifar10", per_shard=25)
    sources = ["hf", "wds"]
    if _has_tfds():
        write_tfds(data, cifar10_dir, name="cifar10", version="3.0.2", classes=names)
        sources.append("tfds")
    for source in sources:
        for s, reference in pickles.items():
            split = spec.load_split(cifar10_dir, s, source)
            assert split.dataset == "cifar10" and split.source == source
            assert split.official_size == reference.official_size
            assert split.labels.tolist() == reference.labels.tolist()
            assert all(np.array_equal(np.asarray(split.image(i)), reference.images[i]) for i in range(len(split)))
    results = tmp_path / "results"
    base = ("run", "--model", "vit-ti/16", "--weights", "random", "--dataset", "cifar10", "--data-dir",
            str(cifar10_dir), "--res", "32", "--workers", "0", "--shots", "2", "--seeds", "0",
            "--protocol", "fewshot,knn", "--results", str(results))  # fmt: skip
    for source in [None, *sources]:
        code, _, err = cli(*base, *(("--data-source", source) if source else ()))
        assert code == 0, err
    runs = store.read_results(results)
    runs = runs[runs["metric"] == "accuracy"]
    assert set(runs["data_source"]) == {"cifar-pickle", *sources}
    for protocol, group in runs.groupby("protocol"):
        assert group["value"].nunique() == 1, (protocol, group[["data_source", "value"]])
        assert group["run_key"].nunique() == len(group)  # each source its own result
    # a source that is not there: one line naming where it was looked for
    code, _, err = cli(*base[:-2], "--results", str(tmp_path / "r2"), "--dataset", "pets", "--data-source", "wds")
    assert code == 2 and err.strip().splitlines()[-1] == (
        f"error: {cifar10_dir / 'wds' / 'oxford-iiit-pet'}: missing; --data-source wds reads pets's shards "
        f"(<split>-*.tar) there"
    )


# --- training from shards: a shard-ordered stream, killed and resumed ------------------------------


def test_a_shard_ordered_stream_reads_one_file_at_a_time_and_is_a_function_of_seed_and_epoch():
    from vitbench.engine.train_data import Stream

    groups = np.repeat(np.arange(6), [5, 7, 3, 9, 4, 6])  # six shards of unequal sizes
    stream = Stream(len(groups), batch=4, micro=4, seed=3, groups=groups)
    for epoch in range(3):
        order = stream._epoch(epoch)
        assert sorted(order.tolist()) == list(range(len(groups)))  # every image once an epoch
        files = groups[order]
        assert (np.diff(files) != 0).sum() == 5  # each file's images together: 5 switches for 6 files
        assert order.tolist() == Stream(len(groups), 4, 4, 3, groups=groups)._epoch(epoch).tolist()
    assert not np.array_equal(stream._epoch(0), stream._epoch(1))
    # ranks take contiguous slices of each global batch: together they read the same stream
    ranks = [Stream(len(groups), 4, 2, 3, rank=r, world=2, groups=groups) for r in (0, 1)]
    merged = [i for step in zip(*(r.micro_batches(0, 5) for r in ranks), strict=True) for b in step for i, _ in b]
    assert merged == [i for b in stream.micro_batches(0, 5) for i, _ in b]


@pytest.mark.slow
def test_a_streamed_finetune_killed_and_resumed_ends_as_an_uninterrupted_one(tmp_path):
    """`--train-order shards` from WebDataset shards, killed with SIGKILL after a checkpoint and run
    again: it resumes the stream where the checkpoint left it, step for step as a run never stopped."""
    import signal
    import subprocess
    import sys
    import time

    from vitbench.store import read_curves

    shards = write_shards(samples({"train": 16, "test": 4}), tmp_path / "shards", per_shard=7)
    steps = 40
    args = ["run", "--model", "vit-ti/16", "--weights", "random", "--dataset", f"wds:{shards}", "--protocol",
            "finetune", "--res", "32", "--batch", "16", "--workers", "0", "--device", "cpu", "--steps", str(steps),
            "--lr", "0.03", "--seeds", "0", "--checkpoint-every", "5", "--train-order", "shards"]  # fmt: skip
    env = {**os.environ, "VITBENCH_CACHE": str(tmp_path / "cache")}

    def command(results: str) -> list[str]:
        return [sys.executable, "-m", "vitbench", *args, "--results", str(tmp_path / results)]

    straight = subprocess.Popen(command("straight"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    proc = subprocess.Popen(command("killed"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 180
    while not list((tmp_path / "killed" / "runs").glob("*/checkpoint.pt")) and time.monotonic() < deadline:
        assert proc.poll() is None, "the run ended before its first checkpoint"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    resumed = subprocess.run(command("killed"), capture_output=True, text=True, env=env, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed at step" in resumed.stderr
    assert straight.wait(timeout=600) == 0, straight.stderr.read() if straight.stderr else ""
    curves = {n: read_curves(tmp_path / n) for n in ("killed", "straight")}
    losses = [c[c["name"] == "train_loss"]["value"].tolist() for c in curves.values()]
    assert len(losses[0]) == steps and losses[0] == losses[1]
    runs = {n: store.read_results(tmp_path / n) for n in ("killed", "straight")}
    accuracy = {n: r.loc[r["metric"] == "accuracy", "value"].item() for n, r in runs.items()}
    assert accuracy["killed"] == accuracy["straight"]
    assert json.loads(runs["killed"]["hparams"].iloc[0])["train_order"].startswith("shards")


def test_a_shard_order_for_a_split_not_in_shards_is_refused_as_planned(same_bytes, cli, tmp_path):
    code, _, err = cli("run", "--model", "vit-ti/16", "--weights", "random", "--dataset", same_bytes["folder"],
                       "--protocol", "finetune", "--smoke", "--train-order", "shards", "--dry-run",
                       "--results", str(tmp_path / "r"))  # fmt: skip
    assert code == 2 and err.strip().splitlines()[-1].startswith("error: --train-order shards: folder:")
    code, out, err = cli("run", "--model", "vit-ti/16", "--weights", "random", "--dataset", same_bytes["wds"],
                         "--protocol", "finetune", "--smoke", "--train-order", "shards", "--dry-run",
                         "--results", str(tmp_path / "r"))  # fmt: skip
    assert code == 0, err


def test_shard_members_are_grouped_by_webdatasets_own_rule():
    from webdataset.tariterators import base_plus_ext

    from vitbench.datasets.wds_format import _base_plus_ext

    names = ["a.jpg", "dir/a.b.jpg", "x/y/z.seg.png", "noext", ".hidden", "a..b", "d.ir/f.cls", "n0142/img_17.JPEG"]
    assert [_base_plus_ext(n) for n in names] == [base_plus_ext(n) for n in names]


def test_shards_of_a_paper_dataset_with_few_of_its_classes_keep_the_datasets_classes(tmp_path, monkeypatch):
    """Shards name no classes; for a paper dataset the count is the dataset's (Pets: 37), not train's
    largest label + 1 (the shared Pets subset holds 6 of the 37 breeds: it was refused as 6 classes)."""
    from vitbench.datasets import DATASETS

    monkeypatch.setenv("VITBENCH_CACHE", str(tmp_path / "cache"))
    data = samples({"train": 2, "test": 1})
    data = {s: [(n, {0: 3, 1: 20, 2: 36}[y], b) for n, y, b in items] for s, items in data.items()}
    write_shards(data, tmp_path / "wds" / "oxford-iiit-pet")
    test = DATASETS["pets"].load_split(tmp_path, "test", "wds")
    assert test.labels.tolist() == [3, 20, 36] and test.source == "wds" and test.is_subset
