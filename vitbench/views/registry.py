"""Every view by name: the tables `vitbench table --view NAME` shows (a plugin's too, through the
`vitbench.views` entry-point group) and the figures `vitbench plot NAME` draws. A view says what
it reads and which of the command's options apply to it; the commands look a name up here
instead of branching on it, and refuse an option a view does not take with one line that names
both."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cache, cached_property
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitbench import store
from vitbench.catalog.entry_points import VIEWS, Registry, load_group
from vitbench.errors import UserError, listed
from vitbench.protocols.base import Protocol
from vitbench.protocols.registry import BUILTIN, protocols
from vitbench.views.cells import TableData

if TYPE_CHECKING:
    import pandas as pd

    from vitbench.views.figures import confusion, plots, pretraining, series
    from vitbench.views.figures.figure_kit import Figure
    from vitbench.views.measured import contamination, pretraining_runs
    from vitbench.views.tables import attention, bench_table, per_class, pretrain, robustness, table
else:  # the views (pandas, DuckDB, matplotlib) load when one is built: `--help` lists them by name only

    class _OnUse:
        def __init__(self, name: str) -> None:
            self._name = name

        def __getattr__(self, attr: str) -> Any:
            return getattr(import_module(f"vitbench.views.{self._name}"), attr)

    attention, bench_table, contamination, confusion, per_class, plots, pretrain, pretraining, pretraining_runs = (
        _OnUse(name)
        for name in (
            "tables.attention", "tables.bench_table", "measured.contamination", "figures.confusion",
            "tables.per_class", "figures.plots", "tables.pretrain", "figures.pretraining", "measured.pretraining_runs",
        )
    )  # fmt: skip
    robustness, series, table = (_OnUse(name) for name in ("tables.robustness", "figures.series", "tables.table"))


@dataclass
class Inputs:
    """What a view is built from: the command's options, and the stored runs read on first use
    (the attention and bench views read tables of their own, and never pay for the runs)."""

    results: Path
    where: list[str] | None = None
    protocol: str | None = None
    compare: list[str] = field(default_factory=list)
    layout: str = "2"  # --table
    shots: int | None = None
    fields: list[str] = field(default_factory=list)  # --group-by
    include_marked: bool = False
    delta_to: str | None = None
    ci: bool = False
    baseline: list[str] = field(default_factory=list)  # --baseline: what --ci's marks compare against
    all_rows: bool = False
    per_class: str | None = None
    out_dir: Path = Path("plots")
    formats: tuple[str, ...] = ("png", "svg")
    cost: str = "flops"
    run: str | None = None
    runs: pd.DataFrame | None = None  # these stored runs instead of the store's (the summary after a run)
    named: bool = False  # `vitbench plot NAME`: the figure was asked for by name (a bare `plot` draws what it can)

    @cached_property
    def df(self) -> pd.DataFrame:
        if self.runs is not None:
            return self.runs
        from vitbench.store import query

        store.sync(self.results)  # shards that cluster workers wrote since the last merge
        return contamination.with_test_duplicates(
            query.apply_where(store.read_results(self.results), self.where), self.results
        )


# the options of `vitbench table` a view may take, by their flags (each a default when not given)
TABLE_OPTIONS = {
    "compare": "--compare",
    "layout": "--table",
    "shots": "--shots",
    "fields": "--group-by",
    "include_marked": "--include-marked",
    "delta_to": "--delta-to",
    "ci": "--ci",
    "baseline": "--baseline",
    "all_rows": "--all-rows",
}
_DEFAULTS = Inputs(Path())


@dataclass(frozen=True)
class TableView:
    name: str
    build: Callable[[Inputs], TableData]
    takes: frozenset[str] = frozenset()  # TABLE_OPTIONS that apply to it
    empty: str = ""  # what to say where the store has nothing for it (else: the empty table)
    chosen_by: str = ""  # the flag that picks it, where that is not `--view NAME`
    # the runs it shows, of those given (a protocol's view may show another's runs too: pre-training
    # beside its transfer); None: it is no protocol's view
    shows: Callable[[pd.DataFrame], set[str]] | None = None
    summary: str = ""  # what `--view NAME` shows, in `vitbench table --help`

    def check(self, inputs: Inputs) -> None:
        given = [o for o in TABLE_OPTIONS if getattr(inputs, o) != getattr(_DEFAULTS, o) and o not in self.takes]
        if given:
            flags = ", ".join(TABLE_OPTIONS[o] for o in given)
            what = self.chosen_by or f"--view {self.name}"
            raise UserError(f"{what}: has its own layout; {flags} {'does' if len(given) == 1 else 'do'} not apply")


def _accuracy(i: Inputs) -> TableData:
    """`--table 2|5|6|9`: the paper table's layout."""
    if i.ci and i.layout != "2":
        raise UserError("--ci: intervals and paired tests are shown in Table 2's layout (the default view)")
    if i.baseline and not i.ci:
        raise UserError(f"--baseline {','.join(i.baseline)}: names what --ci's marks compare against; add --ci")
    if i.all_rows and i.layout != "2":
        raise UserError(f"--all-rows: --table {i.layout} shows the paper's whole table already")
    if i.layout == "2":
        ci = i.results if i.ci else None
        chosen = (i.shots, i.fields, i.include_marked, i.delta_to, i.all_rows, ci)
        data = table.accuracy_view(i.df, i.compare, i.protocol, *chosen, baseline=i.baseline)
        table.say_rows_left_out(data)
        return data
    if i.layout == "9":
        return table.table9_view(i.df, i.compare, i.protocol, i.fields, i.include_marked, i.delta_to)
    if i.layout in ("5", "6"):
        if i.compare or i.fields or i.delta_to:
            raise UserError(
                f"--table {i.layout}: shows the paper's whole table; --compare/--group-by/--delta-to are for 2 and 9"
            )
        view_fn = table.table5_view if i.layout == "5" else table.table6_view
        return view_fn(i.df, i.protocol, i.include_marked)
    raise UserError(f"--table {i.layout}: expected 2, 5, 6 or 9")


_BUILTIN_TABLES = (
    TableView("accuracy", _accuracy, frozenset(TABLE_OPTIONS), summary="the paper's layouts: --table 2, 5, 6 or 9"),
    TableView(
        "robustness",
        lambda i: robustness.robustness_view(i.df, i.compare, i.protocol, i.include_marked, i.delta_to),
        frozenset({"compare", "include_marked", "delta_to"}),
        summary="ImageNet val, V2, R, A, Sketch, ObjectNet: --protocol eval runs",
    ),
    TableView("calibration", lambda i: per_class.calibration_view(i.df), summary="ECE and NLL of eval runs"),
    TableView(
        "attention",
        lambda i: attention.attention_view(store.read_attention_distance(i.results)),
        summary="mean attention distance per layer",
    ),
    TableView(
        "pretrain",
        lambda i: pretrain.pretrain_view(i.df),
        shows=lambda df: pretraining_runs.linked_runs(df),
        summary="pre-training runs beside the few-shot accuracy of their weights and of random init",
    ),
    TableView(
        "per-class",
        lambda i: per_class.per_class_view(i.df, i.per_class or "", i.results, i.protocol),
        chosen_by="--per-class",
    ),
    TableView(
        "bench",
        lambda i: bench_table.bench_view(store.read_bench(i.results)),
        empty="no throughput measurements in {db} yet; try `vitbench bench`",
        chosen_by="--bench",
    ),
)
CHOSEN_BY_FLAG = ("per-class", "bench")  # --per-class DATASET, --bench: not names of --view


def _not_a_view(name: str, known: list[str]) -> str:
    return f"--view {name}: expected {listed(n for n in known if n not in CHOSEN_BY_FLAG)}"


@cache
def _plugin_views() -> list[tuple[str, object]]:
    """What the `vitbench.views` plugins give (read once): table views and figures alike."""
    return load_group(VIEWS, "VIEWS", (TableView, FigureView))


# the built-ins, then the views other packages give through the `vitbench.views` entry-point group
TABLES: Registry[TableView] = Registry(
    "table view", lambda v: v.name, lambda: _BUILTIN_TABLES, _plugin_views, of_type=TableView, unknown=_not_a_view
)


def views_help() -> str:
    """`--view`'s help, from the views themselves: each name with what it shows."""
    named = [f"{v.name}: {v.summary}" for v in TABLES.values() if v.name not in CHOSEN_BY_FLAG]
    return "; ".join(named[:-1]) + "; or " + named[-1]


def table_view(name: str) -> TableView:
    if name in CHOSEN_BY_FLAG:  # (by its flag, not by name)
        raise UserError(_not_a_view(name, list(TABLES)))
    return TABLES.find(name)


@dataclass(frozen=True)
class FigureView:
    name: str
    draw: Callable[[Inputs], Figure]
    by_default: bool  # drawn by a bare `vitbench plot` (the others need asking for, by name)
    summary: str = ""  # what it draws, in `vitbench plot --help`


_BUILTIN_FIGURES = (
    FigureView("vtab", lambda i: plots.vtab_figure(i.df, i.out_dir, i.formats, i.protocol), True, "VTAB groups"),
    FigureView(
        "cost",
        lambda i: plots.cost_figure(i.df, i.out_dir, i.formats, i.protocol, i.cost),
        True,
        "accuracy against cost (--cost flops or days)",
    ),
    FigureView(
        "curves",
        lambda i: plots.curves_figure(i.df, store.read_curves(i.results), i.out_dir, i.formats, i.run),
        True,
        "training curves (--run KEY for one run)",
    ),
    FigureView(
        "confusion",
        lambda i: confusion.confusion_figure(i.df, i.results, i.out_dir, i.formats, i.run),
        False,
        "one run's confusion matrix (--run KEY)",
    ),
    FigureView(
        "checkpoints",
        lambda i: series.checkpoints_figure(i.df, i.out_dir, i.formats, i.protocol),
        False,
        "accuracy over a series of checkpoints",
    ),
    FigureView(
        "datasize",
        lambda i: pretraining.datasize_figure(i.df, i.out_dir, i.formats),
        True,
        "Fig 4: accuracy against pre-training images",
    ),
    FigureView(
        "compute",
        lambda i: pretraining.compute_figure(i.df, i.out_dir, i.formats),
        True,
        "Fig 5: accuracy against pre-training exaFLOPs",
    ),
)
# the built-ins, then a plugin's (`vitbench.views`, as the table views); the axis figures are made
# from the protocols (axis_figures)
FIGURES: Registry[FigureView] = Registry("figure", lambda v: v.name, lambda: _BUILTIN_FIGURES, _plugin_views,
                                         of_type=FigureView)  # fmt: skip


def axis_figures(known: Iterable[Protocol] | None = None) -> dict[str, FigureView]:
    """A figure per protocol whose runs vary along an axis (few-shot: shots; k-NN: k; a plugin's),
    named by the protocol: its accuracy against that axis. `known`: these protocols (the built-ins
    for `--help`, which loads no plugin), by default every one installed."""
    found = protocols().values() if known is None else known
    return {
        p.name: FigureView(p.name, _axis_drawing(p.name), True, f"accuracy against {p.axis.label}")
        for p in found
        if p.axis is not None
    }


def _axis_drawing(protocol: str) -> Callable[[Inputs], Figure]:
    return lambda i: plots.axis_figure(i.df, protocol, i.out_dir, i.formats, values_needed=1 if i.named else 2)


def all_figures(known: Iterable[Protocol] | None = None) -> dict[str, FigureView]:
    """Every figure by name, in the order a bare `vitbench plot` draws them: the VTAB groups and the
    cost, each axis figure, then the training curves; those asked for by name only after."""
    fixed = list(FIGURES.values())
    return {v.name: v for v in (*fixed[:2], *axis_figures(known).values(), *fixed[2:])}


def figures_help() -> str:
    """`vitbench plot`'s help, from the figures themselves (a plugin's figures too; a plugin
    protocol's axis figure joins them once installed: `--help` loads no protocol plugin)."""
    figures = all_figures(BUILTIN).values()
    named = "; ".join(f"{v.name}: {v.summary}" for v in figures if v.by_default)
    asked = "; ".join(f"{v.name}: {v.summary}" for v in figures if not v.by_default)
    return (
        f"{named}; any protocol with an axis: its accuracy against it. A bare `vitbench plot` draws each one the "
        f"store has data for; asked for by name only: {asked}."
    )


def default_figures() -> list[FigureView]:
    return [v for v in all_figures().values() if v.by_default]


def figure_view(name: str) -> FigureView:
    found = all_figures()
    if name not in found:
        raise UserError(f"vitbench plot {name}: expected one of {', '.join(found)}")
    return found[name]
