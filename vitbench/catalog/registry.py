"""Name -> model / dataset / suite. Backends and datasets are discovered through the
`vitbench.backends` and `vitbench.datasets` entry-point groups (entry_points.py), lazily: listing
plugins reads package metadata only; models are imported on first use. A built-in backend
registers exactly like a third-party package."""

from __future__ import annotations

import logging
from functools import cache

from vitbench.catalog import entry_points
from vitbench.catalog.entry_points import BACKENDS, PluginInfo, Registry
from vitbench.catalog.entry_points import DATASETS as DATASET_PLUGINS
from vitbench.catalog.suites import SUITES, Suite
from vitbench.datasets import DATASETS, DatasetSpec
from vitbench.datasets.base import DatasetFormat
from vitbench.datasets.folder import FORMATS as FOLDER_FORMATS
from vitbench.datasets.hf_format import FORMATS as HF_FORMATS
from vitbench.datasets.tfds_format import FORMATS as TFDS_FORMATS
from vitbench.datasets.wds_format import FORMATS as WDS_FORMATS
from vitbench.errors import UserError
from vitbench.models.backend import ModelSpec
from vitbench.models.timm_models import PREFIX as TIMM_PREFIX
from vitbench.models.timm_models import timm_spec

log = logging.getLogger("vitbench")

# Models that exist only as paper rows: their weights were never released.
REFERENCE_ONLY = [
    ModelSpec(
        "bit-l",
        "resnetv2_152x4_bit",
        None,
        summary="BiT-L ResNet152x4 (JFT-300M), Table 2",
        reference_only="BiT-L was pre-trained on the private JFT-300M; its weights were never released",
    ),
    ModelSpec(
        "vit-h/14-jft",
        "vit_huge_patch14_224",
        None,
        summary="ViT-H/14 pre-trained on JFT-300M, Table 2",
        reference_only="the JFT-300M ViT-H/14 weights were never released (vision_transformer #14, #133)",
    ),
    ModelSpec(
        "vit-l/16-jft",
        "vit_large_patch16_224",
        None,
        summary="ViT-L/16 pre-trained on JFT-300M, Table 2",
        reference_only="the JFT-300M ViT-L/16 weights were never released",
    ),
    ModelSpec(
        "noisy-student",
        "tf_efficientnet_l2",
        None,
        summary="Noisy Student EfficientNet-L2, Table 2",
        reference_only="Noisy Student is a paper baseline only; vitbench has no EfficientNet backend",
    ),
]


def plugins() -> list[PluginInfo]:
    """The backend plugins, from metadata alone (`vitbench ls plugins`)."""
    return entry_points.plugins(BACKENDS)


def _models() -> list[tuple[str, ModelSpec]]:
    """The backends' models: vitbench's own through the same entry-point group as a plugin's
    (pyproject.toml names them; `plugins/` is importable as `vitbench_plugins` once installed)."""
    return entry_points.load_group(BACKENDS, "MODELS", ModelSpec)


@cache
def _dataset_plugins() -> list[tuple[str, DatasetSpec | DatasetFormat]]:
    """What the `vitbench.datasets` plugins give: named datasets and parametric formats alike."""
    return entry_points.load_group(DATASET_PLUGINS, "DATASETS", (DatasetSpec, DatasetFormat))


def _by_name(spec: ModelSpec | DatasetSpec) -> str:
    return spec.name


# the paper's reference-only rows after every backend's models (a backend may not take their names)
MODELS: Registry[ModelSpec] = Registry(
    "model", _by_name, tuple, lambda: [*_models(), *(("vitbench", spec) for spec in REFERENCE_ONLY)], of_type=ModelSpec
)
DATASETS_BY_NAME: Registry[DatasetSpec] = Registry(
    "dataset", _by_name, lambda: DATASETS.values(), _dataset_plugins, of_type=DatasetSpec
)
# the container formats researchers keep their data in: Hub parquet / save_to_disk, WebDataset shards, TFDS
BUILT_IN_FORMATS = [*FOLDER_FORMATS, *HF_FORMATS, *WDS_FORMATS, *TFDS_FORMATS]
# parametric datasets by prefix: `folder:<path>`, then the plugins' (none may take `timm`, a model prefix)
DATASET_FORMATS: Registry[DatasetFormat] = Registry(
    "dataset format", lambda form: form.prefix, lambda: BUILT_IN_FORMATS, _dataset_plugins, of_type=DatasetFormat,
    reserved=frozenset({TIMM_PREFIX.rstrip(":")}),
)  # fmt: skip


def models() -> Registry[ModelSpec]:
    return MODELS


def datasets() -> Registry[DatasetSpec]:
    """The built-in datasets, then those of `vitbench.datasets` plugins (which may not replace one)."""
    return DATASETS_BY_NAME


def dataset_formats() -> Registry[DatasetFormat]:
    return DATASET_FORMATS


def get_model(name: str, runnable: bool = True) -> ModelSpec:
    if name.startswith(TIMM_PREFIX):
        return timm_spec(name)
    spec = MODELS.find(name)
    if runnable and spec.reference_only:
        raise UserError(f"model {name} is a paper reference only and cannot be run: {spec.reference_only}")
    return spec


def get_dataset(name: str) -> DatasetSpec:
    """A dataset of the table or of a plugin, or `PREFIX:<argument>` of a format (`folder:<path>`,
    any ImageFolder tree with train/ and test/; a plugin's)."""
    prefix, colon, argument = name.partition(":")
    if colon and name not in datasets():
        form = dataset_formats().get(prefix)
        if form is None:
            known = ", ".join(f"{p}:" for p in dataset_formats())
            raise UserError(f"dataset '{name}': no dataset format '{prefix}:' (known: {known}; `vitbench ls datasets`)")
        if not argument:
            raise UserError(f"dataset '{name}': {prefix}: needs its argument ({form.summary})")
        return form.build(argument)
    return DATASETS_BY_NAME.find(name)


def fetch_dataset(name: str) -> None:
    """--download for a dataset named by a format that fetches (`hf:<repo id>`); nothing for the rest."""
    prefix, colon, argument = name.partition(":")
    form = dataset_formats().get(prefix) if colon and name not in datasets() else None
    if form is not None and form.fetch is not None and argument:
        form.fetch(argument)


def get_suite(name: str) -> Suite:
    return SUITES.find(name)
