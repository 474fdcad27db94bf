"""The one module a plugin imports: everything a backend, a protocol, a dataset (or a dataset
format) and a view of a package of your own needs, with `__all__` as the contract. The rest of
vitbench may move; these names stay. docs/architecture.md ("Extending vitbench") is the guide,
one section per kind, each written against this module alone.

A plugin registers through an entry-point group of its distribution's metadata (or, in a
notebook, `register_protocol`):

- `vitbench.backends`: a list of `ModelSpec` (a name, a timm architecture or your own network, its
  `Backend` and `Preprocessing`). A family of your own subclasses `Backend`; a model of a built-in
  family reuses its backend: `get_model("vit-b/16").backend`.
- `vitbench.datasets`: a list of `DatasetSpec` (a loader returning a `Split`) or of `DatasetFormat`
  (a `PREFIX:<argument>` a user types, like `folder:<path>`). `fingerprinted` and
  `fingerprint_files` give a split's provenance; `get_dataset("digits")` reads a built-in one.
- `vitbench.protocols`: a `Protocol` instance or class (a `Trainer` for one that trains), its
  options a `ProtocolOptions` dataclass of `option(...)` fields, its numbers `Metric`s along an
  `Axis`, each run a `Result`. `group_model` and `outputs_over` are the frozen-feature protocols'
  model and features; `Clock` counts the device-seconds a result reports.
- `vitbench.views`: `TableView`s returning `TableData` of `Cell`s, and `FigureView`s returning a
  `Figure`.

A user's mistake is a `UserError`: one line naming the option or file and what was expected.

Importing this module loads no torch, timm or pandas (a view's or a dataset's plugin is read by
commands that never do): `group_model`, `outputs_over` and the position-embedding helpers are
loaded when first named."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vitbench.catalog.registry import get_dataset, get_model
from vitbench.datasets.base import DatasetFormat, DatasetSpec, Split, fingerprinted
from vitbench.errors import UserError
from vitbench.host.devices import Clock
from vitbench.models.backend import BIG_VISION_FEWSHOT, Backend, ModelSpec
from vitbench.models.preprocessing import Preprocessing
from vitbench.protocols.base import Group, Protocol, Request, Result, RunSpec, Trainer, Work
from vitbench.protocols.measures import Axis, Metric
from vitbench.protocols.options import ProtocolOptions, option
from vitbench.protocols.registry import register as register_protocol
from vitbench.provenance import fingerprint_files, sha256_file, sha256_text
from vitbench.views.cells import Cell, TableData
from vitbench.views.figures.figure_kit import Figure
from vitbench.views.registry import FigureView, Inputs, TableView

if TYPE_CHECKING:
    from vitbench.engine.features import group_model, outputs_over
    from vitbench.models.position_embeddings import install_relative, relative_variant

__all__ = [
    # backends
    "BIG_VISION_FEWSHOT",
    "Backend",
    "ModelSpec",
    "Preprocessing",
    "get_model",
    "install_relative",
    "relative_variant",
    # datasets and dataset formats
    "DatasetFormat",
    "DatasetSpec",
    "Split",
    "fingerprint_files",
    "fingerprinted",
    "get_dataset",
    "sha256_file",
    "sha256_text",
    # protocols
    "Axis",
    "Clock",
    "Group",
    "Metric",
    "Protocol",
    "ProtocolOptions",
    "Request",
    "Result",
    "RunSpec",
    "Trainer",
    "Work",
    "group_model",
    "option",
    "outputs_over",
    "register_protocol",
    # views
    "Cell",
    "Figure",
    "FigureView",
    "Inputs",
    "TableData",
    "TableView",
    # every kind
    "UserError",
]


def __getattr__(name: str) -> Any:
    """The names whose modules load torch, loaded when a plugin first names them."""
    if name in ("group_model", "outputs_over"):
        from vitbench.engine import features

        return getattr(features, name)
    if name in ("install_relative", "relative_variant"):
        from vitbench.models import position_embeddings

        return getattr(position_embeddings, name)
    raise AttributeError(f"module 'vitbench.plugin' has no attribute {name!r}")
