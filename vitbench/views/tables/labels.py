"""Tables that read at a glance: what every measured column shares is said once, not per column or
per cell. A model and weights common to all measured columns move into the title (the columns keep
only their setting: "1-shot", "finetune"), and a run count common to every measured cell moves into
the footnote (cells drop their "(n=3)"). Provenance footnotes are already one per distinct
provenance (views/measured/footnotes.py)."""

from __future__ import annotations

from vitbench.views.cells import RANDOM_MARK, TableData
from vitbench.views.measured.columns import Measured, weights_label

PER_CELL_N = "mean ± std over seeds (n runs)"


def say_once(data: TableData, m: Measured) -> None:
    measured = [c for c in data.columns if c not in data.paper_columns]
    counts = {
        cell.n for (_, col), cell in data.cells.items() if col in measured and cell.text is None and cell.n is not None
    }
    if len(counts) == 1:
        data.uniform_n = counts.pop()
        said = "one run each" if data.uniform_n == 1 else f"mean ± std over {data.uniform_n} runs (seeds) each"
        data.footnotes = [n.replace(PER_CELL_N, said) for n in data.footnotes]
    if not measured or m.runs.empty:
        return
    shown = m.runs[m.runs["column"].isin(measured)]
    identities = shown[["model", "weights", "weights_sha256", "random_init"]].drop_duplicates()
    if len(identities) != 1:
        return
    first = identities.iloc[0]
    mark = RANDOM_MARK if first["random_init"] else ""  # said with the model, in the title
    prefix = f"{first['model']}{mark} · "
    if not all(c.startswith(prefix) for c in measured):
        return
    rename = {c: c[len(prefix) :] for c in measured}
    data.columns = [rename.get(c, c) for c in data.columns]
    data.cells = {(row, rename.get(col, col)): cell for (row, col), cell in data.cells.items()}
    for old in sorted(rename, key=len, reverse=True):
        data.footnotes = [n.replace(old, rename[old]) for n in data.footnotes]
    label = weights_label(first["model"], first["weights"], first["weights_sha256"], bool(first["random_init"]))
    data.title += f" · {label}{mark}"
