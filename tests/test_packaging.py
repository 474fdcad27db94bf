"""`pip install .` as a user does it, not `-e`: vitbench's own wheel, built from a copy of the
source, installed into a clean virtual environment, runs the demo from that environment's
`vitbench` script, with the built-in backends (plugins/, installed as `vitbench_plugins`) and the
paper's tables (data files under the environment's share/) taken from the wheel alone."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "vitbench", "plugins", "results/paper")


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
def test_the_built_wheel_installs_and_runs_the_demo_in_a_clean_venv(clean_env, tmp_path):
    python = clean_env / "bin" / "python"
    # from an empty folder: `python -c` puts the current folder first on sys.path (a checkout would win)
    code = "import vitbench, vitbench_plugins, vitbench.paper as p; "
    code += "print(vitbench.__file__, vitbench_plugins.__file__, p.paper_dir(), sep='\\n')"
    where = _run(str(python), "-c", code, cwd=tmp_path)
    assert where.returncode == 0, where.stderr
    module, plugins, paper = where.stdout.split()
    assert all(Path(p).is_relative_to(clean_env) for p in (module, plugins, paper)), where.stdout
    assert Path(paper) == clean_env / "share" / "vitbench" / "paper"  # the data files came with the wheel

    demo = _run(str(clean_env / "bin" / "vitbench"), "run", cwd=tmp_path, timeout=600)
    assert demo.returncode == 0, demo.stderr[-2000:]
    assert "Pre-training and what it buys" in demo.stdout and "random init" in demo.stdout
    assert (tmp_path / "results" / "demo" / "vitbench.duckdb").exists()
    listed = _run(str(clean_env / "bin" / "vitbench"), "ls", "models", cwd=tmp_path)
    assert listed.returncode == 0 and "vit-b/16" in listed.stdout and "bit-m-r50x1" in listed.stdout  # entry points
