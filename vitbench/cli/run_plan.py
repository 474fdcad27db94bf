"""`vitbench run --dry-run`'s plan as printed: each planned run with its state and estimated time,
a row per dataset with each part of it, and the total still to run (execution/estimate.py prices
the model's passes; execution/overheads.py measures what a run pays beside them)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vitbench.cli.app import out, print_table
from vitbench.execution import estimate, jobs_price, overheads, solve_price
from vitbench.files.downloads import cache_root
from vitbench.host.devices import resolve_device
from vitbench.protocols.base import Request
from vitbench.protocols.measures import weights_label
from vitbench.protocols.registry import get_protocol

if TYPE_CHECKING:
    from vitbench import api
    from vitbench.execution.cluster import ClusterOptions


def print_plan(
    summary: api.Summary,
    here: str,
    rate: estimate.Rate | None,
    req: Request,
    startup: float,
    explain: bool = False,
    as_jobs: ClusterOptions | None = None,
) -> None:
    """Each planned run with its state and estimated time, a row per dataset (images, each part of
    the time, whether its data is here and how to get it where not), then the total still to run.
    The rate: --assume-mfu's, what `vitbench bench` measured here, or a few seconds' micro-benchmark
    (kept in the user's cache for every dry run on this machine). Priced here, the estimate adds what
    the runs pay beside the model's passes, measured here (execution/overheads.py), and `startup`:
    this command's seconds before the plan, as the run will spend them. The summary is two lines:
    the total and its parts, then the rate in a few words; `explain` adds the method in full.
    `as_jobs` (`submit --dry-run`): the jobs those options make, what each asks for, how many run
    at once and the wait that makes (execution/jobs_price.py)."""
    groups, todo = summary.groups, [s.run_key for s in summary.todo]
    device = resolve_device(req.device)
    precision = groups[0].runtime.precision if groups else None  # bf16 on a CPU: priced at its own rate
    if rate is None and groups:
        rate = estimate.micro_rate(groups, device, here, cache_root(), precision)  # per machine
    found = estimate.estimate(groups, rate, set(todo)) if rate else None
    if found is not None and rate is not None and rate.here and groups:
        build = rate.build or estimate.micro_rate(groups, device, here, cache_root(), precision).build
        images = estimate.planned_images(groups, set(todo))
        found.beside = overheads.measure(
            groups, {k: images.get(k, 0.0) for k in todo}, found.seconds, build, startup, req.workers
        )
        solves = solve_price.plan_solves(groups, set(todo), device, here, cache_root(), summary.results)
        found.beside.solves, found.solves = solves.seconds, solves
    absent = {s.run_key for g in groups if g.absent is not None for s in g.specs}
    lines = []
    for s in summary.specs:
        detail = get_protocol(s.protocol).describe(s)
        detail = f" {detail}" if detail else ""
        state = "done" if s.run_key in summary.done else "todo"
        priced = found is not None and state == "todo" and s.run_key in found.seconds
        cost = f"  ≈ {estimate.duration(found.run_seconds(s.run_key))}" if priced and found else ""
        cost = "  not priced" if found is not None and state == "todo" and not priced else cost  # never "< 1 s"
        key = "(no data yet)" if s.run_key in absent else s.run_key[:12]  # a key of no files: not the real one's
        # the weights on every line: two weights of one model plan lines that would otherwise read the same
        lines.append(
            f"{key:13s} {s.model:12s} {weights_label(s):16s} {s.dataset:18s} {s.protocol}{detail} seed={s.seed}  "
            f"{state}{cost}"
        )
    if lines:  # one print, unhighlighted: a line each through rich took 1 ms (100,000 runs: 113 s)
        out.print("\n".join(lines), markup=False, highlight=False, soft_wrap=True)
    if len({g.dataset.name for g in groups}) > 1 or absent:
        _print_datasets(summary, found)
    if found is None:
        out.print(f"{len(todo)} run(s) to do", markup=False, soft_wrap=True)
        _print_jobs(summary, req, as_jobs, found, startup)
        return
    unpriced = sum(key not in found.seconds for key in todo)
    if todo and unpriced == len(todo):  # never "< 1 s" for what was not priced at all
        out.print(f"{len(todo)} run(s) to do, none priced: the rate has none for their configurations "
                  "(--assume-mfu 0.4@H100 prices them)", markup=False, soft_wrap=True)  # fmt: skip
    else:
        out.print(_total_line(found, todo, unpriced), markup=False, soft_wrap=True)
    # the second line: what the price rests on, in a few words; the method in full behind --explain
    missing = list(dict.fromkeys(found.beside.unmeasured)) if found.beside is not None else []
    unmeasured = f"; decoding not measured for {len(missing)} datasets (no files here)" if len(missing) > 1 else ""
    unmeasured = f"; decoding not measured for {missing[0]} (no files here)" if len(missing) == 1 else unmeasured
    out.print(f"(an estimate at the rate of {found.short or found.basis}{unmeasured}; {EXPLAIN})", markup=False,
              soft_wrap=True)  # fmt: skip
    _print_jobs(summary, req, as_jobs, found, startup)
    if explain:
        out.print(_method(found), markup=False, soft_wrap=True)


def _print_jobs(
    summary: api.Summary, req: Request, opts: ClusterOptions | None, found: estimate.Estimate | None, startup: float
) -> None:
    """`submit --dry-run`: the plan as its jobs (execution/jobs_price.py)."""
    todo = {s.run_key for s in summary.todo}
    if opts is None or not todo:
        return
    plan = jobs_price.as_jobs(summary.groups, todo, req, opts, found, startup)
    out.print("\n".join(plan.lines()), markup=False, highlight=False, soft_wrap=True)


EXPLAIN = "--explain says how"


def _method(found: estimate.Estimate) -> str:
    """--explain: where the rate comes from, what the estimate counts and what it leaves out."""
    counted = estimate.COUNTED if found.beside is not None else estimate.COUNTED_ELSEWHERE
    unmeasured = (
        f"; decoding not measured for {', '.join(dict.fromkeys(found.beside.unmeasured))} (no files here)"
        if found.beside is not None and found.beside.unmeasured
        else ""
    )
    priced = found.solves
    solves = ""
    if priced is not None and priced.pace is not None:
        from vitbench.engine.logistic import MAX_ITER
        from vitbench.engine.solve_pace import EXPECTED_ITERATIONS

        solves = f" The solves at the pace measured here {priced.pace.measured} on random features"
        solves += " (engine/solve_pace.py)"
        if "logistic" in priced.kinds:
            solves += (
                f", each of the linear probe's fits at {EXPECTED_ITERATIONS['trained']} L-BFGS iterations on trained "
                f"weights' features, {EXPECTED_ITERATIONS['random init']} on random init's (what real sweeps' fits "
                f"cost here; each linear run stores its own; the cap is {MAX_ITER})"
            )
            learned = [f"{dataset} ({kind}) {iterations:.0f} ({runs} run{'s' if runs > 1 else ''})"
                       for (dataset, kind), (iterations, runs) in sorted(priced.learned.items())]  # fmt: skip
            solves += ("; where this folder's linear runs show what a fit took on the same dataset and kind of "
                       f"weights, the median of theirs: {', '.join(learned)}") if learned else ""  # fmt: skip
        solves += "; scikit-learn's import once." if priced.imported else "."
    return f"How: counted FLOPs at the rate of {found.basis}. {counted}{unmeasured}.{solves} (docs/performance.md)"


def _total_line(found: estimate.Estimate, todo: list[str], unpriced: int) -> str:
    """The plan's summary line: the whole wait (its range) and its parts where measured here, else the device time."""
    span = found.range(todo)
    between = f" ({estimate.duration(span[0])} to {estimate.duration(span[1])})" if span else ""
    # a total of part of the plan says so before its number (issue 89: "< 1 s" for 3 runs of 28 read
    # as the whole plan's)
    head = f"{len(todo)} run(s) to do,"
    if unpriced:
        head = f"{len(todo)} run(s) to do, {unpriced} of them not priced; the other {len(todo) - unpriced}:"
    if found.beside is None:
        return f"{head} estimated device time {estimate.duration(found.total(todo))}{between}"
    beside = found.beside
    decode, weights, solves = (
        sum(part.get(k, 0.0) for k in todo) for part in (beside.decode, beside.weights, beside.solves)
    )
    parts = (
        f"model passes {estimate.duration(found.total(todo))}, decoding and resizing {estimate.duration(decode)}, "
        + (f"solves {estimate.duration(solves)}, " if beside.solves else "")
        + f"weights {estimate.duration(weights)}, start-up {estimate.duration(beside.startup)}"
    )
    return f"{head} estimated time {estimate.duration(found.wall(todo))}{between}: {parts}"


def _print_datasets(summary: api.Summary, found: estimate.Estimate | None) -> None:
    """A row per dataset of the plan: runs to do, images through the model, each part of the
    estimated time (the model's passes; decoding and resizing, and the weights, where measured
    here), and whether its data is here; then, for what is missing, where it is published and how it
    becomes the folder vitbench reads (one line for datasets that share the instructions)."""
    from rich.table import Table

    todo = {s.run_key for s in summary.todo}
    images = estimate.planned_images(summary.groups, todo)
    beside = found.beside if found else None
    parts = ["model passes", "decode & resize", *(["solves"] if beside and beside.solves else []), "weights"]
    parts = parts if beside else ["est. device time"]
    table = Table("dataset", "runs to do", "images", *parts, "data", title="per dataset")
    missing: dict[str, list[str]] = {}
    for name in dict.fromkeys(g.dataset.name for g in summary.groups):
        groups = [g for g in summary.groups if g.dataset.name == name]
        keys = [s.run_key for g in groups for s in g.specs if s.run_key in todo]
        unpriced = sum(k not in found.seconds for k in keys) if found else 0
        if found is None or not keys:
            seconds = [""]
        elif unpriced == len(keys):  # a run that cannot be priced says so here too, not "< 1 s"
            seconds = ["not priced"]
        else:
            seconds = [estimate.duration(found.total(keys)) + (f" ({unpriced} not priced)" if unpriced else "")]
        if beside:  # decoding is timed on the files: a dataset not here has none to time it on
            decode = sum(beside.decode.get(k, 0.0) for k in keys)
            seconds += [
                "not measured" if name in beside.unmeasured else estimate.duration(decode),
                *([estimate.duration(sum(beside.solves.get(k, 0.0) for k in keys))] if beside.solves else []),
                estimate.duration(sum(beside.weights.get(k, 0.0) for k in keys)),
            ]
        absent = next((g.absent for g in groups if g.absent is not None), None)
        if absent is not None:
            missing.setdefault(groups[0].dataset.how_to_get or "see `vitbench ls datasets`", []).append(name)
        table.add_row(
            name,
            str(len(keys)),
            f"{sum(images.get(k, 0.0) for k in keys):,.0f}",
            *seconds,
            f"missing: no {absent} (planned from the official split sizes)" if absent else "here",
        )
    print_table(table)
    for how, names in missing.items():
        listed = ", ".join(names) if len(names) <= 3 else f"{names[0]} … {names[-1]} ({len(names)} datasets)"
        out.print(f"to get {listed}: {how}", markup=False, soft_wrap=True)
