"""`pip install .` as a user does it, not `-e`: vitbench's own wheel, built from a copy of the
source, installed into a clean virtual environment, runs from that environment's `vitbench`
script, with the built-in backends (plugins/, installed as `vitbench_plugins`) and the paper's
tables (data files under the environment's share/) taken from the wheel alone; and a dataset-format
plugin built from the docs' worked example installs beside it."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "vitbench", "plugins", "results/paper", "results/measured")


def _run(*command, cwd: Path | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("VITBENCH_")}
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)


@pytest.fixture(scope="module")
def clean_env(tmp_path_factory) -> Path:
    """A venv holding the vitbench wheel and nothing else of vitbench. Its third-party dependencies
    (torch, timm, …) are the test environment's, made visible by a .pth line: installing them again
    would download gigabytes. A .pth line is no site directory, so the test environment's editable
    vitbench (its own .pth and finder) stays invisible there."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    built = _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                 "-w", str(root / "dist"), str(source))  # fmt: skip
    assert built.returncode == 0, built.stderr
    (wheel,) = (root / "dist").glob("vitbench-*.whl")
    venv = root / "venv"
    assert _run(sys.executable, "-m", "venv", "--without-pip", str(venv)).returncode == 0
    python = venv / "bin" / "python"
    installed = _run(sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                     "--no-index", str(wheel))  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    site = _run(str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
    (Path(site) / "test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


@pytest.mark.slow
def test_the_built_wheel_installs_and_runs_from_a_clean_venv(clean_env, tmp_path):
    python = clean_env / "bin" / "python"
    # from an empty folder: `python -c` puts the current folder first on sys.path (a checkout would win)
    code = "import vitbench, vitbench_plugins, vitbench.reference.paper as p, vitbench.reference.shipped_rates as r; "
    code += "print(vitbench.__file__, vitbench_plugins.__file__, p.paper_dir(), r.measured_dir(), sep='\\n')"
    where = _run(str(python), "-c", code, cwd=tmp_path)
    assert where.returncode == 0, where.stderr
    module, plugins, paper, measured = where.stdout.split()
    assert all(Path(p).is_relative_to(clean_env) for p in (module, plugins, paper, measured)), where.stdout
    assert Path(paper) == clean_env / "share" / "vitbench" / "paper"  # the data files came with the wheel
    assert Path(measured) == clean_env / "share" / "vitbench" / "measured"  # --price-on's rates too

    # a run through a built-in backend (an entry point of the wheel's metadata), stored, then tabled
    # beside the paper's column (a data file of the wheel); the demo itself is the README walk's
    vitbench = str(clean_env / "bin" / "vitbench")
    run = _run(vitbench, "run", "--model", "vit-ti/16", "--weights", "random", "--dataset", "digits", "--res", "32",
               "--shots", "1", "--seeds", "0", "--workers", "0", cwd=tmp_path, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert "[1/1] vit-ti/16 (random init) digits fewshot shots=1 seed 0: accuracy" in run.stderr
    shown = _run(vitbench, "table", "--compare", "bit-l", "--all-rows", "--format", "csv", cwd=tmp_path)
    assert shown.returncode == 0 and "CIFAR-10,bit-l (paper),99.37" in shown.stdout, shown.stderr
    assert (tmp_path / "results" / "vitbench.duckdb").exists()
    listed = _run(vitbench, "ls", "models", cwd=tmp_path)
    assert listed.returncode == 0 and "vit-b/16" in listed.stdout and "bit-m-r50x1" in listed.stdout  # entry points


def _documented_package(target: Path, package: str = "acme-csv") -> Path:
    """A plugin of docs/architecture.md, each file taken from its code block (`# acme-csv/…` on the
    block's first line) exactly as a reader would copy it."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    blocks = re.findall(rf"```(?:python|toml)\n# ({package}/[\w.]+)\n(.*?)```", text, flags=re.S)
    module = package.replace("-", "_")
    assert {name for name, _ in blocks} == {f"{package}/{module}.py", f"{package}/pyproject.toml"}
    for name, body in blocks:
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        (target / name).write_text(body)
    return target / package


def _install_documented(clean_env: Path, tmp_path: Path, package: str) -> None:
    """The docs' `package` built into a wheel and installed into the clean venv, as a user would."""
    source = _documented_package(tmp_path / "plugin", package)
    built = _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                 "-w", str(tmp_path / "dist"), str(source))  # fmt: skip
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob(f"{package.replace('-', '_')}-*.whl")
    python = clean_env / "bin" / "python"
    installed = _run(sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                     "--no-index", str(wheel))  # fmt: skip
    assert installed.returncode == 0, installed.stderr


def _photos_csv(root: Path) -> Path:
    """Three classes of real PNG files (each a colour with noise) listed in a CSV of path,label,split."""
    rng = np.random.default_rng(0)
    rows = ["path,label,split"]
    for c, colour in enumerate(((200, 40, 40), (40, 200, 40), (40, 40, 200))):
        for split, n in (("train", 8), ("test", 6)):
            for i in range(n):
                pixels = np.clip(np.array(colour) + rng.normal(0, 40, (24, 24, 3)), 0, 255).astype(np.uint8)
                path = Path("images") / f"{split}-{c}-{i}.png"
                (root / path).parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(pixels).save(root / path)
                rows.append(f"{path},class{c},{split}")
    (root / "photos.csv").write_text("\n".join(rows) + "\n")
    return root / "photos.csv"


@pytest.mark.slow
def test_the_documented_format_plugin_installs_beside_the_wheel_and_runs_knn(clean_env, tmp_path):
    """Issue 45: a parametric dataset format (`csv:<file>`) from a package of its own, built from the
    docs' two files as written and installed into the same fresh venv as vitbench's wheel; k-NN runs
    on it end to end from that venv's `vitbench`."""
    _install_documented(clean_env, tmp_path, "acme-csv")
    vitbench = str(clean_env / "bin" / "vitbench")
    listed = _run(vitbench, "ls", "datasets", cwd=tmp_path)
    assert listed.returncode == 0 and "csv:<…> reads a CSV file of path,label,split rows" in listed.stdout

    table = _photos_csv(tmp_path / "photos")
    run = _run(vitbench, "run", "--model", "vit-ti/16", "--weights", "random", "--res", "32", "--workers", "0",
               "--protocol", "knn", "--knn-k", "3", "--dataset", f"csv:{table}", cwd=tmp_path, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert re.search(r"\[1/1\] vit-ti/16 \(random init\) csv:photos@\w{8} knn k=3: accuracy", run.stderr), run.stderr
    shown = _run(vitbench, "table", "--format", "csv", cwd=tmp_path)
    (row,) = [line for line in shown.stdout.splitlines() if line.startswith("csv:photos@")]
    assert float(row.split(",")[2]) > 100 / 3  # three colours: a random ViT's features beat chance
    missing = _run(vitbench, "run", "--model", "vit-ti/16", "--weights", "random", "--dataset", "csv:nope.csv",
                   cwd=tmp_path)  # fmt: skip
    assert missing.returncode == 2 and "csv:nope.csv: no such file" in missing.stderr
    assert "Traceback" not in missing.stderr


@pytest.mark.slow
def test_the_documented_nn_module_backbone_installs_beside_the_wheel_and_runs(clean_env, tmp_path):
    """Issue 68: a backbone of one's own (an nn.Module that is not in timm), from the docs' two files
    as written, installed into the fresh venv beside vitbench's wheel: few-shot runs on it at random
    init and with weights of one's own (its state dict as a .safetensors file, the file's sha256 the
    weights' fingerprint), and the table names it."""
    _install_documented(clean_env, tmp_path, "acme-cnn")
    vitbench = str(clean_env / "bin" / "vitbench")
    listed = _run(vitbench, "ls", "models", cwd=tmp_path)
    assert listed.returncode == 0 and "acme-cnn" in listed.stdout, listed.stderr
    common = ["--model", "acme-cnn", "--res", "32", "--dataset", "digits", "--shots", "1,5", "--seeds", "0",
              "--workers", "0"]  # fmt: skip
    run = _run(vitbench, "run", *common, "--weights", "random", cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "[2/2] acme-cnn (random init) digits fewshot shots=5 seed 0: accuracy" in run.stderr
    # the user's own trained weights: a state dict saved from the module the backend builds
    python = str(clean_env / "bin" / "python")
    save = ("import torch, acme_cnn; from safetensors.torch import save_file; torch.manual_seed(1); "
            "m = acme_cnn.TinyCNN(10); save_file(m.state_dict(), 'acme.safetensors')")  # fmt: skip
    assert _run(python, "-c", save, cwd=tmp_path).returncode == 0
    run = _run(vitbench, "run", *common, "--weights", "acme.safetensors", cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    shown = _run(vitbench, "table", "--format", "md", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "| acme-cnn · 5-shot |" in shown.stdout and "| acme-cnn† · 5-shot |" in shown.stdout  # trained, random
    sha = hashlib.sha256((tmp_path / "acme.safetensors").read_bytes()).hexdigest()
    assert f"weights acme.safetensors sha256 {sha[:12]}" in shown.stdout  # the user's file, fingerprinted
    assert "weights random init (seeded)" in shown.stdout
