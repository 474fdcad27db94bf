"""Every file format vitbench reads, fuzzed (issue 63): CIFAR pickles, weights (.npz, .safetensors,
.pth), configs, dedup checkpoints and leases get random bytes, truncations, wrong dtypes,
out-of-range values and FIFOs. Each answer is a correct result or one line naming the file, never
a traceback and never a hang (a FIFO is refused before it is opened for reading). Shards and image
files have their own fuzz tests (test_fuzz.py, test_shard_fuzz.py). Hypothesis, derandomised."""

from __future__ import annotations

import io
import json
import os
import pickle
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from vitbench.catalog.registry import get_model
from vitbench.cli import config as cfg
from vitbench.cli.run import run as run_command
from vitbench.datasets import Split, imagenet
from vitbench.datasets.cifar import read_cifar_batch
from vitbench.datasets.imagenet import imagenet_synsets
from vitbench.datasets.pets import load_pets
from vitbench.engine import dedup
from vitbench.errors import UserError
from vitbench.execution.lease import UNREADABLE_GRACE, Lease
from vitbench.weights.loading import check_weights_file, read_state_dict

FUZZ = settings(derandomize=True, deadline=None, suppress_health_check=list(HealthCheck), database=None)
FIFO = b"<fifo>"  # in place of contents: the file is made a FIFO
FOLDER = b"<folder>"  # in place of contents: a folder of the file's name


def _write(path: Path, content: bytes) -> Path:
    if path.is_dir() and not path.is_symlink():
        path.rmdir()
    path.unlink(missing_ok=True)
    if content == FIFO:
        os.mkfifo(path)
    elif content == FOLDER:
        path.mkdir()
    else:
        path.write_bytes(content)
    return path


def _one_line(error: BaseException, path: Path) -> None:
    assert isinstance(error, UserError), f"{type(error).__name__}: {error}"
    assert str(path) in str(error) and "\n" not in str(error), str(error)


def _damaged(valid: bytes):
    """Random bytes, the valid file cut anywhere or with bytes flipped, an empty file, or a FIFO."""
    return st.one_of(
        st.binary(max_size=300),
        st.integers(0, max(len(valid) - 1, 0)).map(lambda n: valid[:n]),
        st.tuples(st.integers(0, max(len(valid) - 1, 0)), st.binary(min_size=1, max_size=8)).map(
            lambda cut: valid[: cut[0]] + cut[1] + valid[cut[0] + len(cut[1]) :]
        ),
        st.just(b""),
        st.just(FIFO),
    )


# CIFAR pickles: any dtype and range of `data` and labels (issue 63: int64 above 255 wrapped into uint8)
cifar_data = st.one_of(
    st.sampled_from(["uint8", "int64", "int16", "float32", "bool"]).flatmap(
        lambda dtype: st.integers(-300, 300).map(lambda v: np.full((2, 3072), v).astype(dtype))
    ),
    st.integers(-5, 400).map(lambda v: [[v] * 3072, [0] * 3072]),
    st.just(np.zeros((2, 100), dtype=np.uint8)),
    st.just("pixels"),
)
cifar_labels = st.one_of(st.just([1, 2]), st.just([1]), st.just([-1, 2]), st.just([1.5, 2.0]), st.just("ab"))


@settings(FUZZ, max_examples=40)
@given(data=cifar_data, labels=cifar_labels, damage=st.one_of(st.none(), _damaged(b"x" * 64)))
def test_cifar_batches_read_correctly_or_in_one_line(tmp_path_factory, data, labels, damage):
    path = tmp_path_factory.mktemp("cifar") / "data_batch_1"
    content = pickle.dumps({"data": data, "labels": labels}) if damage is None else damage
    _write(path, content)
    try:
        images, read_labels = read_cifar_batch(path, "labels")
    except Exception as e:
        _one_line(e, path)
        return
    raw = np.asarray(data)
    assert raw.dtype.kind in "iu" and raw.min() >= 0 and raw.max() <= 255  # nothing out of range gets through
    assert images.dtype == np.uint8 and images.shape == (2, 32, 32, 3) and (images.reshape(2, -1).max(1) >= 0).all()
    assert read_labels.tolist() == labels


def _weights_files() -> dict[str, bytes]:
    model = get_model("vit-ti/16")
    state = {"pos_embed": torch.zeros(1, 5, 192), "head.weight": torch.ones(3, 192)}
    buffer = io.BytesIO()
    torch.save(state, buffer)
    from safetensors.torch import save

    npz = io.BytesIO()
    np.savez(npz, **{"Transformer/posembed_input/pos_embedding": np.zeros((1, 5, 192), np.float32)})
    return {".pth": buffer.getvalue(), ".safetensors": save(state), ".npz": npz.getvalue()}, model


WEIGHTS, MODEL = _weights_files()


@settings(FUZZ, max_examples=45)
@given(suffix=st.sampled_from(sorted(WEIGHTS)), content=st.sampled_from(sorted(WEIGHTS)).flatmap(
    lambda s: _damaged(WEIGHTS[s])))  # fmt: skip
def test_weights_files_load_or_fail_in_one_line(tmp_path_factory, suffix, content):
    path = _write(tmp_path_factory.mktemp("weights") / f"w{suffix}", content)
    try:
        state = read_state_dict(check_weights_file(path, f"--weights {path}"), MODEL)
    except Exception as e:
        _one_line(e, path)
        return
    assert all(isinstance(v, torch.Tensor) for v in state.values())


CONFIG = b'model = "vit-ti/16"\nweights = "random"\nseeds = [0, 1]\nres = 32\n'


@settings(FUZZ, max_examples=30)
@given(content=_damaged(CONFIG))
def test_configs_load_or_fail_in_one_line(tmp_path_factory, content):
    path = _write(tmp_path_factory.mktemp("config") / "exp.toml", content)
    try:
        loaded = cfg.load(path, cfg.option_kinds(run_command))
    except Exception as e:
        _one_line(e, path)
        return
    assert isinstance(loaded, dict)


@pytest.fixture(scope="module")
def small_audit():
    rng = np.random.default_rng(0)
    train = rng.integers(0, 255, (120, 16, 16, 3), dtype=np.uint8)
    test = np.concatenate([train[:3], rng.integers(0, 255, (17, 16, 16, 3), dtype=np.uint8)])

    def split(name, images):
        return Split("fuzz", name, np.zeros(len(images), dtype=np.int64), "arrays", name, images=images)

    method = dedup.Method()
    test_split, train_split = split("test", test), split("train", train)
    whole = dedup.audit(test_split, train_split, method, block=40)[0]
    return test_split, train_split, method, [(p.test, p.duplicate) for p in whole]


def _checkpoint_bytes(small_audit, folder: Path, monkeypatch) -> bytes:
    """A real checkpoint: an audit stopped after its second block of three."""
    test, train, method, _ = small_audit
    monkeypatch.setattr(dedup, "CHECKPOINT_SECONDS", 0.0)

    def stop(blocks, total):
        for i, block in enumerate(blocks):
            if i == 2:
                raise KeyboardInterrupt
            yield block

    with pytest.raises(KeyboardInterrupt):
        dedup.audit(test, train, method, block=40, progress=stop, checkpoint=folder / "real.pt")
    return (folder / "real.pt").read_bytes()


def test_dedup_checkpoints_continue_or_start_over_with_the_same_pairs(small_audit, tmp_path, monkeypatch):
    """A damaged checkpoint (issue 63: an 18-frame traceback on every rerun) is set aside and the
    search starts over: the same pairs as an audit without one, for every damage drawn."""
    test, train, method, expected = small_audit
    valid = _checkpoint_bytes(small_audit, tmp_path, monkeypatch)
    counter = iter(range(10**6))

    @settings(FUZZ, max_examples=25)
    @given(st.one_of(st.just(valid), _damaged(valid)))
    def check(content):
        path = _write(tmp_path / f"c{next(counter)}.pt", content)
        pairs, _, seen, _ = dedup.audit(test, train, method, block=40, checkpoint=path)
        assert [(p.test, p.duplicate) for p in pairs] == expected and seen == len(train)

    check()


@settings(FUZZ, max_examples=25)
@given(content=_damaged(b'{"token": "abc", "host": "h", "pid": 1, "taken_at": 0}'))
def test_leases_that_name_no_live_holder_are_taken_once_old_enough(tmp_path_factory, content):
    """Issue 63: a lease left empty by a full disk blocked its run for the whole lease time. A lease
    file of any content is taken over once it is older than the grace for an unfinished write
    (or once its holder is gone); a fresh one that names nobody is left to its taker."""
    results = tmp_path_factory.mktemp("lease")
    lease = Lease(results, "k" * 64, seconds=600)
    lease.path.parent.mkdir(parents=True)
    _write(lease.path, content)
    old = time.time() - UNREADABLE_GRACE - 1
    os.utime(lease.path, (old, old))
    try:
        named = json.loads(content).get("token") if content != FIFO else None
    except (ValueError, AttributeError):
        named = None
    if named:  # a lease that still names its holder: the ordinary rules hold (test_cluster.py)
        return
    try:
        assert lease.acquire()  # it names nobody and is older than the grace: stale, taken over
    finally:
        lease.release()
    assert not lease.path.exists()


FOLDER_ENTRY = st.sampled_from(["random", "empty", "fifo", "folder", "gif", "truncated", "text"])


@settings(FUZZ, max_examples=20)
@given(entries=st.lists(st.tuples(FOLDER_ENTRY, st.sampled_from(["a", "b"]), st.sampled_from([".png", ".jpg", ".tif"])),
                        min_size=1, max_size=4), noise=st.binary(min_size=1, max_size=64))  # fmt: skip
def test_image_folders_with_hostile_entries_load_or_fail_in_one_line(tmp_path_factory, entries, noise):
    """An ImageFolder tree with random bytes, empty files, FIFOs, folders and GIFs under image names
    beside real images: the split lists what it can read (a FIFO or folder is no image), and every
    listed file decodes to RGB or a one-line error naming it, never a hang."""
    from conftest import write_image

    from vitbench.catalog.registry import get_dataset
    from vitbench.datasets.base import CorruptImage, decode

    root = tmp_path_factory.mktemp("folder") / "photos"
    for split in ("train", "test"):
        for label in ("a", "b"):
            write_image(root / split / label / "real.png", seed=len(label))
    for i, (kind, label, suffix) in enumerate(entries):
        path = root / "train" / label / f"x{i}{suffix}"
        if kind == "fifo":
            os.mkfifo(path)
        elif kind == "folder":
            path.mkdir()
        elif kind == "gif":
            write_image(path.with_suffix(".gif"), seed=i)
        else:
            content = {"random": noise, "empty": b"", "text": b"hello", "truncated": (root / "test/a/real.png")
                       .read_bytes()[:40]}[kind]  # fmt: skip
            path.write_bytes(content)
    try:
        split = get_dataset(f"folder:{root}").load_split(None, "train")
    except Exception as e:
        assert isinstance(e, UserError) and "\n" not in str(e), f"{type(e).__name__}: {e}"
        return
    assert all(Path(p).is_file() for p in split.paths)  # no FIFO or folder is listed as an image
    for path in split.paths:
        try:
            assert decode(path).mode == "RGB"
        except CorruptImage as e:
            assert path in str(e) and "\n" not in str(e)


# Issue 71, item 8: the label files of ImageNet (synset_words.txt, real.json) and Pets (annotations/*.txt).
# Before: a FIFO hung `run --dry-run` and `doctor`; a folder, binary bytes or a wrong JSON type
# (`[5, ...]`) was a traceback, even in a dry run.
SYNSETS = "".join(f"{synset} a class\n" for synset in imagenet_synsets(Path("/nonexistent"))).encode()
REAL = json.dumps([[i % 1000] for i in range(50_000)]).encode()
HOSTILE_REAL = [json.dumps(v).encode() for v in ([5] * 50_000, [[1000]] * 50_000, [[-1]] * 50_000, [["a"]] * 50_000,
                                                 [[True]] * 50_000, {"a": 1}, [[1]] * 49_999)]  # fmt: skip
PETS = b"#Image CLASS-ID SPECIES BREED ID\nAbyssinian_1 1 1 1\n"
LABEL_FILES = {"synset_words.txt": SYNSETS, "real.json": REAL, "annotations/trainval.txt": PETS}


def _read_label_file(root: Path, name: str):
    if name == "synset_words.txt":
        return imagenet_synsets(root)
    if name == "real.json":
        return imagenet.read_real_labels(root, ["val/ILSVRC2012_val_00000002.JPEG"])[0]
    return load_pets(root, "train").labels.tolist()


@settings(FUZZ, max_examples=45)
@given(name=st.sampled_from(sorted(LABEL_FILES)), content=st.one_of(
    st.sampled_from(sorted(LABEL_FILES)).flatmap(lambda n: _damaged(LABEL_FILES[n][:4000])),
    st.sampled_from(HOSTILE_REAL), st.just(FOLDER), st.just(FIFO)))  # fmt: skip
def test_label_files_read_correctly_or_in_one_line(tmp_path_factory, name, content):
    root = tmp_path_factory.mktemp("labels")
    (root / "annotations").mkdir()
    (root / "images").mkdir()
    Image.new("RGB", (8, 8)).save(root / "images" / "Abyssinian_1.jpg")
    path = _write(root / name, content)
    start = time.monotonic()
    try:
        found = _read_label_file(root, name)
    except Exception as e:
        _one_line(e, path)
        return
    finally:
        assert time.monotonic() - start < 60  # a FIFO is refused, not read until someone writes to it
    expected = {"synset_words.txt": 1000, "real.json": 1, "annotations/trainval.txt": 1}[name]
    assert len(found) == expected  # only a well-formed file reads
    if name == "real.json":
        assert found == [[1]] and content not in HOSTILE_REAL


@pytest.mark.parametrize("name", sorted(LABEL_FILES))
def test_each_label_file_reads_when_valid(tmp_path, name):
    (tmp_path / "annotations").mkdir()
    (tmp_path / "images").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "images" / "Abyssinian_1.jpg")
    _write(tmp_path / name, LABEL_FILES[name])
    found = _read_label_file(tmp_path, name)
    assert found == {"synset_words.txt": imagenet_synsets(Path("/nonexistent")), "real.json": [[1]],
                     "annotations/trainval.txt": [0]}[name]  # fmt: skip


# Issue 71, item 9: audit shards of valid structure and hostile values. Before: `n_test_flagged: 5000`
# of 797 merged and the tables showed ¶5000; -5 hid the mark; NaN thresholds merged.
@pytest.fixture(scope="module")
def audit_shard(tmp_path_factory) -> tuple[Path, dict]:
    """A real audit shard: digits' test set against its train set (sixty near-duplicate pairs)."""
    import vitbench.api as api

    results = tmp_path_factory.mktemp("audit") / "results"
    api.dedup("digits", results=results)
    (path,) = (results / "audits").glob("*.json")
    return path, json.loads(path.read_text())


HOSTILE = st.one_of(st.sampled_from([-5, 5000, 2**40, float("nan"), float("inf"), -1.5, 2.5, "5", True, None, [], 0]),
                    st.integers(-10, 2000), st.floats(allow_nan=True))  # fmt: skip
AUDIT_FIELDS = ("n_test", "n_audited", "n_pairs", "n_test_flagged", "skipped_images", "threshold", "seconds")
PAIR_FIELDS = {1: "test_index", 3: "duplicate_index", 5: "distance", 6: "exact"}


@settings(FUZZ, max_examples=60)
@given(where=st.one_of(st.sampled_from(AUDIT_FIELDS), st.sampled_from(sorted(PAIR_FIELDS))), value=HOSTILE)
def test_audit_shards_with_hostile_values_merge_only_when_in_range(audit_shard, tmp_path_factory, where, value):
    from vitbench.store.audit_shards import BadAudit, read_audit_shard

    source, document = audit_shard
    document = json.loads(json.dumps(document))
    if isinstance(where, str):
        document["audit"][where] = value
    else:
        document["pairs"][0][where] = value
    path = tmp_path_factory.mktemp("hostile") / source.name
    path.write_text(json.dumps(document))
    try:
        audit, pairs = read_audit_shard(path)
    except BadAudit as e:
        assert "\n" not in str(e)
        return
    flagged, n_test = audit["n_test_flagged"], audit["n_test"]
    assert type(flagged) is int and 0 <= flagged <= n_test and audit["n_pairs"] == len(pairs)
    assert -1 <= audit["threshold"] <= 1 and all(0 <= p["distance"] <= 2 for p in pairs)
    assert all(0 <= p["test_index"] < n_test and 0 <= p["duplicate_index"] < audit["n_audited"] for p in pairs)
    assert all(type(p["exact"]) is bool for p in pairs)


def test_an_audit_shard_past_its_size_bound_is_not_read(audit_shard, tmp_path, monkeypatch):
    from vitbench.store import audit_shards

    source, _ = audit_shard
    path = tmp_path / source.name
    path.write_bytes(source.read_bytes())
    monkeypatch.setattr(audit_shards, "MAX_AUDIT_BYTES", path.stat().st_size - 1)
    monkeypatch.setattr(audit_shards, "read_regular", lambda p: pytest.fail("read past the bound"))
    with pytest.raises(audit_shards.BadAudit, match="more than an audit shard holds"):
        audit_shards.read_audit_shard(path)


# Issue 71, items 7 and 10: the dry run's kept micro-benchmark rates (micro-rates.json, the user's cache).
# Before: a file of the wrong shape was a traceback (TypeError, ZeroDivisionError, KeyError), NaN printed
# "≈ nan days", negative rates "< 1 s", and a file of any size was read whole.
RATE_KEY = "CPU|vit-ti/16|32|2 threads|torch 2.14.1|batch 64"
RATE_ENTRY = {"median": 2e9, "slowest": 1e9, "fastest": 4e9, "passes": 5, "measured": "2099-01-01 00:00 UTC",
              "build": 0.05}  # fmt: skip
RATES = json.dumps({RATE_KEY: RATE_ENTRY}).encode()
RATE_VALUES = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 5), st.just("x"),
                        st.just(None), st.just(True), st.just([]))  # fmt: skip


def _one_value_changed(change: tuple[str, object]) -> bytes:
    name, value = change
    return json.dumps({RATE_KEY: {**RATE_ENTRY, name: value}}).encode()  # NaN and Infinity written as such


@settings(FUZZ, max_examples=60)
@given(content=st.one_of(_damaged(RATES), st.tuples(st.sampled_from(sorted(RATE_ENTRY)), RATE_VALUES).map(
    _one_value_changed)))  # fmt: skip
def test_kept_rates_are_measurements_or_measured_again(tmp_path_factory, content):
    from vitbench.execution import estimate
    from vitbench.execution.kept_rates import kept_rates

    path = _write(tmp_path_factory.mktemp("rates") / estimate.MICRO_RATES, content)
    kept = kept_rates(path)  # never raises: what is not a measurement is measured again
    for entry in kept.values():
        assert 0 < entry["slowest"] <= entry["median"] <= entry["fastest"] < float("inf")
        assert type(entry["passes"]) is int and entry["passes"] > 0
        assert 0 <= entry["build"] < float("inf") and not isinstance(entry["build"], bool)
        assert estimate.duration(1e9 / entry["median"]) != "unknown"


def test_kept_rates_past_their_size_bound_are_not_read(tmp_path, monkeypatch):
    from vitbench.execution import estimate
    from vitbench.execution.kept_rates import kept_rates
    from vitbench.files import atomic

    path = tmp_path / estimate.MICRO_RATES
    path.write_bytes(RATES)
    assert kept_rates(path)
    monkeypatch.setattr("vitbench.execution.kept_rates.MAX_RATES_BYTES", len(RATES) - 1)
    monkeypatch.setattr(atomic, "read_regular", lambda p: pytest.fail("read past the bound"))  # the cache's reader
    assert kept_rates(path) == {}
