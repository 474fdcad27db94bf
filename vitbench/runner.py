"""Expand a request into RunSpecs, key them, skip finished ones, execute, write shards, ingest.

A RunSpec holds everything that changes a number; its run_key is the sha256 of its canonical
JSON. Paths are not part of it (the same weights or data elsewhere give the same number); they
are recorded as provenance beside it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

import torch

from vitbench import evaluate, fewshot, finetune
from vitbench.backend import ModelSpec, Preprocessing
from vitbench.datasets import DatasetSpec, Split
from vitbench.errors import UserError
from vitbench.inference import Outputs, run_over
from vitbench.lease import Lease, Leases
from vitbench.provenance import (
    Clock,
    canonical_json,
    device_name,
    environment,
    sha256_file,
    sha256_text,
    write_atomic,
)
from vitbench.registry import get_dataset, get_model, get_suite
from vitbench.store import ingest, shard_dir
from vitbench.weights import RANDOM, RANDOM_INIT_SEED, build_model, check_weights_arg, has_pre_logits

log = logging.getLogger("vitbench")


@dataclass(frozen=True)
class RunSpec:
    model: str
    weights_sha256: str  # "random" for random-init weights
    dataset: str
    data_source: str
    data_fingerprint: str
    protocol: str
    protocol_version: str
    hparams: dict
    seed: int
    shots: int | None = None

    @property
    def run_key(self) -> str:
        return sha256_text(canonical_json(asdict(self)))


@dataclass
class Request:
    """What the user asked for, after parsing (see `vitbench run -h`)."""

    model: str | None = None
    suite: str | None = None
    datasets: tuple[str, ...] = ()
    protocol: str | None = None
    weights: str | None = None
    seeds: tuple[int, ...] = fewshot.SEEDS
    shots: tuple[int, ...] = fewshot.SHOTS
    fewshot_l2: str = "1024"
    res: int | None = None
    gelu: str = "exact"
    data_dir: Path | None = None
    data_source: str | None = None  # None: each dataset's own (folder) source; "tfds" for VTAB from TFDS
    skip_missing: bool = False
    skip_corrupt: bool = False
    results: Path = Path("results")
    device: str = "auto"
    batch_size: int = 64
    workers: int = 1
    input_pipeline: str = "auto"  # device_data.PIPELINES: where images are decoded and augmented
    # fine-tuning (None: Table 4's value for the dataset, or the protocol's default)
    steps: int | None = None
    batch: int | None = None
    micro_batch: int | None = None
    lr: float | None = None  # a fixed LR: no dev sweep
    polyak: float | None = None
    smoke: bool = False
    precision: str = "auto"  # bf16 on CUDA, fp32 on CPU
    compile: bool = False
    checkpoint_every: int | None = None  # None: finetune.checkpoint_interval(steps)


PROTOCOLS = {
    fewshot.PROTOCOL: fewshot.VERSION,
    evaluate.PROTOCOL: evaluate.VERSION,
    finetune.PROTOCOL: finetune.VERSION,
}


@dataclass
class Group:
    """The runs that share one model and one dataset, hence one pass over each split."""

    model: ModelSpec
    weights: str
    dataset: DatasetSpec
    protocol: str
    splits: dict[str, Split]
    res: int
    l2s: tuple[float, ...]
    preprocessing: Preprocessing
    specs: list[RunSpec] = field(default_factory=list)


def resolve(req: Request) -> tuple[str, tuple[str, ...], str, str]:
    """(model, datasets, protocol, weights) from the request and its suite's defaults."""
    if req.suite and req.datasets:
        raise UserError("give --suite or --dataset, not both")
    # explicit datasets run on their own; otherwise the named suite, or the embedded demo
    suite = None if req.datasets else get_suite(req.suite or "demo")
    datasets = suite.datasets if suite else req.datasets
    defaults = suite.defaults if suite else {}
    model = req.model or defaults.get("model")
    if not model:
        raise UserError("--model is required (see `vitbench ls models`)")
    weights = req.weights or defaults.get("weights")
    if not weights:
        raise UserError("--weights is required: a .safetensors/.pth file, or 'random' for random-init weights")
    protocol = req.protocol or (suite.protocol if suite else fewshot.PROTOCOL)
    if protocol not in PROTOCOLS:
        raise UserError(f"--protocol {protocol}: expected {', '.join(PROTOCOLS)}")
    return model, datasets, protocol, weights


def protocol_splits(protocol: str, dataset: DatasetSpec) -> tuple[str, ...]:
    """Few-shot: shots from the first split, scored on the second; eval: the final test split only;
    fine-tune: the dev sweep's (train on, score on), then the final runs' (train on, report on)."""
    if protocol == finetune.PROTOCOL:
        return tuple(dict.fromkeys(dataset.sweep_splits + dataset.final_splits))
    return dataset.fewshot_splits if protocol == fewshot.PROTOCOL else dataset.final_splits[1:]


def present_datasets(names: tuple[str, ...], protocol: str, req: Request) -> list[DatasetSpec]:
    """The datasets to run. One lacking a file the protocol's splits need stops the plan before any
    work, listing all of them, unless --skip-missing (then the rest run and the skipped are named)."""
    specs = [get_dataset(n) for n in names]
    if req.data_source is not None:  # another source (TFDS) reports its own absence when read
        return specs
    lacking = [(s, s.missing_for(req.data_dir, protocol_splits(protocol, s))) for s in specs]
    missing = [(s, path) for s, path in lacking if path is not None]
    if not missing:
        return specs
    where = f"under {req.data_dir}" if req.data_dir else "(no --data-dir given)"
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
    return kept


def plan(req: Request) -> list[Group]:
    model_name, dataset_names, protocol, weights_arg = resolve(req)
    model = get_model(model_name)
    assert model.backend is not None
    weights = check_weights_arg(weights_arg, model)
    weights_sha = RANDOM if weights == RANDOM else sha256_file(Path(weights), req.results / "cache")
    tuning = protocol == finetune.PROTOCOL
    default_res = (finetune.smoke_res(model.input_multiple) if req.smoke else finetune.RES) if tuning else None
    res = req.res or default_res or model.preprocessing.size
    model.backend.check_img_size(model, res)
    model.backend.timm_kwargs(res, req.gelu)  # an impossible --gelu fails before any work
    representation = model.backend.representation_name(has_pre_logits(weights))
    label, l2s = fewshot.parse_l2(req.fewshot_l2)
    preprocessing = model.preprocessing.at(res)
    if weights != RANDOM:
        preprocessing = Preprocessing.from_weights_config(weights, preprocessing)
    if tuning:  # evaluated after a plain resize (vit_jax), in the backend's value range
        preprocessing = replace(preprocessing, crop_pct=1.0, crop_mode="squash")
    groups = []
    for dataset in present_datasets(dataset_names, protocol, req):
        split_names = protocol_splits(protocol, dataset)
        splits = {s: dataset.load_split(req.data_dir, s, req.data_source) for s in split_names}
        first, scored = splits[split_names[0]], splits[split_names[-1]]
        hparams = {
            "res": res,
            "preprocessing": preprocessing.describe(),
            "gelu": req.gelu,
            **({"init_seed": RANDOM_INIT_SEED} if weights == RANDOM else {}),
            "splits": list(split_names),
            "test_fingerprint": scored.fingerprint,
        }
        if protocol == fewshot.PROTOCOL:
            hparams |= {"l2": label, "representation": representation}
            if _extraction_precision(req) == "bf16":  # (fp32 is the default and stays out of the key)
                hparams["precision"] = "bf16"
        group = Group(model, weights, dataset, protocol, splits, res, l2s, preprocessing)
        if tuning:
            from vitbench import finetune_runs  # it builds on this module's types

            group.specs = finetune_runs.plan_specs(req, model, weights_sha, dataset, splits, hparams)
            groups.append(group)
            continue
        # eval is deterministic: one run, seed 0; few-shot: every (seed, shots)
        runs = (
            [(seed, shots) for seed in req.seeds for shots in req.shots]
            if protocol == fewshot.PROTOCOL
            else [(0, None)]
        )
        for seed, shots in runs:
            group.specs.append(
                RunSpec(
                    model.name,
                    weights_sha,
                    dataset.name,
                    first.source,
                    first.fingerprint,
                    protocol,
                    PROTOCOLS[protocol],
                    hparams,
                    seed,
                    shots,
                )
            )
        groups.append(group)
    return groups


def _pass_over(
    group: Group, split_name: str, req: Request, device: torch.device, clock: Clock, cache_parts: dict, fn, model_fn
) -> tuple[Outputs, bool]:
    """The model's outputs over one split: from the cache, or computed now (timed on `clock`)."""
    split = group.splits[split_name]
    cache = fewshot.FeatureCache(req.results / "cache" / "features")
    spec = group.specs[0]
    key = cache.key(
        model=group.model.name,
        arch=group.model.arch,
        weights=spec.weights_sha256,
        res=group.res,
        dataset=group.dataset.name,
        source=split.source,
        fingerprint=split.fingerprint,
        split=split_name,
        preprocessing=spec.hparams["preprocessing"],
        gelu=spec.hparams["gelu"],
        init_seed=spec.hparams.get("init_seed"),
        skip_corrupt=req.skip_corrupt,
        **cache_parts,
    )
    found = cache.load(key)
    if found is not None:
        return found, False
    with clock:
        found = run_over(
            fn,
            model_fn(),
            split,
            group.preprocessing,
            device,
            req.batch_size,
            req.workers,
            f"{group.model.name} · {group.dataset.name} {split_name}",
            req.skip_corrupt,
            req.input_pipeline,
        )
    cache.save(key, found)
    return found, True


class _Model:
    """The model, built (and compiled, if asked) on first use only: a fully cached group never builds it."""

    def __init__(self, group: Group, keep_head: bool, compile: bool = False):
        self.group, self.keep_head, self.compile = group, keep_head, compile
        self.model: torch.nn.Module | None = None

    def __call__(self):
        if self.model is None:
            g = self.group
            gelu = g.specs[0].hparams["gelu"]
            self.model = build_model(g.model, g.dataset.num_classes, g.res, g.weights, gelu, self.keep_head)
            if self.compile:
                self.model = torch.compile(self.model)  # type: ignore[assignment]
        return self.model


def execute(
    groups: list[Group],
    req: Request,
    con,
    done: set[str],
    rerun: bool = False,
    on_result: Callable[[RunSpec, dict], None] | None = None,
) -> int:
    """Run every planned spec not yet done; each result is a shard and an ingest of its own, so an
    interruption loses at most the run in flight."""
    from vitbench import finetune_runs  # it builds on this module's types
    from vitbench.distributed import setup
    from vitbench.provenance import resolve_device

    world, device = setup(resolve_device(req.device))
    with Leases(req.results) as leases:
        recorder = Recorder(req, con, device, on_result, world, leases)
        for group in groups:
            todo = _leased([s for s in group.specs if rerun or s.run_key not in done], req, leases, world, rerun)
            if todo and group.protocol == finetune.PROTOCOL:
                finetune_runs.execute(group, todo, req, device, recorder)
            elif todo and group.protocol == fewshot.PROTOCOL:
                _run_fewshot(group, todo, req, device, recorder)
            elif todo:
                _run_eval(group, todo[0], req, device, recorder)
    return recorder.count


def _leased(todo: list[RunSpec], req: Request, leases: Leases, world, rerun: bool) -> list[RunSpec]:
    """The runs of `todo` this process may execute: those whose lease it took (rank 0 takes them,
    the other ranks follow) and that nobody finished meanwhile (their shard appeared)."""
    from vitbench.distributed import broadcast

    if not todo:
        return []
    keys: list[str] = []
    if world.is_main:
        folder = shard_dir(req.results)
        pending = [s.run_key for s in todo if rerun or not (folder / f"{s.run_key}.json").exists()]
        keys, busy = leases.take(pending)
        for key in busy:
            holder = Lease(req.results, key).holder()
            where = f"{holder.get('host', '?')} pid {holder.get('pid', '?')}"
            if holder.get("slurm_job"):
                where += f", SLURM job {holder['slurm_job']}"
            log.warning("%s: skipped, running elsewhere (%s)", key[:12], where)
    keys = broadcast(keys, world)
    return [s for s in todo if s.run_key in keys]


def _extraction_precision(req: Request) -> str:
    """Few-shot features: bf16 autocast on a GPU unless --precision fp32; fp32 on a CPU."""
    from vitbench.provenance import resolve_device

    if req.precision == "auto":
        return "bf16" if resolve_device(req.device).type == "cuda" else "fp32"
    return req.precision


def _run_fewshot(group: Group, todo: list[RunSpec], req: Request, device: torch.device, recorder: Recorder) -> None:
    assert group.model.backend is not None
    backend = group.model.backend
    extraction = Clock(device)
    model = _Model(group, keep_head=False, compile=req.compile)
    parts = {"representation": group.specs[0].hparams["representation"]}  # LN(CLS) or tanh(Dense(LN(CLS)))
    bf16 = group.specs[0].hparams.get("precision") == "bf16"
    if bf16:
        parts["precision"] = "bf16"

    def features(m: torch.nn.Module, images: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            return backend.features(m, images)

    (train, train_new), (test, test_new) = [
        _pass_over(group, s, req, device, extraction, parts, features, model) for s in group.dataset.fewshot_splits
    ]
    extracted = train_new or test_new
    n_images = len(train.labels) + len(test.labels)
    # on the device once for every (shots, seed, λ): the solve runs there in float64
    train_pair = (torch.from_numpy(train.values).to(device), train.labels)
    test_pair = (torch.from_numpy(test.values).to(device), torch.from_numpy(test.labels).to(device))
    for spec in todo:
        started = datetime.now(UTC)
        solve = Clock(device)
        with solve:
            accs, n_train = fewshot.fewshot_accuracies(
                train_pair, test_pair, group.dataset.num_classes, spec.shots or 0, spec.seed, group.l2s
            )
        share = 1 / len(todo)  # the one extraction is shared by the runs that needed it
        recorder.record(
            group,
            spec,
            _metrics(accs, spec.hparams["l2"]),
            started,
            seconds=extraction.seconds * share + solve.seconds,
            images=n_images * share if extracted else 0.0,
            n_train=n_train,
            n_test=len(test.labels),
            skipped=train.skipped + test.skipped,
            notes={"features_from_cache": not extracted, "extraction_seconds": extraction.seconds},
        )


def _run_eval(group: Group, spec: RunSpec, req: Request, device: torch.device, recorder: Recorder) -> None:
    started = datetime.now(UTC)
    clock = Clock(device)
    split_name = group.dataset.final_splits[1]
    split = group.splits[split_name]
    logits, computed = _pass_over(
        group, split_name, req, device, clock, {"outputs": "logits"}, lambda m, x: m(x), _Model(group, True)
    )
    real = [split.real_labels[i] for i in logits.indices] if split.real_labels is not None else None
    metrics = evaluate.scores(logits.values, logits.labels, real)
    recorder.record(
        group,
        spec,
        metrics,
        started,
        seconds=clock.seconds,
        images=float(len(logits.labels)) if computed else 0.0,
        n_train=None,
        n_test=len(logits.labels),
        skipped=logits.skipped,
        notes={"outputs_from_cache": not computed, "real_labels": split.real_labels is not None},
    )


class Recorder:
    """Writes each finished run as a shard and ingests it at once, with its full provenance."""

    def __init__(self, req: Request, con, device: torch.device, on_result, world=None, leases: Leases | None = None):
        from vitbench.distributed import World
        from vitbench.provenance import peak_flops

        self.req, self.con, self.device, self.on_result = req, con, device, on_result
        self.leases = leases
        self.world = world or World()
        self.env, self.device_name = environment(), device_name(device)
        self.peak = peak_flops(self.device_name) if device.type == "cuda" else None
        self.count = 0
        self._flops: dict[tuple[str, int], int] = {}

    def flops_per_image(self, group: Group) -> int:
        """Forward FLOPs per image, counted once per (model, resolution): a FlopCounterMode pass of
        ViT-H takes a while, and a group records up to 12 runs."""
        key = (group.model.name, group.res)
        if key not in self._flops:
            assert group.model.backend is not None
            self._flops[key] = group.model.backend.flops_per_image(group.model, group.res)
        return self._flops[key]

    def sweep_choice(self, sweep: list[RunSpec]) -> dict:
        """The sweep's best LR by dev accuracy (the first of the grid on a tie), from the store."""
        from vitbench.store import metric_values, shard_metric_values

        keys = [s.run_key for s in sweep]
        # a cluster worker has no database, only the shards the sweep's jobs wrote
        found = (
            metric_values(self.con, keys, "dev_accuracy")
            if self.con
            else shard_metric_values(self.req.results, keys, "dev_accuracy")
        )
        missing = [s.hparams["lr"] for s in sweep if s.run_key not in found]
        if missing:
            raise UserError(f"the dev sweep has no result for lr {missing[0]:g}; run it first (drop --rerun filters)")
        by_lr = {s.hparams["lr"]: found[s.run_key] for s in sweep}
        best = max(by_lr, key=lambda lr: (by_lr[lr], -lr))
        return {"lr": best, "dev_accuracy": by_lr[best], "sweep": {f"{lr:g}": acc for lr, acc in by_lr.items()}}

    def record(
        self,
        group: Group,
        spec: RunSpec,
        metrics: dict[str, float],
        started: datetime,
        seconds: float,
        images: float,
        n_train: int | None,
        n_test: int,
        skipped: list[str],
        notes: dict,
        curves: dict[str, list[float]] | None = None,
    ) -> None:
        flops_per_image = self.flops_per_image(group)
        run = {
            "run_key": spec.run_key,
            **asdict(spec),
            "arch": group.model.arch,
            "backend": group.model.family,
            "weights": group.weights,
            "random_init": group.weights == RANDOM,
            "data_dir": str(self.req.data_dir.resolve()) if self.req.data_dir else None,
            # a subset of the official split, or images left out as corrupt: not the paper's data
            "data_subset": any(s.is_subset for s in group.splits.values()) or bool(skipped),
            "n_train": n_train,
            "n_test": n_test,
            "skipped_images": len(skipped),
            "status": "done",
            "started_at": started.isoformat(),
            "finished_at": datetime.now(UTC).isoformat(),
            "device": self.device.type,
            "device_name": self.device_name,
            "device_count": self.world.size,
            "device_seconds": seconds,
            "flops_per_image": flops_per_image,
            "flops": flops_per_image * images,
            **self.env,
            "notes": {**notes, **({"skipped_corrupt": skipped} if skipped else {})},
        }
        shard = shard_dir(self.req.results) / f"{spec.run_key}.json"
        write_atomic(shard, canonical_json({"run": run, "metrics": metrics, "curves": curves or {}}))
        if self.con is not None:  # a cluster worker leaves the merge to `vitbench ingest`
            ingest(self.con, [shard])
        if self.leases is not None:
            self.leases.release(spec.run_key)
        self.count += 1
        if self.on_result:
            self.on_result(spec, metrics)


def _metrics(accs: dict[float, float], l2_label: str) -> dict[str, float]:
    if l2_label != "sweep":
        return {"accuracy": next(iter(accs.values()))}
    # every λ is kept; the table picks one λ per shot count across datasets (mean rank, as the
    # ViT-era code did) instead of choosing on this dataset's own test split
    return {f"accuracy@l2={l2:g}": acc for l2, acc in accs.items()}
