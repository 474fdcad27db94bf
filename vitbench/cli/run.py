"""`vitbench run`: parse the options into a Request, then one call of the Python API (or torchrun,
which runs this same command once per device)."""

from __future__ import annotations

import inspect
import logging
import sys
import typing
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from vitbench.cli import config as cfg
from vitbench.cli import options as o
from vitbench.cli import protocol_flags
from vitbench.cli import run_options as ro
from vitbench.cli.app import app, command_began, err
from vitbench.cli.output import ended_well, print_summary_table
from vitbench.cli.run_cluster import JobsProgress, cluster_options, report
from vitbench.cli.run_plan import print_plan
from vitbench.cli.run_progress import Progress
from vitbench.engine import loader_workers
from vitbench.errors import UserError
from vitbench.execution import estimate
from vitbench.host.devices import device_name, resolve_device
from vitbench.protocols.base import Request
from vitbench.protocols.registry import get_protocol, option_table
from vitbench.protocols.requests import SHARED, make_request
from vitbench.protocols.shared_options import TrainingOptions
from vitbench.store.shards import checkpoint_path

# The API, the engine and torch load inside the command, once it runs: `--help` never pays for them.
if TYPE_CHECKING:
    from vitbench.execution.cluster import ClusterOptions
    from vitbench.execution.machine_load import Stopwatch

log = logging.getLogger("vitbench")

CLUSTERS = ("auto", "slurm", "local")


def _shared_options(
    *,
    model: ro.Model,
    suite: ro.SuiteName,
    datasets: ro.Datasets = None,
    protocol: ro.RunProtocol,
    weights: ro.Weights,
    res: ro.Res,
    gelu: ro.Gelu,
    rerun: ro.Rerun = False,
    dry_run: ro.DryRun = False,
    explain: ro.Explain = False,
    assume_mfu: ro.AssumeMfu = None,
    price_on: ro.PriceOn = None,
    config: ro.Config = None,
    print_config: ro.PrintConfig = False,
    data_dir: ro.RunDataDir,
    data_source: ro.DataSource,
    skip_missing: ro.SkipMissing,
    skip_corrupt: ro.SkipCorrupt,
    verify_data: ro.VerifyData,
    download: ro.Download,
    extraction_batch: ro.ExtractionBatch,
    device: ro.RunDevice,
    devices: ro.Devices = 1,
    precision: ro.Precision,
    compile: ro.Compile,
    workers: ro.RunWorkers,
    input_pipeline: ro.InputPipeline,
    results: ro.RunResults,
    tensorboard: ro.TensorBoard,
    tracker: ro.Tracker = None,
) -> None:
    """The options `vitbench run` and `vitbench submit` share that are not a protocol's (the
    signatures of these three functions are read, never called). One without a default here is a
    Request field's, whose default (and check) the Request declares: `_signature` fills it in."""


def _torchrun_options(
    nnodes: ro.Nnodes = 1,
    node_rank: ro.NodeRank = 0,
    rdzv_endpoint: ro.RdzvEndpoint = None,
    rdzv_id: ro.RdzvId = None,
    rdzv_backend: ro.RdzvBackend = "c10d",
) -> None:
    """`vitbench run`'s own: one data-parallel job across nodes you start yourself."""


def _cluster_options(
    cluster: ro.Cluster = "auto",
    partition: ro.Partition = None,
    gpus_per_job: ro.GpusPerJob = 0,
    nodes: ro.Nodes = 1,
    time_limit: ro.TimeLimit = 240,
    cpus_per_job: ro.CpusPerJob = None,
    mem_gb: ro.MemGb = None,
    array_parallelism: ro.ArrayParallelism = 64,
    slurm_account: ro.SlurmAccount = None,
    slurm_qos: ro.SlurmQos = None,
    no_wait: ro.NoWait = False,
) -> None:
    """`vitbench submit`'s own: the jobs submitit starts."""


def moved_to_submit(command: str | None, flag: str | None) -> str | None:
    """Why `vitbench run` does not take `flag` where it is a cluster job's option (`--executor`
    and the jobs' options were run's before `vitbench submit`); None for any other flag."""
    if command != "run" or flag is None:
        return None
    if flag == "--executor":
        return "--executor: cluster jobs are `vitbench submit` now (run's options, and the jobs' own)"
    if flag in {"--" + name.replace("_", "-") for name in inspect.signature(_cluster_options).parameters}:
        return f"{flag}: an option of the cluster jobs, which `vitbench submit` starts (with run's options)"
    return None


def run(ctx: typer.Context, **given: Any) -> None:
    """Plan, run and store a benchmark. With no options: the embedded demo suite.

    On a cluster: `vitbench submit`, with the same options and the jobs' own."""
    _dispatch(ctx, given, run)


def submit(ctx: typer.Context, **given: Any) -> None:
    """Plan here, run as cluster jobs (submitit: SLURM arrays, or local subprocesses), store each result.

    The options of `vitbench run`, and the jobs' own (docs/cluster.md)."""
    _dispatch(ctx, given, submit)


def _signature(*sources: Callable[..., None]) -> inspect.Signature:
    """A command's options as typer reads them: those of `sources` and every protocol's own (a
    plugin's too), each in its `--help` panel, the panels in order."""
    shared = []
    for source in sources:
        hints = typing.get_type_hints(source, include_extras=True)  # (the annotations, evaluated)
        shared += [
            p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=hints[p.name], default=_default(p))
            for p in inspect.signature(source).parameters.values()
        ]
    ordered = sorted([*shared, *protocol_flags.parameters()], key=lambda p: protocol_flags.panel_rank(_panel(p)))
    context = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)
    return inspect.Signature([context, *ordered], return_annotation=None)


def _default(parameter: inspect.Parameter) -> Any:
    """The parameter's default; for one that has none, the Request field's of that name."""
    if parameter.default is not inspect.Parameter.empty:
        return parameter.default
    return next(f.default for f in fields(Request) if f.name == parameter.name)


def _panel(parameter: inspect.Parameter) -> str | None:
    return typing.get_args(parameter.annotation)[1].rich_help_panel


for command, sources in ((run, (_shared_options, _torchrun_options)), (submit, (_shared_options, _cluster_options))):
    command.__signature__ = _signature(*sources)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in command.__signature__.parameters.values()}  # type: ignore[attr-defined]
    app.command()(command)


def _dispatch(ctx: typer.Context, given: dict, command: Callable[..., None]) -> None:
    """The command's work: print the config, or run here, under torchrun or on a cluster."""
    began = command_began()
    from vitbench import api
    from vitbench.execution import launch

    g, resolved = _with_config(ctx, given, command)
    if g.get("explain") and not g["dry_run"]:
        raise UserError("--explain: says how --dry-run's estimate was made; add --dry-run")
    for option, given_as in (("--price-on", g.get("price_on")), ("--assume-mfu", g.get("assume_mfu"))):
        if given_as is not None and not g["dry_run"]:  # a real run measures its own time: never priced
            raise UserError(f"{option} {given_as}: prices a plan for --dry-run (a run measures its own); add --dry-run")
    if g["print_config"]:
        sys.stdout.write(resolved)
        return
    req = _request({**g, "config": resolved})  # with its suite's defaults: e.g. the demo's own results folder
    if req.results != g["results"] and not g["dry_run"]:
        log.info("the %s suite keeps its runs in %s (--results names another folder)", req.suite or "demo", req.results)
    if command is submit and not g["dry_run"]:
        jobs = cluster_options(g)
        processes = jobs.processes_per_node * g["nodes"]
        if processes > 1:
            _check_before_launch(req, processes)
        progress = JobsProgress()
        try:
            summary = api.run(req, rerun=g["rerun"], cluster_options=jobs, on_jobs=progress)
        except KeyboardInterrupt:
            progress.close()
            err.print(
                "interrupted: the submitted jobs go on in the queue; run the same command again to wait for "
                "them (it does not submit them again), `vitbench ingest` to merge what they stored, or "
                f"`vitbench jobs --cancel --results {req.results}` to cancel them",
                soft_wrap=True,
            )
            sys.exit(loader_workers.interrupted_code())
        finally:
            progress.close()
        report(summary, jobs.wait)
        return
    if command is submit:  # a dry run plans here, as `vitbench run --dry-run` does, then as jobs
        _run_here(req, g["rerun"], True, _rate(g, req), began, g["explain"], cluster_options(g))
        return
    if g["devices"] > 1 or g["nnodes"] > 1:  # the same command, once per device, under torchrun
        _check_before_launch(req, g["devices"] * g["nnodes"])
        rdzv = launch.Rendezvous(g["nnodes"], g["node_rank"], g["rdzv_endpoint"], g["rdzv_id"], g["rdzv_backend"])
        argv = launch.strip_devices(sys.argv[1:])
        raise typer.Exit(launch.launch(g["devices"], argv, rdzv, log_dir=Path(req.results) / "logs"))
    _run_here(req, g["rerun"], g["dry_run"], _rate(g, req), began, g["explain"])


def _rate(g: dict, req: Request) -> estimate.Rate | None:
    """--price-on's rate (the shipped measurements, --assume-mfu's for the rest), --assume-mfu's, or
    None (checked before any work, as every option is)."""
    assumed = None
    if g["assume_mfu"] is not None:
        assumed = estimate.parse_assume_mfu(g["assume_mfu"], device_name(resolve_device(req.device)))
    if g.get("price_on") is not None:
        return estimate.price_on(g["price_on"], assumed)
    return assumed


def _with_config(ctx: typer.Context, given: dict, command: Callable[..., None]) -> tuple[dict, str]:
    """The options with a --config file's where the command line gave none, and all of them as a
    config file (what --print-config prints and every run stores)."""
    kinds = cfg.option_kinds(command)
    elsewhere = {k: "vitbench submit" for k in cfg.option_kinds(_cluster_options)} if command is run else {}
    if given["config"] is not None:
        params = {p.name: p for p in ctx.command.params}
        for key, value in cfg.load(given["config"], kinds, elsewhere).items():
            source = ctx.get_parameter_source(key)  # typer vendors click: its enum, compared by name
            if source is None or source.name != "COMMANDLINE":
                given[key] = _as_on_the_command_line(ctx, params[key], value, given["config"])
    return given, cfg.to_toml(given, kinds, strict=bool(given["print_config"]))


def _as_on_the_command_line(ctx: typer.Context, param, value, config: Path):
    """A config file's value through the command line's own conversion and range check (the
    cluster options'), so that a file cannot pass what the command line refuses."""
    try:
        return value if value is None else param.process_value(ctx, value)
    except typer.BadParameter as e:
        raise UserError(f"{config}: key '{param.name}': {e.message}") from None


def _run_here(
    req: Request,
    rerun: bool,
    dry_run: bool,
    rate: estimate.Rate | None = None,
    began: Stopwatch | None = None,
    explain: bool = False,
    as_jobs: ClusterOptions | None = None,
) -> None:
    """This process (or this torchrun rank): the API's session, its progress lines, then the
    planned runs (dry run) or the summary table. `began`: when the command began; `as_jobs`: a
    dry run of `submit`, whose plan is also said as those jobs."""
    from vitbench import api
    from vitbench.engine.distributed import world

    here = device_name(resolve_device(req.device))
    if rate is None and world().is_main:  # what `vitbench bench` measured here, read before the run holds the store
        rate = estimate.measured_rate(req.results, here)
    progress = Progress(None if dry_run else rate, req.results, here)
    try:
        summary = api.run(req, rerun=rerun, dry_run=dry_run, on_plan=progress.planned, on_result=progress)
    except KeyboardInterrupt:
        running = progress.todo[progress.finished] if progress.finished < len(progress.todo) else None
        # the run that was cut off left a checkpoint (a training run past its first one): it goes on from there
        hint = ""
        if running is not None and checkpoint_path(req.results, running.run_key).is_file():
            hint = f" (the interrupted {running.protocol} run continues from its last checkpoint)"
        err.print(
            f"interrupted: {progress.stored()} of {len(progress.todo)} runs stored; "
            f"run the same command again to do the rest{hint}"
        )
        sys.exit(loader_workers.interrupted_code())  # its own line said it: main() would say "interrupted" again
    if dry_run:
        startup = began.seconds() if began is not None else 0.0
        print_plan(summary, here, rate, req, startup, explain, as_jobs)
    elif world().is_main:  # the runs this command planned (stored before or now), not the whole folder
        print_summary_table(req.results, {s.run_key for s in summary.specs})
        ended_well(summary)


def _request(given: dict) -> Request:
    """The API's Request from the command line's values (the same names: comma lists split here)."""
    if "cluster" in given:
        o.check_choice("--cluster", given["cluster"], CLUSTERS, "or")
    shared = {k: given[k] for k in SHARED if k in given}
    shared |= {
        "datasets": o.words(given["datasets"]),
        "data_dir": o.check_data_dir(given["data_dir"]),
        "tracker": o.words(given["tracker"]),
    }
    # the protocols' options as their flags parsed them (a switch not given is False: not given)
    table = option_table()
    options = {
        k: v for k, v in given.items() if k in table and v is not None and not (v is False and table[k][0].kind is bool)
    }
    return make_request("vitbench run", **shared, **options)


def _check_before_launch(req: Request, devices: int) -> None:
    """Plan here, once, so that a mistake (a missing dataset, a batch that does not split over the
    devices) is one line from this process, not the same error from every torchrun child followed
    by torchrun's failure report."""
    from vitbench import api
    from vitbench.engine.training import micro_batch_size

    device_type = resolve_device(req.device).type
    for group in api.plan(req):
        if not get_protocol(group.protocol).work(group).data_parallel:
            raise UserError(f"--devices {devices}: {api.not_data_parallel(group.protocol)}")
        for spec in (s for s in group.specs if "batch" in s.hparams):  # training's batch splits over the devices
            micro_batch_size(spec.hparams["batch"], devices, TrainingOptions.of(req).micro_batch, device_type)
