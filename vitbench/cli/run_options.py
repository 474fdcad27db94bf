"""The options of `vitbench run` (help texts as `vitbench run -h` shows them)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from vitbench.cli.options import DataDir, Device, Results, in_panel, option
from vitbench.errors import listed
from vitbench.protocols.options import CLUSTER_PANEL as CLUSTER
from vitbench.protocols.options import DATA_PANEL as DATA
from vitbench.protocols.options import DEVICES_PANEL as DEVICES
from vitbench.protocols.options import FEWSHOT_PANEL as FEWSHOT
from vitbench.protocols.options import NODES_PANEL as NODES
from vitbench.protocols.options import OUTPUT_PANEL as OUTPUT
from vitbench.protocols.options import WHAT_PANEL as WHAT
from vitbench.protocols.registry import BUILTIN

# `vitbench run --help` groups its options by what they are for (protocols/options.py has the
# panels, in order); only the first matters to an ordinary few-shot run. The options a protocol
# declares are its own flags: cli/protocol_flags.py.


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
Datasets = Annotated[
    str | None, option("--datasets", "--dataset", "-d", panel=WHAT, help="Dataset name(s), comma-separated.")
]


RunProtocol = Annotated[
    str | None,
    option(
        "--protocol",
        panel=WHAT,
        # the names from the registry's built-ins (a plugin's protocol is in `vitbench ls protocols`)
        help=f"{listed(p.name for p in BUILTIN)} (`vitbench ls protocols` says what each measures); default "
        f"{BUILTIN[0].name} (the vtab and table2 suites: finetune); a comma list runs each.",
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
Res = Annotated[
    int | None,
    option(
        "--res", panel=WHAT, help="Input resolution [default: 384 for finetune (64 with --smoke), else the model's]."
    ),
]
Gelu = Annotated[str, option("--gelu", panel=WHAT, help="exact (timm) or tanh (Flax's approximate GELU).")]
DataSource = Annotated[
    str | None,
    option(
        "--data-source",
        panel=DATA,
        help="tfds: VTAB from prepared TFDS builders; hf, wds or tfds: ImageNet, CIFAR, Pets and Flowers from "
        "<data-dir>/hf/<name>, <data-dir>/wds/<name> or TFDS builds [default: the folder layouts].",
    ),
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
ExtractionBatch = Annotated[
    int,
    option(
        "--extraction-batch",
        "--batch-size",
        panel=FEWSHOT,
        help="Images per forward pass when extracting features (not fine-tuning's --batch, images per step).",
    ),
]
RunWorkers = Annotated[int, option("--workers", panel=DEVICES, help="DataLoader worker processes.")]
Precision = Annotated[
    str,
    option(
        "--precision",
        panel=DEVICES,
        help="Fine-tuning and few-shot extraction: auto (bf16 on CUDA, fp32 on CPU), bf16 or fp32.",
    ),
]
Devices = Annotated[
    int,
    option(
        "--devices",
        panel=DEVICES,
        min=1,
        help="Data-parallel processes (torchrun): finetune, pretrain (DDP); fewshot, knn, linear (the extraction).",
    ),
]
Nnodes = Annotated[int, option("--nnodes", panel=NODES, min=1, help="torchrun: nodes in the data-parallel job.")]
NodeRank = Annotated[int, option("--node-rank", panel=NODES, min=0, help="torchrun: this node's rank.")]
RdzvEndpoint = Annotated[
    str | None, option("--rdzv-endpoint", panel=NODES, help="torchrun: HOST:PORT every node joins (multi-node).")
]
RdzvId = Annotated[str | None, option("--rdzv-id", panel=NODES, help="torchrun: the job's rendezvous id.")]
RdzvBackend = Annotated[str, option("--rdzv-backend", panel=NODES, help="torchrun: rendezvous backend.")]
Cluster = Annotated[
    str, option("--cluster", panel=CLUSTER, help="submitit: auto (SLURM when sbatch is found), slurm or local.")
]
Partition = Annotated[str | None, option("--partition", panel=CLUSTER, help="submitit: SLURM partition.")]
GpusPerJob = Annotated[
    int, option("--gpus-per-job", panel=CLUSTER, min=0, help="submitit: GPUs per node of each job (DDP over them).")
]
Nodes = Annotated[int, option("--nodes", panel=CLUSTER, min=1, help="submitit: nodes per job (torchrun across them).")]
TimeLimit = Annotated[
    int,
    option(
        "--time-limit",
        panel=CLUSTER,
        min=1,
        help="submitit: minutes per job (then checkpointed, requeued and resumed); 4 or more on SLURM.",
    ),
]
CpusPerJob = Annotated[
    int | None,
    option("--cpus-per-job", panel=CLUSTER, min=1, help="submitit: CPUs per job [default: 1 + --workers a process]."),
]
MemGb = Annotated[
    int | None,
    option("--mem-gb", panel=CLUSTER, min=1, help="submitit: memory per node (GB) [default: what the plan needs]."),
]
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
    option(
        "--dry-run",
        panel=WHAT,
        help="Show the planned runs, each with its estimated time (model passes, decoding, solves, weights, start-up),"
        " and stop.",
    ),
]
Explain = Annotated[
    bool,
    option(
        "--explain",
        panel=WHAT,
        help="With --dry-run: say how the estimate was made (the rate's measurement, what it counts and leaves out).",
    ),
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
PriceOn = Annotated[
    str | None,
    option(
        "--price-on",
        panel=WHAT,
        help="--dry-run's estimate on a GPU you do not have, from the rates vitbench measured there and ships: h100, "
        "h200 (inference only) (the rest at --assume-mfu's rate where given).",
    ),
]
Config = Annotated[
    Path | None,
    option(
        "--config",
        panel=WHAT,
        help="A TOML file of these options (a protocol's also in [protocols.NAME]; and [suites.NAME]); "
        "the command line wins. Relative paths in it (results, data_dir, weights) are taken from the working "
        "directory, as on the command line, not from the file's folder.",
    ),
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
        help="Where images are resized and augmented: auto (the device on a GPU, workers on a CPU), workers"
        " (PIL), device (image files decoded by the workers' PIL, resized on the device to PIL's or TensorFlow's"
        " pixels), or nvjpeg (decoded on the GPU too: other pixels, so other run keys).",
    ),
]
