"""Pre-training end to end through the CLI: a sweep of two models over three nested subsets with
its automatic 5-shot transfer and figures, a run killed with SIGKILL and resumed, and the
weights used by other protocols with their provenance. (The demo's pre-training benefit is
checked in test_demo.py.)"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time

import pytest
import warm_launcher

from vitbench import store

TINY = ("--dataset", "digits0-4", "--transfer", "digits5-9", "--workers", "0", "--batch", "16", "--res", "32")


def test_a_two_model_three_subset_sweep_runs_end_to_end(cli, results, tmp_path):
    code, out, err = cli(
        "run", "--protocol", "pretrain", "--model", "vit-ti/16,vit-s/16", "--smoke", "--steps", "8",
        "--pretrain-subset", "10%,30%,100%", *TINY, "--results", results,
    )  # fmt: skip
    assert code == 0, err
    df = store.read_results(results)
    pre = df[df["protocol"] == "pretrain"].drop_duplicates("run_key")
    assert len(pre) == 6 and sorted(pre["model"].unique()) == ["vit-s/16", "vit-ti/16"]
    sizes = sorted({json.loads(h)["subset"] for h in pre["hparams"]})
    assert sizes == [45, 136, 453]  # 10 %, 30 % and all of the 453 train images of digits 0-4 (dev held out)
    for _, run in pre.iterrows():
        notes = json.loads(run["notes"])
        assert len(notes["validation"]) == 8  # early stopping scored the dev split at each of the 8 steps
        assert run["flops"] > 0 and run["device_seconds"] > 0
    few = df[df["protocol"] == "fewshot"].drop_duplicates("run_key")
    # per model: its 3 checkpoints and random init, 5-shot, 3 seeds
    assert len(few) == 2 * 4 * 3 and set(few["dataset"]) == {"digits5-9"}
    assert {json.loads(h)["shots"] for h in few["hparams"]} == {5}
    transferred = few[~few["random_init"]]
    provenance = [json.loads(n)["pretrained"] for n in transferred["notes"]]
    assert {p["run_key"] for p in provenance} == set(pre["run_key"])  # each names the run that made its weights
    assert "Pre-training and what it buys" in " ".join(out.split()) and "random init" in out
    # each plan counts from 1 (the count used to jump from [1/1] to [2/25]); each line names its weights
    lines = [line for line in err.splitlines() if line.startswith("[")]
    counts = [line.split("]")[0] + "]" for line in lines]
    # the 6 pre-training runs, then each model's 12 transfer runs, planned once its weights exist
    assert counts == [f"[{k}/6]" for k in range(1, 7)] + [f"[{k}/12]" for k in range(1, 13)] * 2
    assert all(" (random init) digits0-4 pretrain " in line for line in lines[:6])
    transfer = lines[6:]
    assert (
        sum("(random init) digits5-9 fewshot shots=5 seed" in line for line in transfer) == 2 * 3
    )  # random init, 2 models
    assert (
        sum(re.search(r"\(weights [0-9a-f]{8}\) digits5-9 fewshot shots=5 seed", line) is not None for line in transfer)
        == 18
    )
    code, out, _ = cli("plot", "datasize", "compute", "--results", results, "--out", tmp_path / "plots")
    assert code == 0, out
    assert (tmp_path / "plots" / "accuracy_vs_pretraining_images.png").stat().st_size > 10_000
    assert (tmp_path / "plots" / "accuracy_vs_pretraining_exaflops.svg").exists()
    code, md, _ = cli("table", "--view", "pretrain", "--format", "md", "--results", results)
    assert code == 0 and md.count("| vit-ti/16, n=") == 3 and md.count("· random init |") == 2
    # the protocol declares its view (issue 30.3): --protocol pretrain alone shows it
    assert cli("table", "--protocol", "pretrain", "--format", "md", "--results", results)[1] == md


def test_a_killed_pretraining_resumes_with_the_loss_curve_of_an_uninterrupted_one(tmp_path):
    args = [
        "run", "--protocol", "pretrain", "--model", "vit-ti/16", "--steps", "20", "--checkpoint-every", "4",
        "--transfer", "none", *TINY,
    ]  # fmt: skip
    killed, straight = tmp_path / "killed", tmp_path / "straight"
    # the uninterrupted run, meanwhile, in a process of its own (the same trajectory whatever the load)
    log = (tmp_path / "straight.log").open("w")
    uninterrupted = subprocess.Popen([sys.executable, "-m", "vitbench", *args, "--results", str(straight)],
                                     stdout=subprocess.DEVNULL, stderr=log)  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-m", "vitbench", *args, "--results", str(killed)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 300
    while not list((killed / "runs").glob("*/checkpoint.pt")) and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert list((killed / "runs").glob("*/checkpoint.pt")) and not list((killed / "runs").glob("*.json"))
    done = subprocess.run([sys.executable, "-m", "vitbench", *args, "--results", str(killed)],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert uninterrupted.wait(timeout=600) == 0, (tmp_path / "straight.log").read_text()
    curves = {name: store.read_curves(folder) for name, folder in (("killed", killed), ("straight", straight))}
    loss = {k: c[c["name"] == "train_loss"]["value"].tolist() for k, c in curves.items()}
    assert len(loss["straight"]) == 20 and loss["killed"] == loss["straight"]
    runs = {
        k: store.read_results(f).drop_duplicates("run_key").iloc[0]
        for k, f in (("killed", killed), ("straight", straight))
    }
    assert json.loads(runs["killed"]["notes"])["restarts"] == 1
    assert runs["killed"]["weights_sha256"] == runs["straight"]["weights_sha256"]
    weights = {k: json.loads(r["notes"])["weights_file"]["sha256"] for k, r in runs.items()}
    assert weights["killed"] == weights["straight"]  # the same best weights, bit for bit


def test_pretrained_weights_serve_other_protocols_by_run_key(cli, results):
    code, _, err = cli("run", "--protocol", "pretrain", "--model", "vit-ti/16", "--steps", "4", "--transfer", "none",
                       *TINY, "--results", results)  # fmt: skip
    assert code == 0, err
    key = store.read_results(results)["run_key"].iloc[0]
    code, _, err = cli("run", "--protocol", "knn", "--model", "vit-ti/16", "--weights", f"run:{key[:10]}",
                       "--dataset", "digits5-9", "--res", "32", "--workers", "0", "--seeds", "0",
                       "--results", results)  # fmt: skip
    assert code == 0, err
    knn = store.read_results(results)
    knn = knn[knn["protocol"] == "knn"].iloc[0]
    assert json.loads(knn["notes"])["pretrained"]["run_key"] == key and not knn["random_init"]
    code, _, err = cli("run", "--protocol", "pretrain", "--model", "vit-ti/16", "--weights", f"run:{key[:10]}",
                       *TINY, "--results", results)  # fmt: skip
    assert code == 2 and "trains from random init" in err
    for args, message in (
        (["--objective", "bert"], "--objective bert: expected supervised or mpp"),
        (["--pos-embed", "3-d"], "--pos-embed 3-d: expected one of"),
        (["--model", "bit-m-r50x1", "--objective", "mpp"], "masked patch prediction needs a ViT"),
        (["--pretrain-subset", "200%"], "--pretrain-subset 200%: expected 1 to 453 images"),
        (["--lr-decay", "step"], "--lr-decay step: expected linear or cosine"),
        (["--weights", "run:beef"], "no pre-training run with that key"),
        (["--transfer", "digitz"], "unknown dataset 'digitz'"),
        (["--transfer-shots", "0"], "--transfer-shots 0: expected an integer from 1 to"),
    ):
        base = ["run", "--protocol", "pretrain", "--model", "vit-ti/16", *TINY, "--results", results]
        code, _, err = cli(*base, *args)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def _vitbench(*args, results):
    # warm (tests/warm_launcher.py): what these runs check is what they store and print, not their start
    return warm_launcher.run([sys.executable, "-m", "vitbench", *map(str, args), "--results", str(results)],
                             capture_output=True, text=True, timeout=600)  # fmt: skip


def test_data_parallel_pretraining_follows_the_single_process_trajectory(cli, tmp_path):
    # no dropout: its masks are drawn per process, so two processes draw other ones than one
    args = ["run", "--protocol", "pretrain", "--model", "vit-ti/16", "--steps", "4", "--dropout", "0"]
    args += ["--transfer", "none", *TINY]
    # the single process in this one (what it proves is the two processes' trajectory, not its own start)
    code, _, err = cli(*args, "--results", tmp_path / "one")
    assert code == 0, err
    two = _vitbench(*args, "--devices", "2", results=tmp_path / "two")
    assert two.returncode == 0, two.stderr
    loss = [store.read_curves(tmp_path / n).query("name == 'train_loss'")["value"].to_numpy() for n in ("one", "two")]
    assert len(loss[0]) == 4 and loss[0] == pytest.approx(loss[1], rel=1e-5, abs=1e-6)
    assert store.read_results(tmp_path / "two")["device_count"].iloc[0] == 2


def test_mpp_pretraining_learns_its_targets_and_its_weights_transfer(cli, results):
    code, _, err = cli("run", "--protocol", "pretrain", "--objective", "mpp", "--model", "vit-ti/16", "--steps", "80",
                       "--lr", "0.001", *TINY, "--res", "48", "--results", results)  # fmt: skip
    assert code == 0, err
    df = store.read_results(results)
    pre = df[df["protocol"] == "pretrain"].drop_duplicates("run_key").iloc[0]
    h, notes = json.loads(pre["hparams"]), json.loads(pre["notes"])
    assert (h["objective"], h["mpp_target"], h["mpp_rate"], h["lr_decay"]) == ("mpp", "mean-colour", 0.5, "cosine")
    scores = [v for _, v in notes["validation"]]
    assert max(scores) > scores[0] + 0.05, scores  # the masked patches' colours are learned
    few = df[(df["protocol"] == "fewshot") & ~df["random_init"]]
    assert len(few) == 3 and json.loads(few["notes"].iloc[0])["pretrained"]["objective"] == "mpp"
    # App. B.1.2: no early stopping; the last step's weights are the run's, scored at that step
    metrics = df[df["run_key"] == pre["run_key"]].set_index("metric")["value"]
    assert h["early_stopping"].startswith("none (App. B.1.2)") and metrics["best_step"] == 80
    assert notes["validation"][-1][0] == 80 and metrics["val_accuracy"] == notes["validation"][-1][1]
    assert json.loads(few["notes"].iloc[0])["pretrained"]["best_step"] == 80


def test_mpp_defaults_to_app_b12s_one_million_steps_at_batch_4096():
    """Without --steps or --epochs, MPP trains App. B.1.2's 1M steps of 4,096 images (the same
    images at another batch), where supervised pre-training takes Table 3's epochs."""
    import vitbench

    common = {"protocol": "pretrain", "model": "vit-ti/16", "datasets": "digits0-4", "transfer": ("none",),
              "res": 32}  # fmt: skip
    (mpp,) = vitbench.plan(objective="mpp", batch=512, **common)
    (supervised,) = vitbench.plan(batch=512, **common)
    h, s = mpp.specs[0].hparams, supervised.specs[0].hparams
    assert h["steps"] == 1_000_000 * 4096 // 512 and h["steps_rule"].startswith("App. B.1.2: 1M steps")
    assert s["steps"] < 10_000 and s["early_stopping"].startswith("best dev accuracy")


def test_a_bit_resnet_pretrains_through_its_own_head(cli, results):
    """A ResNet has no pre_logits layer and a 1x1-convolution head: it trains through timm's forward."""
    code, _, err = cli("run", "--protocol", "pretrain", "--model", "bit-m-r50x1", "--steps", "2", "--batch", "8",
                       "--dataset", "digits0-4", "--transfer", "none", "--workers", "0", "--res", "32",
                       "--results", results)  # fmt: skip
    assert code == 0, err
    run = store.read_results(results).drop_duplicates("run_key").iloc[0]
    assert run["backend"] == "bit" and json.loads(run["hparams"])["head"] == "linear"


def test_ctrl_c_during_pretraining_names_what_resumes(cli, results, monkeypatch):
    """Before: Ctrl-C during pre-training said "a fine-tune continues from its last checkpoint". The
    hint is now said where the cut-off run left a checkpoint (not from a flag the protocol sets), and
    only there: a run stopped before its first checkpoint starts again."""
    from vitbench.engine import train_checkpoint, training

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    run = ("run", "--protocol", "pretrain", "--model", "vit-ti/16", "--smoke", "--steps", "4", "--checkpoint-every",
           "2", *TINY, "--results", results)  # fmt: skip
    with monkeypatch.context() as patched:
        patched.setattr(training, "_steps", interrupted)
        code, _, err = cli(*run)
    assert code == 130 and "interrupted: 0 of 1 runs stored; run the same command again to do the rest\n" in err
    saved = train_checkpoint.save

    def save_then_interrupt(*args, **kwargs):
        saved(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(train_checkpoint, "save", save_then_interrupt)
    code, _, err = cli(*run)
    assert code == 130
    assert (
        "interrupted: 0 of 1 runs stored; run the same command again to do the rest (the interrupted pretrain "
        "run continues from its last checkpoint)" in " ".join(err.split())
    )


def test_the_relative_variants_record_what_they_compute():
    """`relative` (App. D.4's) and `relative-bias` (vitbench's) record their method, so neither
    shares a run key with the other nor with a `relative` run stored before issue 35; the other
    variants' keys are unchanged."""
    import vitbench

    common = {"protocol": "pretrain", "model": "vit-ti/16", "datasets": "digits0-4", "transfer": ("none",),
              "res": 32, "smoke": True}  # fmt: skip
    variants = ("1-d", "relative", "relative-bias")
    hparams = {v: vitbench.plan(pos_embed=v, **common)[0].specs[0].hparams for v in variants}
    assert hparams["relative"]["relative_positions"].startswith("App. D.4: 1-D offset embeddings")
    assert hparams["relative-bias"]["relative_positions"].startswith("vitbench's")
    assert "relative_positions" not in hparams["1-d"]


def test_transfer_defaults_to_imagenet_where_its_few_shot_splits_are_there(imagenet_dir):
    """Fig 4's metric is 5-shot on ImageNet: the default --transfer where ImageNet's train and val
    folders are under --data-dir; else the pre-training dataset itself."""
    import shutil

    import vitbench
    from vitbench import api
    from vitbench.protocols.pretrain import PRETRAIN

    options = {"protocol": "pretrain", "model": "vit-ti/16", "datasets": "digits0-4", "smoke": True,
               "data_dir": imagenet_dir}  # fmt: skip
    req = api.request(**options)
    assert PRETRAIN.followups(req, vitbench.plan(req))[0].datasets == ("digits0-4",)  # ImageNet: val only
    shutil.copytree(imagenet_dir / "imagenet" / "val", imagenet_dir / "imagenet" / "train")
    assert PRETRAIN.followups(req, vitbench.plan(req))[0].datasets == ("imagenet",)
    explicit = api.request(**options, transfer=("digits5-9",))
    assert PRETRAIN.followups(explicit, vitbench.plan(explicit))[0].datasets == ("digits5-9",)


@pytest.mark.parametrize("option", ["--dedup-against", "--transfer"])
def test_a_misspelt_dataset_of_a_pretraining_option_names_the_option(cli, tmp_path, option):
    """Before: "unknown dataset 'nosuch'", without the option that named it."""
    code, _, err = cli("run", "--protocol", "pretrain", "--model", "vit-ti/16", "--dataset", "digits0-4", option,
                       "nosuch", "--dry-run", "--results", tmp_path)  # fmt: skip
    assert code == 2 and f"{option} nosuch: unknown dataset 'nosuch'" in err and "Traceback" not in err


def test_the_transfer_stage_runs_how_and_where_the_pre_training_ran():
    """Issue 48: `followups` copied 13 Request fields by hand, so a field it did not name was
    silently dropped (--gelu tanh pre-trained a tanh network, then few-shot evaluated it with exact
    GELU; --precision, --verify-data, --download, --data-source were lost too). The next stage now
    takes every field but what it evaluates from the request (Request.next_stage)."""
    from dataclasses import fields

    import vitbench
    from vitbench import api
    from vitbench.protocols.base import WHAT
    from vitbench.protocols.pretrain import PRETRAIN

    req = api.request(protocol="pretrain", model="vit-ti/16", datasets="digits0-4", smoke=True, gelu="tanh",
                      precision="fp32", verify_data=True, workers=0, transfer=("digits5-9",),
                      transfer_shots=(5,))  # fmt: skip
    (after,) = PRETRAIN.followups(req, vitbench.plan(req))
    carried = [f.name for f in fields(req) if f.name not in WHAT]
    assert {name: getattr(after, name) for name in carried} == {name: getattr(req, name) for name in carried}
    assert after.gelu == "tanh" and after.verify_data and after.precision == "fp32"
    assert (after.protocol, after.model, after.datasets, after.options.values()) == (
        "fewshot", "vit-ti/16", ("digits5-9",), {"shots": (5,)})  # fmt: skip
    assert after.weights.startswith("random,") and after.suite is None
