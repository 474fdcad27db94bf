"""A results folder before a run writes to it: checked writable (and not a file where vitbench keeps a
folder), then its database opened for the run, or the run told to write shards only."""

from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path

from vitbench import store
from vitbench.errors import UserError, one_line
from vitbench.store import duck

log = logging.getLogger("vitbench")


RESULT_FOLDERS = ("runs", "audits", "leases", "cache", "quarantine", "logs")  # what vitbench keeps under --results


def writable_results(results: Path) -> Path:
    duck.check_path(results)
    if results.exists() and not results.is_dir():
        raise UserError(f"--results {results}: is a file, expected a folder")
    for name in RESULT_FOLDERS:
        if (results / name).exists() and not (results / name).is_dir():
            raise UserError(f"--results {results}: {results / name} is a file, expected a folder vitbench keeps there")
    try:
        results.mkdir(parents=True, exist_ok=True)
        probe = results / f".write-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"  # two threads: two probes
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise UserError(f"--results {results}: cannot write there ({e.strerror or one_line(e)})") from None
    return results


def open_for_run(results: Path):
    """(The store for writing, None), or (None, why) where this run writes its results as shards
    only: while another process holds it (leases keep the two from running the same run; not a
    problem), or when it cannot take the shards earlier runs left (a full disk: a problem the
    command ends by naming). Whichever command next opens the store merges them."""
    try:
        con = store.connect(results)
    except store.StoreLocked as e:
        log.warning("%s: this run stores its results as shards, merged by the next command that opens it", e)
        return None, None
    try:
        store.ingest_pending(con, results)  # what earlier runs left as shards
    except store.StoreUnavailable as e:
        con.close()
        log.warning("%s; this run stores its results as shards meanwhile", e)
        return None, str(e)
    return con, None
