"""The architecture holds: the import contract of pyproject.toml ([tool.importlinter]: layers
point down, no cycles) is kept, and vitbench modules are imported late only to keep a heavy package out."""

import ast
import os
import re
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
    assert done.stdout.count("KEPT") == 3


HEAVY = {"torch", "timm", "torchvision", "matplotlib", "scipy", "sklearn", "safetensors", "tensorflow",
         "tensorflow_datasets", "submitit", "tensorboard", "pandas", "duckdb"}  # fmt: skip


def test_a_vitbench_module_is_imported_late_only_to_keep_a_heavy_package_out():
    """Imports inside functions once hid a circle of seven modules: import-linter now reads them
    too (its `acyclic` contract above fails on one), and a vitbench module is imported inside a
    function only where its module-level imports reach torch, timm, matplotlib, … — the reason
    light commands stay light (tests/test_light_commands.py)."""
    top, late = _imports()
    heavy = {m for m in top if _reaches_heavy(m, top, set())}
    needless = [f"{where} imports {sorted(group)} late" for where, group in late if not group & heavy]
    assert needless == [], "import these at module level: they load nothing heavy"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    parts[0] = "vitbench_plugins" if parts[0] == "plugins" else parts[0]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> tuple[dict[str, set[str]], list[tuple[str, set[str]]]]:
    """Each module's module-level imports (TYPE_CHECKING blocks left out), and every late
    (inside a function) import statement of vitbench modules as (file:line, the modules it names);
    the package root's lazy API (`vitbench.run`) is left out."""
    top: dict[str, set[str]] = {}
    late: list[tuple[str, set[str]]] = []
    for path in [*sorted((ROOT / "vitbench").rglob("*.py")), *sorted((ROOT / "plugins").glob("*.py"))]:
        name, tree = _module_name(path), ast.parse(path.read_text())
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in tree.body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            for child in [node, *(node.body if isinstance(node, ast.Try) else [])]:
                found |= _targets(child, package)
        top[name] = found
        if path == ROOT / "vitbench" / "__init__.py":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                for inner in ast.walk(node):
                    group = {m for m in _targets(inner, package) if m.split(".")[0] in ("vitbench", "vitbench_plugins")}
                    if group:
                        late.append((f"{path.relative_to(ROOT)}:{inner.lineno}", group))
    return top, late


def _targets(node: ast.AST, package: str) -> set[str]:
    if isinstance(node, ast.Import):
        return {a.name for a in node.names}
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
        return {base} | {f"{base}.{a.name}" for a in node.names}
    return set()


def _reaches_heavy(module: str, top: dict[str, set[str]], seen: set[str]) -> bool:
    if module in seen:
        return False
    seen.add(module)
    parents = [".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)]  # packages run first
    for target in [*top.get(module, ()), *parents]:
        if target.split(".")[0] in HEAVY or (target in top and _reaches_heavy(target, top, seen)):
            return True
    return False


# where a protocol's name must never decide anything: the views ask a protocol's attributes instead
# (its metrics and their axes, whether it is a Trainer: protocols/base.py)
NAME_FREE = ("vitbench/views", "vitbench/execution", "vitbench/store", "vitbench/api.py", "vitbench/cli/output.py")


def test_no_view_and_no_runner_compares_a_protocol_name():
    """Issue 30: views tested protocol names (report headings keyed by name, `== "eval"` for the
    robustness and calibration rows, `== "pretrain"` for Fig 4/5, `== "finetune"` for the training
    curves), so a plugin protocol could not take part in them."""
    from vitbench.protocols.registry import BUILTIN

    names = {p.name for p in BUILTIN}
    found = []
    for root in NAME_FREE:
        paths = [ROOT / root] if root.endswith(".py") else sorted((ROOT / root).rglob("*.py"))
        for path in paths:
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Compare):
                    named = [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and n.value in names]
                elif isinstance(node, ast.Dict):  # a table keyed by protocol names is the same test
                    named = [k.value for k in node.keys if isinstance(k, ast.Constant) and k.value in names]
                    named = named if len(named) > 1 else []
                else:
                    continue
                if named:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} names {named}")
    assert found == []


def layout_modules(text: str) -> set[str]:
    """The modules docs/architecture.md's Layout describes, as paths under vitbench/: a name on a
    line under a folder's line (`  engine/`, or a package within it: `    views/tables/` written
    `    tables/`, two deeper) is that folder's, a name on a top-level line is vitbench's own; a name
    written with a folder (`views/statistics/significance.py`) is a reference, not a description, and counts
    for nothing."""
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    found: set[str] = set()
    folders: dict[int, str] = {}  # the indent of a folder's line -> its path under vitbench/
    for line in block.splitlines():
        indent = len(line) - len(line.lstrip())
        if indent == 0:
            if line.strip() and not line.startswith("vitbench/"):
                break  # plugins/: outside the package
            continue
        head = re.match(r"\s*([a-z_0-9]+)/\s", line + " ")
        if head or indent <= max(folders, default=0):  # a line at a folder's depth or above closes what is deeper
            folders = {i: f for i, f in folders.items() if i < indent}
        names = re.findall(r"(?<![/\w])([a-z_0-9]+\.py)\b", line)
        if head:
            parent = folders[max(folders)] + "/" if folders else ""
            folders[indent] = parent + head.group(1)
        if indent == 2 and not head:
            found |= {name for name in names[:1]}  # a top-level module's line starts with its name
            found |= {name for name in names[1:] if line.split()[0].endswith(",")}
        elif folders:
            found |= {f"{folders[max(folders)]}/{name}" for name in names}
    return found


def test_every_module_is_named_in_the_architecture_map():
    """Issue 30: docs/architecture.md omitted 31 modules; a new one now needs its line there, under
    its own folder (issue 48: a name anywhere in the text let seven modules pass undescribed)."""
    described = layout_modules((ROOT / "docs" / "architecture.md").read_text())
    modules = [p for p in sorted((ROOT / "vitbench").rglob("*.py")) if p.name != "__init__.py"]
    assert [str(p.relative_to(ROOT)) for p in modules if str(p.relative_to(ROOT / "vitbench")) not in described] == []


def test_nothing_decides_by_a_backend_family_name():
    """Issue 30: 13 tests of `family` ("vit", "hybrid", "bit") decided channels-last, Table 8's
    variants, MPP, the pre_logits head, the ResNet baselines' recipes and .npz layouts; a family
    now declares these (backend.py), so a plugin family takes part without vitbench's modules
    knowing its name."""
    found = []
    for path in [*sorted((ROOT / "vitbench").rglob("*.py")), *sorted((ROOT / "plugins").glob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                for side in (node.left, *node.comparators):
                    by_family = isinstance(side, ast.Attribute) and side.attr == "family"
                    if by_family and not (isinstance(side.value, ast.Name) and side.value.id == "self"):
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert found == []


def test_a_view_never_imports_the_engine():
    """Issue 30: views/inspection.py built and ran a model; the measurement is execution/inspection.py
    now (api.inspect), and a view only reads the store and draws."""
    forbidden = ("vitbench.engine", "vitbench.execution", "vitbench.weights", "torch", "timm")
    found = []
    for path in sorted((ROOT / "vitbench" / "views").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            found += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names if n.startswith(forbidden)]
    assert found == []


def test_every_protocol_metric_names_a_table_view_that_says_which_runs_it_shows():
    """A protocol's metrics name the table its runs are shown in (the summary after `vitbench run`,
    and `vitbench table --protocol NAME`): an existing view, one per protocol, and one that can say
    which runs it shows."""
    from vitbench.protocols.registry import own_view, protocols
    from vitbench.views.registry import TABLES

    for name, protocol in protocols().items():
        assert {m.view for m in protocol.metrics} == {own_view(protocol)}, name
        assert own_view(protocol) in TABLES, (name, own_view(protocol))
        assert own_view(protocol) == "accuracy" or TABLES[own_view(protocol)].shows is not None, name


def test_the_protocol_contract_is_narrow_and_no_member_is_one_builtins_own():
    """Issue 48: a protocol is its measurement. The contract's members (protocols/base.Protocol,
    helpers excepted) stay few, and each is set (declared or overridden) by at least two built-ins
    or by none: a member only one protocol sets is that protocol's business, not the contract's.
    What pre-training alone says (the evaluations of what it made) is a Trainer's, a protocol that
    makes weights; `axis` is read from the metrics, which declare it."""
    from vitbench.protocols.base import Protocol, Trainer
    from vitbench.protocols.registry import BUILTIN

    helpers = {"base_spec", "axis"}
    members = {n for n in vars(Protocol) if not n.startswith("_") and n not in helpers} | set(Protocol.__annotations__)
    assert len(members) <= 12, sorted(members)  # 27 before issue 48
    setters = {m: [p.name for p in BUILTIN if m in vars(type(p))] for m in members}
    alone = {m: who for m, who in setters.items() if len(who) == 1}
    assert alone == {}
    assert {n for n in vars(Trainer) if not n.startswith("_")} == {"followups"}
    assert [p.name for p in BUILTIN if isinstance(p, Trainer)] == ["pretrain"]


def test_no_flag_travels_in_a_context_variable():
    """--dry-run, --verify-data and --download were ContextVars set far from where they were read:
    now the planner hands each down as an argument (issue 30.2), and no module may bring one back."""
    found = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in sorted((ROOT / "vitbench").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Name | ast.Attribute) and (getattr(node, "id", None) or node.attr) == "ContextVar"
    ]
    assert found == []


def test_every_measurement_is_written_through_the_recorder():
    """A run's result, an inspection's attention distances and a bench's throughput are written by
    execution/recorder.py alone (issue 30.5): no command, view or the API writes to the store itself."""
    writes = {"ingest", "save_bench", "save_attention_distance"}
    found = sorted(
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in (ROOT / "vitbench").rglob("*.py")
        if "store" not in path.relative_to(ROOT / "vitbench").parts[:1] and path.name != "recorder.py"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and (getattr(node.func, "attr", None) or getattr(node.func, "id", None)) in writes
    )
    assert found == []


def test_the_core_knows_a_runs_axes_not_one_protocols_settings():
    """Issue 48: few-shot's shots was a field of every run spec and a column of the store, export
    and trackers, and DatasetSpec had few-shot's own splits and train limit. A run's value on its
    protocol's axis is one of its hparams; a dataset passes a protocol's own settings through
    `per_protocol` without naming them."""
    from dataclasses import fields

    from vitbench.datasets.base import DatasetSpec
    from vitbench.protocols.base import RunSpec
    from vitbench.protocols.registry import protocols
    from vitbench.store import RUN_COLUMNS

    known = protocols().values()
    axes = {p.axis.name for p in known if p.axis is not None}
    assert {"shots", "knn_k"} <= axes
    assert not axes & {f.name for f in fields(RunSpec)} and not axes & set(RUN_COLUMNS)
    assert not [f.name for f in fields(DatasetSpec) if any(p.name in f.name for p in known)]


def test_the_stores_public_names_are_not_its_modules_names():
    """`vitbench.store` loads its modules on first use (`vitbench --help` never pays for DuckDB and
    pandas): a module named as one of its functions (ingest.py, `store.ingest`) would replace the
    function with the module once anything imported it."""
    import pkgutil

    import vitbench.store

    modules = {m.name for m in pkgutil.iter_modules(vitbench.store.__path__)}
    assert modules and not modules & set(vitbench.store.__all__)


def _views_room(module: str) -> str | None:
    """The room of views/ a module is in (`tables`, `registry`, …), or None outside views/."""
    parts = module.split(".")
    return parts[2] if parts[:2] == ["vitbench", "views"] and len(parts) > 2 else None


def test_the_views_rooms_are_drawn_as_the_code_imports_them():
    """Issue 90: docs/architecture.md draws views/' rooms, each with the rooms it imports, every
    arrow pointing at a room drawn below it; the drawing is the code's (module-level and late
    imports alike, and the registry's lazily loaded views by the names it loads them by)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text.split("## The views' rooms", 1)[1].split("```", 2)[1]
    drawn: dict[str, list[str]] = {}
    for line in block.strip().splitlines():
        source, _, targets = line.partition("─►")
        drawn[source.strip().removesuffix("/").removesuffix(".py")] = [
            t.removesuffix("/").removesuffix(".py") for t in targets.split()
        ]
    order = list(drawn)
    assert all(order.index(t) > order.index(s) for s, ts in drawn.items() for t in ts), "an arrow points up"
    found: dict[str, set[str]] = {room: set() for room in drawn}
    for path in sorted((ROOT / "vitbench" / "views").rglob("*.py")):
        source = _views_room(_module_name(path))
        if source is None or source == "__init__":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            named = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                named = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and source == "registry":
                named = [f"vitbench.views.{node.value}"] if re.fullmatch(r"[a-z]+\.[a-z_]+", node.value) else []
            rooms = {_views_room(n) for n in named} - {None, "__init__", source}
            found[source] |= {r for r in rooms if r in drawn} | {f"undrawn: {r}" for r in rooms if r not in drawn}
    assert found == {room: set(targets) for room, targets in drawn.items()}


def test_the_layers_drawn_are_the_import_contracts():
    """Issue 98: docs/architecture.md's first drawing is pyproject.toml's `layers` contract, layer for layer
    (import-linter holds the code to the contract; this holds the drawing to it)."""
    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in contracts if c["id"] == "layers"]
    contract = [{name.strip().removeprefix("vitbench.") for name in layer.split("|")} for layer in layers]
    text = (ROOT / "docs" / "architecture.md").read_text()
    drawing = text.split("```", 2)[1]
    drawn = [{name.strip() for name in layer.split("|")} for layer in drawing.replace("\n", " ").split("─►")]
    assert drawn == contract
    # and the packages it names are the folders of vitbench/ (with the modules the top level keeps)
    named = set().union(*contract)
    folders = {p.parent.name for p in (ROOT / "vitbench").glob("*/__init__.py")}
    modules = {p.stem for p in (ROOT / "vitbench").glob("*.py")} - {"__init__", "__main__"}
    assert named == folders | modules
