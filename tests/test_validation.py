"""Validation at the door (issue: one bad input must not take the store down, nor store a number
that does not mean what its label says): values the store cannot hold, a resolution of 0, and a
dataset named twice."""

import json
import os
import re
import shutil

import pytest

import vitbench
from vitbench import store
from vitbench.errors import UserError

RUN = ("run", "--model", "vit-ti/16", "--weights", "random", "--dataset", "digits", "--res", "32", "--workers", "0")


@pytest.mark.parametrize(
    "args,message",
    [
        (("--seeds", "2147483648"), "--seeds 2147483648: expected an integer from 0 to 2147483647"),
        (("--seeds", "99999999999999999999"), "--seeds 99999999999999999999: expected an integer from 0 to"),
        (("--shots", "2147483648"), "--shots 2147483648: expected an integer from 1 to 2147483647"),
        (("--protocol", "knn", "--knn-k", "2147483648"), "--knn-k 2147483648: expected an integer from 1 to"),
        # before: three runs of one key planned, two skipped as "running elsewhere" under this very pid
        (("--seeds", "0,0,0"), "--seeds 0,0,0: 0 is given 3 times"),
        (("--shots", "1,5,1"), "--shots 1,5,1: 1 is given 2 times"),
    ],
)
def test_values_the_store_cannot_hold_are_refused_before_any_work(cli, results, one_run, args, message):
    """Before: the run wrote its shard, then DuckDB's INT64 -> INT32 conversion failed, and from then
    on every command on the results folder failed with that traceback."""
    code, _, err = cli(*RUN, *args, "--results", results)
    assert code == 2 and message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (results / "runs").exists() and not (results / store.DB_NAME).exists()
    shutil.copytree(one_run / "cache", results / "cache")  # the digits features: the check below is quick
    code, _, err = cli(*RUN, "--shots", "1", "--seeds", "0", "--results", results)
    assert code == 0, err  # the folder still works


def test_the_python_api_refuses_them_too():
    with pytest.raises(UserError, match="--seeds 2147483648: expected an integer from 0 to 2147483647"):
        vitbench.run(model="vit-ti/16", weights="random", datasets="digits", seeds=(2147483648,))


def test_res_zero_is_an_error_not_the_default(cli, results):
    """Before: `--res 0` quietly ran at the model's default resolution."""
    code, _, err = cli("run", "--model", "vit-ti/16", "--weights", "random", "--res", "0", "--results", results)
    assert code == 2 and "--res 0: expected an integer from 1 to 1024" in err


BIG = ("run", "--model", "vit-ti/16", "--weights", "random", "--dataset", "digits", "--workers", "0")


@pytest.mark.parametrize(
    "args,message",
    [  # issue 71, item 6. Before: a 30 GB allocation's traceback, a dry run with no answer, accepted
        (("--res", "100000"), "--res 100000: expected an integer from 1 to 1024"),
        (("--res", "2048", "--dry-run"), "--res 2048: expected an integer from 1 to 1024"),
        (
            ("--protocol", "finetune", "--batch", "100000000000"),
            "--batch 100000000000: expected an integer from 1 to 65536",
        ),
        (("--protocol", "pretrain", "--epochs", "1e9"), "--epochs 1000000000.0: expected a number above 0 to 10000"),
        (("--extraction-batch", "10000000"), "--extraction-batch 10000000: expected an integer from 1 to 65536"),
    ],
)
def test_sizes_past_any_machine_are_refused_before_any_work(cli, results, args, message):
    code, _, err = cli(*BIG, *args, "--results", results)
    assert code == 2 and message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_a_plan_of_too_many_runs_is_refused_before_it_is_made(cli, results, tmp_path):
    """Issue 71, item 5. Before: 1,000 seeds x 1,000 shots (each under the 10,000 a list may hold) made
    10^6 runs to plan: minutes, and a dry run of a 64 KB config's 10^7 grew past 4 GB. Now the
    product is refused by its lengths, before any split is listed, from the command line and a config."""
    seeds, shots = ",".join(map(str, range(1000))), ",".join(map(str, range(1, 1001)))
    code, _, err = cli(*RUN, "--seeds", seeds, "--shots", shots, "--dry-run", "--results", results)
    assert code == 2 and "the plan is 1,000,000 runs" in err and "1,000 seeds x 1,000 shots" in err, err
    assert len(err.strip().splitlines()) == 1 and not results.exists()
    config = tmp_path / "big.toml"
    config.write_text(
        f"seeds = [{', '.join(map(str, range(10_000)))}]\nshots = [{', '.join(map(str, range(1, 1001)))}]\n"
    )
    code, _, err = cli(*RUN, "--config", config, "--dry-run", "--results", results)
    assert code == 2 and "the plan is 10,000,000 runs" in err, err
    with pytest.raises(UserError, match="the plan is 1,000,000 runs"):
        vitbench.plan(model="vit-ti/16", weights="random", datasets="digits", seeds=range(1000), shots=range(1, 1001))


def test_a_dataset_named_twice_runs_once(cli, results, caplog):
    """Before: `digits,digits` printed [1/2], [2/2] and stored one run."""
    code, out, err = cli(*RUN, "--dataset", "digits,digits", "--shots", "1", "--seeds", "0", "--results", results,
                         "--dry-run")  # fmt: skip
    assert code == 0 and out.count("todo") == 1
    assert "1 runs planned" in err and "--dataset names digits more than once; each runs once" in err


def test_16_bit_greyscale_pngs_keep_their_grey_levels(tmp_path):
    """Before: PIL's convert("RGB") clipped 16-bit values at 255, so a 16-bit PNG decoded to pure white."""
    import numpy as np
    import torch
    from PIL import Image
    from torchvision.io import read_file

    from vitbench.datasets.base import decode
    from vitbench.engine.device_data import _decode_bytes

    levels = np.array([[0, 257 * 10, 257 * 128], [257 * 200, 257 * 255, 65535]], dtype=np.uint16)
    Image.fromarray(levels).save(tmp_path / "g16.png")
    pixels = np.asarray(decode(tmp_path / "g16.png"))
    assert pixels[..., 0].tolist() == [[0, 10, 128], [200, 255, 255]] and (pixels[..., 0] == pixels[..., 2]).all()
    on_device = _decode_bytes(read_file(str(tmp_path / "g16.png")), torch.device("cpu"), "g16.png")
    assert on_device.dtype == torch.uint8 and (on_device.permute(1, 2, 0).numpy() == pixels).all()


def _tree(root, classes=("cat", "dog"), n=(3, 2), seed=0):
    from conftest import write_image

    for split, count in zip(("train", "test"), n, strict=True):
        for c, cls in enumerate(classes):
            for i in range(count):
                write_image(root / split / cls / f"{i}.png", seed=seed + 10 * c + i)
    return root


def test_a_folder_dataset_with_one_class_is_refused(cli, results, tmp_path):
    """Before: `folder:` with one class stored 100 % accuracy."""
    tree = _tree(tmp_path / "one", classes=("cat",))
    code, _, err = cli(*RUN, "--dataset", f"folder:{tree}", "--shots", "1", "--seeds", "0", "--results", results)
    assert code == 2 and "expected two or more <class>/ folders, found only 'cat'" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("how", ["symlink", "copy"])
def test_a_test_split_that_is_the_train_split_is_warned_about(cli, results, tmp_path, how):
    """Before: test/ identical to (or symlinked to) train/ stored a result without a word."""
    import shutil

    tree = _tree(tmp_path / "same")
    shutil.rmtree(tree / "test")
    if how == "symlink":
        (tree / "test").symlink_to(tree / "train")
    else:
        shutil.copytree(tree / "train", tree / "test")
    code, _, err = cli(*RUN, "--dataset", f"folder:{tree}", "--shots", "1", "--seeds", "0", "--results", results,
                       "--dry-run")  # fmt: skip
    assert code == 0 and "its accuracy is not a test accuracy" in err


def test_two_folder_datasets_named_alike_stay_two_datasets(cli, results, tmp_path):
    """Before: X/ds and Y/ds were averaged into one cell, and data_dir was stored as NULL."""
    first, second = _tree(tmp_path / "X" / "ds"), _tree(tmp_path / "Y" / "ds", seed=5)
    for tree in (first, second):
        code, _, err = cli(*RUN, "--dataset", f"folder:{tree}", "--shots", "1", "--seeds", "0", "--results", results)
        assert code == 0, err
    runs = store.read_results(results).drop_duplicates("run_key")
    assert runs["dataset"].nunique() == 2 and all(runs["dataset"].str.startswith("folder:ds@"))
    assert sorted(runs["data_dir"]) == [str(first.resolve()), str(second.resolve())]
    code, out, _ = cli("table", "--results", results, "--protocol", "fewshot")
    assert code == 0 and all(name in out for name in runs["dataset"])


def test_more_shots_than_a_class_holds_is_said_and_shown(cli, results, one_run):
    """Before: `--shots 100000` was stored as "100000-shot" with n_train 1000."""
    shutil.copytree(one_run / "cache", results / "cache")  # the digits features
    code, _, err = cli(*RUN, "--shots", "100000", "--seeds", "0", "--results", results)
    assert code == 0 and "--shots 100000: digits train has only" in err
    run = store.read_results(results).iloc[0]
    fewest = json.loads(run["notes"])["effective_shots"]
    assert 0 < fewest < 1000 and run["n_train"] == 1000
    code, out, _ = cli("table", "--results", results, "--protocol", "fewshot")
    assert code == 0 and f"[{fewest}-shot]" in out and "[k-shot] after a value" in out


@pytest.mark.parametrize(
    "protocol, args, ignored",
    [("eval", ("--steps", "10"), "--steps"), ("fewshot", ("--lr", "0.1", "--knn-k", "5"), "--knn-k, --lr")],
)
def test_options_a_protocol_ignores_are_warned_about(cli, results, protocol, args, ignored):
    """Before: `--steps` for few-shot and `--shots` for eval were ignored without a word."""
    code, _, err = cli(*RUN, "--protocol", protocol, *args, "--results", results, "--dry-run")
    assert f"{ignored}: --protocol {protocol} does not use" in err


def test_images_changed_in_place_are_noticed(cli, results, tmp_path, caplog):
    """Before: images overwritten in place (same size) left the fingerprint and the feature cache
    as they were; `--rerun` reused the old features. Now size + mtime are in the fingerprint, and
    `--verify-data` hashes contents (for a rewrite that even keeps the time)."""
    import os

    import numpy as np
    from PIL import Image

    tree = tmp_path / "bmp"
    rng = np.random.default_rng(0)
    for split, n in (("train", 3), ("test", 2)):
        for c, cls in enumerate(("cat", "dog")):
            for i in range(n):
                (tree / split / cls).mkdir(parents=True, exist_ok=True)
                pixels = rng.integers(0, 255, (16, 16, 3), dtype=np.uint8) // 2 + 100 * c
                Image.fromarray(pixels.astype(np.uint8)).save(tree / split / cls / f"{i}.bmp")
    args = (*RUN, "--dataset", f"folder:{tree}", "--shots", "1", "--seeds", "0", "--results", results)
    assert cli(*args)[0] == 0
    victim = tree / "test" / "cat" / "0.bmp"
    stat = victim.stat()
    Image.fromarray(np.zeros((16, 16, 3), np.uint8)).save(victim)  # same size, new pixels
    assert victim.stat().st_size == stat.st_size
    os.utime(victim, (stat.st_atime + 10, stat.st_mtime + 10))
    code, _, err = cli(*args)
    assert code == 0 and "1 to run" in err
    code, out, _ = cli("table", "--results", results, "--protocol", "fewshot")
    text = " ".join(out.split())  # the terminal table wraps its footnotes
    assert "one run each" in text and "1 earlier run(s) of a shown setting on data whose files have changed" in text
    # a rewrite that keeps size and time: only --verify-data sees it
    Image.fromarray(np.full((16, 16, 3), 255, np.uint8)).save(victim)
    os.utime(victim, (stat.st_atime + 10, stat.st_mtime + 10))
    assert "0 to run" in cli(*args)[2]
    assert "1 to run" in cli(*args, "--verify-data")[2]
    assert "0 to run" in cli(*args, "--verify-data")[2]


@pytest.mark.parametrize("device", ["meta", "mps", "xpu"])
def test_a_device_vitbench_cannot_run_on_is_one_line(cli, results, device):
    code, _, err = cli(*RUN, "--device", device, "--results", results)
    assert code == 2 and err.strip() == f"error: --device {device}: expected auto, cpu, cuda or cuda:N"


def test_an_npz_with_an_object_array_is_named(cli, tmp_path):
    import numpy as np

    np.savez(tmp_path / "obj.npz", a=np.array([{"x": 1}], dtype=object))
    code, _, err = cli("weights", "inspect", tmp_path / "obj.npz")
    assert code == 2 and "array 'a' holds Python objects, expected numbers" in err and "Traceback" not in err


def test_a_bad_lease_time_is_one_line(cli, results, monkeypatch):
    monkeypatch.setenv("VITBENCH_LEASE_SECONDS", "abc")
    code, _, err = cli(*RUN, "--shots", "1", "--seeds", "0", "--results", results)
    assert code == 2 and "VITBENCH_LEASE_SECONDS=abc: expected a positive number of seconds" in err


def test_a_symlink_loop_named_like_an_image_is_named(cli, results, tmp_path):
    tree = _tree(tmp_path / "loop")
    (tree / "test" / "cat" / "x.jpg").symlink_to("x.jpg")
    code, _, err = cli(*RUN, "--dataset", f"folder:{tree}", "--results", results, "--dry-run")
    assert code == 2 and "x.jpg: cannot be read (Too many levels of symbolic links)" in err


@pytest.mark.parametrize("name", ["runs", "leases", "cache"])
def test_a_file_where_a_results_folder_belongs_is_named(cli, results, name):
    results.mkdir()
    (results / name).write_text("")
    code, _, err = cli(*RUN, "--shots", "1", "--seeds", "0", "--results", results)
    assert code == 2 and f"{results / name} is a file, expected a folder vitbench keeps there" in err


def test_an_empty_results_option_is_refused(cli, tmp_path, monkeypatch):
    """Before: `--results ""` wrote the store into the current directory."""
    monkeypatch.chdir(tmp_path)
    code, _, err = cli(*RUN, "--shots", "1", "--seeds", "0", "--results", "")
    assert code == 2 and "--results: empty" in err and not any(tmp_path.iterdir())


def test_doctor_names_the_file_it_cannot_read(cli, tmp_path):
    """Before: an unreadable CIFAR batch showed as "train —" without naming the file."""
    from conftest import write_cifar_batch

    root = tmp_path / "data" / "cifar-10-batches-py"
    write_cifar_batch(root / "test_batch", 10, 10, "labels")
    (root / "data_batch_1").write_bytes(b"\x80\x02 truncated")
    code, out, _ = cli("doctor", "--data-dir", tmp_path / "data")
    flat = " ".join(out.split())
    assert code == 0 and "train — (cifar-10-batches-py/data_batch_1: not a readable CIFAR batch" in flat


@pytest.mark.parametrize("value", ["inf", "2^2000", "nan", "0"])
def test_a_ridge_strength_that_is_no_positive_number_is_refused(cli, results, value):
    code, _, err = cli(*RUN, "--fewshot-l2", value, "--results", results, "--dry-run")
    assert code == 2 and f"--fewshot-l2 {value}: expected a positive number" in err


# (option, its Request/API name, a bad value, the one line that refuses it)
BAD_NUMBERS = [
    ("--workers", "workers", -3, "--workers -3: expected an integer from 0 to 1024"),
    ("--extraction-batch", "extraction_batch", 0, "--extraction-batch 0: expected an integer from 1 to 65536"),
    ("--batch", "batch", 0, "--batch 0: expected an integer from 1 to 65536"),
    ("--lr", "lr", -0.5, "--lr -0.5: expected a number > 0"),
    ("--lr", "lr", float("nan"), "--lr nan: expected a finite number"),
    ("--polyak", "polyak", 2.0, "--polyak 2.0: expected a number from 0 to below 1"),
    ("--mpp-rate", "mpp_rate", 0.0, "--mpp-rate 0.0: expected a number above 0 to 1"),
    ("--label-smoothing", "label_smoothing", 1.0, "--label-smoothing 1.0: expected a number from 0 to below 1"),
    ("--input-pipeline", "input_pipeline", "gpu", "--input-pipeline gpu: expected auto, workers, device or nvjpeg"),
]


@pytest.mark.parametrize("option, name, value, message", BAD_NUMBERS, ids=[f"{b[0]}={b[2]}" for b in BAD_NUMBERS])
def test_a_value_is_checked_once_alike_from_the_command_line_a_config_and_the_api(
    cli, tmp_path, option, name, value, message
):
    """Before: a config's workers=-3 and batch_size=0 gave torch's tracebacks, lr=nan trained for
    149 s and quarantined its own shard, polyak=2.0 stored 10.04 %. Now one check (protocols/bounds.py)
    refuses each before any work, whichever way the value came."""
    results = tmp_path / "results"
    code, _, err = cli("run", "--protocol", "finetune", option, str(value), "--dry-run", "--results", results)
    assert code == 2 and err.strip() == f"error: {message}"
    config = tmp_path / "exp.toml"
    key = option.removeprefix("--").replace("-", "_")
    assert key == name  # one vocabulary: the flag, the config key and the API keyword name the option alike
    config.write_text(f"{key} = {json.dumps(value) if isinstance(value, str) else value}\n")
    code, _, err = cli("run", "--protocol", "finetune", "--config", config, "--dry-run", "--results", results)
    assert code == 2 and err.strip() == f"error: {message}"
    with pytest.raises(UserError, match=re.escape(message)):
        vitbench.run(protocol="finetune", dry_run=True, results=results, **{name: value})
    assert not results.exists()  # nothing was done


def test_a_config_file_that_is_no_config_is_one_line(cli, tmp_path):
    """Before: non-UTF-8 bytes and 5,000 nested arrays gave tracebacks, 10^6 seeds planned for
    minutes in over 1 GB, a FIFO blocked the read forever."""
    config = tmp_path / "exp.toml"
    cases = {
        b'model = "vit\xff"\n': "not UTF-8 text (byte 12)",
        b"seeds = " + b"[" * 5000 + b"]" * 5000 + b"\n": "nested too deeply for a config",
        b"seeds = ["
        + b",".join(b"%d" % i for i in range(10_001))
        + b"]\n": "key 'seeds': 10,001 values; expected at most 10,000",
        b"# " + b"x" * 1_000_001 + b"\n": "1,000,004 bytes; a config holds options, expected at most 1 MB",
        b"devices = 0\n": "key 'devices': ",
    }
    for text, message in cases.items():
        config.write_bytes(text)
        code, _, err = cli("run", "--config", config, "--dry-run", "--results", tmp_path / "r")
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, (message, err)
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    code, _, err = cli("run", "--config", fifo, "--dry-run", "--results", tmp_path / "r")
    assert code == 2 and err.strip() == f"error: --config {fifo}: not a regular file; expected a TOML file"


def test_compare_across_a_test_split_that_grew_says_so_and_pairs_the_common_images(cli, results, tmp_path):
    """Before: runs on a folder whose test split grew from 12 to 24 images were compared as
    "Δ +0.00 [+0.00, +0.00], p 1 on the same test images", A's 12 against B's 24."""
    tree = _tree(tmp_path / "ds", n=(3, 6), seed=50)
    code, _, err = cli(*RUN, "--dataset", f"folder:{tree}", "--shots", "1", "--seeds", "0", "--results", results)
    assert code == 0, err
    for c, cls in enumerate(("cat", "dog")):  # six more test images per class, under new names
        _tree_images(tree / "test" / cls, range(6, 12), seed=100 + 10 * c)
    code, _, err = cli(*RUN, "--dataset", f"folder:{tree}", "--shots", "1", "--seeds", "0", "--results", results)
    assert code == 0, err
    runs = store.read_results(results).drop_duplicates("run_key").sort_values("n_test")
    assert list(runs["n_test"]) == [12, 24]
    a, b = (f"n_test={n}" for n in runs["n_test"])
    code, out, err = cli("compare", a, b, "--format", "md", "--results", results)
    assert code == 0, err
    note = " ".join(out.split())
    assert "A and B were scored on different test sets" in note and "A scored 12 images, B 24" in note
    assert "every figure of this row is on the 12 images both scored" in note
    # on the same files again: no such note
    code, out, _ = cli("compare", a, a, "--format", "md", "--results", results)
    assert code == 0 and "different test sets" not in out


def _tree_images(folder, indices, seed):
    from conftest import write_image

    for i in indices:
        write_image(folder / f"{i}.png", seed=seed + i)


@pytest.mark.parametrize("args", [("table",), ("run", "--dry-run")])
def test_a_results_path_the_file_system_cannot_hold_is_one_line(cli, tmp_path, args):
    """Before: OSError 36 as a traceback for a 256-byte folder name or a path over 4,096 bytes (issue 49)."""
    for too_long in (tmp_path / ("x" * 256), tmp_path.joinpath(*["y" * 200] * 25)):
        code, _, err = cli(*args, "--results", too_long)
        assert code == 2 and "file name too long for this file system" in err and "Traceback" not in err
        assert len(err.strip().splitlines()) == 1
