"""Per-image predictions of a run, as Parquet beside its shard (`runs/<run_key>.predictions.parquet`):
each scored image's id, label, top-k classes and whether top-1 was right. Written atomically before
the shard, whose notes carry the file's sha256 and row count (`notes.predictions`): a file that no
longer matches is reported, never read as the run's. DuckDB writes and reads it (no pyarrow).
Stores written before predictions were kept have none; every reader treats that as "not kept"."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from vitbench.errors import UserError, io_reason
from vitbench.files.atomic import write_atomic
from vitbench.provenance import sha256_file
from vitbench.store import duck
from vitbench.store.shards import shard_dir

if TYPE_CHECKING:  # DuckDB and pandas load where a file is written or read, not where a protocol is declared
    import pandas as pd

SUFFIX = ".predictions.parquet"
TOP = 5  # the best classes kept of each scored image (top-5, as `scores` reports)


def top_classes(scores: np.ndarray, k: int = TOP) -> np.ndarray:
    """(N, min(k, K)) each row's k highest-scoring classes, best first, a tie to the lower class: what
    a stable argsort of the negated scores gives, without its N x K int64 ranks (21,843 classes).
    The k-th best score bounds each row's candidates; a row with more (a tie at the bound) is sorted
    whole."""
    k = min(k, scores.shape[1])
    if k == 0 or len(scores) == 0:
        return np.zeros((len(scores), k), dtype=np.int64)
    bound = np.partition(scores, scores.shape[1] - k, axis=1)[:, scores.shape[1] - k]
    candidate = scores >= bound[:, None]
    count = candidate.sum(axis=1)
    top = np.empty((len(scores), k), dtype=np.int64)
    plain = np.flatnonzero(count == k)
    if len(plain):  # the candidates in ascending class order, ranked stably by their scores
        columns = np.nonzero(candidate[plain])[1].reshape(len(plain), k)
        ranked = np.argsort(-scores[plain[:, None], columns], axis=1, kind="stable")
        top[plain] = np.take_along_axis(columns, ranked, axis=1)
    for row in np.flatnonzero(count != k):  # a tie at the bound, or a NaN score: as the whole sort ranks it
        top[row] = np.argsort(-scores[row], kind="stable")[:k]
    return top


@dataclass
class Predictions:
    """What a run predicted for each scored image, in the order scored: the image's id (its path,
    else its index in the split), its label and the top-k classes, best first. Kept per run
    (store/predictions.py) for per-class metrics, intervals and paired tests."""

    ids: list[str]
    labels: np.ndarray  # (N,)
    top: np.ndarray  # (N, k) class indices, best first

    @classmethod
    def from_scores(cls, scores: np.ndarray, labels: np.ndarray, ids: list[str]) -> Predictions:
        return cls(list(ids), np.asarray(labels), top_classes(scores))

    @property
    def correct(self) -> np.ndarray:
        return self.top[:, 0] == self.labels


def predictions_path(results: Path, run_key: str) -> Path:
    return shard_dir(results) / f"{run_key}{SUFFIX}"


def _quote(path: Path) -> str:
    return str(path).replace("'", "''")


def write_predictions(results: Path, run_key: str, predictions: Predictions) -> dict:
    """Write the file; returns what the shard's notes record about it."""
    import duckdb
    import pandas as pd

    frame = pd.DataFrame(
        {
            "id": predictions.ids,
            "label": predictions.labels.astype("int64"),
            "top1": predictions.top[:, 0].astype("int64"),
            "topk": predictions.top.astype("int64").tolist(),  # one call, not one per row (10,000 rows a run)
            "correct": predictions.correct,
        }
    )
    path = predictions_path(results, run_key)
    con = duck.connect()
    try:
        con.register("predictions", frame)
        write_atomic(path, lambda tmp: con.execute(f"COPY predictions TO '{_quote(tmp)}' (FORMAT parquet)"))
    except duckdb.Error as e:  # DuckDB's own write failed (a full disk): its 60-line traceback, before
        raise UserError(f"{path}: cannot write it ({io_reason(e)}); nothing was written") from None
    finally:
        con.close()
    return {"file": path.name, "sha256": sha256_file(path), "rows": len(frame)}


def read_predictions(results: Path, run_key: str, recorded: dict | None) -> pd.DataFrame | None:
    """The run's predictions (columns id, label, top1, topk, correct), or None where the run kept
    none (`recorded`: its `notes.predictions`). A missing or changed file is a one-line error."""
    return _read(results, run_key, recorded, lambda con, file: con.execute(f"SELECT * FROM {file}").df())


# kept runs with more rows than this are paired by a 64-bit digest of each image id (DuckDB's hash)
# instead of the id itself: 10M ids as Python strings took 0.7 GB a run, and `table --ci` over two such
# runs was killed for memory. Two different ids of one view share a digest with a probability of about
# n² / 2^65 (3e-6 at 10M); a run whose own ids share one is read by its ids instead.
IDS_AS_DIGESTS_ABOVE = 1_000_000


def read_outcomes(results: Path, run_key: str, recorded: dict | None, digests: bool = False) -> pd.Series | None:
    """Whether each image's top-1 was right (bool), indexed by its id (`digests`: by its id's 64-bit
    digest, uint64, where the run's ids have distinct ones), checked as read_predictions checks; None
    where the run kept none. Reads two columns, not the top-5 lists: memory in proportion to the
    images, some bytes each."""
    import pandas as pd

    def outcomes(con, file: str) -> pd.Series:
        ids = "id"
        if digests:  # DuckDB counts the distinct digests (pandas' is_unique took a second a run)
            distinct, rows = con.execute(f"SELECT count(DISTINCT hash(id)), count(*) FROM {file}").fetchone()
            ids = "hash(id)" if distinct == rows else ids
        found = con.execute(f"SELECT {ids} AS id, correct FROM {file}").fetchnumpy()
        return pd.Series(found["correct"].astype(bool), index=pd.Index(found["id"]))

    return _read(results, run_key, recorded, outcomes)


def checked_predictions(results: Path, run_key: str, recorded: dict | None) -> Path | None:
    """The run's predictions file once checked as read_predictions checks it (a one-line error if it
    is missing, changed or not the run's), for a reader that streams it itself; None where the run
    kept none."""
    return _read(results, run_key, recorded, lambda con, file: shard_dir(results) / str(recorded["file"]))


def _read(results: Path, run_key: str, recorded: dict | None, read):
    """`read(connection, file)` (`file`: the run's predictions as a DuckDB table expression) once the
    file is checked; None where the run kept none."""
    import duckdb

    if not recorded:
        return None
    path = shard_dir(results) / str(recorded.get("file", ""))
    if not path.is_file():
        raise UserError(f"{path}: the predictions of run {run_key[:12]} are missing (the run's shard names this file)")
    if sha256_file(path) != recorded.get("sha256"):
        raise UserError(f"{path}: changed since run {run_key[:12]} wrote it (sha256 differs from its shard's record)")
    file = f"read_parquet('{_quote(path)}')"
    con = duck.connect()
    try:
        con.execute("SET enable_progress_bar = false")
        problem = _problem(con, file, recorded)
        found = None if problem else read(con, file)
    except duckdb.Error as e:
        raise UserError(f"{path}: unreadable predictions ({str(e).splitlines()[0]})") from None
    finally:
        con.close()
    if problem:
        raise UserError(f"{path}: not the predictions of run {run_key[:12]} ({problem})")
    return found


COLUMNS = ("id", "label", "top1", "topk", "correct")
MAX_CLASSES = 100_000  # ImageNet-21k has 21,843; a label past this is no class (2e9 asked for 26.8 GiB)
INTEGER_TYPES = {"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT"}


def _problem(con, file: str, recorded: dict) -> str | None:
    """What makes a predictions file unusable, or None: its columns, its row count (the shard's
    record), labels and predicted classes whole numbers from 0 (below the run's class count where it
    kept the names, else MAX_CLASSES), and `correct` what they say. Counted by DuckDB in one pass
    over three columns: nothing of the file is held here."""
    types = dict(con.execute(f"SELECT column_name, column_type FROM (DESCRIBE SELECT * FROM {file})").fetchall())
    if any(c not in types for c in COLUMNS):
        return f"expected the columns {', '.join(COLUMNS)}"
    rows, wrong, *ranges = con.execute(
        "SELECT count(*),"
        " count(*) FILTER (WHERE CAST(correct AS BOOLEAN) IS DISTINCT FROM (label = top1)),"
        f" min(label), max(label), count(label), min(top1), max(top1), count(top1) FROM {file}"
    ).fetchone()
    if recorded.get("rows") is not None and rows != recorded["rows"]:
        return f"{rows} rows, its run recorded {recorded['rows']}"
    classes = len(recorded["classes"]) if isinstance(recorded.get("classes"), list) else MAX_CLASSES
    for column, (low, high, present) in zip(("label", "top1"), (ranges[:3], ranges[3:]), strict=True):
        if types[column] not in INTEGER_TYPES or present < rows or (rows and not 0 <= low <= high < classes):
            return f"{column} values outside the classes 0..{classes - 1}"
    if wrong:
        return "'correct' does not match label and top1"
    return None
