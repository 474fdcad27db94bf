"""The options of `vitbench run` (help texts as `vitbench run -h` shows them)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

RUN_WORKERS = min(4, (os.cpu_count() or 2) // 2)
Model = Annotated[str | None, typer.Option("--model", "-m", help="Paper name, e.g. vit-b/16 (`vitbench ls models`).")]
SuiteName = Annotated[
    str | None, typer.Option("--suite", "-s", help="Named suite (`vitbench ls suites`); default: demo.")
]
Datasets = Annotated[str | None, typer.Option("--dataset", "-d", help="Dataset name(s), comma-separated.")]
RunProtocol = Annotated[
    str | None,
    typer.Option(
        "--protocol",
        help="fewshot (default; the suite's own for vtab/table2: finetune), finetune (App. B: dev LR sweep, "
        "then 3 seeds), eval: score the checkpoint's own classifier, knn (DINO's weighted k-NN) or linear "
        "(a logistic-regression probe); `vitbench ls protocols`.",
    ),
]
Weights = Annotated[str | None, typer.Option("--weights", "-w", help="A .safetensors/.pth file, or 'random'.")]
Seeds = Annotated[str | None, typer.Option("--seeds", help="Comma-separated seeds [default: 0,1,2].")]
Shots = Annotated[str | None, typer.Option("--shots", help="Comma-separated shot counts [default: 1,5,10,25].")]
KnnK = Annotated[str | None, typer.Option("--knn-k", help="knn: comma-separated neighbour counts [default: 20].")]
FewshotTrain = Annotated[
    str,
    typer.Option(
        "--fewshot-train",
        help="default: shots from big_vision's part of train where it has one (ImageNet: 65 per class, "
        "65,000 images); full: the whole train split.",
    ),
]
FewshotL2 = Annotated[str, typer.Option("--fewshot-l2", help="Ridge λ (1024, 2^10) or 'sweep' (2^-10..2^19).")]
Res = Annotated[
    int | None,
    typer.Option("--res", help="Input resolution [default: 384 for finetune (64 with --smoke), else the model's]."),
]
Gelu = Annotated[str, typer.Option("--gelu", help="exact (timm) or tanh (Flax's approximate GELU).")]
DataSource = Annotated[
    str | None,
    typer.Option("--data-source", help="tfds: VTAB from prepared TFDS builders [default: the folder layouts]."),
]
SkipMissing = Annotated[
    bool, typer.Option("--skip-missing", help="Run the datasets that are there; name the ones skipped.")
]
VerifyData = Annotated[
    bool,
    typer.Option(
        "--verify-data",
        help="Fingerprint datasets by their files' contents, not names, sizes and times (reads every byte).",
    ),
]
SkipCorrupt = Annotated[bool, typer.Option("--skip-corrupt", help="Leave corrupt images out (counted in each result).")]
ExtractionBatch = Annotated[int, typer.Option("--batch-size", min=1, help="Feature-extraction batch size.")]
RunWorkers = Annotated[int, typer.Option("--workers", min=0, help="DataLoader worker processes.")]
Steps = Annotated[
    int | None, typer.Option("--steps", min=1, help="finetune, pretrain: optimizer steps [default: Table 4's / 3's].")
]
Batch = Annotated[
    int | None, typer.Option("--batch", min=1, help="finetune, pretrain: global batch over all devices [512 / 4096].")
]
Lr = Annotated[
    float | None,
    typer.Option("--lr", min=0.0, help="finetune: a fixed base LR instead of the dev sweep; pretrain: the LR."),
]
Polyak = Annotated[
    float | None,
    typer.Option("--polyak", min=0.0, max=1.0, help="finetune: parameter EMA decay (Table 2 ImageNet: 0.9999)."),
]
PolyakWarmup = Annotated[
    bool,
    typer.Option(
        "--polyak-warmup",
        help="finetune: warm the EMA decay up (timm's ModelEmaV3) instead of constant from the pre-trained weights.",
    ),
]
Smoke = Annotated[
    bool,
    typer.Option(
        "--smoke",
        help="finetune: 20 steps, batch 32, 64 px (pretrain: 50, 64, 48 px); marked, never compared.",
    ),
]
Precision = Annotated[
    str,
    typer.Option(
        "--precision", help="Fine-tuning and few-shot extraction: auto (bf16 on CUDA, fp32 on CPU), bf16 or fp32."
    ),
]
Devices = Annotated[int, typer.Option("--devices", min=1, help="finetune: data-parallel processes (torchrun + DDP).")]
CheckpointEvery = Annotated[
    int | None,
    typer.Option(
        "--checkpoint-every",
        min=1,
        help="finetune: steps between resumable checkpoints [default: steps/10, 50..500].",
    ),
]
Nnodes = Annotated[int, typer.Option("--nnodes", min=1, help="torchrun: nodes in the data-parallel job.")]
NodeRank = Annotated[int, typer.Option("--node-rank", min=0, help="torchrun: this node's rank.")]
RdzvEndpoint = Annotated[
    str | None, typer.Option("--rdzv-endpoint", help="torchrun: HOST:PORT every node joins (multi-node).")
]
RdzvId = Annotated[str | None, typer.Option("--rdzv-id", help="torchrun: the job's rendezvous id.")]
RdzvBackend = Annotated[str, typer.Option("--rdzv-backend", help="torchrun: rendezvous backend.")]
Executor = Annotated[
    str,
    typer.Option("--executor", help="local (this process) or submitit (array jobs on SLURM, or local subprocesses)."),
]
Cluster = Annotated[str, typer.Option("--cluster", help="submitit: auto (SLURM when sbatch is found), slurm or local.")]
Partition = Annotated[str | None, typer.Option("--partition", help="submitit: SLURM partition.")]
GpusPerJob = Annotated[
    int, typer.Option("--gpus-per-job", min=0, help="submitit: GPUs per node of each job (DDP over them).")
]
Nodes = Annotated[int, typer.Option("--nodes", min=1, help="submitit: nodes per job (torchrun across them).")]
TimeLimit = Annotated[
    int, typer.Option("--time-limit", min=1, help="submitit: minutes per job (then requeued, resuming).")
]
CpusPerJob = Annotated[int | None, typer.Option("--cpus-per-job", min=1, help="submitit: CPUs per job.")]
MemGb = Annotated[int | None, typer.Option("--mem-gb", min=1, help="submitit: memory per node (GB).")]
ArrayParallelism = Annotated[
    int, typer.Option("--array-parallelism", min=1, help="submitit: jobs of the array running at once.")
]
SlurmAccount = Annotated[str | None, typer.Option("--slurm-account", help="submitit: SLURM account.")]
SlurmQos = Annotated[str | None, typer.Option("--slurm-qos", help="submitit: SLURM QOS.")]
NoWait = Annotated[
    bool, typer.Option("--no-wait", help="submitit: submit and return; `vitbench ingest` merges the shards later.")
]
DryRun = Annotated[
    bool,
    typer.Option("--dry-run", help="Show the planned runs, each with its estimated device time, and stop."),
]
AssumeMfu = Annotated[
    str | None,
    typer.Option(
        "--assume-mfu",
        help="--dry-run's estimate at this fraction of a bf16 peak: 0.4 (this GPU) or 0.4@H100 "
        "[default: the rate `vitbench bench` stored for this device].",
    ),
]
Config = Annotated[
    Path | None,
    typer.Option("--config", help="A TOML file of these options (and [suites.NAME]); the command line wins."),
]
PrintConfig = Annotated[
    bool, typer.Option("--print-config", help="Print the resolved options as a --config file and stop.")
]
TensorBoard = Annotated[
    Path | None,
    typer.Option(
        "--tensorboard", help="Write each fine-tune's loss, LR, gradient norm and accuracy here (event files)."
    ),
]
Rerun = Annotated[bool, typer.Option("--rerun", help="Run again even where results exist.")]
Compile = Annotated[
    bool, typer.Option("--compile", help="torch.compile the model (fine-tuning and few-shot extraction).")
]
InputPipeline = Annotated[
    str,
    typer.Option(
        "--input-pipeline",
        help="Where images are decoded and augmented: auto (the device on a GPU, else workers), workers or device.",
    ),
]
MicroBatch = Annotated[
    int | None,
    typer.Option("--micro-batch", min=1, help="finetune: images per pass per device; the rest is accumulated."),
]
# pre-training (--protocol pretrain); None: Table 3's value for the dataset
Objective = Annotated[
    str, typer.Option("--objective", help="pretrain: supervised (§3.1) or mpp (masked patch prediction, §4.6).")
]
MppTarget = Annotated[
    str,
    typer.Option(
        "--mpp-target", help="pretrain --objective mpp: mean-colour (3-bit, 512 classes), downsized-4x4 or l2."
    ),
]
MppRate = Annotated[
    float, typer.Option("--mpp-rate", min=0.0, max=1.0, help="pretrain --objective mpp: patches corrupted (0.5).")
]
PosEmbed = Annotated[
    str, typer.Option("--pos-embed", help="pretrain, ViT: position embeddings 1-d (default), none, 2-d or relative.")
]
PretrainSubset = Annotated[
    str | None,
    typer.Option(
        "--pretrain-subset",
        help="pretrain: nested random subsets of train, e.g. 10%,30%,100% or image counts (Fig 4); each is "
        "evaluated with 5-shot transfer.",
    ),
]
PretrainRecipe = Annotated[
    str,
    typer.Option(
        "--pretrain-recipe",
        help="pretrain: Table 3's row for the defaults: imagenet, imagenet21k or jft (auto: imagenet21k from "
        "10,000 classes, else imagenet).",
    ),
]
Epochs = Annotated[float | None, typer.Option("--epochs", min=0.0, help="pretrain: epochs of the full train split.")]
Warmup = Annotated[int | None, typer.Option("--warmup", min=0, help="pretrain: LR warmup steps [default: 10k].")]
LrDecay = Annotated[str | None, typer.Option("--lr-decay", help="pretrain: linear or cosine after the warmup.")]
WeightDecay = Annotated[float | None, typer.Option("--weight-decay", min=0.0, help="pretrain: decoupled weight decay.")]
Dropout = Annotated[float | None, typer.Option("--dropout", min=0.0, help="pretrain: dropout rate.")]
LabelSmoothing = Annotated[float | None, typer.Option("--label-smoothing", min=0.0, help="pretrain: label smoothing.")]
Transfer = Annotated[
    str | None,
    typer.Option(
        "--transfer",
        help="pretrain: datasets for the few-shot evaluation of its weights [default: the pre-training dataset]; none.",
    ),
]
TransferShots = Annotated[str | None, typer.Option("--transfer-shots", help="pretrain: shots of that evaluation [5].")]
