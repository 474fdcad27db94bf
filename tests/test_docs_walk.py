"""The pages of docs/ that show commands (tests/readme_walk.py: WALKED_DOCS), walked as the README
is, in a folder of their own: each command runs, each quoted output is what it printed, and what
the pages claim of numbers trained on a CPU holds on every CPU. A unit of its own for the test
workers, beside the README's walk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import needs_shared_data
from readme_walk import WALKED_DOCS, Step, check_quote, failed_steps, parse, walk

from vitbench import store
from vitbench.views.measured.axes import with_axes

QUOTED = [(s, q) for page in WALKED_DOCS for s in parse(page)[0] for q in s.quotes]


@pytest.fixture(scope="module")
def docs_walk(tmp_path_factory) -> tuple[Path, list[Step]]:
    root = tmp_path_factory.mktemp("docs-walk")
    ran, _ = walk(WALKED_DOCS, root)
    return root / "checkout", ran


def test_every_walked_docs_command_succeeds(docs_walk):
    _, ran = docs_walk
    assert ran and not failed_steps(ran), "\n".join(failed_steps(ran))


@pytest.mark.parametrize("step, quote", QUOTED, ids=[f"{q.page}:{q.line}" for _, q in QUOTED])
def test_the_docs_quote_what_their_commands_print(docs_walk, step, quote):
    check_quote(docs_walk[1], step, quote)


def _walk_accuracies(checkout: Path, protocol: str):
    """A row per run of `protocol` in the walk's results folder, with its (test) accuracy as `value`."""
    df = with_axes(store.read_results(checkout / "results"))
    return df[(df["protocol"] == protocol) & (df["metric"] == "accuracy")].drop_duplicates("run_key")


@needs_shared_data
def test_the_smoke_fine_tune_learns_the_digits_on_every_cpu(docs_walk):
    """What docs/finetune.md says of `--protocol finetune --smoke` on any CPU (its trained mean holds only
    on a CPU like the one that printed it): 20 steps move DeiT-Ti a long way on the digits, to far
    above chance (10 %). Printed: 49.35 on an Intel Xeon and 50.02 on an AMD EPYC."""
    checkout, _ = docs_walk
    final = _walk_accuracies(checkout, "finetune")
    final = final[final["hparams"].map(lambda h: json.loads(h)["stage"]) == "final"]
    assert len(final) == 3 and set(final["dataset"]) == {"digits"}
    assert final["value"].mean() > 0.30, final["value"].tolist()


def test_the_smoke_pretraining_loses_to_random_init_on_every_cpu(docs_walk):
    """What docs/pretraining.md says of the smoke pre-training on any CPU: on 45 to 453 images of digits
    0-4 the ViT's features are worse for the unseen digits 5-9 than the same network at random
    init, at every subset (printed: 23-29 % against 50.46 %)."""
    checkout, _ = docs_walk
    few = _walk_accuracies(checkout, "fewshot")
    few = few[few["dataset"] == "digits5-9"]
    random = few.loc[few["random_init"], "value"]
    assert len(random) == 3
    pretrained = few[~few["random_init"]].groupby("weights_sha256")["value"].agg(["mean", "count"])
    assert len(pretrained) == 3 and set(pretrained["count"]) == {3}
    assert (pretrained["mean"] < random.mean()).all(), (pretrained, random.mean())
