"""One public plugin surface (issue 98): a plugin imports vitbench only from `vitbench.plugin` (and
`vitbench` itself), so that vitbench's own modules may move without breaking a plugin written
elsewhere. The docs, the README, the built-in plugins and the test plugins are held to it; the
module's `__all__` names what it gives, each the very object vitbench uses, and importing it loads
no heavy package. The package's top level keeps few modules, every package says what it holds."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import test_plugins
import test_protocol_plugin

import vitbench.plugin

ROOT = Path(__file__).resolve().parents[1]


def _internal_imports(source: str, where: str) -> list[str]:
    """`where:line imports vitbench.x` for each import of vitbench other than `vitbench` and `vitbench.plugin`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module]
            if node.module == "vitbench":  # `from vitbench import store` is an internal module by another door
                names = [f"vitbench.{alias.name}" for alias in node.names if alias.name != "plugin"]
                names = [n for n in names if n.removeprefix("vitbench.") not in vitbench.__all__]
        else:
            continue
        found += [f"{where}:{node.lineno} imports {n}" for n in names if n.startswith("vitbench.") and
                  n != "vitbench.plugin"]  # fmt: skip
    return found


def _python_blocks(markdown: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", markdown, flags=re.S)


def test_docs_readme_and_plugins_import_vitbench_only_from_the_plugin_module():
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for number, block in enumerate(_python_blocks(path.read_text())):
            found += _internal_imports(block, f"{path.relative_to(ROOT)} block {number + 1}")
    for path in sorted((ROOT / "plugins").glob("*.py")):
        found += _internal_imports(path.read_text(), str(path.relative_to(ROOT)))
    tested = {
        "test_plugins.PLUGIN_SOURCE": test_plugins.PLUGIN_SOURCE,
        "test_protocol_plugin.PACKAGE": test_protocol_plugin.PACKAGE,
        "test_protocol_plugin.VIEW_MODULE": test_protocol_plugin.VIEW_MODULE,
    }
    for where, source in tested.items():
        found += _internal_imports(source, where)
    assert found == []
    # and the checker sees what it must: an internal import, by either door
    assert _internal_imports("from vitbench.protocols.base import Protocol\nfrom vitbench import store\n", "x") == [
        "x:1 imports vitbench.protocols.base",
        "x:2 imports vitbench.store",
    ]


def test_the_plugin_module_gives_what_it_lists_and_loads_nothing_heavy():
    """Each name of `__all__` is vitbench's own object (not a copy a plugin would subclass in vain);
    `import vitbench.plugin` (what a view's or a dataset's plugin does under `vitbench table`) loads no
    torch, timm, pandas or matplotlib; the names that need torch load it when first named."""
    from vitbench.engine import features
    from vitbench.models import backend
    from vitbench.protocols import base

    names = vitbench.plugin.__all__
    assert len(names) == len(set(names)) and all(hasattr(vitbench.plugin, n) for n in names)
    assert vitbench.plugin.Protocol is base.Protocol and vitbench.plugin.Backend is backend.Backend
    assert vitbench.plugin.group_model is features.group_model
    code = (
        "import sys, vitbench.plugin as p\n"
        "heavy = lambda: sorted(m for m in ('torch', 'timm', 'pandas', 'matplotlib') if m in sys.modules)\n"
        "print(heavy()); p.outputs_over; print(heavy())"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert done.stdout.split("\n")[:2] == ["[]", "['timm', 'torch']"], done.stdout
    assert "group_model" in vitbench.plugin.__doc__ and "UserError" in vitbench.plugin.__doc__


def test_the_top_level_keeps_few_modules_and_every_package_says_what_it_holds_and_may_import():
    top = sorted(p.name for p in (ROOT / "vitbench").glob("*.py"))
    assert top == ["__init__.py", "__main__.py", "api.py", "errors.py", "plugin.py", "version.py"]
    for init in sorted((ROOT / "vitbench").glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert len(doc) > 80, f"{init.relative_to(ROOT)}: say what the package holds"
    for init in sorted((ROOT / "vitbench").glob("*/__init__.py")):
        package = init.parent.name
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "May import" in doc, f"{package}: say what it may import (pyproject.toml's layers hold it)"
