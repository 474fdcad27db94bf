"""Each finished run becomes a shard (atomically) and, where this process holds the database, an
ingest of its own, with its full provenance: an interruption loses at most the run in flight.
The side measurements (`inspect`'s attention distances, `bench`'s throughput) are written here
too, each in one transaction of its own table."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

import torch

from vitbench import store
from vitbench.engine.distributed import World
from vitbench.errors import UserError
from vitbench.execution.job_process import job_label
from vitbench.execution.lease import Leases
from vitbench.execution.trackers import Trackers
from vitbench.files.atomic import write_atomic
from vitbench.host.devices import cpu_kernels, device_name, peak_flops
from vitbench.protocols.base import Group, Protocol, Request, Result
from vitbench.protocols.registry import get_protocol
from vitbench.provenance import canonical_json, environment, sha256_text
from vitbench.store import SHARD_SCHEMA, StoreUnavailable, metric_values, shard_metric_values
from vitbench.store.audit_shards import ingest_audits, write_audit_shard
from vitbench.store.merge import merge_runs
from vitbench.store.predictions import write_predictions
from vitbench.store.row_checks import metric_problem
from vitbench.store.shards import mark, shard_path

log = logging.getLogger("vitbench")


class RefusedResult(UserError):
    """A result whose metrics the store refuses (not a number; a fraction outside [0, 1]): its run
    fails in one line and the command's other runs go on (runner.execute)."""


def check_metrics(protocol: Protocol, metrics: object) -> None:
    """Every metric a finite number; one the protocol declares a fraction (unit "%", shown × 100)
    within [0, 1]: a plugin's accuracy of 1.5 was stored and tabled as 150.00."""
    if not isinstance(metrics, dict) or not metrics:
        raise RefusedResult(f"its metrics are {type(metrics).__name__} {metrics!r:.60}, expected {{name: number}}")
    declared = {m.name for m in protocol.metrics if m.unit == "%"}
    for name, value in metrics.items():
        problem = metric_problem(name, value, declared)
        if problem:
            raise RefusedResult(f"{problem}; not stored")


class Recorder:
    """Writes each finished run as a shard and ingests it at once, with its full provenance."""

    def __init__(self, req: Request, con, device: torch.device, on_result, world=None, leases: Leases | None = None):
        self.req, self.con, self.device, self.on_result = req, con, device, on_result
        self.leases = leases
        self.world = world or World()
        self.env, self.device_name = environment(), device_name(device)
        self.peak = peak_flops(self.device_name) if device.type == "cuda" else None
        self.count = 0
        # why the database could not take a result (store.StoreUnavailable's line): kept as shards since
        self.store_problem: str | None = None
        self.trackers = Trackers(req.tracker, req.results, req.tensorboard) if self.world.is_main else None

    def flops_per_image(self, group: Group) -> int:
        """Forward FLOPs per image (the backend counts them once per architecture and size)."""
        assert group.model.backend is not None
        return group.model.backend.flops_per_image(group.model, group.res)

    def metric_values(self, run_keys: list[str], name: str) -> dict[str, float]:
        """{run_key: value} of one stored metric; a cluster worker has no database, only the shards."""
        if self.con is not None:
            return metric_values(self.con, run_keys, name)
        return shard_metric_values(self.req.results, run_keys, name)

    def _threads(self) -> dict:
        """A CPU run's intra-op thread count and the CPU's kernels: float sums split over threads, or
        taken by other vector instructions, round differently, so a trained CPU result is reproducible
        at one count on one kind of CPU only (the demo: 2 threads, see suites.py; README.md)."""
        if self.device.type != "cpu":
            return {}
        return {"cpu_threads": torch.get_num_threads(), "cpu_kernels": cpu_kernels()}

    def record(self, group: Group, result: Result) -> None:
        """Store one finished run: its shard (atomic), its ingest, its trackers, its lease released."""
        spec, metrics, notes, skipped = result.spec, result.metrics, result.notes, result.skipped
        check_metrics(get_protocol(group.protocol), metrics)
        flops_per_image = self.flops_per_image(group)
        if self.req.config is not None:  # what the command asked for, as a file that reruns it
            notes = {**notes, "config": {"sha256": sha256_text(self.req.config), "toml": self.req.config}}
        origin = group.weights.provenance
        if origin is not None:  # weights vitbench pre-trained: the run that made them
            notes = {**notes, "pretrained": origin}
        job = job_label()
        if job is not None:  # run inside a Slurm job: which one (its log, `sacct -j`)
            notes = {**notes, "slurm_job": job}
        coverage = test_classes(group)
        if coverage is not None:  # chance is 100 / the classes present, not / the dataset's (3 of 37 breeds)
            notes = {**notes, "test_classes": coverage}
        if result.predictions is not None:  # the file first: a shard never names predictions that are not there
            predictions = write_predictions(self.req.results, spec.run_key, result.predictions)
            if group.dataset.class_names:  # label i is class_names[i]: per-class tables name them
                predictions = {**predictions, "classes": list(group.dataset.class_names)}
            notes = {**notes, "predictions": predictions}
        run = {
            "run_key": spec.run_key,
            **asdict(spec),
            "arch": group.model.arch,
            "backend": group.model.family,
            "weights": group.weights.path,
            "random_init": group.weights.random,
            "data_dir": _data_dir(group, self.req),
            # a subset of the official split, or images left out as corrupt: not the paper's data
            "data_subset": any(s.is_subset for s in group.splits.values()) or bool(skipped),
            "n_train": result.n_train,
            "n_test": result.n_test,
            "skipped_images": len(skipped),
            "status": "done",
            "started_at": result.started.isoformat(),
            "finished_at": datetime.now(UTC).isoformat(),
            "device": self.device.type,
            "device_name": self.device_name,
            "device_count": self.world.size,
            "device_seconds": result.seconds,
            "flops_per_image": flops_per_image,
            "flops": flops_per_image * result.images,
            **self.env,
            "notes": {**notes, **({"skipped_corrupt": skipped} if skipped else {}), **self._threads()},
        }
        shard = shard_path(self.req.results, spec.run_key)
        record = {"schema": SHARD_SCHEMA, "run": run, "metrics": metrics, "curves": result.curves or {}}
        mark(self.req.results, spec.run_key)  # newer than the database's row until merged (shards.MARK)
        write_atomic(shard, canonical_json(record))
        mark(self.req.results, spec.run_key)
        if self.con is not None:  # a cluster worker leaves the merge to `vitbench ingest`
            self._ingest(spec.run_key)
        if self.trackers is not None:  # after the shard: a tracker that fails never costs the result
            self.trackers.log_run(record)
        if self.leases is not None:
            self.leases.release(spec.run_key)
        self.count += 1
        if self.on_result:
            self.on_result(spec, metrics)

    def _ingest(self, run_key: str) -> None:
        """The shard into the database; where the database cannot take it (a full disk, an I/O
        error), the shard stays pending and the rest of this command writes shards only: the next
        command that opens the store merges them, and this one ends saying so (store.StoreUnavailable)."""
        try:
            merge_runs(self.con, self.req.results, [run_key])
        except StoreUnavailable as e:
            self.store_problem, self.con = str(e), None


def _data_dir(group: Group, req: Request) -> str | None:
    """Where the run's data came from: the dataset's own folder (folder:<path>), else --data-dir."""
    where = group.dataset.location or req.data_dir
    return str(where.resolve()) if where else None


def record_attention_distance(results: Path, rows: list[dict]) -> None:
    """One inspection's mean attention distances (execution/inspection.attention_distance_rows)."""
    with store.connect(results) as con:  # (closed on leaving, as on an error)
        store.save_attention_distance(con, rows)


def record_bench(results: Path, records: list[dict]) -> None:
    """One bench configuration's measurements (engine/bench.to_records): each stored as it is
    measured, so a later configuration's failure loses nothing."""
    with store.connect(results) as con:
        store.save_bench(con, records)


def record_audit(results: Path, audit: dict, pairs: list[dict], on_disk: Callable[[], None] = lambda: None) -> None:
    """One near-duplicate audit (execution/dedup.py) and its pairs, stored as it finishes: its shard
    (atomic; then `on_disk()`: what the search kept until now may go), then the database. While
    another process holds the database the shard waits (the next command that opens the store
    merges it); a database that cannot take it (a full disk) is a StoreUnavailable naming the shard kept."""
    shard = write_audit_shard(results, audit, pairs)
    on_disk()
    try:
        con = store.connect(results)
    except store.StoreLocked as e:
        log.warning("%s: the audit is kept in %s, merged by the next command that opens the store", e, shard)
        return
    try:
        ingest_audits(con, results, {shard.stem})
    finally:
        con.close()


def test_classes(group: Group) -> dict | None:
    """`{"present": k, "of": n}`: how many of the dataset's n classes the scored split (the protocol's
    last) holds. Counted once, from its labels, and stored with the run: a subset of 3 of Pets' 37
    breeds has chance 33 %, not 2.7 %, and the views say so. None where no split was read."""
    import numpy as np

    names = get_protocol(group.protocol).splits(group.dataset)
    scored = group.splits.get(names[-1]) if names else None
    if scored is None or not len(scored):
        return None
    return {"present": int(np.unique(scored.labels).size), "of": int(group.dataset.num_classes)}
