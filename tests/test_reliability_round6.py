"""Issue 81, reliability round 6: a diverged backbone, a long sweep or a signal never becomes a wrong or
lost number. One test per item, each seen failing on the main it was written against."""

from __future__ import annotations

from pathlib import Path

import pytest

from vitbench import registry, store

FEWSHOT = ("--dataset", "digits", "--res", "32", "--shots", "2", "--seeds", "0", "--workers", "0")


def _overflowing_weights(path: Path) -> Path:
    """A ViT-Ti whose final LayerNorm scales by 3e38: every feature beyond float32's range (inf) from a
    checkpoint of finite numbers (a checkpoint holding a NaN is refused as it is read)."""
    import torch
    from safetensors.torch import save_file

    spec = registry.get_model("vit-ti/16")
    model = spec.backend.create(spec, num_classes=0, img_size=224)
    with torch.no_grad():
        model.norm.weight.fill_(3e38)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


def test_item2_features_with_inf_stop_the_run_and_store_nothing(cli, tmp_path):
    """Before: 9.91 % (chance) stored, exit 0, no warning."""
    weights = _overflowing_weights(tmp_path / "diverged.safetensors")
    results = tmp_path / "results"
    for protocol in ("fewshot", "knn", "linear"):
        code, _, err = cli("run", "--model", "vit-ti/16", "--weights", str(weights), "--protocol", protocol,
                           *FEWSHOT, "--results", str(results))  # fmt: skip
        last = err.strip().splitlines()[-1]
        assert code == 2, (protocol, err[-500:])
        assert last.startswith(f"error: vit-ti/16 ({weights}) on digits ") and "have non-finite features" in last
        assert "nothing stored" in last
    assert not (results / "vitbench.duckdb").exists() or store.read_results(results).empty


def test_item2_zero_width_or_nan_features_are_refused_before_caching():
    from types import SimpleNamespace

    import numpy as np

    from vitbench.engine.features import check_features
    from vitbench.errors import UserError

    group = SimpleNamespace(model=SimpleNamespace(name="acme-cnn"), weights=SimpleNamespace(random=True, path="random"),
                            dataset=SimpleNamespace(name="digits"))  # fmt: skip
    with pytest.raises(
        UserError, match=r"acme-cnn \(random init\) on digits train: the backbone's features are \(0,\) wide"
    ):
        check_features(np.zeros((4, 0), np.float32), group, "train")
    values = np.ones((5, 3), np.float32)
    values[3, 1] = np.nan
    with pytest.raises(UserError, match=r"1 of 5 images have non-finite features \(NaN or inf\), the first at image 3"):
        check_features(values, group, "test")
    check_features(np.ones((5, 3), np.float32), group, "test")  # finite: nothing said


@pytest.mark.slow
@pytest.mark.parametrize("name", ["SIGTERM", "SIGHUP"])
def test_item8_sigterm_and_sighup_end_a_run_as_ctrl_c_does(tmp_path, name):
    """Before: SIGTERM killed `vitbench run` in 0.2 s with no line, its leases and the store's WAL left
    behind, and the next run printed a raw dict per stale lease."""
    import signal
    import subprocess
    import sys
    import time

    results = tmp_path / "results"
    command = [sys.executable, "-m", "vitbench", "run", "--model", "vit-ti/16", "--weights", "random", *FEWSHOT[:-4],
               "--shots", "1,2", "--seeds", "0,1", "--workers", "1", "--results", str(results)]  # fmt: skip
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list((results / "leases").glob("*")) and time.monotonic() < deadline:  # a run under way
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.02)
    proc.send_signal(getattr(signal, name))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-1000:]
    assert err.strip().splitlines()[-1].startswith("interrupted: "), err[-1000:]
    assert "Traceback" not in err
    left = {p.name[:12]: p.read_text() for p in (results / "leases").glob("*")}
    assert not left, f"leases left behind: {left}"
    assert not (results / "vitbench.duckdb.wal").exists()
    if name == "SIGHUP":
        return  # the same code path as SIGTERM's from here
    again = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-1000:]
    assert "stale lease" not in again.stderr
    runs = store.read_results(results)
    assert runs["run_key"].nunique() == 4 and len(runs.drop_duplicates(["run_key", "metric"])) == len(runs)


def test_item8_a_stale_lease_is_described_not_dumped():
    from vitbench.execution.lease import describe_holder

    holder = {"token": "abc", "host": "node7", "pid": 4123, "slurm_job": "991", "taken_at": 1795877000.0}
    assert describe_holder(holder) == "process 4123 on node7 (SLURM job 991), taken 2026-11-28 14:43 UTC"
    assert describe_holder({}) == "its file names no holder"


def test_item7_two_weights_files_with_the_same_bytes_are_one_set_of_runs(cli, tmp_path):
    """Before: "2 runs planned … 2 to run", one run done and stored, no word about the other."""
    import shutil

    import torch
    from safetensors.torch import save_file

    spec = registry.get_model("vit-ti/16")
    torch.manual_seed(0)
    model = spec.backend.create(spec, num_classes=0, img_size=224)
    first, second = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(first))
    shutil.copy(first, second)
    code, _, err = cli("run", "--model", "vit-ti/16", "--weights", f"{first},{second}", *FEWSHOT[:-2],
                       "--workers", "0", "--results", str(tmp_path / "results"))  # fmt: skip
    assert code == 0, err
    assert f"--weights {second}: the same file as {first} (sha256 " in err
    assert "1 runs planned, 0 already stored, 1 to run" in err
    assert len(store.read_results(tmp_path / "results").drop_duplicates("run_key")) == 1


def test_item14_the_dry_run_says_kept_only_where_the_rates_were_kept(cli, tmp_path, monkeypatch):
    """Before: "kept in <cache>/micro-rates.json" when VITBENCH_CACHE was a file and nothing was kept."""
    cache = tmp_path / "cache-is-a-file"
    cache.write_text("not a folder")
    monkeypatch.setenv("VITBENCH_CACHE", str(cache))
    args = (
        "run",
        "--model",
        "vit-ti/16",
        "--weights",
        "random",
        *FEWSHOT,
        "--dry-run",
        "--results",
        str(tmp_path / "r"),
    )
    code, out, err = cli(*args)
    assert code == 0, err
    said = out + err
    assert f"kept in {cache}" not in said and f"(not kept: {cache / 'micro-rates.json'} cannot be written)" in said
    monkeypatch.setenv("VITBENCH_CACHE", str(tmp_path / "cache"))
    code, out, err = cli(*args)
    assert code == 0 and f"kept in {tmp_path / 'cache' / 'micro-rates.json'}" in out + err


def test_item16_an_audit_named_twice_runs_once():
    from vitbench.execution import dedup

    once = dedup.plan("digits", ("digits",))
    assert len(dedup.plan("digits", ("digits", "digits"))) == len(once)  # before: each audit twice


def test_item16_a_config_with_a_byte_order_mark_loads(cli, tmp_path):
    """Before: "not valid TOML (… line 1, column 1)", no word of the BOM a Windows editor writes."""
    import tomllib

    config = tmp_path / "bom.toml"
    config.write_bytes(b"\xef\xbb\xbf" + b'model = "vit-ti/16"\nweights = "random"\ndatasets = ["digits"]\n')
    code, printed, err = cli("run", "--config", str(config), "--print-config")
    assert code == 0, err
    assert tomllib.loads(printed)["model"] == ["vit-ti/16"]


def test_item16_where_matches_a_name_typed_in_either_unicode_form():
    """Before: `--where` with the NFD form (macOS's file names) of an NFC-stored name matched nothing."""
    import pandas as pd

    from vitbench.store.query import apply_where

    runs = pd.DataFrame({"dataset": ["folder:caf\u00e9@1", "folder:tea@2"], "weights": ["caf\u00e9.pt", "t.pt"],
                         "weights_sha256": ["ab", "cd"]})  # fmt: skip
    assert apply_where(runs, ["dataset=folder:cafe\u0301@*"])["dataset"].tolist() == ["folder:caf\u00e9@1"]
    assert apply_where(runs, ["dataset~cafe\u0301"])["dataset"].tolist() == ["folder:caf\u00e9@1"]
    assert apply_where(runs, ["weights=cafe\u0301.pt"])["weights"].tolist() == ["caf\u00e9.pt"]


def test_item16_the_stored_command_is_shell_quoted(monkeypatch):
    """Before: `vitbench run --where a b` stored as words that no shell reads back as the command."""
    import shlex

    from vitbench.provenance import environment

    argv = ["/usr/bin/vitbench", "table", "--where", "dataset=folder:my pets", "--title", "it's"]
    monkeypatch.setattr("sys.argv", argv)
    command = environment()["command"]
    assert shlex.split(command) == ["vitbench", *argv[1:]]


def test_item15_an_out_name_of_up_to_255_bytes_is_written(cli, tmp_path):
    """Before: a valid --out name of 236-255 bytes was refused (the temp file's name passed 255 bytes),
    and the error named the temp file."""
    from vitbench.atomic import write_atomic

    for length in (236, 250, 255):
        out = tmp_path / ("r" * (length - 4) + ".csv")
        write_atomic(out, "a,b\n")
        assert out.read_text() == "a,b\n"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temp file left
    results = tmp_path / "results"
    code, _, err = cli("run", "--model", "vit-ti/16", "--weights", "random", "--dataset", "digits", "--res", "32",
                       "--shots", "1", "--seeds", "0", "--workers", "0", "--results", str(results))  # fmt: skip
    assert code == 0, err
    out = tmp_path / ("e" * 250 + ".csv")  # 254 bytes
    code, _, err = cli("export", "--results", str(results), "--format", "csv", "--out", str(out))
    assert code == 0, err
    assert out.is_file() and out.read_text().startswith("run_key") or out.stat().st_size > 0


def test_item3_and_13_export_cells_keeps_settings_named_like_its_columns_and_huge_integers(cli, tmp_path):
    """Before: a setting named `mean` took the measurement's column (the mean became `mean_1`, as
    text); an integer setting beyond int64 was an OverflowError."""
    import hashlib
    import json
    import sys

    import pandas as pd

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from synthetic_store import template

    from vitbench.store.query import json_field

    record = template()
    runs = tmp_path / "results" / "runs"
    runs.mkdir(parents=True)
    for seed in (0, 1):
        hparams = {**json_field(record["run"]["hparams"]), "mean": 3, "N": 7, "P": "x", "huge": 2**70}
        key = hashlib.sha256(f"collide{seed}".encode()).hexdigest()
        run = {**record["run"], "run_key": key, "seed": seed, "hparams": hparams}
        (runs / f"{key}.json").write_text(json.dumps({**record, "run": run, "metrics": {"accuracy": 0.5 + seed / 10}}))
    out = tmp_path / "cells.csv"
    code, _, err = cli(
        "export", "--cells", "--results", str(tmp_path / "results"), "--format", "csv", "--out", str(out)
    )
    assert code == 0, err
    cells = pd.read_csv(out)
    assert {"setting:mean", "setting:N", "setting:P", "huge", "mean", "n", "p"} <= set(cells.columns)
    assert "mean_1" not in cells.columns
    (row,) = cells.itertuples()
    assert row.mean == pytest.approx(55.0) and row.n == 2 and row.huge == 2**70
    assert cells["setting:mean"].tolist() == [3]
