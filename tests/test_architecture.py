"""The architecture holds: the import contract of pyproject.toml ([tool.importlinter]: layers
point down, no cycles) is kept, and vitbench's modules import each other at module level only."""

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_import_contract_is_kept():
    lint_imports = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    if not Path(lint_imports).exists():
        pytest.skip("import-linter is not installed (pip install -e '.[dev]')")
    done = subprocess.run(
        [lint_imports, "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert done.stdout.count("KEPT") == 2


def test_vitbench_modules_are_imported_at_module_level_only():
    """Imports inside functions hid a circle of seven modules once; only optional third-party
    packages (submitit, tensorflow_datasets, …) and the package root's lazy API may be imported late."""
    late = []
    for path in sorted((ROOT / "vitbench").rglob("*.py")):
        if path == ROOT / "vitbench" / "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.col_offset and (node.module or "").startswith("vitbench"):
                late.append(f"{path.relative_to(ROOT)}:{node.lineno} from {node.module}")
    # TYPE_CHECKING blocks are indented too: they hold annotations only
    late = [entry for entry in late if "TYPE_CHECKING" not in _block_of(entry)]
    assert late == []


def _block_of(entry: str) -> str:
    path, line = entry.split(" ")[0].rsplit(":", 1)
    lines = (ROOT / path).read_text().splitlines()[: int(line)]
    for text in reversed(lines):
        if text and not text.startswith(" "):
            return text
    return ""
