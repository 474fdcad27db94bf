"""The README's Python API example runs as written, and the API's own mistakes are one-line errors."""

import re
from pathlib import Path

import pytest
from conftest import DEIT_WEIGHTS, SHARED_DATA, needs_shared_data

import vitbench
from vitbench.errors import UserError

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_readme_python_example_runs_as_written(tmp_path, monkeypatch, capsys):
    """On its own, in an empty folder (tests/test_readme.py runs it where the README's walk is)."""
    section = README.read_text().split("## Python API", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "4 runs planned, 4 run now" in out
    frame = vitbench.results(tmp_path / "results")  # a row per run: a column per metric and per setting
    assert sorted(frame["shots"]) == [1, 1, 5, 5] and frame["accuracy"].between(0, 1).all()
    assert set(frame["res"]) == {32} and "value" not in frame and frame["run_key"].is_unique
    # `where` on any stored field, as one clause or a list (issue 45: `metric` was "not a stored field")
    accuracy = vitbench.results(tmp_path / "results", where="metric=accuracy", long=True)
    assert len(accuracy) == 4 and set(accuracy["metric"]) == {"accuracy"}
    assert len(vitbench.results(tmp_path / "results", where=["metric=accuracy", "value>1"])) == 0
    assert set(accuracy["hparams"].str["res"]) == {32}  # hparams as dicts, not JSON text
    assert len(vitbench.results(tmp_path / "results", where="res=32")) == 4  # a setting by its bare name
    with pytest.raises(UserError, match=r"vitbench.results\(123\): expected a results folder"):
        vitbench.results(123)
    # the same call again: everything is stored, nothing runs
    summary = vitbench.run(model="vit-ti/16", weights="random", datasets="digits", shots=(1, 5), seeds=(0, 1),
                           res=32, workers=0, results=tmp_path / "results")  # fmt: skip
    assert summary.ran == 0 and len(summary.todo) == 0 and len(summary.table()) == 4
    folder = str(tmp_path / "results")
    counts = "4 runs planned, 4 stored before, 0 run now, 0 waiting, 0 failed"
    assert repr(summary) == f"Summary({counts}; results={folder!r})"


def test_list_options_take_a_range_and_a_long_one_is_refused_by_its_count(tmp_path):
    """Before: `seeds=range(2)` was refused ("expected a list of integers, got range(0, 2)")."""
    (group,) = vitbench.plan(model="vit-ti/16", weights="random", datasets="digits", shots=range(1, 3),
                             seeds=range(2), res=32, results=tmp_path)  # fmt: skip
    assert sorted((s.seed, s.hparams["shots"]) for s in group.specs) == [(0, 1), (0, 2), (1, 1), (1, 2)]
    with pytest.raises(UserError, match="--seeds: 1,000,000,000,000 values; expected at most 10,000"):
        vitbench.plan(seeds=range(10**12), results=tmp_path)  # never expanded


def test_plan_runs_nothing(tmp_path):
    groups = vitbench.plan(model="vit-ti/16", weights="random", datasets="digits", shots=(5,), results=tmp_path)
    assert [len(g.specs) for g in groups] == [3] and not (tmp_path / "vitbench.duckdb").exists()


def test_an_unknown_option_is_a_one_line_error():
    with pytest.raises(UserError, match="vitbench.run: unknown option 'shot'; expected one of"):
        vitbench.run(model="vit-ti/16", weights="random", shot=5)


def test_the_api_is_discoverable_without_loading_it():
    """`dir(vitbench)` was `['os', 'version']`: tab completion found no `run`. It lists the API, and
    listing it loads neither the API nor torch."""
    import subprocess
    import sys

    probe = "import sys, vitbench; print(dir(vitbench)); print('vitbench.api' in sys.modules, 'torch' in sys.modules)"
    shown = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    listed, loaded = shown.splitlines()
    assert listed == "['Summary', 'UserError', '__version__', 'plan', 'request', 'results', 'run']"
    assert loaded == "False False"
    assert "keyword arguments" in vitbench.__doc__ and callable(vitbench.run) and vitbench.Summary.__doc__


def test_the_demo_has_a_folder_of_its_own_and_pins_its_cpu_threads():
    """The demo's digits runs used to land in `results/` and fill the tables of a person's own runs;
    on another thread count its trained figures came out different (79.13 % at 10 shots on one
    thread, 77.29 % on two)."""
    import torch

    from vitbench.execution.plan import suite_of
    from vitbench.host.devices import cpu_threads
    from vitbench.protocols.base import Request

    assert vitbench.request().results == Path("results") / "demo"  # made with its suite's defaults
    assert vitbench.request(results="mine").results == Path("mine")  # --results wins
    assert vitbench.request(datasets="digits").results == Path("results")  # not the demo
    assert suite_of(Request()).cpu_threads == 2 and suite_of(Request(suite="cifar")).cpu_threads is None
    before = torch.get_num_threads()
    with cpu_threads(1, "cpu"):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with cpu_threads(1, "cuda"):  # a GPU run is left alone
        assert torch.get_num_threads() == before


@needs_shared_data
def test_the_api_takes_python_values_and_documents_every_option():
    """Issue 45: `weights=[path, "random"]` died with "'list' object has no attribute 'split'", and
    `help(vitbench.run)` showed `**options` only. A list option takes a list, a path a Path; the
    docstrings list every shared option and every built-in protocol's, from their declarations."""
    groups = vitbench.plan(model="deit-ti/16", weights=[DEIT_WEIGHTS, "random"], datasets=["cifar10"],
                           data_dir=SHARED_DATA, shots=[1], seeds=[0])  # fmt: skip
    assert [g.weights.random for g in groups] == [False, True] and all(len(g.specs) == 1 for g in groups)
    for documented in (vitbench.run, vitbench.plan):
        doc = documented.__doc__
        assert "knn_k: list[int] = (20,)  knn: comma-separated neighbour counts" in doc
        assert "weights: str | None (a list joins as --weights's comma list)" in doc and "fewshot_l2" in doc
