"""The protocol interface, and the types every protocol and the runner share.

A protocol is one class with one instance, registered by name (registry.py): its name and
version, the splits it reads, how it expands a request into run specs, how it runs a group of
them, and how its results are labelled. The runner, the cluster executor, the tables and the
CLI ask it these questions instead of testing its name.

A RunSpec holds everything that changes a number; its run_key is the sha256 of its canonical
JSON. Paths are not part of it (the same weights or data elsewhere give the same number); they
are recorded as provenance beside it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar
from typing import Protocol as TypingProtocol

from vitbench.datasets import DatasetSpec, Split
from vitbench.errors import UserError
from vitbench.host.devices import DEFAULT_WORKERS, PIPELINES, PRECISIONS, Runtime
from vitbench.models.backend import ModelSpec, Preprocessing
from vitbench.protocols import bounds
from vitbench.protocols.measures import Axis, Metric
from vitbench.protocols.options import Given, ProtocolOptions
from vitbench.provenance import explicit_hparams, run_key_of
from vitbench.store.predictions import Predictions

if TYPE_CHECKING:  # the engine (and torch) load when a protocol runs, not when its name or label is read
    from vitbench.engine.distributed import World
    from vitbench.engine.features import FrozenFeatures
    from vitbench.weights.resolved import Weights


@dataclass(frozen=True)
class RunSpec:
    model: str
    weights_sha256: str  # "random" for random-init weights
    dataset: str
    data_source: str
    data_fingerprint: str
    protocol: str
    protocol_version: str
    hparams: dict  # everything else that changes its numbers, its value on its protocol's axis among them
    seed: int

    @cached_property
    def run_key(self) -> str:
        """Made once a spec: a plan reads each key some 28 times, and `asdict`'s deep copy of the
        hparams made a 10,000-run dry run spend 95 s on keys. A spec is not changed once made."""
        return run_key_of({f.name: getattr(self, f.name) for f in fields(self)})


@dataclass
class Request:
    """What the user asked for, after parsing (see `vitbench run -h`): what every run shares. The
    options only some protocols read are in `options`: each protocol's options object, made from
    the values given (each protocol declares its own, with defaults and checks:
    protocols/options.py). `extraction_batch` is images per forward pass when extracting
    features; fine-tuning's `batch` (an option) is images per step."""

    model: str | None = None
    suite: str | None = None
    datasets: tuple[str, ...] = ()
    protocol: str | None = None
    weights: str | None = None
    options: Given = field(default_factory=Given)  # the protocols' options objects, as given
    res: int | None = bounds.checked(None, bounds.Bound("--res", int, 1, bounds.MAX_RES))
    gelu: str = "exact"
    data_dir: Path | None = None
    data_source: str | None = None  # None: each dataset's own (folder) source; "tfds" for VTAB from TFDS
    skip_missing: bool = False
    skip_corrupt: bool = False
    verify_data: bool = False  # fingerprint datasets by their files' contents (reads every byte once)
    download: bool = False  # fetch named weights (paper:, timm:, hf-hub:) and TFDS builds not here yet
    results: Path = Path("results")
    device: str = "auto"
    extraction_batch: int = bounds.checked(64, bounds.Bound("--extraction-batch", int, 1, bounds.MAX_BATCH))
    workers: int = bounds.checked(DEFAULT_WORKERS, bounds.Bound("--workers", int, 0, 1_024))
    # where images are decoded, resized and augmented; auto precision: bf16 on CUDA, fp32 on CPU
    input_pipeline: str = bounds.checked("auto", bounds.Choices("--input-pipeline", PIPELINES))
    precision: str = bounds.checked("auto", bounds.Choices("--precision", PRECISIONS))
    compile: bool = False
    tensorboard: Path | None = None  # TensorBoard event files here (the tensorboard tracker's folder)
    tracker: tuple[str, ...] = ()  # every stored run also to these: tensorboard, wandb, mlflow
    config: str | None = None  # the resolved options as a config file (cli/config.py): stored with each run

    def next_stage(self, **what: Any) -> Request:
        """A request a session runs after this one (pre-training's transfer): what it evaluates is
        `what` (the WHAT fields, the rest of them at their defaults); how and where it runs is this
        request's, every other field of it, so that a field added later is carried too."""
        unknown = set(what) - set(WHAT)
        assert not unknown, f"next_stage({', '.join(sorted(unknown))}): not what a request evaluates"
        unset = Request()
        return replace(self, **{name: what.get(name, getattr(unset, name)) for name in WHAT})

    def __post_init__(self) -> None:
        """Values the store could not hold, or that would quietly mean something else, are refused
        here, before any work: the command line, a config file and the Python API all pass through
        (each field declares its check beside its default, `bounds.checked`; each protocol's
        options dataclass checks its own when the request is made: protocols/requests.py)."""
        found = bounds.problems(self)
        if found:
            raise UserError(found[0])


# the fields of a Request that say what it evaluates; every other one says how and where it runs,
# which a session's next stage keeps (Request.next_stage)
WHAT = ("model", "suite", "datasets", "protocol", "weights", "options", "res")


@dataclass
class Group:
    """The runs that share one model and one dataset, hence one pass over each split."""

    model: ModelSpec
    weights: Weights  # resolved once by the planner
    dataset: DatasetSpec
    protocol: str
    splits: dict[str, Split]
    res: int
    preprocessing: Preprocessing
    runtime: Runtime  # how this process computes (precision, input pipeline), resolved once per plan
    specs: list[RunSpec] = field(default_factory=list)
    # a dry run's group whose data is not here: the first file it lacks (its splits are the official
    # sizes, its run keys stand for no files, so they are not the keys the real runs will have)
    absent: Path | None = None


@dataclass
class Result:
    """One finished run, as a protocol yields it; the runner's recorder stores it (with the
    provenance a protocol does not know: device, hardware, code, config, the weights' origin)."""

    spec: RunSpec
    metrics: dict[str, float]
    started: datetime
    seconds: float  # device-seconds the run took (its share of a shared extraction)
    images: float  # images through the model, a training image counting 3 (forward + backward)
    n_train: int | None
    n_test: int
    skipped: list[str] = field(default_factory=list)  # images left out as corrupt
    notes: dict = field(default_factory=dict)
    curves: dict[str, list[float]] | None = None
    predictions: Predictions | None = None


def frozen_result(
    spec: RunSpec, found: FrozenFeatures, metrics: dict[str, float], started: datetime, share: float,
    solve_seconds: float, notes: dict | None = None, predictions: Predictions | None = None,
    n_train: int | None = None, train_rows=None,
) -> Result:  # fmt: skip
    """A frozen-feature run's Result: its `share` of the extraction it shared (device-seconds and
    images extracted now: 0 from the cache), its own solve, and the split sizes (`n_train`: the
    images its solve used, where fewer than the features held). Its notes also carry its cost
    (`cost_seconds`, `cost_images`): the extraction of every image it read, whoever extracted it,
    and its solve; the tables' cost rows read that, so a cell's cost does not depend on which run
    of a shared extraction ran first (`train_rows`: the train feature rows its solve read)."""
    charged = found.cost(train_rows)
    cost = {} if charged is None else {"cost_seconds": charged[0] + solve_seconds, "cost_images": charged[1]}
    return Result(
        spec,
        metrics,
        started,
        seconds=found.seconds * share + solve_seconds,
        images=found.images * share,
        n_train=len(found.train.labels) if n_train is None else n_train,
        n_test=len(found.test.labels),
        skipped=found.skipped,
        notes={"features_from_cache": not found.extracted, **cost, **(notes or {})},
        predictions=predictions,
    )


class Recorder(TypingProtocol):
    """What a protocol may ask of the runner's recorder while it runs (execution.recorder.Recorder)."""

    world: World
    peak: float | None

    def flops_per_image(self, group: Group) -> int: ...

    def metric_values(self, run_keys: list[str], name: str) -> dict[str, float]: ...


@dataclass(frozen=True)
class ModelInputs:
    """What the model sees in a protocol's runs: the image size when `--res` is not given (None:
    the weights' own), and the protocol's preprocessing made from the weights' published recipe at
    the run's size (vitbench/models/preprocessing.py; by default big_vision's few-shot recipe in the
    weights' value range)."""

    res: int | None = None
    recipe: Callable[[Preprocessing], Preprocessing] = Preprocessing.frozen_features


SOLVE_KINDS = ("ridge", "knn", "logistic")  # what execution/solve_price.py knows how to price


@dataclass(frozen=True)
class Solve:
    """What runs compute on frozen features once they are extracted, for the dry run's price
    (execution/solve_price.py, at a pace measured on this device): `kind` (SOLVE_KINDS: few-shot's
    closed-form ridge, k-NN's similarity pass and vote, the linear probe's L-BFGS fits), fitted
    on `train` feature rows of `classes` classes and scoring `test` rows, `repeats` times (ridge:
    the λ scored; k-NN: the k voted; logistic: the fits, the sweep's and the refit, `held_out` rows
    of train kept out of the sweep's fits for validation). One solve serves `runs` (k-NN: every k
    from one pass), its time divided among those still to do."""

    kind: str
    runs: tuple[str, ...]
    train: int
    test: int
    classes: int
    repeats: int = 1
    held_out: int = 0


@dataclass
class Work:
    """How a group's runs are done and divided: the images each passes through the model, by mode
    ("train": a training image, three forward passes' FLOPs; "inference": one), for the dry run's
    cost estimate; the cluster jobs they run in, as waves (each waits for the one before); and
    whether torchrun's processes can share out the work (`--devices N`). `shared`: where the group's
    images come from a cache entry other groups read too (the frozen features of a split, one entry
    for few-shot, k-NN and the linear probe), that entry's file and how many of its images the group
    needs; the estimate then charges each image once, to the first group that extracts it, as the run
    does (execution/estimate.py `priced_images`). Empty: `images` is what the group passes. `solves`:
    what the runs compute on those features (few-shot's ridge, k-NN's vote, the linear probe's fits)."""

    images: dict[str, dict[str, float]]  # run_key -> mode -> images
    waves: list[list[list[RunSpec]]]
    data_parallel: bool = True
    shared: dict[str, float] = field(default_factory=dict)  # cache entry's file -> images of it needed
    solves: list[Solve] = field(default_factory=list)  # what the runs compute on frozen features (priced here)

    def of(self, run_keys: set[str]) -> list[list[list[RunSpec]]]:
        """The waves of jobs holding only the runs `run_keys` names (those still to do)."""
        return [[kept for job in wave if (kept := [s for s in job if s.run_key in run_keys])] for wave in self.waves]


# members of the protocol contract before issue 48, and what replaced each: a plugin written
# against the old contract is refused when its class is made (its entry point is then skipped with
# that line), not run with its size, preprocessing or cost silently ignored
RETIRED = {
    "resolution": "the default image size is inputs().res",
    "preprocessing": "the preprocessing is inputs().recipe",
    "planned_work": "the images each run passes through the model are work().images",
    "jobs": "the cluster jobs are work().waves",
    "data_parallel": "whether torchrun's processes can share the work is work().data_parallel",
    "from_random_init": "a protocol that makes weights subclasses Trainer",
    "followups": "only a Trainer (a protocol that makes weights) has followups",
}


class Protocol:
    """One evaluation protocol. Subclasses set the class attributes and implement `splits`, `plan`
    and `run`; the rest has defaults that suit a protocol scoring frozen features."""

    _makes_weights = False  # a Trainer's: it has followups (not a member: the class says it)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        allowed = {"followups"} if cls._makes_weights else set()
        retired = [name for name in RETIRED if name in vars(cls) and name not in allowed]
        if retired:
            raise TypeError(f"protocol {cls.__name__}: `{retired[0]}` is no longer read: {RETIRED[retired[0]]} "
                            "(docs/architecture.md, the protocol interface)")  # fmt: skip

    name: ClassVar[str]  # `--protocol NAME`, stored with every run
    version: ClassVar[str]  # bumped whenever a change alters the numbers: old and new never average
    summary: ClassVar[str]  # one line for `vitbench ls protocols` and `--protocol`'s help
    label: ClassVar[str]  # how tables and the report speak of its results, e.g. "few-shot"
    # what its runs store, how each number is shown (views, progress lines) and the axis each
    # varies along within one (model, weights, dataset): the views key on these, never on a name
    metrics: ClassVar[tuple[Metric, ...]] = (Metric("accuracy", "accuracy"),)
    # the options only it (or a few protocols) reads: `vitbench run` flags, config keys, API keywords
    Options: ClassVar[type[ProtocolOptions]] = ProtocolOptions

    def splits(self, dataset: DatasetSpec) -> tuple[str, ...]:
        """The dataset's splits it reads, in the order it uses them (the last one is scored)."""
        raise NotImplementedError

    def inputs(self, model: ModelSpec, req: Request) -> ModelInputs:
        """Its image size when `--res` is not given, and its preprocessing (default: the weights'
        size, big_vision's few-shot recipe)."""
        return ModelInputs()

    def plan(self, group: Group, req: Request, weights_sha: str, hparams: dict) -> list[RunSpec]:
        """The runs of one (model, dataset): `hparams` holds what every protocol records (resolution,
        preprocessing, GELU, splits, test fingerprint); add what this protocol's numbers depend on."""
        raise NotImplementedError

    def run(
        self, group: Group, todo: list[RunSpec], req: Request, runtime: Runtime, recorder: Recorder
    ) -> Iterator[Result]:
        """Run `todo` (a subset of `group.specs`) on `runtime` (the device, precision, input
        pipeline, workers, batches, compile and cache folder, resolved once), yielding a Result per
        finished run. The runner stores each before it asks for the next, so a later run can read
        an earlier one's metrics (`recorder.metric_values`: fine-tuning's final runs read the sweep's)."""
        raise NotImplementedError

    def work(self, group: Group) -> Work:
        """How the group's runs are done and divided. Default: one extraction of the protocol's
        splits, shared by the runs, in one cluster job; torchrun's processes share out the
        extraction (engine/features.py)."""
        images = sum(len(group.splits[name]) for name in self.splits(group.dataset))
        each = {s.run_key: {"inference": images / len(group.specs)} for s in group.specs}
        return Work(each, [[group.specs]] if group.specs else [])

    def describe(self, spec: RunSpec) -> str:
        """A run's settings beyond its protocol and seed, for its progress line and `--dry-run`:
        by default its value on the axis (`shots=5`, `k=20`)."""
        if self.axis is None:
            return ""
        return self.axis.setting(spec.hparams.get(self.axis.name))

    @property
    def axis(self) -> Axis | None:
        """The axis its runs vary along: the one its metrics declare (none where they declare none)."""
        return next((m.axis for m in self.metrics if m.axis is not None), None)

    def base_spec(self, group: Group, first: Split, weights_sha: str, hparams: dict, seed: int) -> RunSpec:
        """A RunSpec of this protocol: the data identity is that of the split it learns from. Its
        hparams name every setting, the defaults too (`precision: fp32`): a reader never has to know
        one (provenance.DEFAULT_SETTINGS; the key hashes them as it always did)."""
        return RunSpec(
            group.model.name, weights_sha, group.dataset.name, first.source, first.fingerprint, self.name,
            self.version, explicit_hparams(self.name, hparams), seed,
        )  # fmt: skip


def frozen_work(
    protocol: Protocol, group: Group, needed: dict[str, float] | None = None, solves: list[Solve] | None = None
) -> Work:
    """`work` of a protocol that reads frozen features (engine/features.py `frozen_features`):
    `needed` images of each of its splits (default: all), from the split's cache entry that other
    protocols share, and the `solves` its runs then compute."""
    from vitbench.engine.feature_cache import cache_entry

    if needed is None:
        needed = {name: float(len(group.splits[name])) for name in protocol.splits(group.dataset)}
    each = {s.run_key: {"inference": sum(needed.values()) / len(group.specs)} for s in group.specs}
    shared = {str(cache_entry(group, name)): images for name, images in needed.items()}
    return Work(each, [[group.specs]] if group.specs else [], shared=shared, solves=solves or [])


class FrozenFeatureProtocol(Protocol):
    """A protocol that reads the frozen features of every image of its splits (k-NN, the linear
    probe): its work is that extraction, from the cache entries it shares with the others, and
    what `solves` says its runs compute on them (none by default)."""

    def work(self, group: Group) -> Work:
        return frozen_work(self, group, solves=self.solves(group))

    def solves(self, group: Group) -> list[Solve]:
        return []


class Trainer(Protocol):
    """A protocol that makes weights (pre-training): it starts from random init (`--weights`
    defaults to random), and what it made is then evaluated. Once its runs are stored, the session
    (api.run) plans and runs each request `followups` returns as a stage of its own, through the
    same planner as any run and into the same store; a dry run plans them by name."""

    _makes_weights = True

    def followups(self, req: Request, groups: list[Group]) -> list[Request]:
        """The evaluations of what these groups made (pre-training: few-shot on the weights it
        wrote, whose sha256 keys those runs), made with `req.next_stage(...)`."""
        return []
