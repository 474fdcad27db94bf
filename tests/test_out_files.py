"""What a command writes is the regular file it was asked to write, or a one-line refusal: an `--out`
that is a symbolic link, a FIFO, a device or a path in a missing folder is never replaced by a file,
nor the folder made (issue 71, item 1, for the commands that write one file: table, report, export
and its --cells)."""

from __future__ import annotations

import os

import pytest
from test_tables import build_store

COMMANDS = {
    "table": ["table", "--format", "csv"],
    "report": ["report"],
    "export": ["export", "--format", "csv"],
    "export --cells": ["export", "--cells", "--format", "csv"],
}


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    return build_store(tmp_path_factory.mktemp("out-files") / "results")


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_out_that_is_not_a_regular_file_is_refused_untouched(cli, stored, tmp_path, command):
    target = tmp_path / "kept.txt"
    target.write_text("not vitbench's")
    (tmp_path / "link.csv").symlink_to(target)
    os.mkfifo(tmp_path / "fifo.csv")
    nodes = {"link.csv": "symbolic link", "fifo.csv": "not a regular file", "nodir/x.csv": "no folder"}
    if hasattr(os, "mknod") and os.geteuid() == 0:  # a character device (/dev/null's numbers), where it can be made
        os.mknod(tmp_path / "device.csv", 0o644 | 0o020000, os.makedev(1, 3))
        nodes["device.csv"] = "not a regular file"
    before = {p.name: (p.is_symlink(), p.lstat().st_mode) for p in tmp_path.iterdir()}
    for name, said in nodes.items():
        code, _, err = cli(*COMMANDS[command], "--out", tmp_path / name, "--results", stored)
        assert code == 2 and said in err and len(err.strip().splitlines()) == 1, (name, err)
    assert {p.name: (p.is_symlink(), p.lstat().st_mode) for p in tmp_path.iterdir()} == before
    assert target.read_text() == "not vitbench's" and not (tmp_path / "nodir").exists()
    code, _, err = cli(*COMMANDS[command], "--out", tmp_path / "written.csv", "--results", stored)
    assert code == 0 and (tmp_path / "written.csv").is_file(), err  # a regular file is written as asked
