"""What a reader sees: the paper's tables (rich, Markdown, LaTeX, CSV, HTML), the figures, the
report page, and the statistics they share. Views only read the store; none imports the engine,
the weights or torch.

The rooms, each importing only from those below it (pyproject.toml's `[tool.importlinter]`):

    registry.py   every table view and figure by name: the one place a view is registered
    report/       `vitbench report`: the page, its summary, its sections
    tables/       every `vitbench table` view and its renderers    figures/  every `vitbench plot` figure and its kit
    statistics/   intervals, paired tests and their baselines (`--ci`, `vitbench compare`)
    measured/     stored runs as labelled cells: settings, columns, axes, marks, paper matches, footnotes
    cells.py      Cell and TableData: what every view builds

Tables and figures never import each other or the report; the statistics import no table, figure
or report. docs/architecture.md walks one number through these rooms.

May import: the protocols' declarations (their metrics, axes and registry), the store and what is below
it; never execution, the engine, the weights or torch (tests/test_architecture.py), the API or the CLI.
"""
