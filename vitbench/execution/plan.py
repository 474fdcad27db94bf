"""A request becomes groups of run specs: (model, weights) x datasets x the protocol's own
expansion (seeds, shots, LR sweep). Planning reads every split's listing and fingerprint, never
an image, and is what `--dry-run`, the runner, torchrun children and cluster workers all do, so
that each computes the same run keys."""

from __future__ import annotations

import glob
import logging
import math
import re
from dataclasses import replace
from pathlib import Path

from vitbench.catalog.registry import fetch_dataset, get_dataset, get_model, get_suite
from vitbench.catalog.suites import Suite
from vitbench.datasets import DatasetSpec
from vitbench.errors import UserError
from vitbench.files import downloads
from vitbench.host.devices import Runtime
from vitbench.models.backend import Preprocessing
from vitbench.protocols.base import Group, Request, Trainer
from vitbench.protocols.registry import get_protocol, option_table
from vitbench.provenance.plugin_code import plugin_code
from vitbench.weights import RANDOM, RANDOM_INIT_SEED, pretrained
from vitbench.weights.names import is_named
from vitbench.weights.resolved import Weights
from vitbench.weights.resolved import resolve as resolve_weights

log = logging.getLogger("vitbench")


def suite_of(req: Request) -> Suite | None:
    """The suite a request runs: the named one, the embedded demo when nothing is named, none for
    explicit datasets."""
    return None if req.datasets else get_suite(req.suite or "demo")


def resolve(req: Request) -> tuple[str, tuple[str, ...], str, str]:
    """(model, datasets, protocol, weights) from the request (made with its suite's defaults:
    protocols/requests.py)."""
    if req.suite and req.datasets:
        raise UserError("give --suite or --dataset, not both")
    # explicit datasets run on their own; otherwise the named suite, or the embedded demo
    suite = suite_of(req)
    datasets = suite.datasets if suite else tuple(dict.fromkeys(req.datasets))
    if len(datasets) < len(req.datasets):
        repeated = sorted({d for d in req.datasets if req.datasets.count(d) > 1})
        log.warning("--dataset names %s more than once; each runs once", ", ".join(repeated))
    model = req.model
    if not model:
        raise UserError("--model is required (see `vitbench ls models`)")
    names = _items(req.protocol or (suite.protocol if suite else "fewshot"), "--protocol")
    makes_weights = all(isinstance(get_protocol(name), Trainer) for name in names)  # pre-training starts from random
    weights = req.weights or (RANDOM if makes_weights else None)
    if not weights:
        raise UserError("--weights is required: a .safetensors/.pth file, or 'random' for random-init weights")
    protocol = ",".join(get_protocol(name).name for name in names)  # a comma list: each protocol in turn
    return model, datasets, protocol, weights


def present_datasets(
    names: tuple[str, ...], protocol: str, req: Request, dry_run: bool = False, fetch: bool = False
) -> tuple[list[DatasetSpec], dict[str, Path]]:
    """The datasets to run, and those a dry run plans without their files (name -> the first file
    lacking). One lacking a file the protocol's splits need stops the plan before any work, listing
    all of them, unless --skip-missing (then the rest run and the skipped are named); a dry run
    plans it from its official split sizes instead (what it will cost before it is fetched)."""
    if fetch:  # what a format fetches before it reads (hf:<repo id>: the Hub's snapshot), with --download
        for name in names:
            fetch_dataset(name)
    specs = [get_dataset(n) for n in names]
    if req.data_source is not None:  # another source (TFDS) reports its own absence when read
        return specs, {}
    lacking = [(s, s.missing_for(req.data_dir, get_protocol(protocol).splits(s))) for s in specs]
    missing = [(s, path) for s, path in lacking if path is not None]
    if not missing:
        return specs, {}
    where = f"under {req.data_dir}" if req.data_dir else "(no --data-dir given)"
    if dry_run and not req.skip_missing:
        sizeless = [s.name for s, _ in missing if not s.official_sizes_known]
        if sizeless:
            raise UserError(
                f"--dry-run: {', '.join(sizeless)} not found {where}, and no official split sizes are known to "
                "plan without its files; add --skip-missing to plan the others"
            )
        return specs, {s.name: path for s, path in missing}
    listed = ", ".join(f"{s.name} (no {path})" for s, path in missing)
    if not req.skip_missing:
        raise UserError(
            f"{len(missing)} of {len(specs)} datasets not found {where}: {listed}; "
            "add --skip-missing to run the others (see `vitbench doctor`)"
        )
    log.warning("skipping %d of %d datasets not found %s: %s", len(missing), len(specs), where, listed)
    kept = [s for s in specs if all(s is not m for m, _ in missing)]
    if not kept:
        raise UserError(f"none of the {len(specs)} datasets was found {where}; see `vitbench doctor`")
    return kept, {}


def plan(req: Request, dry_run: bool = False) -> list[Group]:
    """The groups of every (protocol, model, weights) of the request, in order: `--protocol` and
    `--model` may be comma lists, `--weights` a comma list, a directory of checkpoints (each file, in
    step order: one series) or a glob; the plan is their cross product. A dry run plans weights that
    are not here yet (a config written before the download) by name, and fetches nothing."""
    model_arg, dataset_names, protocol_names, weights_arg = resolve(req)
    protocols = [get_protocol(name) for name in protocol_names.split(",")]
    read = frozenset().union(*(p.Options.names() for p in protocols))
    table = option_table()
    ignored = sorted(d.flag for name, (d, _) in table.items() if name in req.options and name not in read)
    if ignored:
        names = ", ".join(p.name for p in protocols)
        log.warning("%s: --protocol %s does not use %s; ignored", ", ".join(ignored), names,
                    "it" if len(ignored) == 1 else "them")  # fmt: skip
    models, weights_list = _items(model_arg, "--model"), expand_weights(weights_arg, req.results)
    check_plan_size(req, protocols, len(models) * len(weights_list) * len(dataset_names))
    groups = []
    # weights and TFDS builds not here yet are fetched while planning (with --download; a dry run never fetches)
    fetch = downloads.allowed(req.download) and not dry_run
    runtime = Runtime.of(req)  # resolved once: the precision and input pipeline runs are keyed on
    for protocol in protocols:
        for model_name in models:
            for weights in weights_list:
                groups += _model_groups(req, runtime, protocol, model_name, weights, dataset_names, dry_run, fetch)
    return _planned_once(groups)


def _planned_once(groups: list[Group]) -> list[Group]:
    """Each run once: two --weights files with the same bytes are one set of runs (their run keys
    are equal), said in one line each instead of "2 to run" and one of them silently dropped."""
    planned: dict[str, str] = {}  # run key -> the weights file that planned it
    kept = []
    for group in groups:
        specs = [s for s in group.specs if s.run_key not in planned]
        repeated = {planned[s.run_key] for s in group.specs if s.run_key in planned} - {group.weights.path}
        for first in sorted(repeated):
            log.warning("--weights %s: the same file as %s (sha256 %s); its runs are planned once",
                        group.weights.path, first, group.weights.sha256[:12])  # fmt: skip
        planned.update((s.run_key, group.weights.path) for s in specs)
        if specs:
            kept.append(group if len(specs) == len(group.specs) else replace(group, specs=specs))
    return kept


MAX_RUNS = 100_000  # a paper's whole Table 2 and VTAB are some thousands; 10^5 took minutes to plan


def check_plan_size(req: Request, protocols: list, groups: int) -> None:
    """Refuse a plan of more than MAX_RUNS runs before it is made (10^7 grew past 4 GB in a dry run):
    each list option a protocol reads (seeds, shots, k, …) multiplies its runs, as the models,
    weights and datasets multiply the groups. Counted from the lengths alone, in no time."""
    total, products = 0, []
    for protocol in protocols:
        options = req.options.of(protocol.Options)
        lengths = {}
        for name in protocol.Options.names():
            value = getattr(options, name, None)
            if isinstance(value, tuple | list | range) and len(value) > 1:
                lengths[name] = len(value)
        total += groups * math.prod(lengths.values())
        products.append(" x ".join(f"{n:,} {name}" for name, n in sorted(lengths.items())) or "1")
    if total > MAX_RUNS:
        raise UserError(
            f"the plan is {total:,} runs ({groups:,} model x weights x dataset group(s), each "
            f"{' + '.join(products)}), more than {MAX_RUNS:,}: give fewer values, or split it into several commands"
        )


def _items(text: str, option: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise UserError(f"{option} {text!r}: expected a name, or a comma-separated list of names")
    return list(dict.fromkeys(items))


CHECKPOINT_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin", ".npz")


def _step_order(path: Path) -> tuple:
    """Checkpoint files in training order: by the numbers in their names (step_900 before step_1000)."""
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", path.name))


def expand_weights(text: str, results: Path = Path("results")) -> list[str]:
    """`--weights`: `random`, `timm:<tag>`, `run:<key>` (weights vitbench pre-trained into `results`),
    a file, a comma list of those, a directory (its checkpoint files, in step order) or a glob (its
    matches, in step order)."""
    found: list[str] = []
    for item in _items(text, "--weights"):
        path = Path(item).expanduser()
        if is_named(item):  # random init or a checkpoint by name (resolved, or fetched, per model)
            found.append(item)
        elif item.startswith(pretrained.RUN_PREFIX):
            found.append(pretrained.resolve_run(item, results))
        elif path.is_dir():
            files = sorted((p for p in path.iterdir() if p.suffix in CHECKPOINT_SUFFIXES), key=_step_order)
            if not files:
                raise UserError(
                    f"--weights {item}: a folder without checkpoint files ({', '.join(CHECKPOINT_SUFFIXES)})"
                )
            found += [str(f) for f in files]
        elif any(c in item for c in "*?["):
            files = sorted((Path(p) for p in glob.glob(str(path))), key=_step_order)
            if not files:
                raise UserError(f"--weights {item}: the pattern matches no file")
            found += [str(f) for f in files]
        else:
            found.append(item)
    return list(dict.fromkeys(found))


def _model_groups(
    req: Request,
    runtime: Runtime,
    protocol,
    model_name: str,
    weights_arg: str,
    dataset_names,
    dry_run: bool,
    fetch: bool,
) -> list[Group]:
    model = get_model(model_name)
    assert model.backend is not None
    weights = resolve_weights(weights_arg, model, req.results / "cache", dry_run, fetch)
    inputs = protocol.inputs(model, req)
    res = req.res or inputs.res or model.preprocessing.size
    model.backend.check_img_size(model, res)
    model.backend.timm_kwargs(res, req.gelu)  # an impossible --gelu fails before any work
    published = model.preprocessing.at(res)  # the weights' own recipe; the protocol takes what it needs
    if not weights.random:
        published = Preprocessing.from_weights_config(weights.path, published)
    preprocessing = inputs.recipe(published)
    datasets, absent = present_datasets(dataset_names, protocol.name, req, dry_run, fetch)
    if fetch:
        for dataset in datasets:
            dataset.fetch(req.data_dir, req.data_source)
    return [
        _group(req, protocol, model, weights, res, preprocessing, runtime, dataset, absent.get(dataset.name))
        for dataset in datasets
    ]


def _group(
    req: Request,
    protocol,
    model,
    weights: Weights,
    res: int,
    preprocessing,
    runtime: Runtime,
    dataset,
    absent: Path | None = None,
) -> Group:
    """One (model, dataset) group: its splits listed and fingerprinted, and its runs planned; a dry
    run's dataset that is `absent` has splits of its official sizes instead."""
    split_names = protocol.splits(dataset)
    lacking = [s for s in split_names if s not in dataset.split_names]
    if lacking:  # a test-only set (the robustness sets) under a protocol that learns from train
        raise UserError(
            f"--protocol {protocol.name} reads the '{lacking[0]}' split, which dataset {dataset.name} does not "
            f"have (it has: {', '.join(dataset.split_names)}){'; ' + dataset.note if dataset.note else ''}"
        )
    if absent is None:
        splits = {s: dataset.load_split(req.data_dir, s, req.data_source, req.verify_data) for s in split_names}
    else:
        splits = {s: dataset.official_split(s) for s in split_names}
    hparams = {
        "res": res,
        "preprocessing": preprocessing.describe(),
        "gelu": req.gelu,
        **({"init_seed": RANDOM_INIT_SEED} if weights.random else {}),
        **plugin_code(model),
        "splits": list(split_names),
        "test_fingerprint": splits[split_names[-1]].fingerprint,
    }
    group = Group(model, weights, dataset, protocol.name, splits, res, preprocessing, runtime, absent=absent)
    group.specs = protocol.plan(group, req, weights.sha256, hparams)
    return group
