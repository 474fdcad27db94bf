"""The `vitbench` command: parse, call, print. No protocol logic lives here."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

import vitbench
from vitbench.errors import UserError

app = typer.Typer(
    help="Reproduce the transfer protocols of 'An Image is Worth 16x16 Words' (ViT) for any backbone.",
    context_settings={"help_option_names": ["-h", "--help"]},
    no_args_is_help=False,
    pretty_exceptions_enable=False,
    add_completion=False,
)
out = Console()
err = Console(stderr=True)
log = logging.getLogger("vitbench")

DataDir = Annotated[
    Path | None,
    typer.Option("--data-dir", envvar="VITBENCH_DATA", help="Root holding datasets in torchvision's layout."),
]
Results = Annotated[
    Path, typer.Option("--results", envvar="VITBENCH_RESULTS", help="Results folder: vitbench.duckdb, runs/, cache/.")
]


def _version(value: bool) -> None:
    if value:
        out.print(f"vitbench {vitbench.__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    pass


def _int_list(option: str, text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        values = ()
    if not values or any(v < 0 for v in values):
        raise UserError(f"{option} {text}: expected comma-separated non-negative integers, e.g. 0,1,2")
    return values


def _check_data_dir(data_dir: Path | None) -> Path | None:
    if data_dir is None:
        return None
    if not data_dir.exists():
        raise UserError(f"--data-dir {data_dir}: no such folder")
    if not data_dir.is_dir():
        raise UserError(f"--data-dir {data_dir}: is a file, expected the folder that holds the datasets")
    return data_dir


def _check_before_launch(req, devices: int) -> None:
    """Plan here, once, so that a mistake (a missing dataset, a batch that does not split over the
    devices) is one line from this process, not the same error from every torchrun child followed
    by torchrun's failure report."""
    from vitbench import finetune, runner
    from vitbench.provenance import resolve_device

    device_type = resolve_device(req.device).type
    for group in runner.plan(req):
        if group.protocol != finetune.PROTOCOL:
            raise UserError(f"--devices {devices}: only the finetune protocol runs data-parallel")
        for spec in group.specs:
            finetune.micro_batch_size(spec.hparams["batch"], devices, req.micro_batch, device_type)


def _check_precision(precision: str) -> None:
    if precision not in ("auto", "bf16", "fp32"):
        raise UserError(f"--precision {precision}: expected auto, bf16 or fp32")


def _check_pipeline(pipeline: str) -> None:
    from vitbench.device_data import PIPELINES

    if pipeline not in PIPELINES:
        raise UserError(f"--input-pipeline {pipeline}: expected {', '.join(PIPELINES)}")


def _writable_results(results: Path) -> Path:
    try:
        results.mkdir(parents=True, exist_ok=True)
        probe = results / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise UserError(f"--results {results}: cannot write there ({e.strerror or e})") from None
    return results


@app.command()
def run(
    model: Annotated[
        str | None, typer.Option("--model", "-m", help="Paper name, e.g. vit-b/16 (`vitbench ls models`).")
    ] = None,
    suite: Annotated[
        str | None, typer.Option("--suite", "-s", help="Named suite (`vitbench ls suites`); default: demo.")
    ] = None,
    dataset: Annotated[str | None, typer.Option("--dataset", "-d", help="Dataset name(s), comma-separated.")] = None,
    protocol: Annotated[
        str | None,
        typer.Option(
            "--protocol",
            help="fewshot (default; the suite's own for vtab/table2: finetune), finetune (App. B: dev LR sweep, "
            "then 3 seeds), or eval: score the checkpoint's own classifier.",
        ),
    ] = None,
    weights: Annotated[
        str | None, typer.Option("--weights", "-w", help="A .safetensors/.pth file, or 'random'.")
    ] = None,
    seeds: Annotated[str | None, typer.Option("--seeds", help="Comma-separated seeds [default: 0,1,2].")] = None,
    shots: Annotated[
        str | None, typer.Option("--shots", help="Comma-separated shot counts [default: 1,5,10,25].")
    ] = None,
    fewshot_l2: Annotated[
        str, typer.Option("--fewshot-l2", help="Ridge λ (1024, 2^10) or 'sweep' (2^-10..2^19).")
    ] = "1024",
    res: Annotated[
        int | None,
        typer.Option("--res", help="Input resolution [default: 384 for finetune (64 with --smoke), else the model's]."),
    ] = None,
    gelu: Annotated[str, typer.Option("--gelu", help="exact (timm) or tanh (Flax's approximate GELU).")] = "exact",
    data_dir: DataDir = None,
    data_source: Annotated[
        str | None,
        typer.Option("--data-source", help="tfds: VTAB from prepared TFDS builders [default: the folder layouts]."),
    ] = None,
    skip_missing: Annotated[
        bool, typer.Option("--skip-missing", help="Run the datasets that are there; name the ones skipped.")
    ] = False,
    skip_corrupt: Annotated[
        bool, typer.Option("--skip-corrupt", help="Leave corrupt images out (counted in each result).")
    ] = False,
    results: Results = Path("results"),
    device: Annotated[str, typer.Option("--device", help="auto, cpu, cuda or cuda:N.")] = "auto",
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Feature-extraction batch size.")] = 64,
    workers: Annotated[int, typer.Option("--workers", min=0, help="DataLoader worker processes.")] = min(
        4, (os.cpu_count() or 2) // 2
    ),
    input_pipeline: Annotated[
        str,
        typer.Option(
            "--input-pipeline",
            help="Where images are decoded and augmented: auto (the device on a GPU, else workers), workers or device.",
        ),
    ] = "auto",
    steps: Annotated[
        int | None, typer.Option("--steps", min=1, help="finetune: optimizer steps [default: Table 4's].")
    ] = None,
    batch: Annotated[
        int | None, typer.Option("--batch", min=1, help="finetune: global batch over all devices [default: 512].")
    ] = None,
    micro_batch: Annotated[
        int | None,
        typer.Option("--micro-batch", min=1, help="finetune: images per pass per device; the rest is accumulated."),
    ] = None,
    lr: Annotated[
        float | None, typer.Option("--lr", min=0.0, help="finetune: a fixed base LR instead of the dev sweep.")
    ] = None,
    polyak: Annotated[
        float | None,
        typer.Option("--polyak", min=0.0, max=1.0, help="finetune: parameter EMA decay (Table 2 ImageNet: 0.9999)."),
    ] = None,
    smoke: Annotated[
        bool, typer.Option("--smoke", help="finetune: 20 steps, batch 32, 64 px; marked, never compared.")
    ] = False,
    precision: Annotated[
        str,
        typer.Option(
            "--precision", help="Fine-tuning and few-shot extraction: auto (bf16 on CUDA, fp32 on CPU), bf16 or fp32."
        ),
    ] = "auto",
    compile_model: Annotated[
        bool, typer.Option("--compile", help="torch.compile the model (fine-tuning and few-shot extraction).")
    ] = False,
    devices: Annotated[
        int, typer.Option("--devices", min=1, help="finetune: data-parallel processes (torchrun + DDP).")
    ] = 1,
    checkpoint_every: Annotated[
        int | None,
        typer.Option(
            "--checkpoint-every",
            min=1,
            help="finetune: steps between resumable checkpoints [default: steps/10, 50..500].",
        ),
    ] = None,
    nnodes: Annotated[int, typer.Option("--nnodes", min=1, help="torchrun: nodes in the data-parallel job.")] = 1,
    node_rank: Annotated[int, typer.Option("--node-rank", min=0, help="torchrun: this node's rank.")] = 0,
    rdzv_endpoint: Annotated[
        str | None, typer.Option("--rdzv-endpoint", help="torchrun: HOST:PORT every node joins (multi-node).")
    ] = None,
    rdzv_id: Annotated[str | None, typer.Option("--rdzv-id", help="torchrun: the job's rendezvous id.")] = None,
    rdzv_backend: Annotated[str, typer.Option("--rdzv-backend", help="torchrun: rendezvous backend.")] = "c10d",
    executor: Annotated[
        str,
        typer.Option(
            "--executor", help="local (this process) or submitit (array jobs on SLURM, or local subprocesses)."
        ),
    ] = "local",
    cluster: Annotated[
        str, typer.Option("--cluster", help="submitit: auto (SLURM when sbatch is found), slurm or local.")
    ] = "auto",
    partition: Annotated[str | None, typer.Option("--partition", help="submitit: SLURM partition.")] = None,
    gpus_per_job: Annotated[
        int, typer.Option("--gpus-per-job", min=0, help="submitit: GPUs per node of each job (DDP over them).")
    ] = 0,
    nodes: Annotated[int, typer.Option("--nodes", min=1, help="submitit: nodes per job (torchrun across them).")] = 1,
    time_limit: Annotated[
        int, typer.Option("--time-limit", min=1, help="submitit: minutes per job (then requeued, resuming).")
    ] = 240,
    cpus_per_job: Annotated[int | None, typer.Option("--cpus-per-job", min=1, help="submitit: CPUs per job.")] = None,
    mem_gb: Annotated[int | None, typer.Option("--mem-gb", min=1, help="submitit: memory per node (GB).")] = None,
    array_parallelism: Annotated[
        int, typer.Option("--array-parallelism", min=1, help="submitit: jobs of the array running at once.")
    ] = 64,
    slurm_account: Annotated[str | None, typer.Option("--slurm-account", help="submitit: SLURM account.")] = None,
    slurm_qos: Annotated[str | None, typer.Option("--slurm-qos", help="submitit: SLURM QOS.")] = None,
    no_wait: Annotated[
        bool, typer.Option("--no-wait", help="submitit: submit and return; `vitbench ingest` merges the shards later.")
    ] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show the planned runs and stop.")] = False,
    rerun: Annotated[bool, typer.Option("--rerun", help="Run again even where results exist.")] = False,
) -> None:
    """Plan, run and store a benchmark. With no options: the embedded demo suite."""
    from vitbench import distributed, fewshot, runner, store

    _check_precision(precision)
    _check_pipeline(input_pipeline)

    req = runner.Request(
        model=model,
        suite=suite,
        protocol=protocol,
        weights=weights,
        datasets=tuple(d.strip() for d in dataset.split(",") if d.strip()) if dataset else (),
        seeds=_int_list("--seeds", seeds) or fewshot.SEEDS,
        shots=_int_list("--shots", shots) or fewshot.SHOTS,
        fewshot_l2=fewshot_l2,
        res=res,
        gelu=gelu,
        data_dir=_check_data_dir(data_dir),
        data_source=data_source,
        skip_missing=skip_missing,
        skip_corrupt=skip_corrupt,
        results=results,
        device=device,
        batch_size=batch_size,
        workers=workers,
        input_pipeline=input_pipeline,
        steps=steps,
        batch=batch,
        micro_batch=micro_batch,
        lr=lr,
        polyak=polyak or None,
        smoke=smoke,
        precision=precision,
        compile=compile_model,
        checkpoint_every=checkpoint_every,
    )
    if 0 in req.shots:
        raise UserError("--shots: shot counts must be at least 1")
    if executor not in ("local", "submitit"):
        raise UserError(f"--executor {executor}: expected local or submitit")
    if cluster not in ("auto", "slurm", "local"):
        raise UserError(f"--cluster {cluster}: expected auto, slurm or local")
    rdzv = distributed.Rendezvous(nnodes, node_rank, rdzv_endpoint, rdzv_id, rdzv_backend)
    if executor == "submitit" and not dry_run:
        from vitbench.cluster import ClusterOptions

        opts = ClusterOptions(
            cluster=cluster,
            partition=partition,
            gpus_per_job=gpus_per_job,
            processes_per_node=max(gpus_per_job, devices),
            nodes=nodes,
            time_limit_min=time_limit,
            cpus_per_task=cpus_per_job,
            mem_gb=mem_gb,
            array_parallelism=array_parallelism,
            account=slurm_account,
            qos=slurm_qos,
            wait=not no_wait,
        )
        if opts.processes_per_node > 1 or nodes > 1:
            _check_before_launch(req, opts.processes_per_node * nodes)
        _run_on_cluster(req, opts, rerun)
        return
    if devices > 1 or nnodes > 1:  # the same command, once per device, under torchrun
        _check_before_launch(req, devices * nnodes)
        raise typer.Exit(distributed.launch(devices, distributed.strip_devices(sys.argv[1:]), rdzv))
    from vitbench.provenance import resolve_device

    world, _ = distributed.setup(resolve_device(device))  # a bad --device fails before any work
    if not dry_run and world.is_main:
        _writable_results(results)
    groups = runner.plan(req)
    if world.size > 1 and any(g.protocol != "finetune" for g in groups):
        raise UserError("--devices / torchrun: only the finetune protocol runs data-parallel")
    specs = [s for g in groups for s in g.specs]
    # only rank 0 opens the store (DuckDB has one writer); it tells the others what is done
    con = None if dry_run or not world.is_main else store.connect(results)
    done: set[str] = set()
    if con is not None:
        store.ingest_pending(con, results)
        done = store.done_keys(con)
    elif dry_run:  # a dry run only reads the store (never creates or migrates it)
        done = set(store.read_results(results)["run_key"])
    done = distributed.broadcast(done, world)
    todo = [s for s in specs if rerun or s.run_key not in done]
    log.info("%d runs planned, %d already stored, %d to run", len(specs), len(specs) - len(todo), len(todo))
    if dry_run:
        for s in specs:
            shots = f" shots={s.shots}" if s.shots is not None else ""
            if s.protocol == "finetune":
                h = s.hparams
                shots = f" {h['stage']} lr={h['lr']} steps={h['steps']} batch={h['batch']} res={h['res']}"
            out.print(
                f"{s.run_key[:12]}  {s.model:12s} {s.dataset:18s} {s.protocol}{shots} seed={s.seed}"
                f"  {'done' if s.run_key in done else 'todo'}"
            )
        return
    finished = 0

    def report(spec, metrics) -> None:
        nonlocal finished
        finished += 1
        value = metrics.get("accuracy")
        shown = f"accuracy {value * 100:.2f}%" if value is not None else f"{len(metrics)} λ values"
        if value is None and "dev_accuracy" in metrics:
            shown = f"dev accuracy {metrics['dev_accuracy'] * 100:.2f}%"
        if "accuracy_real" in metrics:
            shown += f", ReaL {metrics['accuracy_real'] * 100:.2f}%"
        what = f"{spec.shots}-shot seed {spec.seed}" if spec.shots is not None else spec.protocol
        if spec.protocol == "finetune":
            what = f"finetune {spec.hparams['stage']} lr={spec.hparams['lr']} seed {spec.seed}"
        log.info("[%d/%d] %s %s %s: %s", finished, len(todo), spec.model, spec.dataset, what, shown)

    try:
        runner.execute(groups, req, con, done, rerun=rerun, on_result=report)
    except KeyboardInterrupt:
        err.print(
            f"interrupted: {finished} of {len(todo)} runs stored; run the same command again to do the rest"
            + (
                " (a fine-tune continues from its last checkpoint)"
                if any(s.protocol == "finetune" for s in todo)
                else ""
            )
        )
        raise typer.Exit(130) from None
    finally:
        if con is not None:
            con.close()
    if world.is_main:
        _print_table(results, compact=True)


def _run_on_cluster(req, opts, rerun: bool) -> None:
    """Plan here, submit the runs without a result as submitit jobs, merge their shards as they land."""
    from vitbench import cluster, runner, store

    _writable_results(req.results)
    groups = runner.plan(req)
    con = store.connect(req.results)  # closed again at once: the workers' shards are merged by `sync`
    try:
        store.ingest_pending(con, req.results)
        done = store.done_keys(con)
    finally:
        con.close()
    specs = [s for g in groups for s in g.specs]
    todo = {s.run_key for s in specs if rerun or s.run_key not in done}
    log.info("%d runs planned, %d already stored, %d to submit", len(specs), len(specs) - len(todo), len(todo))
    if todo:
        submitted, failed = cluster.submit_and_wait(req, groups, todo, opts, lambda: store.sync(req.results))
        store.sync(req.results)
        stored = len(todo & set(store.read_results(req.results)["run_key"]))
        log.info("%d job(s) submitted; %d of %d runs now stored", submitted, stored, len(todo))
        if opts.wait and not failed and stored < len(todo):
            err.print(
                f"{len(todo) - stored} run(s) have no result yet: leased by another job (see the job logs) or "
                "waiting for their LR sweep; run the same command again to pick them up"
            )
        if failed:
            for line in failed:
                err.print(f"failed: {line}", markup=False, highlight=False, soft_wrap=True)
            raise UserError(
                f"{len(failed)} job(s) failed; run the same command again to resubmit what has no result "
                "(fine-tunes resume from their last checkpoint)"
            )
        if not opts.wait:
            out.print(
                f"submitted; `vitbench ingest --results {req.results}` (or any `vitbench table`) merges the results"
            )
            return
    _print_table(req.results, compact=True)


def _print_table(results: Path, compact: bool = False) -> None:
    """The summary after `vitbench run`: the default view, only the rows that have results."""
    from vitbench import render, store, table

    data = table.accuracy_view(store.read_results(results), compact=compact)
    if data.rows:
        out.print(render.to_rich(data))


def _emit(text: str, out_file: Path | None) -> None:
    if out_file is None:
        sys.stdout.write(text)
        return
    from vitbench.provenance import write_atomic

    if out_file.is_dir():
        raise UserError(f"--out {out_file}: is a folder, expected a file name")
    write_atomic(out_file, text)
    err.print(f"wrote {out_file}")


def _render(data, fmt: str, results: Path, out_file: Path | None = None) -> None:
    from vitbench import render, store

    if fmt not in render.FORMATS:
        raise UserError(f"--format {fmt}: expected {', '.join(render.FORMATS)}")
    if not data.rows:
        err.print(f"no results in {results / store.DB_NAME} yet; try `vitbench run`")
        return
    if fmt == "rich":
        if out_file is not None:
            raise UserError("--out needs a file format: --format md, latex, csv or html")
        out.print(render.to_rich(data))
    else:
        _emit(render.render_text(data, fmt), out_file)


Where = Annotated[
    list[str] | None,
    typer.Option(
        "--where",
        help="Keep runs matching FIELD OP VALUE (OP: = != > < >= <= ~), repeatable: model=vit-b/16, "
        "weights=deit*, data_source~cifar, 'date>=2026-11-01', hparams.res=384.",
    ),
]
Protocol = Annotated[
    str | None,
    typer.Option("--protocol", help="finetune, eval or fewshot (default: fine-tuned results, else few-shot)."),
]


@app.command("table")
def table_cmd(
    names: Annotated[
        list[str] | None, typer.Argument(help="More paper columns after --compare (`--compare bit-l vit-l/16-i21k`).")
    ] = None,
    compare: Annotated[
        list[str] | None, typer.Option("--compare", help="Paper column(s) to add, e.g. bit-l (`vitbench ls models`).")
    ] = None,
    which: Annotated[str, typer.Option("--table", help="2 (default), 5, 6 or 9: the paper table's layout.")] = "2",
    protocol: Protocol = None,
    shots: Annotated[int | None, typer.Option("--shots", help="Only this few-shot count.")] = None,
    group_by: Annotated[
        list[str] | None,
        typer.Option(
            "--group-by", help="Columns by these stored fields instead of (model, weights), e.g. data_source."
        ),
    ] = None,
    where: Where = None,
    include_marked: Annotated[
        bool, typer.Option("--include-marked", help="Give random-init, subset and smoke cells a Δ and a bold too.")
    ] = False,
    delta_to: Annotated[
        str | None, typer.Option("--delta-to", help="The --compare column Δ is taken against (default: the first).")
    ] = None,
    fmt: Annotated[str, typer.Option("--format", "-f", help="rich, md, latex, csv or html.")] = "rich",
    out_file: Annotated[Path | None, typer.Option("--out", "-o", help="Write to this file instead of stdout.")] = None,
    view: Annotated[
        str, typer.Option("--view", help="accuracy, or attention (mean attention distance per layer).")
    ] = "accuracy",
    bench: Annotated[
        bool, typer.Option("--bench", help="The throughput measurements of `vitbench bench` instead of accuracy.")
    ] = False,
    results: Results = Path("results"),
) -> None:
    """Stored results in the paper's layouts, beside the paper's own numbers."""
    from vitbench import query, store, table

    if bench:
        from vitbench.bench_view import bench_view

        data = bench_view(store.read_bench(results))
        if not data.rows:
            err.print(f"no throughput measurements in {results / store.DB_NAME} yet; try `vitbench bench`")
            return
        _render(data, fmt, results, out_file)
        return
    if view == "attention":
        _render(table.attention_view(store.read_attention_distance(results)), fmt, results, out_file)
        return
    if view != "accuracy":
        raise UserError(f"--view {view}: expected accuracy or attention")
    if names and not compare:
        raise UserError(f"unexpected argument {names[0]!r}: paper columns follow --compare (--compare {names[0]})")
    compare = [*(compare or ()), *(names or ())]
    if protocol is not None and protocol not in ("finetune", "eval", "fewshot"):
        raise UserError(f"--protocol {protocol}: expected finetune, eval or fewshot")
    if shots is not None and protocol not in (None, "fewshot"):
        raise UserError(f"--shots {shots}: only few-shot runs have shots; drop --protocol {protocol}")
    if shots is not None:
        protocol = "fewshot"
    store.sync(results)  # shards that cluster workers wrote since the last merge
    df = query.apply_where(store.read_results(results), where)
    fields = query.split_fields(group_by)
    if which == "2":
        data = table.accuracy_view(df, compare, protocol, shots, fields, include_marked, delta_to)
    elif which == "9":
        data = table.table9_view(df, compare, protocol, fields, include_marked, delta_to)
    elif which in ("5", "6"):
        if compare or fields or delta_to:
            raise UserError(
                f"--table {which}: shows the paper's whole table; --compare/--group-by/--delta-to are for 2 and 9"
            )
        view_fn = table.table5_view if which == "5" else table.table6_view
        data = view_fn(df, protocol, include_marked)
    else:
        raise UserError(f"--table {which}: expected 2, 5, 6 or 9")
    _render(data, fmt, results, out_file)


@app.command("ingest")
def ingest_cmd(results: Results = Path("results")) -> None:
    """Merge result shards (from cluster jobs or interrupted runs) into the results database."""
    from vitbench import store

    folder = store.shard_dir(results)
    if not folder.is_dir():
        raise UserError(f"--results {results}: no runs/ folder of result shards there")
    merged = store.sync(results)
    out.print(f"merged {merged} new run(s) into {results / store.DB_NAME} ({len(store.shard_keys(results))} shards)")


@app.command("bench")
def bench_cmd(
    config: Annotated[
        list[str] | None,
        typer.Option(
            "--config",
            "-c",
            help="MODEL@RES, repeatable [default on a GPU: vit-b/16@224, vit-b/16@384, vit-l/16@384, "
            "r50+vit-b/16@384, bit-m-r50x1@448; on a CPU: vit-ti/16@64].",
        ),
    ] = None,
    mode: Annotated[str, typer.Option("--mode", help="train, inference or both.")] = "both",
    batch: Annotated[
        int | None, typer.Option("--batch", min=1, help="Images per step [default: 256 on a GPU, 16 on a CPU].")
    ] = None,
    micro_batch: Annotated[
        int | None,
        typer.Option("--micro-batch", min=1, help="Training images per pass [default: chosen from free memory]."),
    ] = None,
    steps: Annotated[int, typer.Option("--steps", min=1, help="Timed steps (batches) per measurement.")] = 20,
    warmup: Annotated[int, typer.Option("--warmup", min=0, help="Untimed steps first (compilation, autotuning).")] = 5,
    rounds: Annotated[
        int, typer.Option("--rounds", min=1, help="Alternate vitbench and the bare loop this often; keep the median.")
    ] = 1,
    precision: Annotated[
        str, typer.Option("--precision", help="auto (bf16 on CUDA, fp32 on CPU), bf16 or fp32.")
    ] = "auto",
    compile_model: Annotated[bool, typer.Option("--compile", help="torch.compile the model (every runner).")] = False,
    dataset: Annotated[
        str,
        typer.Option("--dataset", "-d", help="Real data for the input-pipeline rows (default: the embedded digits)."),
    ] = "digits",
    data_dir: DataDir = None,
    input_pipeline: Annotated[
        str, typer.Option("--input-pipeline", help="auto (the device on a GPU, else workers), workers or device.")
    ] = "auto",
    workers: Annotated[int, typer.Option("--workers", min=0, help="DataLoader worker processes.")] = min(
        8, (os.cpu_count() or 2) // 2
    ),
    timm_benchmark: Annotated[
        Path | None,
        typer.Option(
            "--timm-benchmark",
            envvar="VITBENCH_TIMM_BENCHMARK",
            help="timm's benchmark.py (from a pytorch-image-models checkout), run at the same settings.",
        ),
    ] = None,
    device: Annotated[str, typer.Option("--device", help="auto, cpu, cuda or cuda:N.")] = "auto",
    results: Results = Path("results"),
) -> None:
    """Throughput of vitbench's fine-tune and extraction loops (synthetic and real data) against bare
    loops and timm's benchmark.py; images/s, MFU and peak memory into the store (`table --bench`)."""
    import uuid

    from vitbench import bench, render, store
    from vitbench.bench_view import bench_view
    from vitbench.provenance import resolve_device

    _check_precision(precision)
    if mode not in ("train", "inference", "both"):
        raise UserError(f"--mode {mode}: expected train, inference or both")
    _check_pipeline(input_pipeline)
    if timm_benchmark is not None and not timm_benchmark.is_file():
        raise UserError(f"--timm-benchmark {timm_benchmark}: no such file (timm's benchmark.py from its repository)")
    torch_device = resolve_device(device)
    gpu = torch_device.type == "cuda"
    configs = [bench.Config.parse(c) for c in (config or (bench.GPU_CONFIGS if gpu else bench.CPU_CONFIGS))]
    size = batch or (256 if gpu else 16)
    if micro_batch is not None and size % micro_batch:
        raise UserError(f"--micro-batch {micro_batch}: must divide --batch {size}")
    opts = bench.with_defaults(
        bench.Options(
            batch=size,
            steps=steps,
            warmup=warmup,
            precision=precision,
            compile=compile_model,
            device=torch_device,
            dataset=dataset,
            data_dir=_check_data_dir(data_dir),
            workers=workers,
            input_pipeline=input_pipeline,
            micro_batch=micro_batch,
            timm_script=timm_benchmark,
            modes=bench.MODES if mode == "both" else (mode,),
            rounds=rounds,
        )
    )
    bench.check_timm_configs(configs, opts)  # before any measuring: a GPU run must not end without timm's row
    _writable_results(results)
    bench_id = uuid.uuid4().hex[:12]
    for cfg in configs:
        records = bench.to_records(bench.measure(cfg, opts), opts, bench_id)
        con = store.connect(results)  # stored per configuration: a later failure loses nothing
        try:
            store.save_bench(con, records)
        finally:
            con.close()
    frame = store.read_bench(results)
    out.print(render.to_rich(bench_view(frame[frame["bench_id"] == bench_id])))
    out.print(f"stored in {results / store.DB_NAME} (bench {bench_id}); all measurements: vitbench table --bench")


@app.command("export")
def export_cmd(
    fmt: Annotated[str, typer.Option("--format", "-f", help="parquet, csv or json.")] = "parquet",
    out_file: Annotated[
        Path | None, typer.Option("--out", "-o", help="The file to write (default vitbench-runs.<format>).")
    ] = None,
    where: Where = None,
    results: Results = Path("results"),
) -> None:
    """Every stored run × metric with its provenance, as Parquet, CSV or JSON (for pandas and sharing)."""
    from vitbench.export import export

    path = out_file or Path(f"vitbench-runs.{fmt}")
    rows = export(results, fmt, path, where)
    out.print(f"wrote {rows} rows (run × metric, with provenance) to {path}")


@app.command("plot")
def plot_cmd(
    figures: Annotated[
        list[str] | None, typer.Argument(help="vtab, cost, fewshot, curves (default: all four).")
    ] = None,
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Folder for the figures.")] = Path("plots"),
    formats: Annotated[str, typer.Option("--formats", help="Comma-separated: png, svg.")] = "png,svg",
    cost: Annotated[str, typer.Option("--cost", help="The cost axis of `cost`: flops or days.")] = "flops",
    run: Annotated[
        str | None, typer.Option("--run", help="`curves`: the run_key (or its start) of a fine-tuning run.")
    ] = None,
    protocol: Protocol = None,
    where: Where = None,
    results: Results = Path("results"),
) -> None:
    """The paper's figures from the store: VTAB groups, accuracy vs cost, few-shot vs shots, fine-tuning curves."""
    from vitbench import plots, query, store

    chosen = figures or list(plots.FIGURES)
    for name in chosen:
        if name not in plots.FIGURES:
            raise UserError(f"vitbench plot {name}: expected one of {', '.join(plots.FIGURES)}")
    exts = tuple(f.strip().lower() for f in formats.split(",") if f.strip())
    if not exts or any(e not in ("png", "svg") for e in exts):
        raise UserError(f"--formats {formats}: expected png, svg or png,svg")
    store.sync(results)  # shards that cluster workers wrote since the last merge
    df = query.apply_where(store.read_results(results), where)
    for name in chosen:
        try:
            if name == "vtab":
                fig = plots.vtab_figure(df, out_dir, exts, protocol)
            elif name == "cost":
                fig = plots.cost_figure(df, out_dir, exts, protocol, cost)
            elif name == "fewshot":
                fig = plots.fewshot_figure(df, out_dir, exts)
            else:
                fig = plots.curves_figure(df, store.read_curves(results), out_dir, exts, run)
        except UserError as e:
            if figures:  # asked for by name: the reason is the error
                raise
            err.print(f"{name}: skipped, {e}", markup=False, highlight=False)
            continue
        out.print(f"[bold]{', '.join(str(f) for f in fig.files)}[/bold]")
        out.print(fig.caption, markup=False, highlight=False)


@app.command("ls")
def ls(
    what: Annotated[str, typer.Argument(help="models, datasets, suites or plugins.")],
) -> None:
    """List what vitbench knows about."""
    from rich.table import Table

    from vitbench import paper, registry
    from vitbench.datasets import DATASETS
    from vitbench.suites import SUITES

    if what == "plugins":  # from package metadata only: nothing is imported
        t = Table("plugin", "target", "distribution", "version")
        for p in registry.plugins():
            t.add_row(p.name, p.target, p.distribution, p.version)
        if registry.autoload_disabled():
            t.caption = f"{registry.AUTOLOAD_ENV}=1: third-party plugins are not loaded"
    elif what == "models":
        t = Table("model", "family", "timm architecture", "paper weights (timm:paper)", "notes")
        for spec in registry.models().values():
            t.add_row(
                spec.name,
                spec.family,
                spec.arch,
                spec.paper_tag or "",
                f"paper reference only: {spec.reference_only}" if spec.reference_only else spec.summary,
            )
        t.caption = "paper columns for --compare: " + ", ".join(paper.columns())
    elif what == "datasets":
        t = Table("dataset", "title", "classes", "folder under --data-dir", "official splits", "LR dev split", "notes")
        for d in DATASETS.values():
            dev = f"{d.dev_fraction:.0%} of train" if d.dev_fraction else " → ".join(d.sweep_splits)
            notes = [d.group or "", "" if d.train_flip else "no flip", "" if d.train_crop else "no crop"]
            notes += [f"also --data-source {s}" for s in d.other_sources]
            t.add_row(
                d.name,
                d.title,
                str(d.num_classes),
                d.folder or "(embedded)",
                ", ".join(f"{k} {v:,}" for k, v in d.official_sizes.items() if v is not None),
                dev,
                ", ".join(n for n in notes if n),
            )
        t.caption = "custom: folder:<path> reads any ImageFolder tree with train/ and test/ (and optional val/)"
    elif what == "suites":
        t = Table("suite", "datasets", "protocol", "description")
        for s in SUITES.values():
            t.add_row(s.name, ", ".join(s.datasets), s.protocol, s.description)
    else:
        raise UserError(f"vitbench ls {what}: expected models, datasets, suites or plugins")
    out.print(t)


@app.command("inspect")
def inspect_cmd(
    model: Annotated[str, typer.Option("--model", "-m", help="A ViT or hybrid (`vitbench ls models`).")],
    weights: Annotated[
        str, typer.Option("--weights", "-w", help="A .npz/.safetensors/.pth file, timm:<tag>, or 'random'.")
    ],
    images: Annotated[Path | None, typer.Option("--images", help="A folder of images.")] = None,
    dataset: Annotated[str | None, typer.Option("--dataset", "-d", help="Or: a dataset's test images.")] = None,
    data_dir: DataDir = None,
    res: Annotated[
        int | None, typer.Option("--res", help="Input resolution (position embeddings interpolated).")
    ] = None,
    num_images: Annotated[int, typer.Option("--num-images", min=1, help="Images for the attention distances.")] = 32,
    rollout_images: Annotated[
        int, typer.Option("--rollout-images", min=0, help="Images to draw rollout maps for.")
    ] = 8,
    out_dir: Annotated[Path, typer.Option("--out", help="Folder for the PNG files.")] = Path("inspect"),
    results: Results = Path("results"),
    device: Annotated[str, typer.Option("--device", help="auto, cpu, cuda or cuda:N.")] = "auto",
) -> None:
    """Paper §4.5 views of a backbone: embedding filters, position similarity, attention distance, rollout."""
    from vitbench import inspection, registry, render, store, table
    from vitbench.provenance import device_name, resolve_device

    spec = registry.get_model(model)
    torch_device = resolve_device(device)
    _writable_results(results)
    found = inspection.inspect_backbone(
        spec,
        weights,
        res,
        images,
        dataset,
        _check_data_dir(data_dir),
        out_dir,
        torch_device,
        num_images=num_images,
        rollout_images=rollout_images,
    )
    key, rows = inspection.attention_distance_rows(spec, found, device_name(torch_device))
    con = store.connect(results)
    try:
        store.save_attention_distance(con, rows)
    finally:
        con.close()
    out.print(render.to_rich(table.attention_view(store.read_attention_distance(results), only=key)))
    written = ["embedding_filters.png"] if found["filters_written"] else []
    written += [
        "position_similarity.png",
        "attention_distance.png",
        f"attention_rollout/ ({len(found['rollout_files'])} images)",
    ]
    if not found["filters_written"]:
        err.print("embedding filters skipped: a hybrid's patch embedding projects ResNet features, not RGB patches")
    out.print(f"wrote {', '.join(written)} under {out_dir}; attention distances stored in {results / store.DB_NAME}")


weights_app = typer.Typer(help="Inspect and convert weights files.", no_args_is_help=True)
app.add_typer(weights_app, name="weights")


@weights_app.command("inspect")
def weights_inspect(path: Annotated[Path, typer.Argument(help="A .npz, .safetensors or .pth file.")]) -> None:
    """Format, inferred architecture, parameters, patch/grid/width/depth/heads, head, pre_logits."""
    from rich.table import Table

    from vitbench.checkpoint import describe

    t = Table("field", "value", show_header=False)
    for key, value in describe(path).items():
        t.add_row(key, str(value))
    out.print(t)


@weights_app.command("convert")
def weights_convert(
    path: Annotated[Path, typer.Argument(help="A Google .npz checkpoint.")],
    output: Annotated[Path, typer.Argument(help="The .safetensors file to write.")],
    model: Annotated[str | None, typer.Option("--model", "-m", help="Architecture, if it cannot be inferred.")] = None,
) -> None:
    """Convert a Google .npz once into safetensors (every tensor checked), keeping pre_logits."""
    from vitbench.checkpoint import convert

    name = convert(path, model, output)
    out.print(f"wrote {output} ({name})")


@app.command()
def doctor(data_dir: DataDir = None) -> None:
    """Versions, accelerators, and which datasets are found under --data-dir."""
    import timm
    import torch
    from rich.table import Column, Table

    from vitbench.datasets import DATASETS, dataset_status
    from vitbench.datasets.vtab import ROOT_FOLDER as VTAB_ROOT
    from vitbench.provenance import device_name, git_sha

    out.print(
        f"vitbench {vitbench.__version__} ({git_sha()}), torch {torch.__version__}, timm {timm.__version__}, "
        f"python {sys.version.split()[0]}"
    )
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            out.print(f"cuda:{i}  {torch.cuda.get_device_name(i)}")
    else:
        out.print(f"no CUDA device; runs use the {device_name(torch.device('cpu'))}")
    data_dir = _check_data_dir(data_dir)
    t = Table(
        "dataset",
        Column("status", overflow="fold"),  # fold, not ellipsis: the missing file's name matters
        "images per split (found / official)",
        title=f"datasets under {data_dir}" if data_dir else "datasets (no --data-dir)",
    )
    absent_vtab = []
    for d in DATASETS.values():
        status, counts = dataset_status(d, data_dir)
        if d.group and status.startswith("absent"):
            absent_vtab.append(d.name)  # one line for a VTAB-1k that is not there at all, below
            continue
        t.add_row(d.name, status, ", ".join(c.describe() for c in counts))
    if absent_vtab:
        t.add_row(f"vtab/* ({len(absent_vtab)} tasks)", f"absent (expected under {VTAB_ROOT}/<task>/)", "")
    out.print(t)


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is now (not the one at start-up), so redirection works."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def _configure_logging() -> None:
    if not any(isinstance(h, _StderrHandler) for h in log.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
    log.setLevel(logging.INFO)


def main() -> None:
    _configure_logging()
    try:
        code = app(standalone_mode=False)
    except UserError as e:
        err.print(f"error: {e}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(e.exit_code)
    except typer.TyperException as e:  # click's usage errors (typer vendors click: no direct import)
        message = e.format_message() if hasattr(e, "format_message") else str(e)
        err.print(f"error: {message} (see -h)", markup=False, highlight=False, soft_wrap=True)
        sys.exit(getattr(e, "exit_code", 2))
    except (KeyboardInterrupt, typer.Abort):
        err.print("interrupted")
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)
