"""Keep it true: random and mutated shards, option values and small image files go to the readers
and the CLI, which answer with a one-line error or a quarantine, never a traceback and never a
changed stored result (hypothesis, derandomised so CI sees the same examples every time)."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from vitbench import store
from vitbench.datasets.base import CorruptImage, decode
from vitbench.errors import UserError

FUZZ = settings(derandomize=True, deadline=None, suppress_health_check=list(HealthCheck), database=None)
RUN = ("run", "--model", "vit-ti/16", "--weights", "random", "--dataset", "digits", "--workers", "0")

json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
json_value = st.recursive(
    json_leaf, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
)


def _stored(results: Path) -> dict[str, dict[str, float]]:
    rows = store.read_results(results)
    return {k: dict(zip(p["metric"], p["value"], strict=True)) for k, p in rows.groupby("run_key")}


@st.composite
def mutated_shards(draw, good: dict) -> tuple[str, bytes]:
    """A file name and contents: the real shard with one field deleted or replaced by any JSON
    value, or its text truncated, or random bytes; named as its run_key or otherwise."""
    record = json.loads(json.dumps(good))
    kind = draw(st.sampled_from(["replace-run", "delete-run", "replace-top", "metrics", "truncate", "bytes"]))
    if kind == "replace-run":
        record["run"][draw(st.sampled_from(sorted(record["run"])))] = draw(json_value)
    elif kind == "delete-run":
        del record["run"][draw(st.sampled_from(sorted(record["run"])))]
    elif kind == "replace-top":
        record[draw(st.sampled_from(["run", "metrics", "curves", "schema"]))] = draw(json_value)
    elif kind == "metrics":
        record["metrics"][draw(st.text(min_size=1, max_size=10))] = draw(json_value)
    text = json.dumps(record).encode()
    if kind == "truncate":
        text = text[: draw(st.integers(0, len(text) - 1))]
    elif kind == "bytes":
        text = draw(st.binary(max_size=200))
    key = record["run"].get("run_key") if isinstance(record.get("run"), dict) else None
    name = key if isinstance(key, str) and key and draw(st.booleans()) else draw(st.sampled_from(["zz", "0a1b"]))
    return (name if "/" not in name and name not in (".", "..") else "zz"), text


@pytest.mark.slow
def test_mutated_shards_never_take_the_store_down_nor_change_a_stored_result(one_run, tmp_path):
    good_path = next((one_run / "runs").glob("*.json"))
    good = json.loads(good_path.read_text())
    before = _stored(one_run)
    counter = iter(range(10**6))

    @settings(FUZZ, max_examples=60)
    @given(mutated_shards(good))
    def check(shard):
        name, content = shard
        results = tmp_path / f"r{next(counter)}"
        shutil.copytree(one_run, results, ignore=shutil.ignore_patterns("cache"))
        path = results / "runs" / f"{name}.json"
        if path.exists():  # the good shard's own name: a copy of itself with another content
            name = f"{name}-copy"
            path = results / "runs" / f"{name}.json"
        path.write_bytes(content)
        store.sync(results)
        after = _stored(results)
        assert after[good_path.stem] == before[good_path.stem]  # the stored result is unchanged
        merged = name in after
        quarantined = (results / "quarantine" / path.name).exists()
        held = path.exists() and not merged
        assert merged or quarantined or held
        shutil.rmtree(results)

    check()


OPTION_VALUES = st.one_of(
    st.integers(min_value=-(2**40), max_value=2**40).map(str),
    st.text(alphabet="0123456789,-. ^ex", max_size=12),
    st.text(max_size=8),
)


@pytest.mark.slow
def test_option_values_end_in_a_plan_or_one_line(cli, tmp_path):
    counter = iter(range(10**6))

    @settings(FUZZ, max_examples=50)
    @given(
        st.sampled_from(["--seeds", "--shots", "--res", "--knn-k", "--fewshot-l2", "--device", "--batch-size",
                         "--workers", "--gelu", "--precision", "--input-pipeline", "--steps", "--lr"]),
        OPTION_VALUES,
    )  # fmt: skip
    def check(option, value):
        results = tmp_path / f"r{next(counter)}"
        code, _, err = cli(*RUN, "--res", "32", option, value, "--results", results, "--dry-run")
        assert "Traceback" not in err
        assert code in (0, 2), err
        if code == 2:
            lines = [line for line in err.strip().splitlines() if line.startswith("error:")]
            assert len(lines) == 1, err

    check()


@settings(FUZZ, max_examples=150)
@given(
    st.sampled_from(["PNG", "JPEG", "BMP", "GIF", "WEBP", "TIFF"]),
    st.sampled_from(["RGB", "L", "LA", "RGBA", "P", "CMYK", "I;16", "I", "F", "1"]),
    st.integers(1, 12),
    st.integers(1, 12),
    st.integers(0, 300),
    st.binary(max_size=16),
)
def test_small_image_files_decode_to_rgb_or_a_named_error(tmp_path_factory, fmt, mode, w, h, cut, noise):
    """Any small file in an image folder: an RGB image of its size, or an error naming it."""
    path = tmp_path_factory.mktemp("img") / f"x.{fmt.lower()}"
    buffer = io.BytesIO()
    try:
        pixels = np.random.default_rng(w * 13 + h).integers(0, 255, (h, w, 3), dtype=np.uint8)
        Image.fromarray(pixels).convert(mode).save(buffer, format=fmt)
    except (OSError, ValueError, KeyError):
        buffer = io.BytesIO(noise)  # a mode the format cannot hold: random bytes instead
    data = buffer.getvalue()
    path.write_bytes(data[: len(data) - cut] + noise if cut else data)
    try:
        image = decode(path)
    except (CorruptImage, UserError) as e:
        assert str(path) in str(e) and "\n" not in str(e)
        return
    assert image.mode == "RGB" and image.size[0] >= 1 and image.size[1] >= 1
