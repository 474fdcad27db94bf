"""A protocol's axis as a column of the stored runs: each run's value on it (few-shot's `shots`,
k-NN's `knn_k`, a plugin's) read from its hparams, where the store keeps it. The views that read
an axis apply it (once: it adds only what is missing), and `vitbench.results` returns it; `--where
shots=10` reads the same hparam by its bare name (store/query.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from vitbench.protocols.measures import Axis
from vitbench.protocols.registry import protocols
from vitbench.store.query import json_field


def with_axes(runs: pd.DataFrame) -> pd.DataFrame:
    """Stored runs (`store.read_results`) with a column per protocol axis: few-shot's `shots`,
    k-NN's `knn_k`, a plugin's, each run's value read from its hparams (none where its protocol
    has not that axis). What tables, figures, `--where shots=10` and `vitbench.results` select and
    group by; the store itself keeps them among the hparams. Whole numbers are nullable integers."""
    names = [n for n in dict.fromkeys(p.axis.name for p in protocols().values() if p.axis) if n not in runs]
    if not names:
        return runs
    try:  # each distinct hparams text parsed once (the runs of one setting share it)
        codes, texts = pd.factorize(runs["hparams"].astype(object), use_na_sentinel=False)
        parsed = [json_field(text) for text in texts]
    except TypeError:  # already parsed (vitbench.results): dicts do not hash
        codes, parsed = np.arange(len(runs)), [json_field(h) for h in runs["hparams"]]
    out = runs.copy()
    for name in names:
        column = _axis_column([h.get(name) for h in parsed])
        out[name] = column.take(codes) if len(codes) else column[:0]
    return out


def _axis_column(values: list) -> pd.api.extensions.ExtensionArray | np.ndarray:
    """One axis' values: integers where any is one (shots, k; a value that is not an integer there
    is missing, as a shard edited by hand may hold), else text and numbers (none for a list)."""
    if any(_whole(v) for v in values) or all(v is None for v in values):
        return pd.array([v if _whole(v) else None for v in values], dtype="Int64")
    return np.array([v if isinstance(v, str | float) else None for v in values], dtype=object)


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and -(2**63) < value < 2**63


def axis_values(df: pd.DataFrame, axis: Axis) -> pd.Series:
    """Each row's value on `axis`: its column (`with_axes`), else its hparam."""
    if axis.name not in df.columns:
        df = with_axes(df)
    if axis.name in df.columns:
        return df[axis.name]
    return df["hparams"].map(lambda h: json_field(h).get(axis.name))  # an axis no known protocol declares
