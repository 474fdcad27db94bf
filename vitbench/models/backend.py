"""The backend interface: what a model family must provide to run through vitbench's protocols.

timm builds every network; a backend only knows how a family maps the paper's names onto timm
architectures, what its few-shot representation is, and how its inputs are preprocessed.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vitbench.errors import UserError
from vitbench.models import flop_counts
from vitbench.models.preprocessing import BIG_VISION_FEWSHOT, Preprocessing

if TYPE_CHECKING:  # torch and timm load where a model is built: commands that only read results never pay for them
    import torch
    from torch import nn

__all__ = ["BIG_VISION_FEWSHOT", "Backend", "ModelSpec", "Preprocessing", "count_parameters"]


@dataclass(frozen=True)
class ModelSpec:
    """One paper-named model: `vit-b/16` -> timm's `vit_base_patch16_224`."""

    name: str
    arch: str
    backend: Backend | None
    preprocessing: Preprocessing = field(default=BIG_VISION_FEWSHOT)
    summary: str = ""
    input_multiple: int = 1  # image sizes must be a multiple of this (the patch size for ViTs)
    paper_tag: str | None = None  # the timm weights tag of the paper's upstream checkpoint (`--weights timm:paper`)
    # Set for names that exist only as paper rows (their weights were never released): the reason.
    reference_only: str | None = None
    # fine-tuning dropout, vit_jax's default for the model (configs/models.py: 0.1 for L/16, H/14
    # and R50+B/16, else 0); inactive in the eval-mode protocols
    dropout: float = 0.0

    @property
    def family(self) -> str:
        return self.backend.family if self.backend else "reference"


_FLOPS: dict[tuple[type, str, int], int] = {}  # (backend class, architecture, image size) -> forward FLOPs per image
_WIDTHS: dict[tuple[type, str, int], int] = {}  # (backend class, architecture, image size) -> representation width


class Backend:
    """A timm model family. Subclasses override what differs between families."""

    family = "timm"  # recorded with every run (its `backend` column); nothing decides by it
    representation = "pre-logits"  # recorded with every few-shot result
    # what protocols and the engine ask of a family (instead of testing its name):
    channels_last = False  # convolutions first: the channels-last memory format on CUDA (BiT, the hybrids' stem)
    position_variants = False  # Table 8's --pos-embed variants apply (a plain ViT's patch grid)
    patch_prediction = False  # masked patch prediction (§4.6) applies: patch tokens to corrupt and predict
    pre_logits_head = False  # supervised pre-training adds §3.1's representation layer, tanh(Dense)
    resnet_baseline = False  # App. B.1.1: fine-tuning also runs BiT-HyperRule and keeps the better on dev
    in21k_without_pre_logits = False  # timm's in21k tags of this family lack the upstream pre_logits layer

    def check_img_size(self, spec: ModelSpec, img_size: int) -> None:

        if img_size <= 0 or img_size % spec.input_multiple:
            raise UserError(
                f"--res {img_size}: {spec.name} needs an image size that is a positive multiple of "
                f"{spec.input_multiple}"
            )

    def timm_kwargs(self, img_size: int, gelu: str = "exact") -> dict:

        if gelu != "exact":
            raise UserError(f"--gelu {gelu}: only transformer backends have a GELU to change, not {self.family}")
        return {}

    def representation_name(self, pre_logits: bool) -> str:
        return self.representation

    def dropout_kwargs(self, rate: float) -> dict:
        """timm keyword arguments for vit_jax's `dropout_rate`; families without one take none."""
        return {}

    def add_pre_logits(self, model: nn.Module, spec: ModelSpec, shape: torch.Size) -> None:

        raise UserError(f"{spec.name}: the weights carry a pre_logits layer, which {self.family} models do not have")

    def create(
        self, spec: ModelSpec, num_classes: int, img_size: int, gelu: str = "exact", dropout: float = 0.0
    ) -> nn.Module:
        """The architecture at `img_size` with a fresh zero-initialised `num_classes` head.

        The paper replaces the whole pre-training head by one zero-initialised linear layer
        (App. B.1.1); with no weights loaded the rest of the network is timm's random init.
        Create it under `torch.device("meta")` to count parameters without allocating them.
        """
        import timm
        from torch import nn

        self.check_img_size(spec, img_size)
        model: Any = timm.create_model(
            spec.arch,
            pretrained=False,
            num_classes=num_classes,
            **self.timm_kwargs(img_size, gelu),
            **(self.dropout_kwargs(dropout) if dropout else {}),
        )
        head = model.get_classifier()
        if isinstance(head, nn.Linear | nn.Conv2d):
            nn.init.zeros_(head.weight)
            if head.bias is not None:
                nn.init.zeros_(head.bias)
        return model

    def fits_npz(self, spec: ModelSpec, model: nn.Module, shapes: dict[str, tuple[int, ...]]) -> bool:
        """Whether a Google .npz of these tensor shapes is `spec`'s (`model`: spec's, on the meta
        device): `vitbench weights inspect` names the model a file belongs to. None by default."""
        return False

    def head_prefix(self, model: nn.Module) -> str:
        """State-dict prefix of the classifier that the protocols replace (`head`, `head.fc`)."""
        return str(getattr(model, "pretrained_cfg", {}).get("classifier", "head"))

    def adapt_state_dict(self, state: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
        """Make a checkpoint fit `model` where the paper allows it (e.g. a new position grid)."""
        return state

    def features(self, model: nn.Module, images: torch.Tensor) -> torch.Tensor:
        """The few-shot representation, (B, 3, H, W) -> (B, D). timm's pre-logits by default."""
        timm_model: Any = model  # timm's forward_features / forward_head are not on nn.Module's type
        return timm_model.forward_head(timm_model.forward_features(images), pre_logits=True)

    def flops_per_image(self, spec: ModelSpec, img_size: int) -> int:
        """Forward FLOPs for one image (2 per multiply-add), counted on the meta device once per
        process and (backend class, architecture, size): a FlopCounterMode pass of ViT-H takes a
        while, and the recorder and the dry run's estimate both ask. A network timm builds is counted
        once per machine (vitbench/models/flop_counts.py: a count imports torch._dynamo)."""
        key = (type(self), spec.arch, img_size)
        if key not in _FLOPS:
            count = functools.partial(self._count_flops, spec, img_size)
            if type(self).create is Backend.create:  # timm's network: the same code, the same count
                _FLOPS[key] = flop_counts.counted(self._count_key(spec, img_size), count)
            else:  # a network of the backend's own making: its code is its own to change
                _FLOPS[key] = count()
        return _FLOPS[key]

    def representation_width(self, spec: ModelSpec, img_size: int) -> int:
        """The width of the few-shot representation (what few-shot, k-NN and the linear probe solve
        on, for the dry run's price of their solves): `features` on the meta device, kept per machine
        as the FLOP counts are."""
        key = (type(self), spec.arch, img_size)
        if key not in _WIDTHS:
            count = functools.partial(self._count_width, spec, img_size)
            if type(self).create is Backend.create:
                _WIDTHS[key] = flop_counts.counted("width|" + self._count_key(spec, img_size), count)
            else:
                _WIDTHS[key] = count()
        return _WIDTHS[key]

    def _count_width(self, spec: ModelSpec, img_size: int) -> int:
        import torch

        with torch.device("meta"):
            model = self.create(spec, num_classes=0, img_size=img_size).eval()
            return int(self.features(model, torch.empty(1, 3, img_size, img_size)).shape[-1])

    def _count_key(self, spec: ModelSpec, img_size: int) -> str:
        """What a kept count of a timm network depends on: the backend, architecture, size, the
        torch and timm versions and the files that define the backend."""
        import timm
        import torch

        backend = f"{type(self).__module__}.{type(self).__qualname__}"
        sources = flop_counts.source_key(type(self), Backend)
        return f"{backend}|{spec.arch}|{img_size}|torch {torch.__version__}|timm {timm.__version__}|{sources}"

    def _count_flops(self, spec: ModelSpec, img_size: int) -> int:
        import torch
        from torch.utils.flop_counter import FlopCounterMode

        with torch.device("meta"):
            model = self.create(spec, num_classes=0, img_size=img_size).eval()  # batch-norm nets take one image
            images = torch.empty(1, 3, img_size, img_size)
            with FlopCounterMode(display=False) as counter:
                self.features(model, images)
        return int(counter.get_total_flops())


def count_parameters(spec: ModelSpec, num_classes: int = 1000, img_size: int = 224) -> int:
    """Parameter count of `spec` with a `num_classes` head, without allocating any memory."""
    import torch

    assert spec.backend is not None
    with torch.device("meta"):
        model = spec.backend.create(spec, num_classes=num_classes, img_size=img_size)
    return sum(p.numel() for p in model.parameters())
