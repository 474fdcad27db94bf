"""A protocol and a dataset from another package: nearest-class-mean on frozen features, defined
here, installed as a real wheel that registers through the `vitbench.protocols` and
`vitbench.datasets` entry-point groups, and run end to end through `vitbench run`, the store and
`vitbench table`, without any change to vitbench's own modules. The protocol declares options of
its own (`--ncm-norm`, `--ncm-dims`), which `vitbench run --help`, a config file and the Python API
all take, and an axis of its own (the principal components kept), along which the table, `vitbench
plot` and the report show it; the package's own table view comes through `vitbench.views` (issue 48)."""

import json
import os
import re
import subprocess
import sys

import pytest
from conftest import install_wheel

PACKAGE = '''
"""Nearest class mean: each test image takes the class whose mean L2-normalised train feature is
closest in cosine similarity."""
from dataclasses import dataclass, replace
from datetime import UTC, datetime

import numpy as np
import torch

from vitbench.plugin import (
    Axis, Clock, DatasetSpec, Metric, Protocol, ProtocolOptions, Result, Split, get_dataset, group_model, option,
    outputs_over,
)


@dataclass(frozen=True)
class NcmOptions(ProtocolOptions):
    ncm_norm: str = option(
        "l2", "ncm: the features' normalisation before the class means: l2 or none.",
        panel="Nearest class mean (--protocol ncm)", choices=("l2", "none"),
    )
    ncm_dims: tuple[int, ...] = option(
        (0,), "ncm: principal components of the train features kept, comma-separated (0: all).",
        panel="Nearest class mean (--protocol ncm)", many=True,
    )


class NearestClassMean(Protocol):
    name = "ncm"
    version = "ncm/1"
    summary = "nearest class mean on L2-normalised frozen features"
    label = "nearest-class-mean"
    Options = NcmOptions
    metrics = (Metric("accuracy", "accuracy", axis=Axis("dims", "principal components kept", log=False)),)

    def splits(self, dataset):
        return dataset.transfer_splits

    def work(self, group):  # its clock counts one process's seconds: it runs on one
        return replace(super().work(group), data_parallel=False)

    def plan(self, group, req, weights_sha, hparams):
        first = group.splits[self.splits(group.dataset)[0]]
        o = NcmOptions.of(req)
        return [
            self.base_spec(group, first, weights_sha, {**hparams, "normalise": o.ncm_norm, "dims": d}, seed=0)
            for d in o.ncm_dims
        ]

    def run(self, group, todo, req, runtime, recorder):
        started, clock = datetime.now(UTC), Clock(runtime.device)
        model = group_model(group, keep_head=False)
        features = group.model.backend.features
        (train, _), (test, _) = [
            outputs_over(group, s, runtime, clock, {"representation": "ncm"}, features, model)
            for s in self.splits(group.dataset)
        ]
        for spec in todo:
            norm, dims = spec.hparams["normalise"], spec.hparams["dims"]
            unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True) if norm == "l2" else x
            train_x, test_x = train.values.astype(np.float64), test.values.astype(np.float64)
            if dims:  # project both onto the train features' first principal components
                centre = train_x.mean(0)
                basis = np.linalg.svd(train_x - centre, full_matrices=False)[2][:dims].T
                train_x, test_x = (train_x - centre) @ basis, (test_x - centre) @ basis
            train_x, test_x = unit(train_x), unit(test_x)
            means = np.stack([train_x[train.labels == c].mean(0) for c in range(group.dataset.num_classes)])
            accuracy = float((np.argmax(test_x @ means.T, axis=1) == test.labels).mean())
            yield Result(
                spec, {"accuracy": accuracy}, started, seconds=clock.seconds / len(todo),
                images=float(len(train.labels) + len(test.labels)) / len(todo), n_train=len(train.labels),
                n_test=len(test.labels),
            )


def load_low_digits(root, split):
    """Digits 0-4 only."""
    digits = get_dataset("digits").load(root, split)
    keep = np.flatnonzero(digits.labels < 5)
    images = digits.images[keep]
    return Split("low-digits", split, digits.labels[keep], "acme", digits.fingerprint + ":0-4", images=images)


PROTOCOL = NearestClassMean()
DATASETS = [
    DatasetSpec("low-digits", "Digits 0-4", 5, None, {"train": None, "test": None}, load_low_digits, source="acme")
]
'''

# a table view of the package's own, in a module of its own: only `vitbench table` imports it
VIEW_MODULE = '''"""acme's views of its ncm runs: accuracy by normalisation (the mean over the dims),
as a table and as a figure."""
import json

import matplotlib.pyplot as plt

from vitbench.plugin import Cell, Figure, FigureView, TableData, TableView


def _means(inputs):
    df = inputs.df
    runs = df[(df["protocol"] == "ncm") & (df["metric"] == "accuracy")].drop_duplicates("run_key")
    norms = runs["hparams"].map(lambda h: json.loads(h)["normalise"])
    return runs.groupby([runs["dataset"], norms])["value"].agg(["mean", "count"])


def by_normalisation(inputs):
    data = TableData(title="ncm: accuracy (%) by normalisation, the mean over the dims")
    for (dataset, norm), row in _means(inputs).iterrows():
        data.add_row(dataset)
        data.add_column(norm)
        data.cells[(dataset, norm)] = Cell(mean=100 * row["mean"], n=int(row["count"]))
    return data


def norms_figure(inputs):
    means = _means(inputs)
    fig, ax = plt.subplots()
    ax.bar([" ".join(k) for k in means.index], 100 * means["mean"])
    ax.set_ylabel("acme ncm accuracy (%)")
    inputs.out_dir.mkdir(parents=True, exist_ok=True)
    files = [inputs.out_dir / f"ncm_norms.{fmt}" for fmt in inputs.formats]
    for path in files:
        fig.savefig(path)
    plt.close(fig)
    return Figure("ncm-norms", "ncm accuracy by normalisation", files)


VIEWS = [
    TableView("ncm-norms", by_normalisation, summary="ncm accuracy by normalisation (acme's view)"),
    FigureView("ncm-norms", norms_figure, False, "ncm accuracy by normalisation (acme's figure)"),
]
'''

ENTRY_POINTS = (
    "[vitbench.protocols]\nncm = acme_ncm:PROTOCOL\n[vitbench.datasets]\nlow = acme_ncm:DATASETS\n"
    "[vitbench.views]\nnorms = acme_ncm_views:VIEWS\n"
)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    modules = {"acme_ncm.py": PACKAGE, "acme_ncm_views.py": VIEW_MODULE}
    return install_wheel(tmp_path_factory.mktemp("ncm"), "acme-ncm", modules, ENTRY_POINTS)


# Several `vitbench` commands in one fresh process (where only the installed wheel's entry points can
# bring the plugin in), in order, each one's exit code, stdout and stderr kept: one interpreter and
# one torch import for a test's commands, not one each (CI's 15 minutes)
DRIVER = """
import io, json, sys
from contextlib import redirect_stderr, redirect_stdout
from vitbench.cli import main
commands, answers = json.loads(sys.argv[1]), sys.argv[2]
found = []
for args in commands:
    out, err = io.StringIO(), io.StringIO()
    sys.argv = ["vitbench", *args]
    with redirect_stdout(out), redirect_stderr(err):
        try:
            main()
            code = 0
        except SystemExit as done:
            code = int(done.code or 0)
    found.append([code, out.getvalue(), err.getvalue()])
with open(answers, "w") as f:
    json.dump(found, f)
"""


def _words(help_text: str) -> str:
    """`--help`'s words in order, as one line: its panels' borders and line breaks fall where the
    terminal's width puts them, inside a sentence too."""
    return " ".join(help_text.replace("│", " ").split())


def vitbench(site, *commands: tuple) -> list[tuple[int, str, str]]:
    """`vitbench ARGS` for each of `commands`, in one process with the wheel's site on its path."""
    answers = site.parent / f"answers-{os.getpid()}-{id(commands)}.json"
    env = {**os.environ, "PYTHONPATH": str(site), "COLUMNS": "200"}
    env.pop("VITBENCH_DISABLE_PLUGIN_AUTOLOAD", None)
    listed = json.dumps([[str(a) for a in command] for command in commands])
    done = subprocess.run([sys.executable, "-c", DRIVER, listed, str(answers)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return [(code, out, err) for code, out, err in json.loads(answers.read_text())]


def test_a_protocol_and_a_dataset_from_another_package_run_end_to_end(site, tmp_path):
    results = tmp_path / "results"
    run = ("run", "--model", "vit-ti/16", "--weights", "random", "--res", "32", "--workers", "0", "--results", results)
    listed, first, again, devices, table = vitbench(
        site,
        ("ls", "protocols"),
        (*run, "--protocol", "ncm", "--dataset", "low-digits"),
        (*run, "--protocol", "ncm", "--dataset", "low-digits"),
        (*run, "--protocol", "ncm", "--dataset", "low-digits", "--devices", "2"),
        ("table", "--protocol", "ncm", "--format", "csv", "--results", results),
    )
    code, out, _ = listed
    assert code == 0 and "ncm" in out and "nearest class mean" in out
    code, _, err = first
    assert code == 0, err
    assert "[1/1] vit-ti/16 (random init) low-digits ncm dims=0: accuracy" in err

    import duckdb

    con = duckdb.connect(str(results / "vitbench.duckdb"), read_only=True)
    protocol, version, dataset, source, value = con.execute(
        "SELECT protocol, protocol_version, dataset, data_source, value FROM runs JOIN metrics USING (run_key)"
    ).fetchone()
    con.close()
    assert (protocol, version, dataset, source) == ("ncm", "ncm/1", "low-digits", "acme")
    assert 0.2 < value <= 1.0  # five classes: chance is 0.2, and a random ViT's features separate digits

    code, _, err = again
    assert code == 0 and "1 already stored, 0 to run" in err
    code, _, err = devices
    assert code == 2 and "--devices 2: the ncm protocol runs on one process only: run it without --devices" in err
    code, csv, err = table
    assert code == 0, err
    cells = [line for line in csv.splitlines() if line.startswith("Digits 0-4,")]
    assert len(cells) == 1 and float(cells[0].split(",")[2]) == pytest.approx(value * 100)


def test_the_plugins_own_axis_shows_in_the_table_the_plot_and_the_report(site, tmp_path):
    """Issue 48: a protocol with an axis vitbench does not know (`dims`), declared in the plugin
    only: a table column per value, `vitbench plot ncm` draws its accuracy against the axis, and
    the report gives it a section with that figure and a column in the summary."""
    results, plots = tmp_path / "results", tmp_path / "plots"
    run = ("run", "--model", "vit-ti/16", "--weights", "random", "--res", "32", "--workers", "0", "--results", results)
    ran, table, plot, report, view, table_help, view_plot, plot_help = vitbench(
        site,
        (*run, "--protocol", "ncm", "--dataset", "low-digits", "--ncm-dims", "2,8,0"),
        ("table", "--protocol", "ncm", "--format", "csv", "--results", results),
        ("plot", "ncm", "--results", results, "--out", plots, "--formats", "svg"),
        ("report", "--out", tmp_path / "r.html", "--results", results),
        # a view from the same package (the `vitbench.views` group): `table --view NAME` and its help
        ("table", "--view", "ncm-norms", "--format", "csv", "--results", results),
        ("table", "--help"),
        ("plot", "ncm-norms", "--results", results, "--out", plots, "--formats", "svg"),
        ("plot", "--help"),
    )
    code, _, err = ran
    assert code == 0, err
    assert "low-digits ncm dims=2: accuracy" in err and "low-digits ncm dims=8: accuracy" in err
    code, csv, err = table
    assert code == 0, err
    columns = [line.split(",")[1] for line in csv.splitlines() if line.startswith("Digits 0-4,")]
    assert columns == ["dims=0", "dims=2", "dims=8"]  # (one model: it is named in the title, with its †)
    code, _, err = plot
    assert code == 0 and (plots / "ncm_dims.svg").is_file(), err
    assert "against principal components kept" in (plots / "ncm_dims.svg").read_text()
    code, _, err = report
    page = (tmp_path / "r.html").read_text()
    assert code == 0 and '<section id="ncm">' in page and 'id="figure-ncm"' in page, err
    assert '<th><span class="part">nearest-class-mean</span></th>' in page  # its column in the summary
    code, csv, err = view
    mean = 100 * sum(_accuracies(results)) / 3
    assert code == 0 and f"low-digits,l2,{mean:.4f},,3," in csv, (csv, err)
    code, shown, _ = table_help
    assert code == 0 and "ncm-norms: ncm accuracy by normalisation (acme's view)" in _words(shown)
    code, _, err = view_plot
    assert code == 0 and "acme ncm accuracy (%)" in (plots / "ncm_norms.svg").read_text(), err
    code, shown, _ = plot_help
    assert code == 0 and "ncm-norms: ncm accuracy by normalisation (acme's figure)" in _words(shown)


def _accuracies(results) -> list[float]:
    import duckdb

    con = duckdb.connect(str(results / "vitbench.duckdb"), read_only=True)
    rows = con.execute("SELECT value FROM metrics JOIN runs USING (run_key) WHERE protocol = 'ncm' "
                       "AND name = 'accuracy'").fetchall()  # fmt: skip
    con.close()
    return [v for (v,) in rows]


def _hparams(results) -> list[dict]:
    import duckdb

    con = duckdb.connect(str(results / "vitbench.duckdb"), read_only=True)
    rows = con.execute("SELECT hparams FROM runs WHERE protocol = 'ncm' ORDER BY started_at").fetchall()
    con.close()
    return [json.loads(h) for (h,) in rows]


def test_the_plugins_own_option_is_a_flag_a_config_key_and_stored(site, tmp_path):
    """Issue 30: a plugin protocol's option shows in `vitbench run --help` in its own panel (after
    the built-in protocols' panels), runs from the command line and from a `[protocols.ncm]`
    table, is stored in the run's hparams, and a wrong value is one line naming the flag."""
    results = tmp_path / "results"
    run = ("run", "--model", "vit-ti/16", "--weights", "random", "--res", "32", "--workers", "0",
           "--protocol", "ncm", "--dataset", "low-digits", "--results", results)  # fmt: skip
    config, misplaced = tmp_path / "ncm.toml", tmp_path / "misplaced.toml"
    config.write_text('[protocols.ncm]\nncm_norm = "l2"\nncm_dims = [0]\n')  # a TOML array for the list
    misplaced.write_text('[protocols.fewshot]\nncm_norm = "l2"\n')
    helped, flag, configured, printed, wrong, misplaced_answer = vitbench(
        site,
        ("run", "--help"),
        (*run, "--ncm-norm", "none"),
        (*run, "--config", config),
        (*run, "--ncm-norm", "none", "--print-config"),
        (*run, "--ncm-norm", "cosine"),
        (*run, "--config", misplaced),
    )
    code, shown, err = helped
    assert code == 0, err
    panel = shown.find("─ Nearest class mean (--protocol ncm) ─")
    assert -1 < shown.find("─ Pre-training (--protocol pretrain) ─") < panel < shown.find("─ Devices and precision ─")
    assert "--ncm-norm" in shown[panel:] and "l2 or none" in shown[panel:] and "[default: l2]" in shown[panel:]
    assert "--ncm-dims" in shown[panel:]  # the axis' option, a list
    assert flag[0] == 0, flag[2]
    assert configured[0] == 0, configured[2]
    assert [h["normalise"] for h in _hparams(results)] == ["none", "l2"]  # two runs: two keys
    code, text, err = printed
    assert code == 0 and 'ncm_norm = "none"' in text, err
    code, _, err = wrong
    assert code == 2 and "--ncm-norm cosine: expected l2 or none" in err and "Traceback" not in err
    code, _, err = misplaced_answer
    assert code == 2 and "key 'ncm_norm' is not an option of fewshot; ncm reads it" in err


def test_a_protocol_registered_in_process_runs_through_the_python_api(tmp_path):
    """A notebook's way: `register` a protocol object, then `vitbench.run` and `vitbench.results`."""
    import vitbench
    from vitbench.errors import UserError
    from vitbench.protocols import registry

    namespace: dict = {}
    exec(PACKAGE, namespace)  # the same protocol, defined in this process instead of installed
    registry.register(namespace["PROTOCOL"])
    try:
        summary = vitbench.run(
            model="vit-ti/16", weights="random", protocol="ncm", datasets="digits", res=32, workers=0,
            results=tmp_path,
        )  # fmt: skip
        assert [s.protocol for s in summary.specs] == ["ncm"] and summary.ran == 1
        frame = vitbench.results(tmp_path, where=["protocol=ncm"])
        assert len(frame) == 1 and 0.1 < frame["accuracy"].iloc[0] <= 1.0 and frame["dims"].iloc[0] == 0
        # its own option, as a keyword of the API (issue 30): stored in the run's hparams
        plain = vitbench.plan(model="vit-ti/16", weights="random", protocol="ncm", datasets="digits", res=32,
                              ncm_norm="none", results=tmp_path)  # fmt: skip
        assert plain[0].specs[0].hparams["normalise"] == "none"
        along = vitbench.plan(model="vit-ti/16", weights="random", protocol="ncm", datasets="digits", res=32,
                              ncm_dims=[2, 8], results=tmp_path)  # fmt: skip
        assert [s.hparams["dims"] for s in along[0].specs] == [2, 8]  # one run per value of its axis
        with pytest.raises(UserError, match="--ncm-norm cosine: expected l2 or none"):
            vitbench.plan(model="vit-ti/16", weights="random", protocol="ncm", datasets="digits", ncm_norm="cosine")
        with pytest.raises(UserError, match="--protocol nope: expected fewshot, finetune, .*, pretrain, ncm"):
            registry.get_protocol("nope")
    finally:
        registry.protocols().unregister("ncm")


@pytest.mark.parametrize(
    "member, replaced_by",
    [("resolution", "inputs().res"), ("preprocessing", "inputs().recipe"), ("planned_work", "work().images"),
     ("jobs", "work().waves"), ("data_parallel", "work().data_parallel"), ("followups", "only a Trainer")],
)  # fmt: skip
def test_a_protocol_written_for_the_old_contract_is_refused_naming_what_replaced_the_member(member, replaced_by):
    """Issue 48 folded six members into inputs(), work() and Trainer: a plugin that still sets one
    would run with its size, preprocessing or cost silently ignored, so its class is refused with
    one line (its entry point is then skipped with that line as the warning)."""
    from vitbench.protocols.base import Protocol, Trainer

    with pytest.raises(TypeError, match=rf"protocol Old: `{member}` is no longer read: .*{re.escape(replaced_by)}"):
        type("Old", (Protocol,), {member: True})
    assert issubclass(type("Pretraining", (Trainer,), {"followups": lambda self, req, groups: []}), Protocol)
