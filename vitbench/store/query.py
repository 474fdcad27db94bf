"""Selecting and grouping stored runs by any stored field: `--where` and `--group-by`.

A field is a `runs` column (`model`, `data_source`, `device_name`, …), a protocol's axis where the
runs were read with them (`shots`, `knn_k`: views/measured/axes.with_axes), `date` (the day a run
finished, YYYY-MM-DD), a key inside the JSON columns (`hparams.res`, `notes.restarts`), or a
setting the runs store, by its bare name (`shots=10` is `hparams.shots=10`).
Shared by `vitbench table`, `export` and `plot`, so one filter means the same thing everywhere.
"""

from __future__ import annotations

import fnmatch
import json
import re
import unicodedata

import pandas as pd

from vitbench.errors import UserError
from vitbench.store import RUN_COLUMNS

OPERATORS = ("!=", ">=", "<=", "=", ">", "<", "~")  # two-character operators first
_CLAUSE = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*(!=|>=|<=|=|>|<|~)\s*(.*?)\s*$")
JSON_FIELDS = ("hparams", "notes")
METRIC_COLUMNS = ("metric", "value")  # a read is one row per (run, metric): --where metric=accuracy


def json_field(value) -> dict:
    """A JSON column's value (hparams, notes) as a dict, whether stored as text or already parsed."""
    if isinstance(value, dict):
        return value
    if isinstance(value, str) and value:
        try:
            parsed = json.loads(value)
        except ValueError:
            return {}
        return parsed if isinstance(parsed, dict) else {}
    return {}


def written_weights_sha(notes) -> str | None:
    """The sha256 of the weights file a pre-training run wrote (its notes.weights_file): what links
    it to the transfer runs that used those weights."""
    sha = json_field(notes).get("weights_file", {}).get("sha256")
    return str(sha) if sha else None


def with_json_parsed(df: pd.DataFrame) -> pd.DataFrame:
    """`df` with its JSON columns (hparams, notes) as dicts, for a program to read
    (`frame["hparams"].str["res"]`); each distinct text parsed once (the runs of one setting share it)."""
    out = df.copy()
    for name in JSON_FIELDS:
        if name in out:
            codes, uniques = pd.factorize(out[name].astype(object), use_na_sentinel=False)
            parsed = [json_field(u) for u in uniques]
            out[name] = pd.Series([parsed[c] for c in codes], index=out.index, dtype=object)
    return out


def per_run(df: pd.DataFrame) -> pd.DataFrame:
    """Stored rows (one per run x metric, JSON columns parsed) as one row per run: a column per
    metric (`accuracy`, `accuracy_top5`, the linear probe's `l2`, …), never one `value` column
    that holds accuracies beside λ, and a column per stored setting (`res`, `shots`, `knn_k`,
    `preprocessing`, …; one that shares a name with a run field or a metric is `hparams.NAME`);
    `hparams` and `notes` stay as dicts. A run lacks a metric (NaN) or a setting (None) its
    protocol does not record. Runs in stored order."""
    if df.empty:
        return df.drop(columns=[c for c in METRIC_COLUMNS if c in df])
    runs = df.drop_duplicates("run_key").drop(columns=list(METRIC_COLUMNS)).set_index("run_key", drop=False)
    metrics = df.pivot_table(index="run_key", columns="metric", values="value", aggfunc="first", sort=False)
    taken = set(runs.columns) | set(metrics.columns)
    settings = pd.DataFrame([json_field(h) for h in runs["hparams"]], index=runs.index)
    settings = settings[[k for k in settings.columns if k not in runs.columns or k in JSON_FIELDS]]
    settings.columns = [f"hparams.{k}" if k in taken else k for k in settings.columns]
    settings = settings.astype(object).where(settings.notna(), None)
    out = pd.concat([runs, metrics.reindex(runs.index), settings], axis=1)
    return out.reset_index(drop=True)


def field_values(df: pd.DataFrame, name: str, option: str = "--where") -> pd.Series:
    """The values of one field for every row, as strings where the field is text or JSON."""
    if name == "date":
        return pd.to_datetime(df["finished_at"], utc=True, errors="coerce").dt.strftime("%Y-%m-%d")
    head, _, key = name.partition(".")
    if key and head in JSON_FIELDS:
        return df[head].map(lambda v: json_field(v).get(key))
    if name in df.columns and not name.startswith("_"):
        return df[name]
    if not key and "hparams" in df.columns:  # a setting the runs store: `shots` is `hparams.shots`
        found = pd.Series([json_field(v).get(name) for v in df["hparams"]], index=df.index, dtype=object)
        if found.notna().any():
            return found
    extra = [c for c in df.columns if c not in (*RUN_COLUMNS, *METRIC_COLUMNS) and not c.startswith("_")]
    fields = ", ".join(["date", *RUN_COLUMNS, *extra, *METRIC_COLUMNS, "hparams.<key>", "notes.<key>"])
    raise UserError(f"{option} {name}: not a stored field; expected one of {fields}")


def parse_clause(text: str, option: str = "--where") -> tuple[str, str, str]:
    match = _CLAUSE.match(text)
    if not match or not match.group(3):
        raise UserError(
            f"{option} {text!r}: expected FIELD OP VALUE with OP one of {' '.join(OPERATORS)} "
            "(e.g. model=vit-b/16, 'date>=2026-11-01', data_source~cifar)"
        )
    return match.group(1), match.group(2), match.group(3)


def _matches_weights(df: pd.DataFrame, pattern: str) -> pd.Series:
    """`weights=` matches the path, its file name (globs allowed), the sha256's start, or `random`."""
    path = _nfc(df["weights"].astype(str))
    name = path.str.rsplit("/", n=1).str[-1]
    sha = df["weights_sha256"].astype(str)
    return (
        path.map(lambda p: fnmatch.fnmatchcase(p, pattern))
        | name.map(lambda n: fnmatch.fnmatchcase(n, pattern))
        | sha.str.startswith(pattern.lower())
    )


def _compare(values: pd.Series, op: str, value: str, name: str = "") -> pd.Series:
    if op == "~":
        return values.astype(str).str.contains(value, case=False, regex=False)
    if op in ("=", "!="):
        if value.lower() in ("true", "false"):  # booleans: random_init=true, data_subset=false, hparams.smoke=true
            hit = values.map(lambda v: str(v).lower() == value.lower())
        else:
            hit = values.map(lambda v: v is not None and fnmatch.fnmatchcase(str(v), value))
        return hit if op == "=" else ~hit
    compare = {">": "gt", "<": "lt", ">=": "ge", "<=": "le"}[op]
    if name == "date" or name.endswith("_at"):  # times compare as times, not as text ('T' sorts after ' ')
        target = pd.to_datetime(value, utc=True, errors="coerce")
        if pd.isna(target):
            raise UserError(
                f"--where {name}{op}{value}: expected a date (2026-11-25) or an ISO time (2026-11-25T19:02:00, UTC)"
            )
        stamps = pd.to_datetime(values, utc=True, errors="coerce", format="mixed")
        return getattr(stamps, compare)(target).fillna(False).astype(bool)
    numbers = pd.to_numeric(values, errors="coerce")
    try:
        target_number = float(value)
    except ValueError:
        stored = values.dropna()
        if len(stored) and pd.to_numeric(stored, errors="coerce").notna().all():
            raise UserError(f"--where {name}{op}{value}: {name} holds numbers; expected a number") from None
        return getattr(values.astype(str), compare)(value).fillna(False).astype(bool)  # text compares as text
    return getattr(numbers, compare)(target_number).fillna(False).astype(bool)


def apply_where(df: pd.DataFrame, clauses: list[str] | tuple[str, ...] | None, option: str = "--where") -> pd.DataFrame:
    """Keep the rows every clause accepts (clauses are ANDed); `option` is what a mistake names
    (`--baseline`, `compare A`: they take --where's clauses)."""
    for text in clauses or ():
        name, op, value = parse_clause(text, option)
        value = unicodedata.normalize("NFC", value)  # a name typed as NFD (macOS) matches its NFC form
        if df.empty:  # nothing to keep; a field that does not exist is still named
            field_values(df, name, option)
            continue
        if name == "weights" and op in ("=", "!="):
            hit = _matches_weights(df, value)
            keep = hit if op == "=" else ~hit
        else:
            keep = _compare(_nfc(field_values(df, name, option)), op, value, name)
        df = df[keep.to_numpy()]
    return df


def _nfc(values: pd.Series) -> pd.Series:
    """Text in Unicode's composed form (NFC), as --where's value is: é typed as e + ◌́ matches é.
    Other values and dtypes stay as they are (a map would turn a setting's 10 into 10.0)."""
    if values.dtype != object:
        return values
    normal = [unicodedata.normalize("NFC", v) if isinstance(v, str) else v for v in values]
    return pd.Series(normal, index=values.index, dtype=object)


def split_fields(values: list[str] | None) -> list[str]:
    """`--group-by model,data_source` and `--group-by model --group-by data_source` alike."""
    return [f.strip() for v in values or () for f in v.split(",") if f.strip()]
