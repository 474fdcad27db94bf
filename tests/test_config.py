"""`vitbench run --config exp.toml` and `--print-config` (issue 17, part 3): a command becomes a file
and back, the command line wins over the file, suites can be defined in it, each run stores the
resolved config and its hash, and mistakes name the file, the key and what was expected."""

from __future__ import annotations

import hashlib
import json
import tomllib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vitbench import store

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "paper-table2.toml"
FAST = ("--model", "vit-ti/16", "--weights", "random", "--dataset", "digits", "--res", "32", "--workers", "0")


def test_print_config_round_trips(cli, tmp_path):
    code, first, err = cli("run", *FAST, "--shots", "1,5", "--seeds", "0,2", "--lr", "0.01", "--print-config")
    assert code == 0, err
    config = tmp_path / "exp.toml"
    config.write_text(first)
    parsed = tomllib.loads(first)
    assert parsed["model"] == ["vit-ti/16"] and parsed["shots"] == [1, 5] and parsed["seeds"] == [0, 2]
    assert parsed["lr"] == 0.01 and parsed["res"] == 32 and "print_config" not in parsed and "dry_run" not in parsed
    code, second, err = cli("run", "--config", config, "--print-config")
    assert code == 0 and second == first, err
    code, third, _ = cli("run", "--config", config, "--seeds", "7", "--print-config")  # the command line wins
    assert tomllib.loads(third)["seeds"] == [7] and tomllib.loads(third)["shots"] == [1, 5]


def test_the_paper_table2_example_plans(cli, tmp_path, cifar10_dir, caplog):
    # a named accelerator's rate: the plan is what is checked, not this CPU's forward pass of a ViT-L at 384 px
    code, out, err = cli("run", "--config", EXAMPLE, "--data-dir", cifar10_dir, "--results", tmp_path, "--dry-run",
                         "--assume-mfu", "0.4@H100")  # fmt: skip
    assert code == 0, err
    rows = [line for line in out.splitlines() if "vit-l/16" in line and "cifar10" in line]
    sweep = [r for r in rows if "sweep" in r]
    assert len(sweep) == 4 and "res=384" in out and "seed=2" in out  # Table 4's grid, then 3 seeds
    assert "the dry run plans it by name" in caplog.text  # the checkpoint is not downloaded here


def test_a_suite_defined_in_the_config_file(cli, tmp_path):
    config = tmp_path / "mine.toml"
    config.write_text(
        'suite = "mine"\nseeds = [0]\nshots = [1]\nres = 32\nworkers = 0\n\n'
        '[suites.mine]\ndatasets = ["digits"]\nprotocol = "fewshot"\nmodel = "vit-ti/16"\nweights = "random"\n'
    )
    results = tmp_path / "results"
    code, _, err = cli("run", "--config", config, "--results", results)
    assert code == 0, err
    run = store.read_results(results).iloc[0]
    stored = json.loads(run["notes"])["config"]
    assert run["dataset"] == "digits" and stored["sha256"] == hashlib.sha256(stored["toml"].encode()).hexdigest()
    assert tomllib.loads(stored["toml"])["suites"]["mine"]["datasets"] == ["digits"]  # the file reruns it


@pytest.mark.parametrize(
    "text,message",
    [
        ('modle = "vit-ti/16"\n', "unknown key 'modle'; did you mean 'model'?"),
        ('seeds = "zero"\n', "key 'seeds': expected integers or a list of them"),
        ("res = 32.5\n", "key 'res': expected an integer, got 32.5"),
        ('model = "vit-q/16"\n', "key 'model': unknown model 'vit-q/16'"),
        ('datasets = ["digitz"]\n', "key 'datasets': unknown dataset 'digitz'"),
        ('dataset = "digits"\ndatasets = ["digits"]\n', "keys 'dataset' and 'datasets' are one option"),
        ("[suites.x]\nprotocol = 'fewshot'\n", "suite 'x': expected datasets = ["),
        ("model = \n", "not valid TOML"),
        ('partition = "gpu"\n', "key 'partition' is an option of `vitbench submit`, not of this command"),
        ('executor = "submitit"\n', "key 'executor': cluster jobs are `vitbench submit` now"),
    ],
)
def test_config_mistakes_are_one_line_naming_file_and_key(cli, tmp_path, text, message):
    config = tmp_path / "bad.toml"
    config.write_text(text)
    code, _, err = cli("run", "--config", config, "--dry-run", "--results", tmp_path)
    assert code != 0 and str(config) in err and message in err and "Traceback" not in err


def _keys(out: str) -> list[str]:
    return [line.split()[0] for line in out.splitlines() if line[:12].isalnum() and len(line.split()[0]) == 12]


@pytest.mark.parametrize(
    "flags",
    [
        ("--shots", "1,5", "--seeds", "0,1"),
        ("--protocol", "fewshot,knn", "--shots", "2", "--seeds", "0", "--knn-k", "5,20"),
        ("--protocol", "finetune", "--smoke", "--steps", "3", "--lr", "0.01", "--seeds", "0,1"),
        ("--fewshot-l2", "sweep", "--shots", "1", "--seeds", "3", "--fewshot-train", "full"),
        (
            "--protocol",
            "pretrain",
            "--pretrain-subset",
            "10%,100%",
            "--steps",
            "3",
            "--objective",
            "mpp",
            "--transfer",
            "digits5-9",
            "--transfer-shots",
            "1,5",
        ),  # fmt: skip
    ],
)
def test_the_printed_config_plans_the_same_run_keys(cli, tmp_path, flags):
    results = ("--results", tmp_path / "results")
    code, printed, err = cli("run", *FAST, *flags, *results, "--print-config")
    assert code == 0, err
    config = tmp_path / "exp.toml"
    config.write_text(printed)
    _, direct, _ = cli("run", *FAST, *flags, *results, "--dry-run")
    _, from_file, _ = cli("run", "--config", config, "--dry-run")
    assert _keys(direct) and _keys(direct) == _keys(from_file)


@settings(derandomize=True, deadline=None, max_examples=200, database=None)
@given(text=st.text(), suite=st.text(min_size=1))
def test_every_text_value_round_trips_through_the_printed_toml(text, suite):
    """Before: non-ASCII beyond U+FFFF was written as JSON's surrogate pairs and a suite name with a
    space as a bare table key: --print-config's own output did not load back."""
    from vitbench.catalog.suites import SUITES, Suite
    from vitbench.cli.config import to_toml

    SUITES.register(Suite(suite, (text, "digits"), "fewshot", f"defined in {text}", {"weights": text}))
    try:
        printed = to_toml({"data_dir": text, "datasets": "a,b", "suite": suite, "lr": 0.5},
                          {"data_dir": "path", "datasets": "str", "suite": "str", "lr": "float"})  # fmt: skip
    finally:
        SUITES.unregister(suite)
    loaded = tomllib.loads(printed)
    assert loaded["data_dir"] == text and loaded["datasets"] == ["a", "b"] and loaded["suite"] == suite
    mine = loaded["suites"][suite]
    assert (
        mine["datasets"] == [text, "digits"] and mine["weights"] == text and mine["description"] == f"defined in {text}"
    )


def test_a_path_that_is_not_utf8_cannot_be_printed_but_a_run_still_records_it():
    from vitbench.cli.config import to_toml
    from vitbench.errors import UserError

    name = b"/data/caf\xe9".decode("utf-8", "surrogateescape")  # a Latin-1 folder name, as Python lists it
    with pytest.raises(UserError, match="is not UTF-8 text; a TOML file cannot hold it"):
        to_toml({"data_dir": name}, {"data_dir": "path"})
    assert (
        tomllib.loads(to_toml({"data_dir": name}, {"data_dir": "path"}, strict=False))["data_dir"] == "/data/caf\ufffd"
    )


def test_an_older_config_loads_by_todays_names(cli, tmp_path, caplog):
    """The CLI, the config and the API share one vocabulary (issue 30): `datasets`,
    `extraction_batch` and `compile` are the API's keywords and today's keys. A config written with
    the old keys still runs, says the key to write instead, and prints back with today's names."""
    config = tmp_path / "old.toml"
    config.write_text(
        'model = "vit-ti/16"\nweights = "random"\ndataset = ["digits"]\nbatch_size = 128\ncompile_model = false\n'
    )
    code, printed, err = cli("run", "--config", config, "--print-config")
    assert code == 0, err
    parsed = tomllib.loads(printed)
    assert parsed["datasets"] == ["digits"] and parsed["extraction_batch"] == 128 and parsed["compile"] is False
    assert not {"dataset", "batch_size", "compile_model"} & set(parsed)
    assert "key 'batch_size' is now 'extraction_batch'" in caplog.text


def test_one_vocabulary_for_the_command_line_a_config_and_the_api():
    """Each option of `vitbench run` has one name: its flag (`--extraction-batch`), its config key and
    its API keyword (`extraction_batch`). The options only the command has (how this one command
    runs: a dry run, torchrun, a cluster) are named here, so a new one is a decision, not a drift."""
    import typer

    from vitbench.cli.app import app
    from vitbench.protocols.requests import known_options

    command_only = {"rerun", "dry_run", "explain", "assume_mfu", "price_on", "print_config", "devices", "nnodes",
                    "node_rank", "rdzv_endpoint", "rdzv_id", "rdzv_backend", "cluster", "partition", "gpus_per_job",
                    "nodes", "time_limit", "cpus_per_job", "mem_gb", "array_parallelism", "slurm_account",
                    "slurm_qos", "no_wait"}  # fmt: skip
    api = set(known_options())
    for command_name in ("run", "submit"):
        command = typer.main.get_command(app).commands[command_name]  # type: ignore[attr-defined]
        options = {p.name: p for p in command.params if p.name != "help"}
        for name, parameter in options.items():
            long = [flag for flag in parameter.opts if flag.startswith("--")]
            assert long[0] == "--" + name.replace("_", "-"), (name, parameter.opts)  # the first is the name
            assert (name in api) != (name in command_only), name
        assert api == set(options) - command_only


def test_a_submit_config_holds_the_jobs_options_and_reruns(cli, tmp_path):
    """`vitbench submit --print-config` writes the jobs' options beside the run's; the file loads
    back into `vitbench submit` as it was written."""
    code, printed, err = cli("submit", *FAST, "--cluster", "local", "--time-limit", "30", "--print-config")
    assert code == 0, err
    parsed = tomllib.loads(printed)
    assert parsed["cluster"] == "local" and parsed["time_limit"] == 30 and parsed["model"] == ["vit-ti/16"]
    config = tmp_path / "jobs.toml"
    config.write_text(printed)
    code, again, err = cli("submit", "--config", config, "--print-config")
    assert code == 0 and again == printed, err


def test_a_protocol_option_is_one_typed_object_from_the_command_line_a_config_and_the_api(tmp_path):
    """`--knn-k 10,20`, `knn_k = [10, 20]` and `knn_k=(10, 20)` make the same `KnnOptions` object
    (the config's array never becomes the text "10,20"); a class others extend reads the values
    given to them (`TrainingOptions.of`: `--checkpoint-every` reached pre-training through it); a
    Request field's default and check are its declaration's, which the command line takes."""
    import dataclasses

    import typer

    from vitbench.api import request
    from vitbench.cli import run as run_cli
    from vitbench.protocols.base import Request
    from vitbench.protocols.knn import KnnOptions
    from vitbench.protocols.pretrain import PretrainOptions
    from vitbench.protocols.shared_options import TrainingOptions

    command = typer.main.get_command(run_cli.app).commands["run"]  # type: ignore[attr-defined]
    flag = next(p for p in command.params if p.name == "knn_k")
    context = command.make_context("run", ["--knn-k", "10,20"])
    from_flag = run_cli._request(context.params)
    config = tmp_path / "knn.toml"
    config.write_text("knn_k = [10, 20]\n")
    from_file = flag.process_value(context, tomllib.loads(config.read_text())["knn_k"])
    assert from_file == (10, 20) and context.params["knn_k"] == (10, 20)
    from_api = request(knn_k=[10, 20])
    assert KnnOptions.of(from_flag) == KnnOptions.of(from_api) == KnnOptions(knn_k=(10, 20))
    assert KnnOptions.of(from_api) is KnnOptions.of(from_api)  # made once, when the request was
    assert "knn_k" in from_api.options and "shots" not in from_api.options
    assert KnnOptions.of(request()) == KnnOptions()  # nothing given: the declared defaults

    trained = request(checkpoint_every=4, steps=7)
    assert TrainingOptions.of(trained).checkpoint_every == 4 == PretrainOptions.of(trained).checkpoint_every
    assert TrainingOptions.of(trained).steps == 7

    defaults = {p.name: p.default for p in command.params}
    assert defaults["extraction_batch"] == Request().extraction_batch == 64
    # the API and the command line: one default for every field they share (datasets and tracker
    # are comma text on the command line; --config is the file, Request.config its resolved text)
    text_here = {"datasets", "tracker", "config", "options"}
    shared = {f.name for f in dataclasses.fields(Request)} - text_here
    assert shared <= set(defaults) and {n: defaults[n] for n in shared} == {n: getattr(Request(), n) for n in shared}
    with pytest.raises(Exception, match="--extraction-batch 0: expected an integer from 1 to 65536"):
        request(extraction_batch=0)
