"""Suites as code: which datasets a named benchmark covers, with which protocol and defaults."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from vitbench.catalog.entry_points import Registry
from vitbench.datasets.robustness import ROBUSTNESS_NAMES
from vitbench.datasets.vtab import TASKS, dataset_name

VTAB = tuple(dataset_name(t) for t in TASKS)  # Table 9's order: natural, specialized, structured
CLASSIC = ("imagenet", "cifar10", "cifar100", "pets", "flowers102")  # Table 2's rows, in its order


@dataclass(frozen=True)
class Suite:
    name: str
    datasets: tuple[str, ...]
    protocol: str
    description: str
    # defaults the user may override on the command line (e.g. the demo's model and weights)
    defaults: dict = field(default_factory=dict)
    # CPU threads its runs use (devices.cpu_threads): a suite whose trained figures are quoted pins
    # them, as the result changes with the thread count
    cpu_threads: int | None = None


_BUILTIN: list[Suite] = [
    # the paper's story in miniature, on 2 CPU cores in about a minute: pre-train, then few-shot,
    # beside the same network at random init. Small-scale settings (32 px, batch 64, 300 steps,
    # LR 1e-3, weight decay 0.05, no dropout), not Table 3's, which are for 300 epochs of ImageNet
    Suite(
        "demo",
        ("digits",),
        "pretrain",
        "embedded default: pre-train ViT-Ti/16 on scikit-learn's 8x8 digits (900 train images, 300 steps), "
        "then linear few-shot on the held-out test digits beside random init (no files needed)",
        defaults={
            "model": "vit-ti/16",
            "weights": "random",
            "res": 32,
            "batch": 64,
            "steps": 300,
            "lr": 1e-3,
            "weight_decay": 0.05,
            "dropout": 0.0,
            "transfer_shots": (1, 5, 10, 25),
            # the digits are arrays in memory, 8x8: a DataLoader worker process costs more than it
            # saves (quiet 39-42 s against 41-43 s; beside two busy processes 87-90 s against
            # 100-121 s, the worker one more process to schedule); the images are the same either way
            "workers": 0,
            # a folder of its own (unless --results names one): the demo's digits runs never mix
            # into the tables of a person's own results
            "results": Path("results") / "demo",
        },
        cpu_threads=2,  # the README's figures: the same on any machine with the same CPU kernels
    ),  # fmt: skip
    Suite("cifar", ("cifar10", "cifar100"), "fewshot", "CIFAR-10 and CIFAR-100 (original pickles)"),
    Suite("pets", ("pets",), "fewshot", "Oxford-IIIT Pets (images/ + annotations/)"),
    Suite("flowers", ("flowers102",), "fewshot", "Oxford Flowers-102 (jpg/ + imagelabels.mat + setid.mat)"),
    Suite("imagenet", ("imagenet",), "fewshot", "ImageNet-1k (train/ and val/; ReaL labels with --protocol eval)"),
    # Table 2's numbers are fine-tuned (App. B.1.1), so these two suites fine-tune by default
    Suite(
        "vtab",
        VTAB,
        "finetune",
        "the 19 VTAB-1k tasks, fine-tuned (lr 0.01, 2500 steps, 384 px); the table rolls them up into "
        "natural / specialized / structured and the VTAB mean",
    ),
    Suite("table2", CLASSIC + VTAB, "finetune", "every dataset behind a row of the paper's Table 2, fine-tuned"),
    Suite("fewshot", CLASSIC, "fewshot", "the paper's few-shot datasets (ImageNet, CIFAR-10/100, Pets, Flowers)"),
    # ImageNet val first: the robustness view reports each set's drop from it
    Suite(
        "robustness",
        ("imagenet", *ROBUSTNESS_NAMES),
        "eval",
        "ImageNet val and its distribution shifts (V2, R, A, Sketch, ObjectNet), scored with the checkpoint's "
        "ImageNet-1k head; add --skip-missing to run the sets that are present",
    ),
]
# a config file's [suites.NAME] joins them in its process (cli/config.py: SUITES.register)
SUITES: Registry[Suite] = Registry("suite", lambda suite: suite.name, lambda: _BUILTIN)
