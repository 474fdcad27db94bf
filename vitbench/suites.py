"""Suites as code: which datasets a named benchmark covers, with which protocol and defaults."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Suite:
    name: str
    datasets: tuple[str, ...]
    protocol: str
    description: str
    # defaults the user may override on the command line (e.g. the demo's model and weights)
    defaults: dict = field(default_factory=dict)


SUITES: dict[str, Suite] = {
    s.name: s
    for s in [
        Suite(
            "demo",
            ("digits",),
            "fewshot",
            "embedded default: few-shot on scikit-learn's 8x8 digits with a random-init ViT-Ti/16 (no files needed)",
            defaults={"model": "vit-ti/16", "weights": "random"},
        ),
        Suite("cifar", ("cifar10", "cifar100"), "fewshot", "CIFAR-10 and CIFAR-100 (original pickles)"),
        Suite("imagenet", ("imagenet",), "fewshot", "ImageNet-1k (train/ and val/ synset folders)"),
    ]
}
