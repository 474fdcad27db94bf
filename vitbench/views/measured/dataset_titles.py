"""A dataset's name as every view shows it: the paper's (ImageNet ReaL, VTAB's groups with their
task counts), a plugin dataset's own title, else its name."""

from __future__ import annotations

from vitbench.catalog import registry
from vitbench.datasets import DATASETS
from vitbench.datasets.vtab import GROUPS, TASKS

TITLES = {
    **{k: v.title for k, v in DATASETS.items()},
    "imagenet_real": "ImageNet ReaL",
    "vtab": "VTAB (19 tasks)",
    **{f"vtab_{g}": f"{g.capitalize()} ({sum(t.group == g for t in TASKS)} tasks)" for g in GROUPS},
    **{f"vtab/{t.key}": t.title for t in TASKS},
}


def title(dataset: str) -> str:
    """A dataset's row label: the paper's name, a plugin dataset's own title, else its name."""
    if dataset in TITLES:
        return TITLES[dataset]
    spec = registry.datasets().get(dataset)
    return spec.title if spec is not None else dataset
