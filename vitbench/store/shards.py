"""Result shards: `runs/<run_key>.json`, one per finished run, written atomically by whoever ran
it. They are the store's source of truth; the database is their merged index.

A shard is checked before anything reads it: JSON of the expected shape, every value of a type
and range its database column holds, and its file name equal to its run_key (a copy under
another name would otherwise be merged as a second result). One that fails is moved to `results/quarantine/` with a
one-line warning naming it and why, so that one bad file never takes the store down; one written
by a newer vitbench (a higher `schema`) is left where it is and not merged."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from vitbench.files.atomic import read_regular
from vitbench.provenance import KEYED_AS, explicit_hparams
from vitbench.store.row_checks import fractions, metric_problem

log = logging.getLogger("vitbench")

# 1: the `schema` field itself; a shard without one (written before it) reads as 0. 2: settings
# stored under their own names (provenance.KEYED_AS: knn's `k` is `knn_k`), and few-shot's `shots`
# among its hparams (it was a field of the run); keys unchanged. 3: every setting explicit, the
# defaults too (provenance.DEFAULT_SETTINGS: `precision: fp32`); keys unchanged
SHARD_SCHEMA = 3
QUARANTINE = "quarantine"
RUN_KEY = re.compile(r"[0-9a-f]{64}")  # a shard's file name: its run key (provenance.run_key_of)
INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)
REQUIRED_TEXT = (
    *("model", "weights", "weights_sha256", "dataset", "data_source", "data_fingerprint", "protocol"),
    *("protocol_version", "status"),
)
OPTIONAL_TEXT = (
    *("arch", "backend", "data_dir", "started_at", "finished_at", "device", "device_name", "git_sha"),
    *("vitbench_version", "torch_version", "timm_version", "python_version", "hostname", "command"),
)
INTEGERS = {"seed": INT32, "n_train": INT32, "n_test": INT32, "skipped_images": INT32}
INTEGERS |= {"device_count": INT32, "flops_per_image": INT64}
NUMBERS = ("device_seconds", "flops")


class BadShard(ValueError):
    """A shard that cannot be merged as it is; the message says why."""


class ForeignFile(BadShard):
    """A file in runs/ that is not vitbench's: vitbench names each shard by its run key, and a
    TensorBoard or Hydra `runs/` folder holds JSON of its own. It is left where it is, unread, unmoved
    (a copy of a shard under another name is not merged either)."""


class NewerShard(BadShard):
    """A shard written by a newer vitbench: valid, but not for this version to read."""


def shard_dir(results: Path) -> Path:
    return results / "runs"


def shard_path(results: Path, run_key: str) -> Path:
    return shard_dir(results) / f"{run_key}.json"


def stored_before(results: Path, run_key: str, since: float | None) -> bool:
    """Whether the run's shard was written before `since` (a time.time()): a rerun asked for at `since`
    has not stored it yet. False where there is no shard, or no `since`."""
    if since is None:
        return False
    try:
        return shard_path(results, run_key).stat().st_mtime < since
    except OSError:
        return False


def checkpoint_path(results: Path, run_key: str) -> Path:
    """Where a training run keeps its resumable checkpoint until its result is stored: a run that
    has one continues from it when the same command runs again."""
    return shard_dir(results) / run_key / "checkpoint.pt"


_LISTED: dict[
    Path, tuple[int, frozenset[str], frozenset[str]]
] = {}  # folder -> (its mtime, shards' and marks' keys then)
SETTLED_NS = 2_000_000_000  # a folder unchanged this long before it is listed keeps its listing until it changes


def shard_keys(results: Path) -> set[str]:
    """The run keys of the shards in the folder. A command asks twice (merge, then read): a folder
    that had not changed for two seconds when it was listed is listed again only once its
    modification time changes (two seconds: longer than the coarsest file-system clock, so a shard
    added after the listing always changes it), so 100,000 shards are listed once per command."""
    return set(_listing(results)[0])


def marked_keys(results: Path) -> set[str]:
    """The run keys whose shard is marked newer than the database's row (`mark`), from the same listing."""
    return set(_listing(results)[1])


def _listing(results: Path) -> tuple[frozenset[str], frozenset[str]]:
    folder = shard_dir(results)
    try:
        mtime = folder.stat().st_mtime_ns
    except OSError:
        return frozenset(), frozenset()
    if not folder.is_dir():
        return frozenset(), frozenset()
    cached = _LISTED.get(folder)
    if cached is not None and cached[0] == mtime:
        return cached[1], cached[2]
    names = [e for e in os.scandir(folder) if e.name.endswith((".json", MARK))]
    # vitbench's files only: what else is in runs/ is another tool's (TensorBoard and Hydra write runs/ too)
    keys = frozenset(e.name[:-5] for e in names if e.name.endswith(".json") and not foreign(Path(e.path)))
    marked = frozenset(
        e.name[: -len(MARK)] for e in names if e.name.endswith(MARK) and RUN_KEY.fullmatch(e.name[: -len(MARK)])
    )
    if mtime < time.time_ns() - SETTLED_NS:
        _LISTED[folder] = (mtime, keys, marked)
    return keys, marked


# A shard is pending while the database lacks its run key. A rerun's shard has a key the database holds:
# written while another process held the database, no later merge took it, and every view showed the
# old number until `ingest --rebuild`. So whoever writes a shard marks it `runs/<key>.unmerged`, before
# and again after the write (a merge that took the first mark off meanwhile read the old shard); a merge
# takes the mark off before it reads the shard (merge.merge_runs), and puts it back should it fail.
MARK = ".unmerged"


def mark_path(results: Path, run_key: str) -> Path:
    return shard_dir(results) / f"{run_key}{MARK}"


def mark(results: Path, run_key: str) -> None:
    """Mark the run's shard newer than the database's row, until a merge takes it."""
    path = mark_path(results, run_key)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()


def take_marks(results: Path, run_keys: list[str]) -> list[str]:
    """Take these runs' marks off (before their shards are read); the keys that had one."""
    taken = []
    for key in run_keys:
        try:
            mark_path(results, key).unlink()
            taken.append(key)
        except FileNotFoundError:
            pass
    return taken


FOREIGN_BYTES = 64 * 2**20  # a shard of a run with curves is some kilobytes; this is far more


def foreign(path: Path) -> bool:
    """Whether a JSON file in runs/ is not vitbench's: vitbench names a shard by its run key (64 hex
    digits); a file named otherwise is vitbench's only where it reads as a shard of that name (a run
    made by hand or by a test: `{"run": {"run_key": NAME, …}}`). Another tool's file, a copy of a
    shard under another name, a FIFO: foreign, never read again, moved or merged."""
    if RUN_KEY.fullmatch(path.stem):
        return False
    try:
        if not path.is_file() or path.stat().st_size > FOREIGN_BYTES:
            return True
        record = json.loads(read_regular(path))
    except (OSError, UnicodeDecodeError, ValueError):
        return True
    run = record.get("run") if isinstance(record, dict) else None
    return not (isinstance(run, dict) and run.get("run_key") == path.stem)


def _check_run(run: dict) -> None:
    for name in REQUIRED_TEXT:
        if not isinstance(run.get(name), str) or not run[name]:
            raise BadShard(f"run.{name} is missing or not text")
    for name in OPTIONAL_TEXT:
        if run.get(name) is not None and not isinstance(run[name], str):
            raise BadShard(f"run.{name} is not text")
    for name in ("random_init", "data_subset"):
        if not isinstance(run.get(name), bool):
            raise BadShard(f"run.{name} is missing or not true/false")
    if run.get("seed") is None:
        raise BadShard("run.seed is missing")
    for name, (low, high) in INTEGERS.items():
        value = run.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high):
            raise BadShard(f"run.{name} = {value!r} is not an integer from {low} to {high}")
    for name in NUMBERS:
        value = run.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value)):
            raise BadShard(f"run.{name} = {value!r} is not a number")
    if not isinstance(run.get("hparams"), dict):
        raise BadShard("run.hparams is missing or not an object")
    if run.get("notes") is not None and not isinstance(run["notes"], dict):
        raise BadShard("run.notes is not an object")
    for name in ("hparams", "notes"):
        _check_finite(run.get(name), f"run.{name}")


def _check_finite(value: object, where: str) -> None:
    """No NaN or infinity anywhere in a JSON value (Python's json reads them): one `"res": NaN`
    in a shard's hparams once took `table` ("cannot convert float NaN to integer") and `export
    --format json` down for the whole folder."""
    if isinstance(value, float) and not math.isfinite(value):
        raise BadShard(f"{where} = {value!r} is not a finite number")
    if isinstance(value, dict):
        for key, item in value.items():
            _check_finite(item, f"{where}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_finite(item, f"{where}[{i}]")


def _check_metrics(metrics: object, protocol: str) -> None:
    if not isinstance(metrics, dict):
        raise BadShard("'metrics' is missing or not an object")
    declared = fractions(protocol)
    for name, value in metrics.items():
        problem = metric_problem(name, value, declared)  # a fraction of its protocol's outside [0, 1] too
        if problem:
            raise BadShard(problem)


def _check_curves(curves: object) -> None:
    if curves is None:
        return
    if not isinstance(curves, dict) or not all(isinstance(v, list) for v in curves.values()):
        raise BadShard("'curves' is not an object of lists")
    for name, values in curves.items():
        if not all(v is None or (isinstance(v, int | float) and not isinstance(v, bool)) for v in values):
            raise BadShard(f"curve {name!r} holds a value that is not a number")


def read_shard(path: Path) -> dict:
    """The shard at `path`, checked (BadShard, or NewerShard, says what is wrong), migrated to
    this version's shape when older."""
    if foreign(path):
        raise ForeignFile("neither named by a run key nor a shard of its name")
    try:
        record = json.loads(read_regular(path))
    except (UnicodeDecodeError, ValueError) as e:
        raise BadShard(f"not JSON ({' '.join(str(e).split())[:80]})") from None
    if not isinstance(record, dict):
        raise BadShard("not a JSON object")
    schema = record.get("schema", 0)
    if isinstance(schema, bool) or not isinstance(schema, int) or schema < 0:
        raise BadShard(f"schema {schema!r} is not a version number")
    if schema > SHARD_SCHEMA:
        raise NewerShard(f"written by a newer vitbench (shard schema {schema}; this one reads up to {SHARD_SCHEMA})")
    run = record.get("run")
    if not isinstance(run, dict):
        raise BadShard("'run' is missing or not an object")
    _check_run(run)
    _check_metrics(record.get("metrics"), run["protocol"])
    _check_curves(record.get("curves"))
    if run.get("run_key") != path.stem:
        raise BadShard(f"its run_key {str(run.get('run_key'))[:16]}… is not its file name (a copy?)")
    if schema < 2:
        record = {**record, "run": _as_today(run)}
    run = record["run"]  # < 3: the defaults it left out, recorded (a shard made by hand may lack them too)
    record = {**record, "run": {**run, "hparams": explicit_hparams(run["protocol"], run["hparams"])}}
    return {**record, "schema": SHARD_SCHEMA}  # 0 -> 1: the shape is the same, the field is new


def _as_today(run: dict) -> dict:
    """A schema-1 run in today's shape: its hparams under today's names, its `shots` among them (its
    run key hashes the old form, as today's keys do: provenance.run_key_of)."""
    today = {keyed: name for name, keyed in KEYED_AS.get(run["protocol"], {}).items()}
    hparams = {today.get(name, name): value for name, value in run["hparams"].items()}
    shots = run.get("shots")
    if shots is not None:
        low, high = INT32
        if isinstance(shots, bool) or not isinstance(shots, int) or not low <= shots <= high:
            raise BadShard(f"run.shots = {shots!r} is not an integer from {low} to {high}")
        hparams["shots"] = shots
    return {**{k: v for k, v in run.items() if k != "shots"}, "hparams": hparams}


def quarantine(path: Path, reason: str, results: Path | None = None) -> None:
    """Move a shard (or, given `results`, a cache file) that cannot be used out of the way, to
    `<results>/quarantine/`, saying so in one line; where it cannot be moved (a read-only folder),
    it is only left out, and so is one in a folder reached through a symbolic link (a `runs/` that is
    a link: its files are where the link points, not the results folder's to move)."""
    target = (results or path.parent.parent) / QUARANTINE / path.name
    if path.parent.is_symlink():
        log.warning("%s: %s; left out (%s is a symbolic link: nothing is moved out of it)", path, reason, path.parent)
        return
    if target.parent.is_symlink():  # it would move the file out of the results folder, wherever it points
        log.warning(
            "%s: %s; left out (%s is a symbolic link: nothing is moved through it)", path, reason, target.parent
        )
        return
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        while target.exists():
            target = target.with_name(f"{target.stem}.{os.urandom(3).hex()}{target.suffix}")
        os.replace(path, target)
        log.warning("%s: %s; moved to %s", path, reason, target)
    except OSError as e:
        log.warning("%s: %s; left out (could not move it to %s: %s)", path, reason, target.parent, e.strerror or e)


@dataclass
class Shards:
    """What a batch of shard files read as: the good records (with their paths), and the run keys
    of shards that are left where they are (newer, or bad but not movable)."""

    records: list[tuple[Path, dict]] = field(default_factory=list)
    held: set[str] = field(default_factory=set)


_TOLD: set[Path] = set()  # newer shards and other tools' files already told about


def read_shards(paths: list[Path]) -> Shards:
    found = Shards()
    for path in paths:
        try:
            found.records.append((path, read_shard(path)))
        except ForeignFile as e:
            if path not in _TOLD:
                log.info("%s: not a vitbench result shard (%s); left alone", path, e)
                _TOLD.add(path)
        except NewerShard as e:
            if path not in _TOLD:  # once per process: sync and the snapshot both read it
                log.warning("%s: %s; left in place, not merged", path, e)
                _TOLD.add(path)
            found.held.add(path.stem)
        except BadShard as e:
            quarantine(path, str(e))
            if path.exists():
                found.held.add(path.stem)
        except OSError as e:  # vanished (quarantined by a concurrent reader) or unreadable
            if path.exists():
                quarantine(path, f"cannot be read ({e.strerror or e})")
    return found


def shard_metric_values(results: Path, run_keys: list[str], name: str) -> dict[str, float]:
    """`metric_values` from the shards themselves (a cluster worker never opens the database)."""
    found = {}
    folder = shard_dir(results)
    paths = [folder / f"{k}.json" for k in run_keys if (folder / f"{k}.json").exists()]
    for path, record in read_shards(paths).records:
        value = record["metrics"].get(name)
        if value is not None:
            found[path.stem] = float(value)
    return found
