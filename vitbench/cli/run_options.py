"""The options of `vitbench run` (help texts as `vitbench run -h` shows them)."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Annotated, Any, get_args

from vitbench.cli.options import DataDir, Device, Results, option

RUN_WORKERS = min(4, (os.cpu_count() or 2) // 2)
# `vitbench run --help` groups its options by what they are for; only the first panel matters to
# an ordinary few-shot run
WHAT = "What to run"
DATA = "Data"
FEWSHOT = "Few-shot, k-NN, linear probe and eval"
FINETUNE = "Fine-tuning (--protocol finetune)"
PRETRAIN = "Pre-training (--protocol pretrain)"
DEVICES = "Devices and precision"
CLUSTER = "Several nodes (torchrun) and clusters (submitit)"
OUTPUT = "Output"


def in_panel(shared: Any, panel: str) -> Any:
    """One of the options other commands share (cli/options.py), shown in `panel` of `run --help`."""
    kind, info = get_args(shared)
    placed = copy.copy(info)
    placed.rich_help_panel = panel
    return Annotated[kind, placed]


RunDataDir = in_panel(DataDir, DATA)
RunResults = in_panel(Results, OUTPUT)
RunDevice = in_panel(Device, DEVICES)
Model = Annotated[
    str | None,
    option(
        "--model",
        "-m",
        panel=WHAT,
        help="A paper name (vit-b/16, r50+vit-b/16, bit-m-r50x1, deit-ti/16: `vitbench ls models`) or "
        "timm:<architecture> for any timm backbone; a comma list runs each.",
    ),
]
SuiteName = Annotated[
    str | None, option("--suite", "-s", panel=WHAT, help="Named suite (`vitbench ls suites`); default: demo.")
]
Datasets = Annotated[str | None, option("--dataset", "-d", panel=WHAT, help="Dataset name(s), comma-separated.")]
RunProtocol = Annotated[
    str | None,
    option(
        "--protocol",
        panel=WHAT,
        help="fewshot (the default; vtab and table2 suites: finetune), finetune (App. B: dev LR sweep, then 3 "
        "seeds), eval (the checkpoint's own classifier), knn (DINO's weighted k-NN), linear (a logistic-"
        "regression probe) or pretrain (from random init); a comma list runs each (`vitbench ls protocols`).",
    ),
]
Weights = Annotated[
    str | None,
    option(
        "--weights",
        "-w",
        panel=WHAT,
        help="A .safetensors, .pth or .npz file; a folder of checkpoints (each file in step order, one series) "
        "or a glob; timm:<architecture>.<tag>, timm:paper or hf-hub:<org>/<repo> (the Hugging Face cache); "
        "paper:ViT-B_16, paper:imagenet21k+imagenet2012/ViT-B_16 or paper (the authors' released .npz files); "
        "run:<key> (the weights a pre-training run wrote); random (random init, marked † in every table). "
        "Named weights not here yet need --download. A comma list: each.",
    ),
]
Seeds = Annotated[str | None, option("--seeds", panel=WHAT, help="Comma-separated seeds [default: 0,1,2].")]
Shots = Annotated[str | None, option("--shots", panel=WHAT, help="Comma-separated shot counts [default: 1,5,10,25].")]
KnnK = Annotated[
    str | None, option("--knn-k", panel=FEWSHOT, help="knn: comma-separated neighbour counts [default: 20].")
]
ObjectnetScoring = Annotated[
    str,
    option(
        "--objectnet-scoring",
        panel=DATA,
        help="eval on ObjectNet: restricted (the logits of the 113 classes that overlap ImageNet, max-pooled) or "
        "all (the top-k over ImageNet's 1,000, a non-overlapping prediction a miss: ObjectNet's own code).",
    ),
]
LinearFeatures = Annotated[
    str,
    option(
        "--linear-features",
        panel=FEWSHOT,
        help="linear: the probe's input: raw (CLIP's A.3 recipe) or standardized (z-scored per dimension).",
    ),
]
FewshotTrain = Annotated[
    str,
    option(
        "--fewshot-train",
        panel=FEWSHOT,
        help="default: shots from big_vision's part of train where it has one (ImageNet: 65 per class, "
        "65,000 images); full: the whole train split.",
    ),
]
FewshotL2 = Annotated[str, option("--fewshot-l2", panel=FEWSHOT, help="Ridge λ (1024, 2^10) or 'sweep' (2^-10..2^19).")]
Res = Annotated[
    int | None,
    option(
        "--res", panel=WHAT, help="Input resolution [default: 384 for finetune (64 with --smoke), else the model's]."
    ),
]
Gelu = Annotated[str, option("--gelu", panel=WHAT, help="exact (timm) or tanh (Flax's approximate GELU).")]
DataSource = Annotated[
    str | None,
    option("--data-source", panel=DATA, help="tfds: VTAB from prepared TFDS builders [default: the folder layouts]."),
]
SkipMissing = Annotated[
    bool, option("--skip-missing", panel=DATA, help="Run the datasets that are there; name the ones skipped.")
]
VerifyData = Annotated[
    bool,
    option(
        "--verify-data",
        panel=DATA,
        help="Fingerprint datasets by their files' contents, not names, sizes and times (reads every byte).",
    ),
]
Download = Annotated[
    bool,
    option(
        "--download",
        panel=DATA,
        help="Fetch named weights (paper:, timm:, hf-hub:) and TFDS builds that are not here yet: resumed, "
        "checksum-verified [env VITBENCH_DOWNLOAD=1; default: offline, nothing is fetched].",
    ),
]
SkipCorrupt = Annotated[
    bool, option("--skip-corrupt", panel=DATA, help="Leave corrupt images out (counted in each result).")
]
ExtractionBatch = Annotated[int, option("--batch-size", panel=FEWSHOT, help="Feature-extraction batch size.")]
RunWorkers = Annotated[int, option("--workers", panel=DEVICES, help="DataLoader worker processes.")]
Steps = Annotated[
    int | None,
    option("--steps", panel=FINETUNE, help="finetune, pretrain: optimizer steps [default: Table 4's / 3's]."),
]
Batch = Annotated[
    int | None,
    option("--batch", panel=FINETUNE, help="finetune, pretrain: global batch over all devices [512 / 4096]."),
]
Lr = Annotated[
    float | None,
    option("--lr", panel=FINETUNE, help="finetune: a fixed base LR instead of the dev sweep; pretrain: the LR."),
]
Polyak = Annotated[
    float | None,
    option("--polyak", panel=FINETUNE, help="finetune: parameter EMA decay (Table 2 ImageNet: 0.9999)."),
]
PolyakWarmup = Annotated[
    bool,
    option(
        "--polyak-warmup",
        panel=FINETUNE,
        help="finetune: warm the EMA decay up (timm's ModelEmaV3) instead of constant from the pre-trained weights.",
    ),
]
Smoke = Annotated[
    bool,
    option(
        "--smoke",
        panel=FINETUNE,
        help="finetune: 20 steps, batch 32, 64 px (pretrain: 50, 64, 48 px); marked, never compared.",
    ),
]
Precision = Annotated[
    str,
    option(
        "--precision",
        panel=DEVICES,
        help="Fine-tuning and few-shot extraction: auto (bf16 on CUDA, fp32 on CPU), bf16 or fp32.",
    ),
]
Devices = Annotated[
    int, option("--devices", panel=DEVICES, min=1, help="finetune: data-parallel processes (torchrun + DDP).")
]
CheckpointEvery = Annotated[
    int | None,
    option(
        "--checkpoint-every",
        panel=FINETUNE,
        help="finetune: steps between resumable checkpoints [default: steps/10, 50..500].",
    ),
]
Nnodes = Annotated[int, option("--nnodes", panel=CLUSTER, min=1, help="torchrun: nodes in the data-parallel job.")]
NodeRank = Annotated[int, option("--node-rank", panel=CLUSTER, min=0, help="torchrun: this node's rank.")]
RdzvEndpoint = Annotated[
    str | None, option("--rdzv-endpoint", panel=CLUSTER, help="torchrun: HOST:PORT every node joins (multi-node).")
]
RdzvId = Annotated[str | None, option("--rdzv-id", panel=CLUSTER, help="torchrun: the job's rendezvous id.")]
RdzvBackend = Annotated[str, option("--rdzv-backend", panel=CLUSTER, help="torchrun: rendezvous backend.")]
Executor = Annotated[
    str,
    option(
        "--executor",
        panel=CLUSTER,
        help="local (this process) or submitit (array jobs on SLURM, or local subprocesses).",
    ),
]
Cluster = Annotated[
    str, option("--cluster", panel=CLUSTER, help="submitit: auto (SLURM when sbatch is found), slurm or local.")
]
Partition = Annotated[str | None, option("--partition", panel=CLUSTER, help="submitit: SLURM partition.")]
GpusPerJob = Annotated[
    int, option("--gpus-per-job", panel=CLUSTER, min=0, help="submitit: GPUs per node of each job (DDP over them).")
]
Nodes = Annotated[int, option("--nodes", panel=CLUSTER, min=1, help="submitit: nodes per job (torchrun across them).")]
TimeLimit = Annotated[
    int, option("--time-limit", panel=CLUSTER, min=1, help="submitit: minutes per job (then requeued, resuming).")
]
CpusPerJob = Annotated[int | None, option("--cpus-per-job", panel=CLUSTER, min=1, help="submitit: CPUs per job.")]
MemGb = Annotated[int | None, option("--mem-gb", panel=CLUSTER, min=1, help="submitit: memory per node (GB).")]
ArrayParallelism = Annotated[
    int, option("--array-parallelism", panel=CLUSTER, min=1, help="submitit: jobs of the array running at once.")
]
SlurmAccount = Annotated[str | None, option("--slurm-account", panel=CLUSTER, help="submitit: SLURM account.")]
SlurmQos = Annotated[str | None, option("--slurm-qos", panel=CLUSTER, help="submitit: SLURM QOS.")]
NoWait = Annotated[
    bool,
    option("--no-wait", panel=CLUSTER, help="submitit: submit and return; `vitbench ingest` merges the shards later."),
]
DryRun = Annotated[
    bool,
    option("--dry-run", panel=WHAT, help="Show the planned runs, each with its estimated device time, and stop."),
]
AssumeMfu = Annotated[
    str | None,
    option(
        "--assume-mfu",
        panel=WHAT,
        help="--dry-run's estimate at this fraction of a bf16 peak: 0.4 (this GPU) or 0.4@H100 "
        "[default: the rate `vitbench bench` stored for this device].",
    ),
]
Config = Annotated[
    Path | None,
    option("--config", panel=WHAT, help="A TOML file of these options (and [suites.NAME]); the command line wins."),
]
PrintConfig = Annotated[
    bool, option("--print-config", panel=WHAT, help="Print the resolved options as a --config file and stop.")
]
TensorBoard = Annotated[
    Path | None,
    option(
        "--tensorboard",
        panel=OUTPUT,
        help="The tensorboard tracker's folder: each run's curves, scores and provenance as event files "
        "[default with --tracker tensorboard: RESULTS/tensorboard].",
    ),
]
Tracker = Annotated[
    str | None,
    option(
        "--tracker",
        panel=OUTPUT,
        help="Also log every run (curves, final metrics, provenance as its config) to tensorboard, wandb "
        "(WANDB_PROJECT, WANDB_MODE=offline) or mlflow (MLFLOW_TRACKING_URI, else RESULTS/mlruns); a comma list: each.",
    ),
]
Rerun = Annotated[bool, option("--rerun", panel=WHAT, help="Run again even where results exist.")]
Compile = Annotated[
    bool, option("--compile", panel=DEVICES, help="torch.compile the model (fine-tuning and few-shot extraction).")
]
InputPipeline = Annotated[
    str,
    option(
        "--input-pipeline",
        panel=DEVICES,
        help="Where images are decoded and augmented: auto (the device on a GPU, else workers), workers or device.",
    ),
]
MicroBatch = Annotated[
    int | None,
    option("--micro-batch", panel=FINETUNE, help="finetune: images per pass per device; the rest is accumulated."),
]
# pre-training (--protocol pretrain); None: Table 3's value for the dataset
Objective = Annotated[
    str,
    option("--objective", panel=PRETRAIN, help="pretrain: supervised (§3.1) or mpp (masked patch prediction, §4.6)."),
]
MppTarget = Annotated[
    str,
    option(
        "--mpp-target",
        panel=PRETRAIN,
        help="pretrain --objective mpp: mean-colour (3-bit, 512 classes), downsized-4x4 or l2.",
    ),
]
MppRate = Annotated[
    float,
    option("--mpp-rate", panel=PRETRAIN, help="pretrain --objective mpp: patches corrupted (0.5)."),
]
PosEmbed = Annotated[
    str,
    option(
        "--pos-embed",
        panel=PRETRAIN,
        help="pretrain, ViT: position embeddings 1-d (default), none, 2-d, relative (App. D.4's) or "
        "relative-bias (vitbench's: a scalar per head and 2-D offset).",
    ),
]
PretrainSubset = Annotated[
    str | None,
    option(
        "--pretrain-subset",
        panel=PRETRAIN,
        help="pretrain: nested random subsets of train, e.g. 10%,30%,100% or image counts (Fig 4); each is "
        "evaluated with 5-shot transfer.",
    ),
]
PretrainRecipe = Annotated[
    str,
    option(
        "--pretrain-recipe",
        panel=PRETRAIN,
        help="pretrain: Table 3's row for the defaults: imagenet, imagenet21k or jft (auto: imagenet21k from "
        "10,000 classes, else imagenet).",
    ),
]
Epochs = Annotated[float | None, option("--epochs", panel=PRETRAIN, help="pretrain: epochs of the full train split.")]
Warmup = Annotated[int | None, option("--warmup", panel=PRETRAIN, help="pretrain: LR warmup steps [default: 10k].")]
LrDecay = Annotated[
    str | None, option("--lr-decay", panel=PRETRAIN, help="pretrain: linear or cosine after the warmup.")
]
WeightDecay = Annotated[
    float | None, option("--weight-decay", panel=PRETRAIN, help="pretrain: decoupled weight decay.")
]
Dropout = Annotated[float | None, option("--dropout", panel=PRETRAIN, help="pretrain: dropout rate.")]
LabelSmoothing = Annotated[float | None, option("--label-smoothing", panel=PRETRAIN, help="pretrain: label smoothing.")]
Transfer = Annotated[
    str | None,
    option(
        "--transfer",
        panel=PRETRAIN,
        help="pretrain: datasets for the few-shot evaluation of its weights [default: imagenet where it is under "
        "--data-dir, as Fig 4; else the pre-training dataset]; none.",
    ),
]
TransferShots = Annotated[
    str | None, option("--transfer-shots", panel=PRETRAIN, help="pretrain: shots of that evaluation [5].")
]
