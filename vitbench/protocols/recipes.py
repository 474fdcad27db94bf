"""The fine-tuning recipes a dev split chooses between. For ViTs one: the paper's LR sweep. For the
ResNet baselines two (App. B.1.1: "we also run the setup of Kolesnikov et al. (2020) and select the
best results across this run and our sweep"): the sweep's runs and one BiT-HyperRule run
(engine/bit_hyperrule.py) are all scored on the dev split, and the final runs take the best.
Both are stored; the choice is recorded with every final run.
"""

from __future__ import annotations

from vitbench.errors import UserError
from vitbench.protocols.base import Group, Recorder, RunSpec
from vitbench.protocols.shared_options import TrainingOptions

HYPERRULE = "bit-hyperrule"
RECIPES_NOTE = "the better on dev of the paper's LR sweep and BiT-HyperRule (App. B.1.1, ResNets)"


def runs_hyperrule(group: Group, o: TrainingOptions) -> bool:
    """The paper's ResNet baselines choose between the two recipes; with --lr there is no choice."""
    return group.model.backend is not None and group.model.backend.resnet_baseline and o.lr is None


def hyperrule_hparams(group: Group, o: TrainingOptions, res: int, steps: int) -> dict:
    """The HyperRule's settings for this dataset (its size and its images' size), recorded as the
    dev run's `recipe`. A shorter run than the rule's (--smoke, --steps) scales its steps, and
    --smoke its resolution too, keeping their ratios."""
    from vitbench.engine import bit_hyperrule  # timm's scheduler: only where a plan is made

    train = group.splits[group.dataset.transfer_splits[0]]
    first = train.image(0)
    found = bit_hyperrule.recipe(len(train), (first.height, first.width))
    if o.smoke or o.steps:
        scale = steps / found.steps[-1]
        found = bit_hyperrule.Recipe(
            tuple(max(i + 1, round(s * scale)) for i, s in enumerate(found.steps)),
            round(res * found.precrop / found.crop) if o.smoke else found.precrop,
            res if o.smoke else found.crop,
            found.mixup,
        )
    return found.hparams(scaled=bool(o.smoke or o.steps))


def sweep_choice(sweep: list[RunSpec], recorder: Recorder) -> dict:
    """The best dev run (the smaller LR on a tie, the paper's recipe before the HyperRule), from the
    store: its LR, dev accuracy and recipe (None: the paper's), and every dev run's accuracy."""
    found = recorder.metric_values([s.run_key for s in sweep], "dev_accuracy")
    missing = [_label(s) for s in sweep if s.run_key not in found]
    if missing:
        what = missing[0] if missing[0] == HYPERRULE else f"lr {missing[0]}"
        raise UserError(f"the dev sweep has no result for {what}; run it first (drop --rerun filters)")
    best = max(sweep, key=lambda s: (found[s.run_key], -s.hparams["lr"], "recipe" not in s.hparams))
    return {
        "lr": best.hparams["lr"],
        "dev_accuracy": found[best.run_key],
        "recipe": best.hparams.get("recipe"),
        "sweep": {_label(s): found[s.run_key] for s in sweep},
    }


def _label(spec: RunSpec) -> str:
    """The dev run's key in `notes.sweep`: its LR (as before the HyperRule), or the recipe's name."""
    return HYPERRULE if "recipe" in spec.hparams else f"{spec.hparams['lr']:g}"


def training_hparams(hparams: dict, recipe: dict | None) -> dict:
    """A run's hparams with a chosen recipe's settings in place of the paper's."""
    if not recipe:
        return hparams
    keys = ("steps", "warmup", "res", "precrop", "mixup", "decay_steps", "schedule", "train_aug")
    return {**hparams, **{k: recipe[k] for k in keys}}
