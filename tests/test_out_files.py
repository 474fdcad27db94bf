"""What a command writes is the regular file it was asked to write, or a one-line refusal: an `--out`
that is a symbolic link, a FIFO, a device, a read-only file or a path in a missing folder is never
replaced by a file, nor the folder made; `-` and a URL are refused, not written as local files named
so (issue 71, item 1: table, report, export and its --cells, dedup; plot's and inspect's output
folders, and the files vitbench writes inside them)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_tables import build_store

COMMANDS = {
    "table": ["table", "--format", "csv"],
    "report": ["report"],
    "export": ["export", "--format", "csv"],
    "export --cells": ["export", "--cells", "--format", "csv"],
    "dedup": ["dedup", "--dataset", "digits"],  # refused before any search: none is written here
}
FOLDER_COMMANDS = {
    "plot": ["plot", "fewshot", "--formats", "png"],
    "inspect": ["inspect", "--model", "vit-ti/16", "--weights", "random", "--dataset", "digits", "--res", "32"],
}


def hostile_nodes(tmp_path, target) -> dict[str, str]:
    """Names under `tmp_path` that are not a regular file vitbench may write -> what the refusal says."""
    (tmp_path / "link.csv").symlink_to(target)
    os.mkfifo(tmp_path / "fifo.csv")
    (tmp_path / "read-only.csv").write_text("mine")
    (tmp_path / "read-only.csv").chmod(0o444)
    nodes = {"link.csv": "symbolic link", "fifo.csv": "not a regular file", "nodir/x.csv": "no folder",
             "read-only.csv": "read-only"}  # fmt: skip
    if hasattr(os, "mknod") and os.geteuid() == 0:  # a character device (/dev/null's numbers), where it can be made
        os.mknod(tmp_path / "device.csv", 0o644 | 0o020000, os.makedev(1, 3))
        nodes["device.csv"] = "not a regular file"
    return nodes


def tree(folder) -> dict:
    return {str(p.relative_to(folder)): (p.is_symlink(), p.lstat().st_mode) for p in folder.rglob("*")}


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    return build_store(tmp_path_factory.mktemp("out-files") / "results")


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_out_that_is_not_a_regular_file_is_refused_untouched(cli, stored, tmp_path, command):
    target = tmp_path / "kept.txt"
    target.write_text("not vitbench's")
    nodes = hostile_nodes(tmp_path, target)
    before = tree(tmp_path)
    for name, said in [*nodes.items(), ("-", "expected a file name"), ("s3://bucket/x.csv", "a URL")]:
        out = name if name in ("-", "s3://bucket/x.csv") else tmp_path / name
        code, _, err = cli(*COMMANDS[command], "--out", out, "--results", stored)
        assert code == 2 and said in err and len(err.strip().splitlines()) == 1, (name, err)
    assert tree(tmp_path) == before and not Path("-").exists() and not Path("s3:").exists()
    assert target.read_text() == "not vitbench's" and (tmp_path / "read-only.csv").read_text() == "mine"
    if command != "dedup":  # a regular file is written as asked
        code, _, err = cli(*COMMANDS[command], "--out", tmp_path / "written.csv", "--results", stored)
        assert code == 0 and (tmp_path / "written.csv").is_file(), err


@pytest.mark.parametrize("command", sorted(FOLDER_COMMANDS))
def test_an_out_folder_that_is_not_one_is_refused_untouched(cli, stored, tmp_path, command):
    target = tmp_path / "kept.txt"
    target.write_text("not vitbench's")
    nodes = {**hostile_nodes(tmp_path, tmp_path / "nothing"), "nodir/plots": "no folder", "kept.txt": "is a file"}
    nodes.update({"link.csv": "symbolic link to nothing", "read-only.csv": "is a file", "fifo.csv": "not a folder"})
    if "device.csv" in nodes:
        nodes["device.csv"] = "not a folder"
    before = tree(tmp_path)
    for name, said in [*nodes.items(), ("-", "expected a folder"), ("gs://bucket/plots", "a URL")]:
        out = name if name in ("-", "gs://bucket/plots") else tmp_path / name
        code, _, err = cli(*FOLDER_COMMANDS[command], "--out", out, "--results", stored)
        assert code == 2 and said in err and len(err.strip().splitlines()) == 1, (name, err)
    assert tree(tmp_path) == before and target.read_text() == "not vitbench's"


def test_a_link_inside_an_out_folder_is_not_written_through(cli, stored, tmp_path):
    """plot writes its own names inside the folder: one of them a link to another file is refused,
    the file it points to untouched; the folder itself may be a link (written into, not replaced)."""
    target = tmp_path / "kept.png"
    target.write_bytes(b"not vitbench's")
    plots = tmp_path / "plots"
    plots.mkdir()
    (plots / "fewshot_shots.png").symlink_to(target)
    code, _, err = cli(*FOLDER_COMMANDS["plot"], "--out", plots, "--results", stored)
    assert code != 0 and "symbolic link" in err and "Traceback" not in err, err
    assert target.read_bytes() == b"not vitbench's" and (plots / "fewshot_shots.png").is_symlink()
    (plots / "fewshot_shots.png").unlink()
    (tmp_path / "via-link").symlink_to(plots)
    code, _, err = cli(*FOLDER_COMMANDS["plot"], "--out", tmp_path / "via-link", "--results", stored)
    assert code == 0 and (plots / "fewshot_shots.png").is_file() and (tmp_path / "via-link").is_symlink(), err
