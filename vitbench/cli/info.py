"""`vitbench ls` and `vitbench doctor`: what vitbench knows, and what this machine and data folder have."""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path
from typing import Annotated

from rich.table import Column, Table

from vitbench.catalog import registry
from vitbench.catalog.entry_points import AUTOLOAD_ENV, GROUPS, autoload_disabled, plugins
from vitbench.catalog.suites import SUITES
from vitbench.cli.app import app, out, print_table
from vitbench.cli.options import DataDir, argument, check_data_dir, option
from vitbench.datasets import dataset_status
from vitbench.datasets.status import source_counts
from vitbench.datasets.vtab import ROOT_FOLDER as VTAB_ROOT
from vitbench.errors import UserError
from vitbench.host.devices import cpu_name
from vitbench.protocols.registry import protocols
from vitbench.provenance import git_sha
from vitbench.version import __version__


@app.command("ls")
def ls(
    what: Annotated[str, argument(help="models, datasets, suites, protocols or plugins.")],
) -> None:
    """List what vitbench knows about."""
    if what == "plugins":  # from package metadata only: nothing is imported
        t = Table("plugin", "target", "distribution", "version", "group")
        for group in GROUPS:
            for p in plugins(group):
                t.add_row(p.name, p.target, p.distribution, p.version, group)
        if autoload_disabled():
            t.caption = f"{AUTOLOAD_ENV}=1: third-party plugins are not loaded"
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
        t.add_row("timm:<architecture>", "timm", "any of timm.list_models()", "timm:<architecture>.<tag>",
                  "any timm backbone, no plugin needed: e.g. --model timm:convnext_tiny")  # fmt: skip
        from vitbench.reference import paper  # (its tables load pandas: only this listing reads them)

        t.caption = "paper columns for --compare: " + ", ".join(paper.columns())
    elif what == "datasets":
        t = Table("dataset", "title", "classes", "folder under --data-dir", "official splits", "LR dev split", "notes")
        for d in registry.datasets().values():
            dev = f"{d.dev_fraction:.0%} of train" if d.dev_fraction else " → ".join(d.sweep_splits)
            if not set(d.sweep_splits) <= set(d.split_names):  # a test set only
                dev = "—"
            notes = [d.group or "", "" if d.train_flip else "no flip", "no crop" if d.train_crop == "none" else ""]
            notes += [f"also --data-source {', '.join(d.other_sources)}"] if d.other_sources else []
            notes += [d.note]
            t.add_row(
                d.name,
                d.title,
                str(d.num_classes),
                d.folder or "(embedded)",
                ", ".join(f"{k} {v:,}" for k, v in d.official_sizes.items() if v is not None),
                dev,
                ", ".join(n for n in notes if n),
            )
        formats = registry.dataset_formats().values()  # folder:, and any plugin's
        t.caption = "custom: " + "; ".join(f"{f.prefix}:<…> reads {f.summary}" for f in formats)
    elif what == "protocols":
        t = Table("protocol", "version", "description")
        for protocol in protocols().values():
            t.add_row(protocol.name, protocol.version, protocol.summary)
    elif what == "suites":
        t = Table("suite", "datasets", "protocol", "description")
        for s in SUITES.values():
            t.add_row(s.name, ", ".join(s.datasets), s.protocol, s.description)
    else:
        raise UserError(f"vitbench ls {what}: expected models, datasets, suites, protocols or plugins")
    print_table(t)


@app.command()
def doctor(
    data_dir: DataDir = None,
    ask_torch: Annotated[
        bool, option("--torch", help="Also ask torch which CUDA devices it can use (loads torch: seconds).")
    ] = False,
) -> None:
    """Versions, accelerators, and which datasets are found under --data-dir."""
    out.print(
        f"vitbench {__version__} ({git_sha()}), torch {_version('torch')}, timm {_version('timm')}, "
        f"python {sys.version.split()[0]}"
    )
    _accelerators(ask_torch)
    data_dir = check_data_dir(data_dir)
    t = Table(
        "dataset",
        Column("status", overflow="fold"),  # fold, not ellipsis: the missing file's name matters
        "images per split (found / official)",
        title=f"datasets under {data_dir}" if data_dir else "datasets (no --data-dir)",
    )
    absent_vtab = []
    for d in registry.datasets().values():
        status, counts = dataset_status(d, data_dir)
        if d.group and status.startswith("absent"):
            absent_vtab.append(d.name)  # one line for a VTAB-1k that is not there at all, below
            continue
        t.add_row(d.name, status, ", ".join(c.describe() for c in counts))
        for source, found in source_counts(d, data_dir):  # the same dataset from hf/, wds/ or a TFDS build
            t.add_row(f"{d.name} --data-source {source}", "found", ", ".join(c.describe() for c in found))
    if absent_vtab:
        t.add_row(f"vtab/* ({len(absent_vtab)} tasks)", f"absent (expected under {VTAB_ROOT}/<task>/)", "")
    print_table(t)


def _version(package: str) -> str:
    """An installed package's version from its metadata: no import (torch's takes seconds)."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _accelerators(ask_torch: bool) -> None:
    """The GPUs the NVIDIA driver lists (its /proc entries: nothing to import), or torch's own view
    with --torch (what a run can use: CUDA_VISIBLE_DEVICES and the CUDA build count there)."""
    if ask_torch:
        import torch

        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                out.print(f"cuda:{i}  {torch.cuda.get_device_name(i)} (CUDA {torch.version.cuda})")
            return
        out.print(f"torch sees no CUDA device; runs use the {cpu_name()}")
        return
    gpus = []
    for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        try:
            model = next((line.split(":", 1)[1].strip() for line in info.read_text().splitlines()
                          if line.startswith("Model:")), "an NVIDIA GPU")  # fmt: skip
        except OSError:
            model = "an NVIDIA GPU"
        gpus.append(f"{model} (bus {info.parent.name})")
    if gpus:
        for i, gpu in enumerate(gpus):
            out.print(f"gpu {i}  {gpu}: the NVIDIA driver's list; `vitbench doctor --torch` asks torch")
    else:
        out.print(f"no NVIDIA GPU listed by a driver; runs use the {cpu_name()}")
