"""Container files built by the libraries that write them, then damaged (issue 89, goal 4): Hub
parquet (the datasets library's), WebDataset shards (webdataset's ShardWriter) and a TFDS build's
TFRecords (TFDS's own writer) get truncations, flipped bytes and zeroed blocks anywhere in one of
their files. Each is then indexed afresh (an empty cache) and every image of every split read and
decoded: each answer is the data as it now is or one line naming the damaged file (or the dataset
argument), never a traceback; and a damaged file run from the command line stores nothing.
Hypothesis, derandomised."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from container_data import samples, write_parquet, write_shards
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vitbench import store
from vitbench.catalog.registry import get_dataset
from vitbench.errors import UserError

pytest.importorskip("webdataset")
pytest.importorskip("datasets")

FUZZ = settings(derandomize=True, deadline=None, suppress_health_check=list(HealthCheck), database=None,
                max_examples=12)  # fmt: skip
DAMAGE = st.tuples(st.sampled_from(["truncate", "flip", "zero"]), st.floats(0, 1), st.integers(1, 255))
R = ("--model", "vit-ti/16", "--weights", "random", "--res", "32", "--shots", "1", "--seeds", "0", "--workers", "0")


def _has_tfds() -> bool:
    try:
        from vitbench.datasets.tfds_format import torchvision_before_tensorflow

        torchvision_before_tensorflow()  # TensorFlow first ends in a segmentation fault (tfds_format.py)
        import tensorflow_datasets  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, tuple[Path, str]]:
    """format -> (its folder, the dataset argument naming it): 3 classes x (3 train, 2 test) JPEGs."""
    data = samples({"train": 3, "test": 2})
    root = tmp_path_factory.mktemp("clean")
    formats = {
        "parquet": (write_parquet(data, root / "parquet"), "hf:{}"),
        "shards": (write_shards(data, root / "shards"), "wds:{}"),
    }
    if _has_tfds():
        from container_data import write_tfds

        formats["tfrecord"] = (write_tfds(data, root / "tfds"), "tfds:{}")
    return formats


def _damage(file: Path, how: str, where: float, value: int) -> None:
    raw = bytearray(file.read_bytes())
    at = min(int(where * len(raw)), len(raw) - 1)
    if how == "truncate":
        del raw[at:]
    elif how == "flip":
        raw[at] ^= value
    else:
        raw[at : at + 64] = bytes(len(raw[at : at + 64]))
    file.write_bytes(bytes(raw))


def _containers(folder: Path) -> list[Path]:
    return sorted(
        p for p in folder.rglob("*") if p.is_file() and (".tfrecord" in p.name or p.suffix in (".parquet", ".tar"))
    )


def _read_everything(argument: str, cache: Path) -> None:
    """Index the dataset afresh and read and decode every image of its splits, as a run would."""
    before = os.environ.get("VITBENCH_CACHE")
    os.environ["VITBENCH_CACHE"] = str(cache)
    try:
        spec = get_dataset(argument)
        for split in spec.split_names:
            loaded = spec.load_split(None, split)
            for i in range(len(loaded)):
                loaded.decoded(i)
    finally:
        if before is None:
            os.environ.pop("VITBENCH_CACHE", None)
        else:
            os.environ["VITBENCH_CACHE"] = before


@pytest.mark.parametrize("kind", ["parquet", "shards", "tfrecord"])
def test_a_damaged_container_is_read_as_it_is_or_refused_in_one_line_naming_it(built, kind, tmp_path_factory):
    if kind not in built:
        pytest.skip("TensorFlow Datasets is not installed")
    clean, pattern = built[kind]
    files = _containers(clean)
    outcomes: list[str] = []

    @FUZZ
    @given(which=st.integers(0, len(files) - 1), damage=DAMAGE)
    def check(which, damage):
        work = tmp_path_factory.mktemp(kind)
        folder = work / clean.name
        shutil.copytree(clean, folder)
        damaged = folder / files[which].relative_to(clean)
        _damage(damaged, *damage)
        argument = pattern.format(folder)
        try:
            _read_everything(argument, work / "cache")
        except UserError as e:
            said = str(e)
            assert "\n" not in said and len(said) < 600, said
            assert str(damaged) in said or argument in said or str(folder) in said, (damage, said)
            outcomes.append("refused")
        else:
            outcomes.append("read")

    check()
    assert "refused" in outcomes, outcomes  # the damage was seen at least once


@pytest.mark.parametrize("kind", ["parquet", "shards", "tfrecord"])
def test_a_truncated_container_stores_nothing(built, kind, cli, tmp_path, monkeypatch):
    if kind not in built:
        pytest.skip("TensorFlow Datasets is not installed")
    clean, pattern = built[kind]
    folder = tmp_path / clean.name
    shutil.copytree(clean, folder)
    damaged = [f for f in _containers(folder) if "test" in f.name][0]
    _damage(damaged, "truncate", 0.6, 0)
    monkeypatch.setenv("VITBENCH_CACHE", str(tmp_path / "cache"))
    results = tmp_path / "results"
    code, _, err = cli("run", *R, "--dataset", pattern.format(folder), "--results", results)
    assert code == 2 and "Traceback" not in err, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: ") and (str(damaged) in last or str(folder) in last), last
    assert not (results / "vitbench.duckdb").exists() or store.read_results(results).empty
