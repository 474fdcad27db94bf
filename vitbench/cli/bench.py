"""`vitbench bench`: throughput of vitbench's loops against bare loops and timm's benchmark.py."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

from vitbench import store
from vitbench.cli import options as o
from vitbench.cli.app import app, out
from vitbench.cli.options import (
    in_panel,  # noqa: F401  (named by the text annotations @panels writes)
    option,
)
from vitbench.cli.output import print_view
from vitbench.engine.bench_types import MODES, Config, Options  # light: the measuring engine loads in the command
from vitbench.errors import UserError
from vitbench.host.devices import check_pipeline, resolve_device

BENCH_WORKERS = min(8, (os.cpu_count() or 2) // 2)
BenchConfigs = Annotated[
    list[str] | None,
    option(
        "--config",
        "-c",
        help="MODEL@RES, repeatable [default on a GPU: vit-b/16@224, vit-b/16@384, vit-l/16@384, "
        "r50+vit-b/16@384, bit-m-r50x1@448; on a CPU: vit-ti/16@64].",
    ),
]
BenchMode = Annotated[str, option("--mode", help="train, inference or both.")]
BenchBatch = Annotated[
    int | None, option("--batch", min=1, help="Images per step [default: 256 on a GPU, 16 on a CPU].")
]
BenchMicroBatch = Annotated[
    int | None,
    option("--micro-batch", min=1, help="Training images per pass [default: chosen from free memory]."),
]
BenchSteps = Annotated[int, option("--steps", min=1, help="Timed steps (batches) per measurement.")]
BenchWarmup = Annotated[int, option("--warmup", min=0, help="Untimed steps first (compilation, autotuning).")]
BenchRounds = Annotated[
    int, option("--rounds", min=1, help="Alternate vitbench and the bare loop this often; keep the median.")
]
BenchPrecision = Annotated[str, option("--precision", help="auto (bf16 on CUDA, fp32 on CPU), bf16 or fp32.")]
BenchCompile = Annotated[bool, option("--compile", help="torch.compile the model (every runner).")]
BenchDataset = Annotated[
    str,
    option("--dataset", "-d", help="Real data for the input-pipeline rows (default: the embedded digits)."),
]
BenchInputPipeline = Annotated[
    str,
    option(
        "--input-pipeline",
        help="auto (the device on a GPU, files decoded by the workers; else workers), workers, device or nvjpeg.",
    ),
]
BenchWorkers = Annotated[int, option("--workers", min=0, help="DataLoader worker processes.")]
TimmBenchmark = Annotated[
    Path | None,
    option(
        "--timm-benchmark",
        envvar="VITBENCH_TIMM_BENCHMARK",
        help="timm's benchmark.py (from a pytorch-image-models checkout), run at the same settings.",
    ),
]


@app.command("bench")
@o.panels(
    {
        "What to measure": ("config", "mode", "batch", "micro_batch", "precision", "compile", "timm_benchmark"),
        "Timing": ("steps", "warmup", "rounds"),
        "Data": ("dataset", "data_dir", "input_pipeline", "workers"),
        "Device and output": ("device", "results"),
    }
)
def bench_cmd(
    config: BenchConfigs = None,
    mode: BenchMode = "both",
    batch: BenchBatch = None,
    micro_batch: BenchMicroBatch = None,
    steps: BenchSteps = 20,
    warmup: BenchWarmup = 5,
    rounds: BenchRounds = 1,
    precision: BenchPrecision = "auto",
    compile: BenchCompile = False,
    dataset: BenchDataset = "digits",
    data_dir: o.DataDir = None,
    input_pipeline: BenchInputPipeline = "auto",
    workers: BenchWorkers = BENCH_WORKERS,
    timm_benchmark: TimmBenchmark = None,
    device: o.Device = "auto",
    results: o.Results = Path("results"),
) -> None:
    """Throughput of vitbench's fine-tune and extraction loops (synthetic and real data) against bare
    loops and timm's benchmark.py; images/s, MFU and peak memory into the store (`table --bench`)."""
    from vitbench import api
    from vitbench.engine import bench as engine_bench
    from vitbench.views.tables import bench_table

    opts = _options(
        mode=mode, batch=batch, micro_batch=micro_batch, steps=steps, warmup=warmup, rounds=rounds,
        precision=precision, compile=compile, dataset=dataset, data_dir=data_dir,
        input_pipeline=input_pipeline, workers=workers, timm_benchmark=timm_benchmark, device=device,
    )  # fmt: skip
    defaults = engine_bench.GPU_CONFIGS if opts.device.type == "cuda" else engine_bench.CPU_CONFIGS
    bench_id = api.bench([Config.parse(c) for c in (config or defaults)], opts, results)
    frame = store.read_bench(results)
    print_view(bench_table.bench_view(frame[frame["bench_id"] == bench_id]))
    out.print(f"stored in {results / store.DB_NAME} (bench {bench_id}); all measurements: vitbench table --bench")


def _options(**given) -> Options:
    """The measurement's Options from the command line, every value checked."""
    from vitbench.engine import bench as engine_bench

    o.check_choice("--precision", given["precision"], o.PRECISIONS, "or")
    o.check_choice("--mode", given["mode"], (*MODES, "both"), "or")
    o.check_choice("--input-pipeline", given["input_pipeline"], o.PIPELINES)
    script = given["timm_benchmark"]
    if script is not None and not script.is_file():
        raise UserError(f"--timm-benchmark {script}: no such file (timm's benchmark.py from its repository)")
    device = resolve_device(given["device"])
    check_pipeline(given["input_pipeline"], device)
    size = given["batch"] or (256 if device.type == "cuda" else 16)
    micro = given["micro_batch"]
    if micro is not None and size % micro:
        raise UserError(f"--micro-batch {micro}: must divide --batch {size}")
    return engine_bench.with_defaults(
        Options(
            batch=size,
            steps=given["steps"],
            warmup=given["warmup"],
            precision=given["precision"],
            compile=given["compile"],
            device=device,
            dataset=given["dataset"],
            data_dir=o.check_data_dir(given["data_dir"]),
            workers=given["workers"],
            input_pipeline=given["input_pipeline"],
            micro_batch=micro,
            timm_script=script,
            modes=MODES if given["mode"] == "both" else (given["mode"],),
            rounds=given["rounds"],
        )
    )
