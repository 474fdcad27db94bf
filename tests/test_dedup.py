"""Near-duplicate audits (`vitbench dedup`, engine/dedup.py) on generated images with planted
copies of each kind (tests/planted.py) and same-class look-alikes that are not copies."""

from __future__ import annotations

import csv
import json
import os
import re

import numpy as np
import pytest
from planted import KINDS, planted_set

from vitbench import store
from vitbench.catalog.registry import get_dataset
from vitbench.datasets import Split
from vitbench.engine import dedup


@pytest.fixture(scope="module")
def planted():
    return planted_set(3000, 600, per_kind=10, seed=1)


def _split(name: str, images: np.ndarray, labels: np.ndarray) -> Split:
    return Split("planted", name, labels, "memory", f"fp-{name}", images=images)


def test_planted_copies_of_every_kind_are_found_and_look_alikes_are_not(planted):
    """≥ 95 % of the planted near-duplicates (each kind), ≤ 1 % of the other test images flagged:
    those have same-class look-alikes in train, sharing their coarse layout."""
    test, train = (
        _split("test", planted.test, planted.test_labels),
        _split("train", planted.train, planted.train_labels),
    )
    pairs, bad, seen, _ = dedup.audit(test, train, dedup.Method(), block=1024)  # several blocks: the running top-k
    assert bad == [] and seen == 3000
    found = {(p.test, p.duplicate) for p in pairs}
    for kind in KINDS:
        planted_of_kind = [(t, d) for t, (d, k) in planted.duplicates.items() if k == kind]
        recall = sum(pair in found for pair in planted_of_kind) / len(planted_of_kind)
        assert recall >= 0.95, (kind, recall)
    false = {p.test for p in pairs} - set(planted.duplicates)
    assert len(false) <= 0.01 * (len(planted.test) - len(planted.duplicates)), sorted(false)
    exact = {(p.test, p.duplicate) for p in pairs if p.exact}
    assert exact == {(t, d) for t, (d, k) in planted.duplicates.items() if k == "exact"}
    assert all(p.distance == 0.0 for p in pairs if p.exact)


def test_a_split_against_itself_does_not_pair_an_image_with_itself(planted):
    images = planted.train[:200].copy()
    images[150] = images[20]  # one copy inside the split
    split = _split("train", images, planted.train_labels[:200])
    pairs, _, _, _ = dedup.audit(split, split, dedup.Method(), same_split=True)
    assert {(p.test, p.duplicate) for p in pairs} == {(20, 150), (150, 20)}


def test_the_correlation_is_one_for_a_copy_and_falls_for_a_look_alike(planted):
    method = dedup.Method()
    import torch

    test = torch.from_numpy(planted.test[:4]).permute(0, 3, 1, 2).contiguous()
    same = dedup.correlation(test, test, method.max_shift, method.scales)
    assert torch.allclose(same, torch.ones(4), atol=1e-4)
    others = torch.from_numpy(planted.test[4:8]).permute(0, 3, 1, 2).contiguous()
    assert (dedup.correlation(test, others, method.max_shift, method.scales) < method.threshold).all()


@pytest.fixture(scope="module")
def planted_folder(tmp_path_factory, planted):
    """A small planted set as an ImageFolder tree of PNG files, one of them truncated."""
    small = planted_set(400, 120, per_kind=2, seed=2)
    root = small.write_folder(tmp_path_factory.mktemp("planted") / "photos")
    corrupt = sorted((root / "train").rglob("*.png"))[7]
    corrupt.write_bytes(corrupt.read_bytes()[:60])
    return small, root


def test_the_command_audits_a_folder_stores_it_and_writes_every_pair(planted_folder, cli, tmp_path):
    small, root = planted_folder
    results, out_csv = tmp_path / "results", tmp_path / "pairs.csv"
    # --dry-run: the audit with its time measured here (issue 69), nothing searched or written
    args = ("dedup", "--dataset", f"folder:{root}", "--out", out_csv, "--results", results, "--workers", "0")
    code, out, err = cli(*args, "--dry-run")
    line = " ".join(out.split())
    assert code == 0 and re.search(r"120 test x \d+ images todo ≈", line), err
    assert re.search(r"1 audit\(s\) to do, estimated time [^:]+: thumbnails [^,]+, search [^,]+, start-up", line)
    assert not results.exists() and not out_csv.exists()
    code, out, err = cli(*args)
    assert code == 0, err
    assert "skipped 1 unreadable image" in err
    with out_csv.open() as f:
        rows = list(csv.DictReader(f))
    assert {"test_image", "duplicate", "distance", "method_threshold", "method_name"} <= set(rows[0])
    test_files = sorted(str(p) for p in (root / "test").rglob("*.png"))
    train_files = sorted(str(p) for p in (root / "train").rglob("*.png"))
    # the folder's split order is class folder then file name; the planted pairs name the array order
    by_name = {int(p.rsplit("/", 1)[1][:6]): p for p in test_files}
    train_by_name = {int(p.rsplit("/", 1)[1][:6]): p for p in train_files}
    expected = {(by_name[t], train_by_name[d]) for t, (d, _) in small.duplicates.items()}
    found = {(r["test_image"], r["duplicate"]) for r in rows}
    assert len(expected & found) >= 0.95 * len(expected) - 1  # the one truncated file may hold a copy
    assert len({r["test_image"] for r in rows} - {t for t, _ in expected}) <= 1
    assert f"{len({r['test_image'] for r in rows})} (" in out  # the summary's count of test images flagged
    audit = store.read_audits(results).iloc[0]
    assert (
        audit["test_dataset"] == get_dataset(f"folder:{root}").name
        and audit["n_test"] == 120
        and audit["skipped_images"] == 1
    )
    assert audit["git_sha"] and json.loads(audit["method"])["threshold"] == 0.77 and audit["audited_fingerprint"]
    # the same audit again is read back, not searched again; --rerun searches
    code, out, _ = cli("dedup", "--dataset", f"folder:{root}", "--results", results, "--workers", "0")
    assert code == 0 and "stored" in out and len(store.read_audits(results)) == 1
    code, out, _ = cli("dedup", "--dataset", f"folder:{root}", "--results", results, "--dry-run")
    assert code == 0 and "images  stored" in out and "0 audit(s) to do" in out  # read back: nothing to price
    code, out, _ = cli("dedup", "--dataset", f"folder:{root}", "--results", results, "--workers", "0", "--rerun")
    assert code == 0 and "│ stored" not in out and len(store.read_audits(results)) == 1


def test_a_pretraining_set_is_audited_against_other_test_sets(planted_folder, cli, tmp_path):
    """`--against`: every image of the audited set (train and test alike) against the named test sets."""
    small, root = planted_folder
    results = tmp_path / "results"
    code, out, err = cli("dedup", "--dataset", f"folder:{root}", "--against", f"folder:{root},digits",
                         "--results", results, "--workers", "0")  # fmt: skip
    assert code == 0, err
    audits, name = store.read_audits(results), get_dataset(f"folder:{root}").name
    assert sorted(zip(audits["test_dataset"], audits["audited_split"], strict=True)) == sorted(
        [(name, "train"), (name, "test"), ("digits", "train"), ("digits", "test")]
    )
    own = audits[(audits["test_dataset"] == name) & (audits["audited_split"] == "test")].iloc[0]
    assert own["n_test_flagged"] == 0  # the test split against itself: no image is its own copy


@pytest.mark.parametrize(
    "args,message",
    [
        (["--dataset", "nosuch"], "nosuch"),
        (["--dataset", "digits", "--threshold", "1.5"], "--threshold 1.5"),
    ],
)
def test_bad_input_is_one_line(cli, tmp_path, args, message):
    code, _, err = cli("dedup", *args, "--results", tmp_path / "r")
    assert code != 0 and message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_pretraining_leaves_out_the_near_duplicates_of_the_test_sets_it_is_told(cli, tmp_path):
    """`--dedup-against`: the planted copies of D's test images leave P's pre-training images
    before training, the run's notes say how many, and its key says against what."""
    from planted import Planted

    small, other = planted_set(400, 120, per_kind=2, seed=3), planted_set(70, 1, per_kind=0, seed=4)
    pretraining = Planted(small.train, small.train_labels, other.train[:40], other.train_labels[:40], {})
    downstream = Planted(other.train[40:], other.train_labels[40:], small.test, small.test_labels, {})
    p_root = pretraining.write_folder(tmp_path / "p")
    d_root = downstream.write_folder(tmp_path / "d")
    results = tmp_path / "results"
    code, _, err = cli("run", "--protocol", "pretrain", "--model", "vit-ti/16", "--smoke", "--steps", "2",
                       "--dataset", f"folder:{p_root}", "--transfer", "none", "--dedup-against", f"folder:{d_root}",
                       "--res", "32", "--batch", "8", "--workers", "0", "--results", results)  # fmt: skip
    assert code == 0, err
    run = store.read_results(results).drop_duplicates("run_key").iloc[0]
    notes, hparams = json.loads(run["notes"]), json.loads(run["hparams"])
    d_name = get_dataset(f"folder:{d_root}").name
    assert list(hparams["dedup_against"]) == [d_name] and hparams["dedup_method"]["threshold"] == 0.77
    # the planted copies that fell in the pre-training part of train (the rest are in its dev part)
    p_spec = get_dataset(f"folder:{p_root}")
    subtrain = p_spec.load_split(None, "subtrain")
    names = [int(path.rsplit("/", 1)[1][:6]) for path in subtrain.paths]
    planted_here = sum(place in names for place, _ in small.duplicates.values())
    dedup_note = notes["dedup"]
    assert dedup_note["of"] == len(subtrain)
    assert planted_here - 1 <= dedup_note["removed"] <= planted_here + 1
    assert dedup_note["test_images_with_duplicates"][d_name] >= planted_here - 1
    assert run["n_train"] == len(subtrain) - dedup_note["removed"]


def test_a_cell_whose_test_images_have_copies_in_its_train_split_says_how_many(cli, tmp_path):
    """After `vitbench dedup`, the table and the report mark the cells of the audited test split with
    the count of its images that have a near-duplicate in train, and say what the mark means."""
    small = planted_set(200, 60, per_kind=1, seed=5)
    root = small.write_folder(tmp_path / "photos")
    results = tmp_path / "results"
    common = ("--dataset", f"folder:{root}", "--results", results)
    code, _, err = cli("run", "--protocol", "knn", "--model", "vit-ti/16", "--weights", "random", "--res", "32",
                       "--workers", "0", "--seeds", "0", *common)  # fmt: skip
    assert code == 0, err
    code, out, _ = cli("table", "--format", "md", "--results", results)
    assert "¶" not in out  # no audit stored yet
    code, _, err = cli("dedup", *common, "--workers", "0")
    assert code == 0, err
    flagged = int(store.read_audits(results)["n_test_flagged"].iloc[0])
    assert len(small.duplicates) - 1 <= flagged <= len(small.duplicates) + 1
    code, out, _ = cli("table", "--format", "md", "--results", results)
    assert code == 0 and f"¶{flagged}" in out and "near-duplicate in the dataset's own train split" in out
    # the pairs, to look at: a contact sheet beside the stored audit, and the report's contamination section
    sheets = list((results / "dedup").glob("*.png"))
    assert len(sheets) == 1 and sheets[0].read_bytes()[:4] == b"\x89PNG"
    report = tmp_path / "report.html"
    code, _, err = cli("report", "--out", report, "--results", results)
    assert code == 0, err
    page = report.read_text()
    assert f"¶{flagged}" in page and '<section id="contamination">' in page and "data:image/png;base64," in page
    assert f"{flagged:,} (" in page  # the audit's row: test images with a near-duplicate
    # issue 63: an audit at another threshold, and the test split against itself, add nothing to the
    # mark (they were added up: ¶47 became ¶742); it comes from the one audit of the cell's train and
    # test splits at the default method
    code, _, err = cli("dedup", *common, "--workers", "0", "--threshold", "0.05")
    assert code == 0, err
    code, _, err = cli("dedup", *common, "--workers", "0", "--against", f"folder:{root}")  # test vs test too
    assert len(store.read_audits(results)) >= 2
    code, out, _ = cli("table", "--format", "md", "--results", results)
    assert code == 0 and re.findall(r"¶(\d+)", out) == [str(flagged)], out


def test_an_interrupted_audit_continues_from_its_last_block(planted, tmp_path, monkeypatch):
    """The search's state is saved after each block (here: every block); a second call continues
    where the first stopped and finds what one uninterrupted call finds."""
    monkeypatch.setattr(dedup, "CHECKPOINT_SECONDS", 0.0)
    test, train = (
        _split("test", planted.test, planted.test_labels),
        _split("train", planted.train, planted.train_labels),
    )
    whole, _, _, _ = dedup.audit(test, train, dedup.Method(), block=500)
    checkpoint = tmp_path / "audit.pt"

    def stop_after(n):
        def progress(blocks, total):
            for i, block in enumerate(blocks):
                if i == n:
                    raise KeyboardInterrupt
                yield block

        return progress

    with pytest.raises(KeyboardInterrupt):
        dedup.audit(test, train, dedup.Method(), block=500, progress=stop_after(3), checkpoint=checkpoint)
    assert checkpoint.exists()
    left = []
    pairs, _, seen, _ = dedup.audit(test, train, dedup.Method(), block=500, checkpoint=checkpoint,
                                 progress=lambda blocks, total: left.append(total) or blocks)  # fmt: skip
    assert left == [3] and seen == 3000  # 6 blocks, 3 done before: 3 left
    assert [(p.test, p.duplicate, p.exact) for p in pairs] == [(p.test, p.duplicate, p.exact) for p in whole]
    assert checkpoint.exists()  # the caller removes it once the audit is stored (issue 63: a held database lost it)

    # a damaged checkpoint (issue 63: `truncate -s 1000` gave an 18-frame traceback on every rerun, --rerun
    # too): set aside, and the search starts over with the same pairs; a FIFO in its place blocks nothing
    checkpoint.write_bytes(checkpoint.read_bytes()[:1000])
    again, _, seen, _ = dedup.audit(test, train, dedup.Method(), block=500, checkpoint=checkpoint)
    assert seen == 3000 and [(p.test, p.duplicate) for p in again] == [(p.test, p.duplicate) for p in whole]
    assert checkpoint.with_name("audit.pt.damaged").exists()
    checkpoint.unlink()
    os.mkfifo(checkpoint)
    again, _, seen, _ = dedup.audit(test, train, dedup.Method(), block=500, checkpoint=checkpoint)
    assert seen == 3000 and len(again) == len(whole) and checkpoint.is_file()  # the FIFO set aside, a real one written


def test_the_command_line_default_threshold_is_the_methods():
    from vitbench.cli.dedup import DEFAULT_THRESHOLD

    assert dedup.Method().threshold == DEFAULT_THRESHOLD


def test_small_images_need_a_closer_match_than_their_upscaled_thumbnails_suggest():
    """scikit-learn's 8 x 8 digits, upscaled to thumbnails, correlate easily: digits 5-9 have no
    copy among digits 0-4 (other classes), and the search finds none there."""
    train, test = get_dataset("digits0-4").load_split(None, "train"), get_dataset("digits5-9").load_split(None, "test")
    pairs, _, _, _ = dedup.audit(test, train, dedup.Method())
    assert pairs == []
    method = dedup.Method()
    import torch

    assert method.threshold_for(torch.tensor([8, 32, 500])).tolist() == pytest.approx([1 - 0.23 / 4, 0.77, 0.77])


def test_a_second_dedup_of_the_same_pair_waits_and_reads_the_first_ones_audit(cli, tmp_path):
    """Issue 71, item 18. Before: two concurrent `dedup`s of one pair both ran the whole search (audits
    took no lease). Now the second waits for the first's lease and reads its stored audit back. The
    first is played by this test: it holds the audit's lease, then stores the audit (a copy of one
    searched in another folder) and lets go."""
    import shutil
    import subprocess
    import sys
    import time

    from vitbench.execution.lease import Lease

    first = tmp_path / "first"
    assert cli("dedup", "--dataset", "digits", "--results", first, "--workers", "0")[0] == 0
    (shard,) = (first / "audits").glob("*.json")
    results = tmp_path / "results"
    lease = Lease(results, f"audit-{shard.stem}")
    assert lease.acquire()
    second = subprocess.Popen([sys.executable, "-m", "vitbench", "dedup", "--dataset", "digits", "--results",
                               str(results), "--workers", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)  # fmt: skip
    try:
        waited, deadline = "", time.monotonic() + 120
        while "waiting for it" not in waited and time.monotonic() < deadline:
            waited += second.stderr.readline()
        assert "being searched by process" in waited, waited
        (results / "audits").mkdir(parents=True)
        shutil.copy(shard, results / "audits" / shard.name)
    finally:
        lease.release()
    out, err = second.communicate(timeout=120)
    assert second.returncode == 0, err
    assert "│ stored" in out and len(store.read_audits(results)) == 1  # read back, not searched again
    assert not (results / "dedup").exists() or not list((results / "dedup").glob("*.pt"))
