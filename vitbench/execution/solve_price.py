"""The dry run's price of what runs compute on frozen features once extracted: few-shot's ridge,
k-NN's pass and vote and the linear probe's λ sweep of L-BFGS fits (protocols/base.py `Solve`,
each protocol's `work`), at the pace this device solves (engine/solve_pace.py, a fraction of a
second's micro-benchmark on random features), kept in the user's cache per machine as the forward
rates are (`solve-paces.json`; a pace measured while other work held the CPU is measured again once
it is quiet). A linear probe on the CPU also pays scikit-learn's import, once per process."""

from __future__ import annotations

import json
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from vitbench.execution.kept_rates import busy_entry, is_moment, kept_entries, stamped
from vitbench.execution.machine_load import others_while
from vitbench.files.atomic import keep_json
from vitbench.protocols.base import SOLVE_KINDS, Group
from vitbench.protocols.registry import get_protocol

if TYPE_CHECKING:
    import torch

SOLVE_PACES = "solve-paces.json"  # in the user's cache, beside micro-rates.json
MAX_PACES_BYTES = 200_000  # a few hundred machines' entries


@dataclass(frozen=True)
class Pace:
    """This device's [seconds per call, seconds per unit] for each solve kind, and the seconds
    importing scikit-learn takes (None: not measured, as this process had already imported it)."""

    per_kind: dict[str, list[float]]
    measured: str
    sklearn_import: float | None = None
    busy: float = 0.0


@dataclass
class Solves:
    """run_key -> seconds of its solves, the pace they were priced at, the kinds priced and whether
    scikit-learn's import was among them, and the probe's fits priced at the iterations the results
    folder's own linear runs took: (dataset, "trained" or "random init") -> (iterations a fit, runs)
    (what `--explain` says of them)."""

    seconds: dict[str, float] = field(default_factory=dict)
    pace: Pace | None = None
    kinds: set[str] = field(default_factory=set)
    imported: bool = False
    learned: dict[tuple[str, str], tuple[float, int]] = field(default_factory=dict)


def plan_solves(
    groups: list[Group], todo: set[str], device: torch.device, name: str, cache: Path | None,
    results: Path | None = None,
) -> Solves:  # fmt: skip
    """Each run still to do: the seconds of its share of the solves its protocol declares, at the
    pace kept for this device (measured now where none is kept). A linear probe's fits are priced at
    the median iterations a fit of the linear runs `results` holds on the same dataset, kind of
    weights (trained or random init) and kind of device took, else at solve_pace's prior. Nothing
    is measured for a plan with no solve to do."""
    planned = [(g, s) for g in groups for s in get_protocol(g.protocol).work(g).solves if set(s.runs) & todo]
    found = Solves()
    if not planned:
        return found
    from vitbench.engine.solve_pace import EXPECTED_ITERATIONS, units

    # a process pays the import once: seen before measuring the pace, which imports it here
    sklearn_paid = "sklearn.linear_model" in sys.modules
    pace = kept_pace(device, name, cache)
    found.pace = pace
    probed = {g.dataset.name for g, s in planned if s.kind == "logistic"}
    stored = stored_iterations(results, device.type, probed) if results is not None and probed else {}
    for group, solve in planned:
        if solve.kind not in SOLVE_KINDS:  # a plugin's own kind: nothing here knows its pace
            continue
        assert group.model.backend is not None
        width = group.model.backend.representation_width(group.model, group.res)
        iterations = EXPECTED_ITERATIONS["trained"]  # (what a fit costs: the probe's alone)
        if solve.kind == "logistic":
            weights = "random init" if group.weights.random else "trained"
            iterations = EXPECTED_ITERATIONS[weights]
            if runs_there := stored.get((group.dataset.name, weights)):
                iterations = statistics.median(runs_there)
                found.learned[(group.dataset.name, weights)] = (iterations, len(runs_there))
        calls, work = units(solve.kind, solve.train, solve.test, width, solve.classes, solve.repeats,
                            solve.held_out, iterations)  # fmt: skip
        call, per_unit = pace.per_kind[solve.kind]
        seconds = calls * call + work * per_unit
        if solve.kind == "logistic" and not sklearn_paid and _by_sklearn(solve, width, device):
            seconds += pace.sklearn_import or 0.0
            sklearn_paid = found.imported = pace.sklearn_import is not None
        found.kinds.add(solve.kind)
        runs = [key for key in solve.runs if key in todo]
        for key in runs:
            found.seconds[key] = found.seconds.get(key, 0.0) + seconds / len(runs)
    return found


def stored_iterations(
    results: Path, device_type: str, datasets: set[str] | None = None
) -> dict[tuple[str, str], list[float]]:
    """(dataset, "trained" or "random init") -> each stored linear run's L-BFGS iterations a fit
    (`notes.l2_iterations`, stored since protocol linear/6's runs), of the runs on `device_type`
    (scikit-learn's L-BFGS on a CPU and torch's on a GPU count their iterations alike, but stop apart)
    and on `datasets` (all where None): the store selects them, a dry run reads no other run."""
    from vitbench.store.database import read_table
    from vitbench.store.schema import sql_text

    sql = ("SELECT dataset, random_init, json_extract(notes, '$.l2_iterations') AS fits FROM runs "
           "WHERE status = 'done' AND protocol = 'linear' AND notes IS NOT NULL "
           f"AND split_part(device, ':', 1) = {sql_text(device_type)}")  # fmt: skip
    if datasets is not None:
        sql += f" AND dataset IN ({', '.join(sql_text(name) for name in sorted(datasets)) or 'NULL'})"
    found: dict[tuple[str, str], list[float]] = {}
    for row in read_table(results, 1, sql, ["dataset", "random_init", "fits"]).itertuples():
        try:
            fits = [float(v) for v in json.loads(row.fits).values()]
        except (TypeError, ValueError, AttributeError):  # notes of another shape: nothing learned from it
            continue
        if fits and all(math.isfinite(v) and v >= 0 for v in fits):
            kind = "random init" if bool(row.random_init) else "trained"
            found.setdefault((str(row.dataset), kind), []).append(sum(fits) / len(fits))
    return found


def _by_sklearn(solve, width: int, device: torch.device) -> bool:
    """Whether the probe fits with scikit-learn (on the CPU; on a GPU, a small problem: engine/logistic.py)."""
    from vitbench.engine.logistic import GPU_MIN_WORK

    return device.type == "cpu" or solve.train * width * solve.classes < GPU_MIN_WORK


def kept_pace(device: torch.device, name: str, cache: Path | None) -> Pace:
    """The pace kept for this device, thread count and versions, else measured now and kept."""
    from importlib.metadata import version

    import torch

    path = cache / SOLVE_PACES if cache is not None else None
    kept = kept_entries(path, is_pace, MAX_PACES_BYTES)  # the rest are measured again
    # scikit-learn's version from its metadata: importing it is what `import_seconds` times
    key = f"{name}|{device.type}|{torch.get_num_threads()} threads|torch {torch.__version__}"
    key += f"|scikit-learn {version('scikit-learn')}"
    entry, changed = kept.get(key), False
    if entry is None or busy_entry(entry):
        entry, changed = _measure(device), True
    if "import" not in entry:  # measured where scikit-learn was already imported: time it where it is not
        from vitbench.engine.solve_pace import import_seconds

        seconds = import_seconds()
        if seconds is not None:
            entry, changed = {**entry, "import": seconds}, True
    if changed and path is not None:
        keep_json(path, {**kept, key: entry})
    per_kind = {kind: list(entry[kind]) for kind in SOLVE_KINDS}
    return Pace(per_kind, entry["measured"], entry.get("import"), entry.get("busy", 0.0))


def _measure(device: torch.device) -> dict:
    from vitbench.engine.solve_pace import import_seconds, measure

    imported = import_seconds()  # before the fits import it
    paces, others = others_while(lambda: measure(device)) if device.type == "cpu" else (measure(device), 0.0)
    return stamped(paces, others) | ({"import": imported} if imported is not None else {})


def is_pace(entry: object) -> bool:
    """{kind: [seconds per call ≥ 0, seconds per unit > 0], finite, for every kind; "measured": the
    moment; "busy" a fraction; "import" (where present) seconds ≥ 0}."""
    if not isinstance(entry, dict) or not is_moment(entry.get("measured")):
        return False
    values = [entry.get("import", 0.0), entry.get("busy", 0.0)]
    for kind in SOLVE_KINDS:
        pair = entry.get(kind)
        if not (isinstance(pair, list) and len(pair) == 2):
            return False
        values += pair
        if not _number(pair[1]) or pair[1] <= 0:
            return False
    return all(_number(v) and v >= 0 for v in values) and entry.get("busy", 0.0) <= 1


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
