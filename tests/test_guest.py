"""vitbench as a library is a good guest: `import vitbench`, `vitbench.plan(...)`, `vitbench.run(...)`
and `vitbench.results(...)` in a researcher's own process leave it as they found it — its environment
variables, `sys.meta_path`, torch's optimizers and compiler functions, thread settings, warning filters,
root logger, the global random generators (torch, numpy, Python), multiprocessing's start method,
signal handlers and running threads — save the modules vitbench imports; a mistake raises
`vitbench.UserError` only. The check runs in a fresh interpreter, as a
notebook's kernel would, with the user's own `HF_HUB_OFFLINE=0` set; on main 5649ac2 it failed on
`import vitbench` alone (GOMP_SPINCOUNT and HF_HUB_OFFLINE set)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

NOTEBOOK = r"""
import gc, hashlib, json, logging, multiprocessing, os, random, signal, sys, threading, time, warnings
import numpy as np
import torch, torch.optim, torch.compiler
# a researcher's notebook that uses timm, torchvision, scikit-learn and huggingface_hub itself: what
# their imports do to the process (timm's and torchvision's import torch._inductor, which sets
# TORCHINDUCTOR_CACHE_DIR; scikit-learn sets KMP_INIT_AT_FORK) is theirs, before vitbench comes in
import timm, torchvision, sklearn, huggingface_hub
if "s3://" in sys.argv[2]:  # ... and s3fs, reading from S3 itself (botocore's import adds its vendored six's finder)
    import s3fs
# ... and its own optimizers: torch wraps an optimizer class's `step` (its profiler hook) when the first
# one is made in a process, whoever makes it
for kind in ("SGD", "Adam", "AdamW"):
    getattr(torch.optim, kind)([torch.zeros(1, requires_grad=True)], lr=0.1)

OPTIMIZERS = ("SGD", "Adam", "AdamW")
OPTIMIZER_METHODS = ("step", "zero_grad", "add_param_group", "state_dict", "load_state_dict")


SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGCHLD", "SIGUSR1", "SIGUSR2", "SIGPIPE")


def digest(*parts):
    return hashlib.sha256(b"".join(p if isinstance(p, bytes) else repr(p).encode() for p in parts)).hexdigest()[:16]


def threads():
    "The threads still running once what ended is collected (a thread that is ending gets a second)."
    deadline = time.monotonic() + 5
    while True:
        gc.collect()
        alive = sorted(t.name.split(" ")[0].rstrip("-0123456789") for t in threading.enumerate())
        if len(alive) <= 1 or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def host():
    "What a library must leave as it found it, by identity where it is a function."
    functions = {f"{o}.{m}": id(getattr(getattr(torch.optim, o), m)) for o in OPTIMIZERS for m in OPTIMIZER_METHODS}
    functions.update({name: id(getattr(torch.compiler, name)) for name in ("disable", "is_compiling")})
    functions.update({"torch.compile": id(torch.compile), "torch._disable_dynamo": id(torch._disable_dynamo)})
    root = logging.getLogger()
    return {
        "environment": dict(os.environ),
        "meta_path": [f"{type(f).__module__}.{type(f).__qualname__}@{id(f)}" for f in sys.meta_path],
        "path_hooks": [repr(h) for h in sys.path_hooks],
        "functions": functions,
        "threads": [torch.get_num_threads(), torch.get_num_interop_threads()],
        "warning filters": [repr(f) for f in warnings.filters],
        "root logger": [root.level, [repr(h) for h in root.handlers]],
        # a seeded notebook's next draws: torch's, numpy's and Python's global generators
        "random states": {"torch": digest(torch.random.get_rng_state().numpy().tobytes()),
                          "numpy": digest(np.random.get_state()[1].tobytes(), np.random.get_state()[2:]),
                          "python": digest(random.getstate())},
        "start method": multiprocessing.get_start_method(allow_none=True),
        "signal handlers": {name: repr(signal.getsignal(getattr(signal, name))) for name in SIGNALS},
        "running threads": threads(),
        "stand-ins in sys.modules": sorted(n for n, m in sys.modules.items() if n.startswith("torch") and m is not None
                                           and type(m).__name__ != "module"),
    }


torch.manual_seed(0); np.random.seed(0); random.seed(0)  # a seeded notebook
before = host()
import vitbench

after_import = host()
results, dataset = sys.argv[1:3]
options = dict(model="vit-ti/16", weights="random", datasets=dataset, shots=(1,), seeds=(0,), res=32, workers=0,
               results=results)
planned = vitbench.plan(**options)
summary = vitbench.run(**options)
# DataLoader workers (their start method, SIGCHLD handler, queue threads) and a model fine-tuned
# from random init (its weights and the loader's seeds drawn from a generator)
tuned = vitbench.run(**{**options, "workers": 1, "protocol": "finetune", "steps": 2, "batch": 8, "device": "cpu"})
frame = vitbench.results(results, where=["protocol=fewshot"])
# a user's mistakes raise vitbench.UserError, nothing else
mistakes = {}
for name, call in {"a folder that is not there": lambda: vitbench.results(results + "-misspelt"),
                   "an unknown dataset": lambda: vitbench.run(**{**options, "datasets": "nope"}),
                   **({"a bucket that is not there": lambda: vitbench.run(**{**options, "datasets": "wds:s3://none/x"})}
                      if "s3://" in dataset else {})}.items():
    try:
        call()
        mistakes[name] = "nothing raised"
    except vitbench.UserError:
        mistakes[name] = "UserError"
    except Exception as e:
        mistakes[name] = type(e).__name__
after_use = host()
# the user's own work goes on as before: their torch.compile, their optimizer
step = torch.compile(lambda a: a * 2 + 1, backend="eager")
assert step(torch.ones(2)).tolist() == [3.0, 3.0]
print("REPORT " + json.dumps({"before": before, "after import": after_import, "after use": after_use,
                              "ran": [summary.ran, tuned.ran], "rows": len(frame), "mistakes": mistakes}))
"""


def test_import_plan_run_and_results_leave_the_host_process_as_they_found_it(tmp_path):
    _a_notebook_is_left_as_it_was(tmp_path, "digits")


def test_a_run_over_an_object_store_leaves_no_thread_or_loop_behind(s3, tmp_path):
    """Shards read from an S3 server (on 127.0.0.1) in the notebook's process and in a DataLoader
    worker: before, fsspec's IO thread (`fsspecIO`, its process-wide event loop) and that loop's
    resolver threads (`asyncio_0`) kept running after `vitbench.run` returned."""
    from container_data import samples, write_shards

    s3.put(str(write_shards(samples({"train": 2, "test": 1}), tmp_path / "shards")), "data/shards", recursive=True)
    _a_notebook_is_left_as_it_was(tmp_path, "wds:s3://data/shards")


def _a_notebook_is_left_as_it_was(tmp_path, dataset: str) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "0", "VITBENCH_CACHE": str(tmp_path / "cache")}
    env.pop("GOMP_SPINCOUNT", None)
    done = subprocess.run(
        [sys.executable, "-c", NOTEBOOK, str(tmp_path / "results"), dataset],
        capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Unclosed" not in done.stderr, done.stderr[-3000:]  # a client session left open for the GC to find
    report = json.loads(next(x for x in done.stdout.splitlines() if x.startswith("REPORT ")).removeprefix("REPORT "))
    assert report["ran"][0] == 1 and report["ran"][1] > 0 and report["rows"] == 1  # the API did its work
    assert set(report["mistakes"].values()) == {"UserError"}, report["mistakes"]
    before = report["before"]
    for moment in ("after import", "after use"):
        for what, was in before.items():
            now = report[moment][what]
            if what == "environment":
                changed = {k for k in was.keys() | now.keys() if was.get(k) != now.get(k)}
                assert not changed, f"{moment}: environment variables changed: {sorted(changed)}"
            elif what == "functions":
                replaced = [name for name in was if was[name] != now[name]]
                assert not replaced, f"{moment}: torch's {replaced} replaced"
            else:
                assert now == was, f"{moment}: {what} changed: {was} -> {now}"
    assert before["environment"]["HF_HUB_OFFLINE"] == "0"  # the user's own setting, kept


def test_import_vitbench_first_installs_nothing_and_imports_nothing_heavy():
    """Imported before torch (a script's first line), vitbench installs no import hook, sets nothing
    and loads no torch: the torch, timm and torchvision the script imports next are their own."""
    code = (
        "import os, sys\n"
        "environment, hooks = dict(os.environ), list(sys.meta_path)\n"
        "import vitbench\n"
        "assert dict(os.environ) == environment and sys.meta_path == hooks\n"
        "assert not {'torch', 'timm', 'torchvision', 'huggingface_hub'} & set(sys.modules)\n"
        "import timm, torch\n"
        "assert sys.meta_path == hooks and torch.compiler.disable.__module__ == 'torch.compiler'\n"
        "print('guest')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and "guest" in done.stdout, done.stderr[-2000:]
