"""Commands that only read results, list or explain answer at once: none of them imports torch,
timm or torchvision (seconds of import), only the figure commands import matplotlib, and only those
that read a table or the store import pandas and DuckDB (half a second: `vitbench --help` took 1.6 s
under load with them). Each command runs in a fresh interpreter, as a person's shell runs it, and
reports `sys.modules` after."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("torch", "timm", "torchvision", "matplotlib", "pandas", "duckdb")
PROBE = f"""
import json, sys
from vitbench.cli import main
sys.argv = ["vitbench", *json.loads(sys.argv[1])]
try:
    main()
except SystemExit as e:
    code = e.code
else:
    code = 0
print("\\nMODULES " + json.dumps([m for m in {HEAVY} if m in sys.modules]))
sys.exit(code or 0)
"""


def light_commands(results: Path, out: Path) -> dict[str, tuple[list[str], set[str]]]:
    """name -> (argv, heavy modules it may import)."""
    r = ["--results", str(results)]
    tables = {"pandas"}  # the paper's tables (ls models), scikit-learn's digits (doctor)
    store = {"pandas", "duckdb"}
    figures = {"matplotlib", *store}
    return {
        "--help": (["--help"], set()),
        "run --help": (["run", "--help"], set()),
        "bench --help": (["bench", "--help"], set()),
        "inspect --help": (["inspect", "--help"], set()),
        "ls models": (["ls", "models"], tables),
        "ls datasets": (["ls", "datasets"], set()),
        "ls protocols": (["ls", "protocols"], set()),
        "ls suites": (["ls", "suites"], set()),
        "doctor": (["doctor"], tables),
        "table": (["table", *r], store),
        "table --ci": (["table", "--ci", "--protocol", "fewshot", *r], store),
        "table --shots 1 --format md": (["table", "--shots", "1", "--format", "md", *r], store),
        "export": (["export", "--format", "csv", "--out", str(out / "runs.csv"), *r], store),
        "compare": (["compare", "seed=0", "seed=0", *r], store),
        "ingest": (["ingest", *r], store),
        "report": (["report", "--out", str(out / "report.html"), *r], figures),
        "plot fewshot": (["plot", "fewshot", "--out", str(out / "plots"), *r], figures),
    }


@pytest.fixture(scope="module")
def probed(one_run, tmp_path_factory) -> dict[str, tuple[int, list[str], str]]:
    """Every light command run once, two at a time (the machine's cores), on a copy of a real store."""
    base = tmp_path_factory.mktemp("light")
    results = base / "results"
    shutil.copytree(one_run, results)
    commands = light_commands(results, base)
    env = {**os.environ, "COLUMNS": "200"}
    found: dict[str, tuple[int, list[str], str]] = {}
    names = list(commands)
    for start in range(0, len(names), 2):
        running = {
            name: subprocess.Popen(
                [sys.executable, "-c", PROBE, json.dumps(commands[name][0])],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )  # fmt: skip
            for name in names[start : start + 2]
        }
        for name, proc in running.items():
            stdout, stderr = proc.communicate(timeout=120)
            line = next((x for x in stdout.splitlines() if x.startswith("MODULES ")), "MODULES null")
            found[name] = (proc.returncode, json.loads(line.removeprefix("MODULES ")), stderr)
    return found


@pytest.mark.parametrize("name", list(light_commands(Path("r"), Path("o"))))
def test_a_light_command_imports_no_engine(probed, name):
    code, modules, stderr = probed[name]
    allowed = light_commands(Path("r"), Path("o"))[name][1]
    assert code == 0, f"vitbench {name} failed: {stderr[-800:]}"
    assert modules is not None, f"vitbench {name} did not report its modules: {stderr[-800:]}"
    assert set(modules) <= allowed, f"vitbench {name} imported {sorted(set(modules) - allowed)}"


def test_the_probe_sees_heavy_imports(tmp_path):
    """The probe is not blind: a command that builds a model reports torch and timm."""
    weights = tmp_path / "w"
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(["weights", "inspect", str(weights)])],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    line = next(x for x in proc.stdout.splitlines() if x.startswith("MODULES "))
    assert proc.returncode == 2 and "torch" in json.loads(line.removeprefix("MODULES "))


# Issue 70: nothing imported that the command does not use. timm and torchvision import torch._dynamo
# and triton for torch.compile, and so do torch's optimizers and the meta-device kernels of a FLOP count
# (vitbench/deferred_dynamo.py puts all three off): a dry run that counts, every protocol's run, eval
# and dedup go without them.
UNUSED = ("torch._dynamo", "triton", "torchvision.transforms.v2")
UNUSED_PROBE = PROBE.replace(repr(HEAVY), repr(UNUSED))
DIGITS = ["--model", "vit-ti/16", "--weights", "random", "--dataset", "digits", "--res", "32", "--workers", "0"]


def unused_imports(argv: list[str], env: dict) -> list[str]:
    proc = subprocess.run([sys.executable, "-c", UNUSED_PROBE, json.dumps(argv)], capture_output=True, text=True,
                          env=env, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("MODULES ")).removeprefix("MODULES "))


def test_a_run_imports_no_compiler_it_does_not_use(tmp_path):
    env = {**os.environ, "COLUMNS": "200", "VITBENCH_CACHE": str(tmp_path / "cache")}
    results = ["--results", str(tmp_path / "results")]
    # the first count of a network at a size: its meta-device kernels import no torch._dynamo, and
    # torch.utils.flop_counter's module-level triton import is held off (deferred_dynamo.flop_counter_mode)
    assert unused_imports(["run", *DIGITS, "--dry-run", *results], env) == []
    assert list((tmp_path / "cache").glob("flop-counts.json"))
    protocols = ["--protocol", "fewshot,knn,linear", "--shots", "1", "--seeds", "0", "--knn-k", "5"]
    assert unused_imports(["run", *DIGITS, *protocols, *results], env) == []
    assert unused_imports(["run", *DIGITS, "--protocol", "eval", *results], env) == []
    assert unused_imports(["dedup", "--dataset", "digits", *results], env) == []
    smoke = ["--protocol", "finetune,pretrain", "--smoke", "--steps", "2", "--seeds", "0", "--transfer", "none"]
    assert unused_imports(["run", *DIGITS, *smoke, *results], env) == []


def test_a_flop_count_without_torch_dynamo_counts_what_it_counts_with_it():
    """Counting on the meta device with torch._dynamo a stand-in (deferred_dynamo.disable_only) counts
    what torch counts with the real module, and leaves torch's wrappers working once it is imported."""
    code = (
        "import sys, vitbench, torch\n"
        "from vitbench.registry import get_model\n"
        "spec = get_model('vit-ti/16')\n"
        "without = spec.backend._count_flops(spec, 48)\n"
        "assert 'torch._dynamo' not in sys.modules and '_dynamo' not in vars(torch)\n"
        "assert 'triton' not in sys.modules  # held off while torch.utils.flop_counter loaded\n"
        "import importlib.util\n"
        "if importlib.util.find_spec('triton'):  # still there for a compile: the real package\n"
        "    import triton.runtime.jit\n"
        "    assert type(sys.modules['triton']).__name__ == 'module'\n"
        "import torch._dynamo\n"
        "assert type(torch._dynamo).__name__ == 'module'\n"
        "assert without == spec.backend._count_flops(spec, 48) > 0\n"
        "print('SAME', without)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "SAME" in proc.stdout, proc.stderr[-2000:]


def test_what_is_put_off_is_the_real_thing_when_compiling():
    """After timm and torchvision are imported without it, torch._dynamo is torch's own: torch.compile
    works, and roi_align's `is_compile_supported` answers through the real one."""
    code = (
        "import sys, vitbench, timm, torchvision, torch\n"
        "assert 'torch._dynamo' not in sys.modules and 'triton' not in sys.modules\n"
        "from torchvision.ops import roi_align as ops\n"
        "f = torch.compile(lambda a: a * 2 + 1, backend='eager')\n"
        "assert f(torch.ones(2)).tolist() == [3.0, 3.0]\n"
        "import torch._dynamo.utils as u\n"
        "assert type(u).__name__ == 'module' and sys.modules['torch._dynamo.utils'] is u\n"
        "assert sys.modules['torchvision.ops.roi_align'].is_compile_supported('cpu') == u.is_compile_supported('cpu')\n"
        "assert torch.compiler.disable.__module__ == 'torch.compiler'\n"
        "print(ops(torch.randn(1, 1, 8, 8), [torch.tensor([[0, 0, 4, 4.0]])], output_size=2).shape)\n"
    )
    assert "torch.Size([1, 1, 2, 2])" in in_a_fresh_python(code)


def in_a_fresh_python(code: str) -> str:
    """What `code` prints, run by a Python of its own (what it imports is its own)."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_an_optimizer_steps_alike_without_and_with_torch_dynamo():
    """SGD's and AdamW's `step` without torch._dynamo's import is torch's: the same parameters after
    each step as torch's own wrapper gives (run once torch._dynamo is imported), under no_grad, and
    torch's wrapper again once it is imported (its zero_grad and state_dict too)."""
    code = (
        "import sys, vitbench, timm, torch\n"
        "def steps(make):\n"
        "    torch.manual_seed(0)\n"
        "    w = torch.nn.Parameter(torch.randn(4, 3))\n"
        "    opt = make([w])\n"
        "    for _ in range(3):\n"
        "        opt.zero_grad()\n"
        "        loss = (w.sin() ** 2).sum()\n"
        "        loss.backward()\n"
        "        opt.step()\n"
        "        assert torch.is_grad_enabled() and not w.grad_fn\n"
        "    opt.load_state_dict(opt.state_dict())\n"
        "    return w.detach().clone()\n"
        "makers = [lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=1e-4),\n"
        "          lambda p: torch.optim.AdamW(p, lr=0.1, weight_decay=0.1)]\n"
        "before = [steps(m) for m in makers]\n"
        "assert 'torch._dynamo' not in sys.modules and 'triton' not in sys.modules\n"
        "import torch._dynamo\n"
        "after = [steps(m) for m in makers]\n"
        "assert all(torch.equal(a, b) for a, b in zip(before, after)) and not torch.equal(before[0], before[1])\n"
        "fn = torch.optim.Optimizer.zero_grad.__wrapped__\n"
        "assert 'as_is_until_dynamo' not in fn.__dynamo_disable.__qualname__\n"
        "print('alike')\n"
    )
    assert "alike" in in_a_fresh_python(code)
