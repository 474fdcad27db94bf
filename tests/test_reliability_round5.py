"""Issue 71, item 19: the smaller findings of the fifth reliability round, each seen failing first.
(The other items have their tests beside the code they touch: test_out_files, test_npz,
test_store_reliability, test_validation, test_file_fuzz, test_inspection, test_dataset_formats,
test_predictions, test_hostile_names, test_dedup.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import vitbench
from vitbench.errors import UserError
from vitbench.execution.trackers import run_name

DIGITS = dict(model="vit-ti/16", datasets="digits", res=32, shots=(1,), seeds=(0,))


def test_the_python_api_takes_a_path_for_weights_and_refuses_wrong_types_in_one_line(tmp_path):
    """Before: weights=Path("random") and results=5 were tracebacks, dry_run="no" (truthy) planned
    instead of running, results(where=5) was a traceback."""
    assert len(vitbench.plan(weights=Path("random"), **DIGITS)) == 1
    with pytest.raises(UserError, match=r"vitbench.plan: results=5: expected a folder"):
        vitbench.plan(weights="random", results=5, **DIGITS)
    with pytest.raises(UserError, match=r"vitbench.run: dry_run='no': expected True or False"):
        vitbench.run(weights="random", results=tmp_path / "r", dry_run="no", **DIGITS)
    with pytest.raises(UserError, match=r"vitbench.results\(where=5\): expected a clause"):
        vitbench.results(tmp_path / "r", where=5)


def test_doctor_does_not_call_empty_files_a_dataset(cli, tmp_path):
    """Before: a Pets folder of empty image files was "found (subset)"."""
    root = tmp_path / "data" / "oxford-iiit-pet"
    (root / "images").mkdir(parents=True)
    (root / "annotations").mkdir()
    for split, names in {"trainval": ["Abyssinian_1", "beagle_2"], "test": ["yorkie_3"]}.items():
        (root / "annotations" / f"{split}.txt").write_text("".join(f"{n} 1 1 1\n" for n in names))
        for name in names:
            (root / "images" / f"{name}.jpg").write_bytes(b"")
    code, out, err = cli("doctor", "--data-dir", tmp_path / "data")
    assert code == 0, err
    line = " ".join(out.split())
    assert "2 of 2 image files are empty (0 bytes)" in line and "found (subset)" not in line


def test_a_long_dataset_name_still_reaches_tensorboard(tmp_path):
    """Before: a 240-character dataset name made a folder name past 255 bytes: `File name too long`,
    the run never logged (a warning, exit 0). (Logged in a process of its own: TensorBoard's writer
    imports TensorFlow, after which torch's meta-device FLOP count crashes a process.)"""
    run = {"run_key": "a" * 64, "model": "vit-ti/16", "dataset": "x" * 240, "protocol": "fewshot", "seed": 0,
           "hparams": {"shots": 5}}  # fmt: skip
    assert len(run_name(run).encode()) <= 200 and run_name(run).startswith("aaaaaaaaaaaa-vit-ti_16-xxx")
    code = (
        "import json, sys; from pathlib import Path; from vitbench.execution.trackers import Trackers\n"
        "Trackers(('tensorboard',), Path(sys.argv[1])).log_run({'run': json.loads(sys.argv[2]),"
        " 'metrics': {'accuracy': 0.5}, 'curves': {}})\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path), json.dumps(run)], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0 and "not logged" not in done.stderr, done.stderr[-2000:]
    (folder,) = (tmp_path / "tensorboard").iterdir()
    assert list(folder.glob("events.out.tfevents.*"))
