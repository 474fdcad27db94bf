"""The one way in: a whole benchmark session, as `vitbench run`, its torchrun children, its
cluster workers and a notebook call it.

    import vitbench
    summary = vitbench.run(model="vit-ti/16", weights="random", datasets=("digits",), shots=(5,), seeds=(0,))
    frame = vitbench.results("results")        # every stored run x metric, with its provenance

`run`: check the results folder is writable, plan, merge shards, skip what is done, lease, execute
(here, under torchrun, or as submitit jobs), store."""

from __future__ import annotations

import functools
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from vitbench import store
from vitbench.catalog import registry
from vitbench.engine.bench_timm import check_timm_configs
from vitbench.engine.distributed import broadcast, setup
from vitbench.errors import UserError
from vitbench.execution import cluster, recorder, trackers
from vitbench.execution.job_process import said_in_the_log
from vitbench.execution.lease import lease_seconds
from vitbench.execution.plan import plan as plan_groups
from vitbench.execution.plan import suite_of
from vitbench.execution.runner import execute
from vitbench.files.out_paths import check_out_folder
from vitbench.host.devices import cpu_threads, device_name, resolve_device
from vitbench.host.state import leaves_no_trace
from vitbench.protocols.base import Group, Request, RunSpec, Trainer
from vitbench.protocols.registry import get_protocol
from vitbench.protocols.requests import make_request, options_doc, request_of
from vitbench.store.query import apply_where, per_run, with_json_parsed
from vitbench.store.results_folder import open_for_run, writable_results
from vitbench.views.figures import contact_sheet, inspection_plots
from vitbench.views.measured.axes import with_axes

log = logging.getLogger("vitbench")


@dataclass
class Summary:
    """What a session planned and did. `specs` in plan order; `done` holds the run_keys stored
    before the session started (a dry run changes nothing)."""

    specs: list[RunSpec]
    done: set[str]
    results: Path
    ran: int = 0
    failed: list[str] = field(default_factory=list)  # one line per failed cluster job or protocol
    store_problem: str | None = None  # why the database could not take the results (kept as shards)
    waiting: int = 0  # cluster runs without a result yet (leased elsewhere, or waiting for their sweep)
    groups: list[Group] = field(default_factory=list)  # the plan behind `specs` (a dry run's cost estimate reads it)

    @property
    def todo(self) -> list[RunSpec]:
        return [s for s in self.specs if s.run_key not in self.done]

    def __repr__(self) -> str:
        """What a notebook shows for it: the counts (the generated repr printed every planned
        split's image array)."""
        return (
            f"Summary({len(self.specs)} runs planned, {len(self.specs) - len(self.todo)} stored before, "
            f"{self.ran} run now, {self.waiting} waiting, {len(self.failed)} failed; results={str(self.results)!r})"
        )

    def merge(self, stage: Summary) -> None:
        """A later stage of the session joins it (its runs, their counts, its plan)."""
        self.specs += stage.specs
        self.groups += stage.groups
        self.done |= stage.done
        self.ran += stage.ran
        self.failed += stage.failed
        self.waiting += stage.waiting
        self.store_problem = self.store_problem or stage.store_problem

    def table(self) -> pd.DataFrame:
        """The stored results of this session's runs (run x metric)."""
        frame = with_axes(store.read_results(self.results))
        return frame[frame["run_key"].isin({s.run_key for s in self.specs})]


def request(**options) -> Request:
    """A Request from keyword options: the names of `vitbench run`'s options, each protocol's own
    among them (`knn_k=(10, 20)`, a plugin's too); lists as tuples, lists or ranges. It carries its
    suite's defaults (the demo's model, weights and results folder) where an option is left out;
    a `Request(...)` made by hand is taken as it is."""
    return make_request("vitbench.run", **options)


@leaves_no_trace
def plan(req: Request | None = None, **options) -> list[Group]:
    """The planned groups of run specs (nothing is run or stored)."""
    return plan_groups(request_of(req, options, "vitbench.plan"))


@leaves_no_trace
def run(
    req: Request | None = None,
    *,
    rerun: bool = False,
    dry_run: bool = False,
    on_plan: Callable[[Summary], None] | None = None,
    on_result: Callable[[RunSpec, dict], None] | None = None,
    cluster_options: cluster.ClusterOptions | None = None,
    on_jobs: Callable[[cluster.Tally], None] | None = None,
    **options,
) -> Summary:
    """Plan, skip what is stored, run the rest and store each result; returns what was done.
    `on_plan(summary)` is called once each stage is planned, before it runs; `on_result(spec,
    metrics)` after each stored run. With `cluster_options`, the runs go out as submitit jobs and
    their shards are merged as they land; `on_jobs(tally)` after each look at them (the jobs by
    state, the runs stored).

    A session runs in stages: the request, then the runs its protocols plan on what it made
    (pre-training: few-shot transfer of the weights each run wrote, beside random init), planned
    once that exists (a dry run plans them by name), into the same store. A stage that did not
    finish here (cluster jobs still waiting or failed; a torchrun world) plans no next stage."""
    for name, value in (("rerun", rerun), ("dry_run", dry_run)):
        if not isinstance(value, bool):  # dry_run="no" is truthy: it planned instead of running
            raise UserError(f"vitbench.run: {name}={value!r:.40}: expected True or False")
    req = request_of(req, options, "vitbench.run")
    summary = Summary([], set(), req.results)
    suite = suite_of(req)  # its pinned CPU threads hold for every stage (the demo's few-shot)
    threads = None if dry_run or cluster_options is not None or suite is None else suite.cpu_threads
    with cpu_threads(threads, resolve_device(req.device).type if threads else "cpu"):
        stage = [req]
        while stage:
            finished = []
            for part_req in stage:
                part, complete = _stage(part_req, rerun, dry_run, on_plan, on_result, cluster_options, on_jobs)
                summary.merge(part)
                if complete:
                    finished.append((part_req, part.groups))
            stage = [after for part_req, groups in finished for after in _next_stage(part_req, groups)]
            for after in stage:
                log.info("then: %s of %s on %s", after.protocol, after.model, ", ".join(after.datasets))
    return summary


run.__doc__ = (run.__doc__ or "") + "\n" + options_doc()
plan.__doc__ = (plan.__doc__ or "") + "\n" + options_doc()


def _stage(
    req: Request, rerun: bool, dry_run: bool, on_plan, on_result, cluster_options, on_jobs=None
) -> tuple[Summary, bool]:
    """One stage of a session: plan, skip what is stored, run the rest here, under torchrun or on
    a cluster; with whether it finished here (its next stage can be planned)."""
    if cluster_options is not None and not dry_run:
        summary = _run_on_cluster(req, cluster_options, rerun, on_jobs)
        return summary, not summary.waiting and not summary.failed
    world, _ = setup(resolve_device(req.device))
    lease_seconds()  # a bad VITBENCH_LEASE_SECONDS: one line, before any work
    if not dry_run and world.is_main:
        writable_results(req.results)
        trackers.check(req.tracker, req.tensorboard)  # a tracker that cannot log: one line before any work
    groups = plan_groups(req, dry_run)
    if world.size > 1:  # (a protocol's work is asked only where processes would share it)
        serial = [g.protocol for g in groups if not get_protocol(g.protocol).work(g).data_parallel]
        if serial:
            raise UserError(f"--devices / torchrun: {not_data_parallel(serial[0])}")
    specs = [s for g in groups for s in g.specs]
    # only rank 0 opens the store (DuckDB has one writer); it tells the others what is done
    con, store_problem = (None, None) if dry_run or not world.is_main else open_for_run(req.results)
    done: set[str] = set()
    if con is not None:
        done = store.done_keys(con) | store.shard_keys(req.results)  # a shard left unmerged is a finished run
    elif world.is_main:  # a dry run, or another run holds the store: a shard is a finished run
        done = set(store.read_results(req.results)["run_key"]) | store.shard_keys(req.results)
    done = broadcast(done, world)
    summary = Summary(specs, set() if rerun else done, req.results, groups=groups)
    log.info(
        "%d runs planned, %d already stored, %d to run", len(specs), len(specs) - len(summary.todo), len(summary.todo)
    )
    if on_plan is not None:
        on_plan(summary)
    if dry_run:
        summary.done = done
        return summary, True
    try:
        executed = execute(groups, req, con, done, rerun=rerun, on_result=on_result)
        summary.ran, summary.failed = executed.ran, executed.failed
        summary.store_problem = executed.store_problem or (store_problem if executed.ran else None)
    finally:
        if con is not None:
            con.close()
        elif world.is_main:  # this run wrote shards only: merge them now if the other run has finished
            store.sync(req.results)
    if world.size > 1:  # the next stage does not run data-parallel: say what runs it
        for after in _next_stage(req, groups):
            log.info("then, on one process: vitbench run --protocol %s --model %s --weights %s --dataset %s",
                     after.protocol, after.model, after.weights, ",".join(after.datasets))  # fmt: skip
        return summary, False
    return summary, not summary.failed


def _next_stage(req: Request, groups: list[Group]) -> list[Request]:
    """What the stage's protocols plan on what it made (pre-training: few-shot transfer)."""
    by_protocol: dict[str, list[Group]] = {}
    for group in groups:
        by_protocol.setdefault(group.protocol, []).append(group)
    return [
        f for name, part in by_protocol.items() if isinstance(trainer := get_protocol(name), Trainer)
        for f in trainer.followups(req, part)
    ]  # fmt: skip


def not_data_parallel(protocol: str) -> str:
    """The one-line reason `protocol`'s runs cannot run under torchrun, and what to do instead."""
    return f"the {protocol} protocol runs on one process only: run it without --devices"


def work(req: Request, run_keys: list[str], rerun_since: float | None = None) -> dict:
    """A cluster job's body: run `run_keys` of the request's plan in this process (or this torchrun
    world), the same plan the submitting process made, re-made here from the same request. With
    `rerun_since` (`submit --rerun`: when it submitted) a run whose shard is older is run again; one
    stored since (by an earlier attempt of a requeued job) is not."""
    groups = plan_groups(req)
    planned = {s.run_key for g in groups for s in g.specs}
    unknown = [k for k in run_keys if k not in planned]
    if unknown:
        raise UserError(
            f"{len(unknown)} of this job's runs are not in the plan any more (the data, weights or vitbench "
            "changed since submission); run the command again to plan afresh"
        )
    # the other runs of the plan count as done; of ours, those with a shard already are skipped
    again = (
        frozenset()
        if rerun_since is None
        else frozenset(k for k in run_keys if store.stored_before(req.results, k, rerun_since))
    )
    executed = execute(groups, req, None, planned - set(run_keys), again, on_result=said_in_the_log(len(run_keys)))
    if executed.failed:  # the job fails, saying which protocol (the submitting process lists it)
        raise UserError("; ".join(executed.failed))
    return {"ran": executed.ran, "host": socket.gethostname()}


def _run_on_cluster(req: Request, opts: cluster.ClusterOptions, rerun: bool, on_jobs=None) -> Summary:
    """Plan here, submit the runs without a result as submitit jobs, merge their shards as they land."""
    cluster.check_time_limit(opts)  # before anything is planned or submitted
    writable_results(req.results)
    groups = plan_groups(req)
    con = store.connect_when_free(req.results)  # closed again at once: the workers' shards are merged by `sync`
    try:
        store.ingest_pending(con, req.results)
        done = store.done_keys(con)
    finally:
        con.close()
    specs = [s for g in groups for s in g.specs]
    summary = Summary(specs, set() if rerun else done, req.results, groups=groups)
    todo = {s.run_key for s in summary.todo}
    # "without a result", not "to submit": some may be queued in a job of an earlier submission (said next)
    log.info("%d runs planned, %d already stored, %d without a result", len(specs), len(specs) - len(todo), len(todo))
    if not todo:
        return summary
    opts = cluster.with_default_resources(opts, req, [g for g in groups if any(s.run_key in todo for s in g.specs)])
    since = time.time() if rerun else None  # a rerun's result is a shard written after this
    worker = work if since is None else functools.partial(work, rerun_since=since)
    submitted, summary.failed = cluster.submit_and_wait(
        worker, req, groups, todo, opts, lambda: store.sync(req.results), on_jobs, since
    )
    store.sync(req.results)
    fresh = {k for k in todo if not store.stored_before(req.results, k, since)} if since is not None else todo
    stored = len(fresh & set(store.read_results(req.results)["run_key"]))  # a skipped rerun is not stored
    log.info("%d job(s) submitted; %d of %d runs now stored", submitted, stored, len(todo))
    summary.ran, summary.waiting = stored, len(todo) - stored
    return summary


@leaves_no_trace
def results(
    results: str | Path = "results", where: str | list[str] | tuple[str, ...] | None = None, long: bool = False
) -> pd.DataFrame:
    """Every stored run with its provenance (shards not yet merged included): one row per run, a
    column per metric it stored (`accuracy`, `accuracy_top5`, `accuracy_real`, the linear probe's
    `l2`, …) and a column per setting it stored (`res`, `shots`, `knn_k`, `preprocessing`, …; a
    setting named like a run field or a metric is `hparams.NAME`), `hparams` and `notes` as dicts.
    So `frame.groupby(["model", "weights", "res", "shots"])["accuracy"].mean()` averages seeds of
    one setting and never λ with accuracy. `where`: clauses as `vitbench table --where` takes
    them, one (`"metric=accuracy"`: only that metric's column) or a list, on any stored field
    (`res=224`, `hparams.res=224`, `notes.<key>`, `date`), applied to the stored rows (one per run
    and metric) before they become a row per run. `long=True`: those rows as stored, one per run
    and metric (`metric`, `value`)."""
    if not isinstance(results, str | os.PathLike):
        raise UserError(f"vitbench.results({results!r}): expected a results folder (a str or Path)")
    clauses = [where] if isinstance(where, str) else where
    if clauses is not None and not (isinstance(clauses, list | tuple) and all(isinstance(c, str) for c in clauses)):
        raise UserError(f"vitbench.results(where={where!r:.40}): expected a clause (str) or a list of them")
    path = Path(results)
    if not path.is_dir():  # a misspelt folder is a mistake, not an empty store
        what = "is a file" if path.exists() else "no such folder"
        raise UserError(
            f"vitbench.results({str(results)!r}): {what}, expected a results folder (`vitbench run` writes one)"
        )
    store.sync(path)
    stored = with_axes(store.read_results(path))
    selected = with_json_parsed(apply_where(stored, clauses))
    return selected if long else per_run(selected)


def inspect(
    model: str,
    weights: str,
    *,
    res: int | None = None,
    images: Path | None = None,
    dataset: str | None = None,
    data_dir: Path | None = None,
    out_dir: Path = Path("inspect"),
    results: Path = Path("results"),
    device: str = "auto",
    num_images: int = 32,
    rollout_images: int = 8,
) -> dict:
    """The paper's §4.5 views of a backbone (embedding filters, position similarity, attention
    distance, rollout) drawn under `out_dir`; the mean attention distances stored in `results`
    with their provenance. Returns what was measured and written, with the inspection's key
    (`inspect_key`, as `vitbench table --view attention` shows it)."""
    from vitbench.execution import inspection  # (torch: loaded when a backbone is inspected)

    spec = registry.get_model(model)
    torch_device = resolve_device(device)
    writable_results(Path(results))
    check_out_folder(Path(out_dir), "out_dir")
    found = inspection.inspect_backbone(
        spec, weights, res, images, dataset, data_dir, Path(out_dir), torch_device, inspection_plots,
        num_images=num_images, rollout_images=rollout_images,
    )  # fmt: skip
    key, rows = inspection.attention_distance_rows(spec, found, device_name(torch_device))
    recorder.record_attention_distance(Path(results), rows)
    return {**found, "inspect_key": key}


def bench(configs: list, options, results: Path = Path("results")) -> str:
    """`vitbench bench`'s measurement: each (model, resolution) of `configs` (engine/bench_types.Config)
    through vitbench's loops, bare loops and timm's benchmark.py under `options` (its Options),
    stored per configuration (a later failure loses nothing). Returns the bench id its rows carry."""
    from vitbench.engine import bench as engine_bench  # (torch: loaded when something is measured)

    check_timm_configs(configs, options)  # before any measuring: a GPU run must not end without timm's row
    writable_results(Path(results))
    bench_id = uuid.uuid4().hex[:12]
    for cfg in configs:
        records = engine_bench.to_records(engine_bench.measure_config(cfg, options), options, bench_id)
        recorder.record_bench(Path(results), records)
    return bench_id


def dedup(
    dataset: str,
    against: list[str] | tuple[str, ...] = (),
    *,
    data_dir: Path | None = None,
    results: Path = Path("results"),
    threshold: float | None = None,
    workers: int = 2,
    rerun: bool = False,
    verify_data: bool = False,
    data_source: str | None = None,
    dry_run: bool = False,
) -> list:
    """Near-duplicate audits (execution/dedup.py): `dataset`'s train (and dev) splits against its test
    split, or every image of `dataset` against each `against` test split, each stored with its pairs
    (`vitbench.store.read_audits`), or read back unless `rerun`: a dict per audit (store.AUDIT_COLUMNS,
    `pairs`, `stored`, `sheet`: a contact sheet PNG); `dry_run`: a `PricedAudit` each, nothing written."""
    from vitbench.engine.dedup import Method
    from vitbench.execution import dedup as dedup_audits  # (torch: loaded when images are compared)
    from vitbench.execution.dedup_price import price

    method = Method() if threshold is None else Method(threshold=threshold)
    if not 0.0 < method.threshold <= 1.0:
        raise UserError(f"--threshold {method.threshold}: expected a correlation in (0, 1]")
    audits = dedup_audits.plan(dataset, tuple(against))
    if dry_run:  # each audit priced here, nothing searched or written
        return price(audits, dedup_audits.split_loader(data_dir, data_source, verify_data), results, method, workers)
    writable_results(Path(results))
    found = dedup_audits.run(audits, data_dir, Path(results), method, workers, rerun, verify_data, data_source)
    for audit in found:  # pairs a person can check: each test image beside what it copies
        test, audited = audit.pop("splits")
        audit["sheet"] = contact_sheet.write_sheet(
            audit, test, audited, contact_sheet.sheet_path(Path(results), audit["audit_key"])
        )
    return found
