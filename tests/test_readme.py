"""The README is a contract: its commands, run top to bottom in one folder as a new user runs them,
print what it quotes (tests/readme_walk.py says how the README marks them). The walk runs once
per session; the demo's own checks read the folder it leaves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from readme_walk import (
    README,
    WALKED_DOCS,
    Quote,
    Step,
    check_quote,
    cpu_fingerprint,
    failed_steps,
    mismatch,
    parse,
    walk,
)

from vitbench import store
from vitbench.views.measured.axes import with_axes

STEPS, SKIPPED = parse(README)
QUOTED = [(s, q) for s in STEPS for q in s.quotes]


@pytest.fixture(scope="session")
def readme_walk(tmp_path_factory) -> tuple[Path, list[Step]]:
    """Every step of the README, in order, from a fresh folder laid out as a checkout with
    `../shared` beside it. Without the shared data, the steps that read it are left out."""
    root = tmp_path_factory.mktemp("readme")
    ran, _ = walk((README,), root)
    return root / "checkout", ran


def test_the_readme_marks_its_commands_and_quotes():
    """The parse finds the walk: the quick start's demo first, a quote per table it shows; the walked
    pages of docs/ give a reason for every block they do not run."""
    assert STEPS[0].source == "vitbench run" and STEPS[0].quotes
    assert len(QUOTED) >= 8 and all(q.text.strip() for _, q in QUOTED)
    skipped = SKIPPED + [reason for page in WALKED_DOCS for reason in parse(page)[1]]
    assert skipped and all("needs" in reason for reason in skipped)


def test_a_quote_made_on_one_cpu_holds_its_numbers_there_and_its_words_elsewhere():
    """A number trained on a CPU comes out other on a CPU with other kernels (the README says why):
    a quote of one holds its numbers where the fingerprint is the quote's, its words and shape
    everywhere, and its untrained lines exactly everywhere."""
    printed = "random init 36.55 ± 6.17\nn=900 dev acc. 92.00 · 1-shot 65.66 ± 8.04"
    made = "random init 36.55 ± 6.17\nn=900 dev acc. 93.00 · 1-shot 70.64 ± 5.36"
    here = Quote(made, 3.0, 1, cpu_fingerprint(), "random init")
    elsewhere = Quote(made, 3.0, 1, "OtherVendor 0/0 avx2", "random init")  # no real CPU's fingerprint
    assert mismatch(here, printed) is not None  # 5 points off: beyond the tolerance
    assert mismatch(Quote(made, 6.0, 1, cpu_fingerprint(), "random init"), printed) is None
    assert mismatch(elsewhere, printed) is None
    assert mismatch(elsewhere, printed.replace("1-shot", "5-shot")) is not None  # the words still hold
    assert mismatch(elsewhere, printed.replace("36.55", "36.56")) is not None  # untrained: exact on every CPU
    assert mismatch(Quote(made, 3.0, 1, "OtherVendor 0/0 avx2"), printed.replace("36.55", "39.55")) is None


def test_every_cpu_trained_quote_names_its_cpu_and_keeps_random_init_exact():
    """The quotes of numbers trained on a CPU (the README's demo, docs/finetune.md's smoke fine-tune,
    docs/pretraining.md's smoke pre-training) each name the CPU they were printed on, keep their
    random-init rows exact on every CPU, and tolerate at most 3 points where they hold; every other
    quote is held on every CPU."""
    quotes = [q for page in (README, *WALKED_DOCS) for s in parse(page)[0] for q in s.quotes]
    trained = [q for q in quotes if q.cpu]
    assert {q.page for q in trained} == {"README.md", "docs/finetune.md", "docs/pretraining.md"}
    assert len(trained) == 3
    for quote in trained:
        assert quote.cpu.split()[0] in ("GenuineIntel", "AuthenticAMD") and quote.tolerance <= 3
        assert "/" in quote.cpu.split()[1]  # the CPU's family/model: its generation
        assert quote.exact_where is None or quote.exact_where in quote.text
    assert sum(q.exact_where == "random init" for q in trained) == 2  # the demo's and pre-training's rows
    assert all(q.cpu is None for q in quotes if q not in trained)


def test_every_readme_command_succeeds(readme_walk):
    _, ran = readme_walk
    assert not failed_steps(ran), "\n".join(failed_steps(ran))


@pytest.mark.parametrize("step, quote", QUOTED, ids=[f"README.md:{q.line}" for _, q in QUOTED])
def test_the_readme_quotes_what_its_command_prints(readme_walk, step, quote):
    check_quote(readme_walk[1], step, quote)


def _mean_accuracy(df, shots: int, random_init: bool) -> float:
    part = df[(df["protocol"] == "fewshot") & (df["shots"] == shots) & (df["random_init"] == random_init)]
    assert len(part) == 3  # three seeds
    return float(part["value"].mean())


def test_the_demo_pretrains_apart_and_beats_random_init_at_every_shot_count(readme_walk):
    """`vitbench run` with no options, the quick start: ViT-Ti pre-trained on the digits, then linear
    few-shot on the held-out test digits beside random init, in results/demo (never mixed into a
    person's own tables), on 2 CPU threads. What the README claims on any CPU (its trained numbers
    hold only on a CPU like the one that printed them): pre-training beats random init at every
    shot count, by a clear margin at 10 shots."""
    checkout, _ = readme_walk
    demo = checkout / "results" / "demo"
    df = with_axes(store.read_results(demo))
    pre = df[df["protocol"] == "pretrain"].drop_duplicates("run_key")
    assert len(pre) == 1
    h = json.loads(pre["hparams"].iloc[0])
    assert (h["steps"], h["batch"], h["res"], h["objective"]) == (300, 64, 32, "supervised")
    few = df[df["protocol"] == "fewshot"].drop_duplicates("run_key")
    assert len(few) == 2 * 4 * 3 and set(few["dataset"]) == {"digits"}  # 2 weights x 1/5/10/25 shots x 3 seeds
    notes = [json.loads(n) for n in df.drop_duplicates("run_key")["notes"]]
    assert {n["cpu_threads"] for n in notes} == {2}
    assert {n["cpu_kernels"] for n in notes} == {cpu_fingerprint()}  # which CPU's kernels made its numbers
    for shots in (1, 5, 10, 25):
        pretrained, random = _mean_accuracy(few, shots, False), _mean_accuracy(few, shots, True)
        assert pretrained > random + (0.05 if shots == 10 else 0), (shots, pretrained, random)
    mine = store.read_results(checkout / "results")  # the README's later commands ran there
    # the demo's pre-training and the few-shot of its weights stayed apart (its random-init runs are
    # the same runs as the README's API example, which stores them in results/ on purpose)
    assert not mine.empty and not set(mine["run_key"]) & set(df.loc[~df["random_init"], "run_key"])
