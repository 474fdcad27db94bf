"""`--tracker tensorboard,wandb,mlflow`: every stored run (pre-training, its few-shot transfer,
fine-tuning) reaches each tracker with its curves, its final metrics and its provenance as config,
read back with each tracker's own reader: TensorBoard's EventAccumulator, MLflow's client on the
local file store, and W&B's offline run file (its records decoded with wandb's own protobufs)."""

from __future__ import annotations

import glob
import json
import struct
from pathlib import Path

import pytest

from vitbench.store import read_results

ALL = "tensorboard,wandb,mlflow"
SMALL = ("--model", "vit-ti/16", "--smoke", "--workers", "0", "--res", "32")
PRETRAIN = ("run", "--protocol", "pretrain", *SMALL, "--steps", "6", "--batch", "16", "--dataset", "digits0-4",
            "--transfer", "digits5-9", "--transfer-shots", "2")  # fmt: skip
FINETUNE = ("run", "--protocol", "finetune", *SMALL, "--weights", "random", "--dataset", "digits", "--steps", "3",
            "--batch", "8", "--lr", "0.01", "--seeds", "0")  # fmt: skip


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    """One pre-training (with its few-shot transfer) and one fine-tune, each run logged to all three."""
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    import sys

    from vitbench.cli import main

    results = tmp_path_factory.mktemp("tracked")
    env = {"WANDB_MODE": "offline", "WANDB_DIR": str(results / "wb"), "WANDB_SILENT": "true"}
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        (results / "wb").mkdir()
        for args in (PRETRAIN, FINETUNE):
            mp.setattr(sys, "argv", ["vitbench", *args, "--tracker", ALL, "--results", str(results)])
            with pytest.raises(SystemExit) as done:
                main()
            assert not done.value.code
    return results


def score(metrics: dict) -> tuple[str, str]:
    """(the tracker's tag, the stored metric) of a run's score: pre-training's is its dev accuracy."""
    return ("test/accuracy", "accuracy") if "accuracy" in metrics else ("dev/accuracy", "val_accuracy")


def stored_runs(results) -> dict[str, dict]:
    df = read_results(results)
    return {key: dict(zip(part["metric"], part["value"], strict=True)) for key, part in df.groupby("run_key")}


def test_every_run_reaches_tensorboard(tracked):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    stored = stored_runs(tracked)
    folders = {p.name[:12]: p for p in (tracked / "tensorboard").iterdir()}
    assert sorted(folders) == sorted(k[:12] for k in stored)  # pre-training, 2-shot transfer, fine-tune
    for key, metrics in stored.items():
        events = EventAccumulator(str(folders[key[:12]]))
        events.Reload()
        tag, name = score(metrics)
        assert events.Scalars(tag)[0].value == pytest.approx(metrics[name])
        text = events.Tensors("provenance/text_summary")[0].tensor_proto.string_val[0].decode()
        assert key in text and "weights_sha256" in text and "data_fingerprint" in text
    pretrain = next(p for k, p in folders.items() if "-pretrain-" in p.name)
    events = EventAccumulator(str(pretrain))
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == list(range(1, 7))


def test_every_run_reaches_mlflow_with_curves_and_provenance(tracked):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(tracked / "mlruns").resolve().as_uri())
    experiment = client.get_experiment_by_name("vitbench")
    runs = {r.data.tags["vitbench.run_key"]: r for r in client.search_runs([experiment.experiment_id])}
    stored = stored_runs(tracked)
    assert set(runs) == set(stored)
    for key, run in runs.items():
        tag, name = score(stored[key])
        assert run.data.metrics[tag] == pytest.approx(stored[key][name])
        assert run.info.status == "FINISHED"
        provenance = json.loads((tracked / "mlruns").joinpath(*_artifact_parts(run)).read_text())
        assert provenance["run_key"] == key and run.data.params["weights_sha256"] == provenance["weights_sha256"]
    for run in runs.values():
        if run.data.params["protocol"] in ("pretrain", "finetune"):
            losses = client.get_metric_history(run.info.run_id, "train/loss")
            assert [m.step for m in losses] == list(range(1, len(losses) + 1)) and len(losses) in (3, 6)
            grad = client.get_metric_history(run.info.run_id, "train/grad_norm")
            assert len(grad) == len(losses)


def _artifact_parts(run) -> tuple[str, ...]:
    path = run.info.artifact_uri.removeprefix("file://")
    return (*path.split("/mlruns/", 1)[1].split("/"), "provenance.json")


def test_every_run_reaches_wandb_offline(tracked):
    from wandb.proto import wandb_internal_pb2

    stored = stored_runs(tracked)
    found: dict[str, dict] = {}
    for path in glob.glob(str(tracked / "wb" / "wandb" / "offline-run-*" / "run-*.wandb")):
        config, history, summary = {}, {}, {}
        for data in _wandb_records(path):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(data)
            kind = record.WhichOneof("record_type")
            if kind == "run":
                config = {item.key: json.loads(item.value_json) for item in record.run.config.update}
            elif kind == "config":
                config |= {item.key: json.loads(item.value_json) for item in record.config.update}
            elif kind == "history":
                items = {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in record.history.item}
                history[record.history.step.num] = items
            elif kind == "summary":
                summary |= {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in record.summary.update}
        found[config["run_key"]] = {"config": config, "history": history, "summary": summary}
    assert set(found) == set(stored)
    for key, run in found.items():
        tag, name = score(stored[key])
        assert run["summary"][tag] == pytest.approx(stored[key][name])
        assert run["config"]["weights_sha256"] and run["config"]["data_fingerprint"]
        if run["config"]["protocol"] == "pretrain":
            assert sorted(run["history"]) == list(range(1, 7))
            assert all("train/loss" in step and "train/lr" in step for step in run["history"].values())


def _wandb_records(path: str):
    """The records of a W&B run file: wandb's LevelDB-style log (a 7-byte ':W&B' header, then
    32 KiB blocks of records each with a 7-byte header: crc32, length, type full/first/middle/last)."""
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B"
    pos, pending, block = 7, b"", 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:
            pos += block - pos % block
            continue
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 1:
            yield chunk
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        else:
            yield pending + chunk


def test_a_tracker_that_is_not_installed_or_unknown_is_one_line(cli, tmp_path, monkeypatch):
    import importlib.util

    code, _, err = cli(*FINETUNE, "--tracker", "neptune", "--results", tmp_path)
    assert code == 2 and "--tracker neptune: expected one of tensorboard, wandb, mlflow" in err
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    code, _, err = cli(*FINETUNE, "--tracker", "wandb", "--results", tmp_path)
    assert code == 2 and "--tracker wandb: needs the wandb package (pip install 'vitbench[wandb]')" in err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # checked before any work


def test_tensorboard_events_are_written_without_importing_tensorflow(tmp_path):
    """TensorBoard's stub of the TensorFlow API writes the event files: a tracked run does not import
    TensorFlow (installed here by the tfds extra; 7 s of a tracked run's 9 s SummaryWriter)."""
    import subprocess
    import sys

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    args = ["run", "--model", "vit-ti/16", "--weights", "random", "--dataset", "digits", "--res", "32", "--shots",
            "1", "--seeds", "0", "--workers", "0", "--tracker", "tensorboard", "--results", str(tmp_path)]  # fmt: skip
    code = (
        "import sys\nfrom vitbench.cli import main\n"
        f"sys.argv = ['vitbench', *{args!r}]\n"
        "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        "print(sorted(m for m in ('tensorflow', 'tensorflow.python') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
    (folder,) = (tmp_path / "tensorboard").iterdir()
    events = EventAccumulator(str(folder))
    events.Reload()
    assert events.Scalars("test/accuracy")[0].value == pytest.approx(read_results(tmp_path)["value"].iloc[0])
