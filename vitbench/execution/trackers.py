"""`--tracker tensorboard|wandb|mlflow` (a comma list: each): every stored run, of every protocol,
also goes to the experiment trackers a lab already uses: its per-step curves (fine-tuning and
pre-training: loss, LR, gradient norm), its final metrics, and its whole provenance (the shard's
`run` record: model, weights sha256, data fingerprint, protocol version, seed, hardware, code
version) as the run's config. The shard is written first, so a tracker that fails costs a warning,
never a result.

Where each writes, by the tracker's own settings where it has them:
- tensorboard: event files under `--tensorboard DIR`, else <results>/tensorboard (torch's SummaryWriter);
- wandb: one W&B run per vitbench run in project WANDB_PROJECT (default "vitbench"), under WANDB_DIR
  (default <results>); WANDB_MODE=offline keeps it local until `wandb sync`;
- mlflow: MLFLOW_TRACKING_URI, else MLflow's local file store at <results>/mlruns (MLflow 3 keeps
  that store in maintenance mode; `mlflow migrate-filestore` moves it to a database), experiment
  MLFLOW_EXPERIMENT_NAME (default "vitbench")."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import types
from pathlib import Path

from vitbench.errors import UserError, one_line
from vitbench.files.text_safety import visible
from vitbench.protocols.registry import protocols

log = logging.getLogger("vitbench")

TRACKERS = ("tensorboard", "wandb", "mlflow")
CURVE_TAGS = {"train_loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm"}
# metrics about the run itself, not a score of its scored split
RUN_METRICS = frozenset(
    {"lr", "best_step", "final_train_loss", "train_images_per_second", "peak_memory_bytes", "mfu", "pretrain_images"}
)


def check(names: tuple[str, ...], tensorboard_dir: Path | None = None) -> None:
    """One line before any work: an unknown tracker, a package that is not installed, or a
    TensorBoard folder that cannot be written."""
    import importlib.util

    for name in names:
        if name not in TRACKERS:
            raise UserError(f"--tracker {name}: expected one of {', '.join(TRACKERS)}")
        # each tracker's package is its extra's (torch's SummaryWriter needs the tensorboard package)
        if importlib.util.find_spec(name) is None:
            raise UserError(f"--tracker {name}: needs the {name} package (pip install 'vitbench[{name}]')")
    if tensorboard_dir is not None:
        try:
            tensorboard_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UserError(f"--tensorboard {tensorboard_dir}: cannot write there ({e.strerror})") from None


def run_name(run: dict) -> str:
    """<key prefix>-<model>-<dataset>-<stage or protocol>[-<its value on the protocol's axis: 5-shot,
    k=20>]-seed<seed>, readable in every UI."""
    stage = run["hparams"].get("stage") or run["protocol"]
    axis = getattr(protocols().get(run["protocol"]), "axis", None)
    value = run["hparams"].get(axis.name) if axis is not None else None
    setting = f"-{axis.text(value)}" if axis is not None and value is not None else ""
    parts = (run["run_key"][:12], run["model"], run["dataset"], f"{stage}{setting}", f"seed{run['seed']}")
    name = "-".join(visible(p, one_line=True).replace("/", "_").replace("\\", "_") for p in parts)
    # a file name (TensorBoard's folder) holds 255 bytes: a 240-character dataset name was never logged;
    # the run key's start, first, keeps a shortened name unique
    return name if len(name.encode()) <= MAX_NAME_BYTES else name.encode()[:MAX_NAME_BYTES].decode(errors="ignore")


MAX_NAME_BYTES = 200


def last_step(curves: dict[str, list[float]]) -> int:
    """The step the final metrics are logged at: the last of the curves (0 without curves)."""
    return max((len(v) for v in curves.values()), default=0)


def plain(run: dict) -> dict:
    """The provenance record as JSON values only (what a tracker's config takes)."""
    return json.loads(json.dumps(run, default=str))


def scalars(record: dict) -> tuple[dict[str, list[float]], dict[str, float]]:
    """(curves by tag, each value at steps 1, 2, ...; final metrics by tag): `test/accuracy` (`dev/`
    for a fine-tuning LR-sweep run's score, and for the dev_/val_ scores: pre-training's early-stopping
    accuracy, the chosen LR's dev accuracy), `run/<name>` for what describes the run, not a score."""
    split = "dev" if record["run"]["hparams"].get("stage") == "sweep" else "test"
    curves = {CURVE_TAGS.get(k, f"train/{k}"): list(v) for k, v in (record.get("curves") or {}).items() if v}
    return curves, {_tag(name, split): float(value) for name, value in record["metrics"].items()}


def _tag(metric: str, split: str) -> str:
    if metric in RUN_METRICS:
        return f"run/{metric}"
    for prefix in ("dev_", "val_"):
        if metric.startswith(prefix):
            return f"dev/{metric.removeprefix(prefix)}"
    return f"{split}/{metric}"


def _without_tensorflow() -> None:
    """TensorBoard's own stub of the TensorFlow API for its event writer, unless TensorFlow is
    loaded already: local event files need nothing more, and importing TensorFlow (where the tfds
    extra installed it) took 7 of the 9 s a tracked run's first SummaryWriter took here. The marker
    module is TensorBoard's switch for it (tensorboard/compat/__init__.py, `tensorboard.compat.notf`)."""
    if "tensorflow" not in sys.modules:
        sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))


class Trackers:
    """The trackers a request names, each called once per stored run."""

    def __init__(self, names: tuple[str, ...], results: Path, tensorboard_dir: Path | None = None) -> None:
        self.names = tuple(dict.fromkeys((*names, *(("tensorboard",) if tensorboard_dir else ()))))
        self.results, self.tensorboard_dir = results, tensorboard_dir or results / "tensorboard"

    def log_run(self, record: dict) -> None:
        for name in self.names:
            try:
                getattr(self, f"_{name}")(record)
            except Exception as e:  # the result is stored already: a tracker's failure is reported, not fatal
                log.warning("--tracker %s: run %s not logged (%s)", name, record["run"]["run_key"][:12], one_line(e))

    def _tensorboard(self, record: dict) -> None:
        _without_tensorflow()
        from torch.utils.tensorboard import SummaryWriter

        curves, final = scalars(record)
        writer = SummaryWriter(log_dir=str(self.tensorboard_dir / run_name(record["run"])))
        try:
            for tag, values in curves.items():
                for step, value in enumerate(values, start=1):
                    writer.add_scalar(tag, float(value), step)
            for tag, value in final.items():
                writer.add_scalar(tag, value, last_step(curves))
            writer.add_text("provenance", f"```json\n{json.dumps(record['run'], indent=1, default=str)}\n```")
        finally:
            writer.close()

    def _wandb(self, record: dict) -> None:
        import wandb

        run_record, (curves, final) = record["run"], scalars(record)
        run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "vitbench"),
            dir=os.environ.get("WANDB_DIR") or str(self.results),
            name=run_name(run_record),
            group=f"{run_record['model']}-{run_record['dataset']}",
            job_type=run_record["protocol"],
            config=plain(run_record),
            reinit="create_new",
        )
        try:
            for step in range(1, last_step(curves) + 1):
                run.log({tag: values[step - 1] for tag, values in curves.items() if step <= len(values)}, step=step)
            run.summary.update(final)
        finally:
            run.finish()

    def _mlflow(self, record: dict) -> None:
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:  # the local file store, which MLflow 3 serves only when asked to
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            uri = (self.results / "mlruns").resolve().as_uri()
        client = MlflowClient(tracking_uri=uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "vitbench")
        found = client.get_experiment_by_name(name)
        experiment = found.experiment_id if found else client.create_experiment(name)
        run_record, (curves, final) = record["run"], scalars(record)
        run = client.create_run(
            experiment, run_name=run_name(run_record), tags={"vitbench.run_key": run_record["run_key"]}
        )
        try:
            ms = int(1000 * time.time())
            metrics = [
                Metric(tag, float(v), ms, step) for tag, values in curves.items() for step, v in enumerate(values, 1)
            ]
            metrics += [Metric(tag, value, ms, last_step(curves)) for tag, value in final.items()]
            params = [Param(k, str(run_record[k])[:500]) for k in PARAMS if run_record.get(k) is not None]
            for start in range(0, max(len(metrics), 1), 1000):  # MLflow takes 1,000 metrics per batch
                client.log_batch(
                    run.info.run_id, metrics=metrics[start : start + 1000], params=params if not start else []
                )
            client.log_dict(run.info.run_id, plain(run_record), "provenance.json")
        finally:
            client.set_terminated(run.info.run_id)


# the provenance fields that become MLflow params (the whole record is the run's provenance.json)
PARAMS = ("model", "arch", "weights_sha256", "dataset", "data_source", "data_fingerprint", "protocol",
          "protocol_version", "seed", "device_name", "git_sha")  # fmt: skip
