"""Numbers independent of how they were computed (issue 46, goal 5): the same request at another
extraction batch or thread count, or on two processes, stores the same per-image predictions under
the same run keys.
Other harnesses lose exactly this (lm-evaluation-harness #2140: its cache works only with the same
GPU count; dinov2 #106: a linear result reproduced only on 8 GPUs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch
from threadpoolctl import threadpool_limits

from vitbench import store
from vitbench.store.predictions import read_predictions

FAST = ("--model", "vit-ti/16", "--weights", "random", "--dataset", "digits", "--res", "32", "--workers", "0")


def stored_predictions(results) -> dict:
    """{run key: (protocol, top-1 by image id)} of every stored run."""
    runs = store.read_results(results).drop_duplicates("run_key")
    found = {}
    for _, run in runs.iterrows():
        table = read_predictions(results, run["run_key"], json.loads(run["notes"])["predictions"])
        assert table is not None, f"{run['protocol']} kept no predictions"
        found[run["run_key"]] = (run["protocol"], table.set_index("id")["top1"].sort_index())
    return found


def test_predictions_and_run_keys_do_not_depend_on_the_extraction_batch_threads_or_processes(cli, tmp_path):
    """Few-shot, k-NN, the linear probe and the checkpoint's own head (eval) at extraction batches
    64, 8 and 256, on 2 threads and on 1 (torch's and the BLAS's), and on two processes
    (`--devices 2`: torchrun, gloo, each extracting half of every split): every one of digits' 797
    test predictions the same, each run under the same key. Before linear/5 one linear-probe
    prediction moved with the BLAS's threads; before these protocols ran data-parallel, `--devices
    2` was refused."""
    found = {}
    two = tmp_path / "two-processes"
    command = [sys.executable, "-m", "vitbench", "run", *FAST, "--protocol", "fewshot,knn,linear,eval", "--shots", "5"]
    command += ["--seeds", "0", "--knn-k", "5", "--devices", "2", "--results", str(two)]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"}, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    found["two processes"] = stored_predictions(two)
    assert set(store.read_results(two)["device_count"]) == {2}
    for batch, threads in ((64, 2), (8, 2), (256, 1)):
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            with threadpool_limits(threads):
                code, _, err = cli(
                    "run", *FAST, "--protocol", "fewshot,knn,linear,eval", "--shots", "5", "--seeds", "0",
                    "--knn-k", "5", "--extraction-batch", batch,
                    "--results", tmp_path / f"batch{batch}-threads{threads}",
                )  # fmt: skip
        finally:
            torch.set_num_threads(before)
        assert code == 0, err
        found[(batch, threads)] = stored_predictions(tmp_path / f"batch{batch}-threads{threads}")
    reference = found[(64, 2)]
    assert sorted(protocol for protocol, _ in reference.values()) == ["eval", "fewshot", "knn", "linear"]
    for how, runs in found.items():
        assert runs.keys() == reference.keys(), how
        for key, (protocol, top1) in runs.items():
            assert len(top1) == 797 and top1.equals(reference[key][1]), (how, protocol)
