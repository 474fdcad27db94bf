"""The README is a contract: its commands, run top to bottom in one folder as a new user runs them,
print what it quotes (tests/readme_walk.py says how the README marks them). The walk runs once
per session; the demo's own checks read the folder it leaves."""

from __future__ import annotations

import json
import os
from contextlib import chdir
from pathlib import Path

import pytest
from conftest import SHARED_DATA
from readme_walk import Quote, Step, cpu_fingerprint, mismatch, parse, run_step

from vitbench import store
from vitbench.views.axes import with_axes

README = Path(__file__).resolve().parents[1] / "README.md"
STEPS, SKIPPED = parse(README)
QUOTED = [(s, q) for s in STEPS for q in s.quotes]


@pytest.fixture(scope="session")
def readme_walk(tmp_path_factory) -> tuple[Path, list[Step]]:
    """Every step of the README, in order, from a fresh folder laid out as a checkout with
    `../shared` beside it. Without the shared data, the steps that read it are left out."""
    root = tmp_path_factory.mktemp("readme")
    checkout = root / "checkout"
    checkout.mkdir()
    if SHARED_DATA.exists():
        (root / "shared").symlink_to(SHARED_DATA.parent, target_is_directory=True)
    ran = []
    # what a pipe receives: no results or data folder of the caller's, and no COLUMNS (pytest-xdist sets
    # COLUMNS=80 in its workers; a table honours it, split to fit)
    env = {k: os.environ.pop(k) for k in ("VITBENCH_RESULTS", "VITBENCH_DATA", "COLUMNS") if k in os.environ}
    try:
        with chdir(checkout):
            for step in STEPS:
                if "../shared" in step.source and not SHARED_DATA.exists():
                    continue
                run_step(step)
                ran.append(step)
    finally:
        os.environ.update(env)
    return checkout, ran


def test_the_readme_marks_its_commands_and_quotes():
    """The parse finds the walk: the quick start's demo first, a quote per table it shows, and a
    reason for every block it does not run."""
    assert STEPS[0].source == "vitbench run" and STEPS[0].quotes
    assert len(QUOTED) >= 8 and all(q.text.strip() for _, q in QUOTED)
    assert SKIPPED and all("needs" in reason for reason in SKIPPED)


def test_a_quote_made_on_one_cpu_holds_its_numbers_there_and_its_words_elsewhere():
    """The demo's trained row comes out other on a CPU with other vector instructions (the README
    says why): its numbers are held where the fingerprint is the quote's, its words everywhere."""
    printed = "dev acc. 92.00 · 1-shot 65.66 ± 8.04"
    here = Quote("dev acc. 93.00 · 1-shot 70.64 ± 5.36", 3.0, 1, cpu_fingerprint())
    elsewhere = Quote(here.text, 3.0, 1, "AuthenticAMD avx2")
    assert mismatch(here, printed) is not None  # 5 points off: beyond the tolerance
    assert mismatch(Quote(here.text, 6.0, 1, cpu_fingerprint()), printed) is None
    assert mismatch(elsewhere, printed) is None
    assert mismatch(elsewhere, printed.replace("1-shot", "5-shot")) is not None  # the words still hold
    demo = STEPS[0].quotes[0]
    assert demo.cpu and demo.cpu.split()[0] in ("GenuineIntel", "AuthenticAMD") and demo.tolerance == 3


def test_every_readme_command_succeeds(readme_walk):
    _, ran = readme_walk
    failed = [f"README.md:{s.line}: {s.source} exited {s.code}\n{s.output[-2000:]}" for s in ran if s.code != 0]
    assert not failed, "\n".join(failed)


@pytest.mark.parametrize("step, quote", QUOTED, ids=[f"README.md:{q.line}" for _, q in QUOTED])
def test_the_readme_quotes_what_its_command_prints(readme_walk, step, quote):
    _, ran = readme_walk
    if step not in ran:
        pytest.skip("reads ../shared/data, which is not present")
    problem = mismatch(quote, step.output)
    assert problem is None, f"{problem}\n(the command: {step.source})"


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
    assert {json.loads(n)["cpu_threads"] for n in df.drop_duplicates("run_key")["notes"]} == {2}
    for shots in (1, 5, 10, 25):
        pretrained, random = _mean_accuracy(few, shots, False), _mean_accuracy(few, shots, True)
        assert pretrained > random + (0.05 if shots == 10 else 0), (shots, pretrained, random)
    mine = store.read_results(checkout / "results")  # the README's later commands ran there
    # the demo's pre-training and the few-shot of its weights stayed apart (its random-init runs are
    # the same runs as the README's API example, which stores them in results/ on purpose)
    assert not mine.empty and not set(mine["run_key"]) & set(df.loc[~df["random_init"], "run_key"])
