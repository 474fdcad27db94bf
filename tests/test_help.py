"""What `--help` and a piped table show a person: every option's own words, grouped, in full."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import typer.main

from vitbench.cli import app

RUN_PANELS = [
    "What to run",
    "Data",
    "Few-shot, k-NN, linear probe and eval",
    "Fine-tuning (--protocol finetune)",
    "Pre-training (--protocol pretrain)",
    "Devices and precision",
    "Several nodes (torchrun)",
    "Output",
]


def _commands(group=None, path=()):
    """(argv path, click command) for every command and sub-command of `vitbench`."""
    group = group or typer.main.get_command(app)
    for name, command in group.commands.items():
        yield (*path, name), command
        if hasattr(command, "commands"):
            yield from _commands(command, (*path, name))


def _help(cli, monkeypatch, *path: str) -> str:
    monkeypatch.setenv("COLUMNS", "4000")  # one line per option: the help is searched as written
    code, stdout, stderr = cli(*path, "--help")
    assert code == 0, stderr
    return " ".join(stdout.split())


def test_every_option_shows_its_bracketed_help_text(cli, monkeypatch):
    """Rich markup took `[default: 0,1,2]` and `[suites.NAME]` for style tags and printed nothing
    in their place ("Comma-separated seeds ."): each option's help must appear as written."""
    checked = 0
    for path, command in _commands():
        shown = _help(cli, monkeypatch, *path)
        for param in command.params:
            text = getattr(param, "help", None)
            if text and "[" in text:
                written = " ".join(text.replace("\\[", "[").split())
                assert written in shown, f"vitbench {' '.join(path)} --help: {param.name}'s help lost its text"
                checked += 1
    assert checked >= 15  # the run, bench and table options that carry a [default: …]


def test_run_help_groups_its_options_by_purpose(cli, monkeypatch):
    shown = _help(cli, monkeypatch, "run")
    where = [shown.find(f"─ {panel} ─") for panel in RUN_PANELS]
    assert -1 not in where, [p for p, at in zip(RUN_PANELS, where, strict=True) if at == -1]
    assert where == sorted(where)  # what to run first, output last
    what = shown[where[0] : where[1]]
    for option in ("--model", "--weights", "--dataset", "--protocol", "--seeds", "--shots", "--dry-run"):
        assert option in what
    for form in ("timm:<architecture>", ".npz", "a folder of checkpoints", "glob", "run:<key>", "random"):
        assert form in what  # --weights names every form it accepts
    assert "pretrain" in what  # --protocol lists every built-in protocol
    nodes = shown[where[6] : where[7]]
    assert "--nnodes" in nodes and "--rdzv-endpoint" in nodes
    # the cluster's options are `vitbench submit`'s (issue 30.4): the everyday command is shorter
    assert "--partition" not in shown and "--gpus-per-job" not in shown and "vitbench submit" in shown
    jobs = _help(cli, monkeypatch, "submit")
    panels = [jobs.find(f"─ {panel} ─") for panel in ("What to run", "Cluster jobs (submitit)", "Output")]
    assert -1 not in panels and panels == sorted(panels)
    assert "--partition" in jobs[panels[1] : panels[2]] and "--nnodes" not in jobs


def test_commands_are_listed_in_the_order_a_person_uses_them(cli, monkeypatch):
    shown = _help(cli, monkeypatch)
    order = [
        "run",
        "submit",
        "table",
        "report",
        "compare",
        "plot",
        "export",
        "ingest",
        "bench",
        "dedup",
        "inspect",
        "ls",
        "doctor",
    ]
    where = [shown.find(f"│ {name} ") for name in order]
    assert -1 not in where and where == sorted(where), dict(zip(order, where, strict=True))


@pytest.fixture(scope="module")
def piped_table(one_run) -> str:
    """`vitbench table` with stdout a pipe and no COLUMNS: what `| less` or `> file` receives."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    done = subprocess.run(
        [sys.executable, "-m", "vitbench", "table", "--results", str(one_run)],
        capture_output=True,
        text=True,
        env=env,
        stdin=subprocess.DEVNULL,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_piped_table_keeps_its_full_width(piped_table):
    """Piped, rich used to cut to 80 columns and wrap the provenance footnote into pieces: each
    footnote is now one line, whole, however long."""
    lines = piped_table.splitlines()
    provenance = [line for line in lines if line.startswith("[1-shot] weights random init")]
    assert len(provenance) == 1, piped_table
    assert provenance[0].rstrip().endswith(")")  # `… vitbench 0.1.0 (git …)`, not cut
    assert max(len(line) for line in lines) > 80
    assert "…" not in piped_table
