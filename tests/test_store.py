import hashlib
import json

import duckdb
import pytest

from vitbench import store
from vitbench.errors import UserError


def shard(tmp_path, key="k1", value=0.5):
    run = {c: None for c in store.RUN_COLUMNS}
    run.update(
        run_key=key,
        model="vit-ti/16",
        weights="random",
        weights_sha256="random",
        random_init=True,
        dataset="digits",
        data_source="sklearn-digits",
        data_fingerprint="f",
        data_subset=False,
        protocol="fewshot",
        protocol_version="fewshot-lsr/1",
        hparams={"l2": "1024"},
        seed=0,
        shots=5,
        status="done",
        notes={},
    )
    path = tmp_path / "runs" / f"{key}.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({"run": run, "metrics": {"accuracy": value}}))
    return path


def test_schema_is_created_with_its_version(tmp_path):
    store.connect(tmp_path).close()
    con = duckdb.connect(str(tmp_path / store.DB_NAME))
    assert con.execute("SELECT max(version) FROM schema_version").fetchone()[0] == store.SCHEMA_VERSION


def test_ingest_is_idempotent_and_a_rerun_replaces(tmp_path):
    con = store.connect(tmp_path)
    path = shard(tmp_path)
    store.ingest(con, [path])
    store.ingest(con, [path])
    assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 1
    store.ingest(con, [shard(tmp_path, value=0.75)])
    assert con.execute("SELECT value FROM metrics").fetchall() == [(0.75,)]
    con.close()
    df = store.read_results(tmp_path)
    assert len(df) == 1 and df.iloc[0]["value"] == 0.75
    # a folder named as a str reads the same (it raised TypeError, `str / str`, where vitbench.results took it)
    assert store.read_results(str(tmp_path)).equals(df)


def test_pending_shards_are_ingested(tmp_path):
    shard(tmp_path, "a"), shard(tmp_path, "b")
    con = store.connect(tmp_path)
    assert store.ingest_pending(con, tmp_path) == 2
    assert store.ingest_pending(con, tmp_path) == 0
    assert store.done_keys(con) == {"a", "b"}


def test_a_shard_the_database_refuses_is_quarantined_and_the_others_merged(tmp_path):
    """A shard that passes the checks but not the database (a start time that is no timestamp):
    the batch falls back to one transaction per shard, the refused one leaves no row behind."""
    con = store.connect(tmp_path)
    good, bad = shard(tmp_path, "good"), shard(tmp_path, "bad")
    record = json.loads(bad.read_text())
    record["run"]["started_at"] = "yesterday, around noon"
    bad.write_text(json.dumps(record))
    assert store.ingest(con, [good, bad]) == 1
    assert store.done_keys(con) == {"good"}
    assert con.execute("SELECT count(*) FROM metrics WHERE run_key = 'bad'").fetchone()[0] == 0
    assert (tmp_path / "quarantine" / "bad.json").exists() and not bad.exists()


def test_a_newer_store_is_refused_and_left_untouched(tmp_path):
    store.connect(tmp_path).close()
    con = duckdb.connect(str(tmp_path / store.DB_NAME))
    con.execute("INSERT INTO schema_version VALUES (99, now(), '9.0')")
    con.close()
    digest = hashlib.sha256((tmp_path / store.DB_NAME).read_bytes()).hexdigest()
    newer = rf"written by a newer vitbench \(schema 99; this one knows up to {store.SCHEMA_VERSION}\)"
    with pytest.raises(UserError, match=newer):
        store.connect(tmp_path)
    with pytest.raises(UserError, match="newer vitbench"):
        store.read_results(tmp_path)
    assert hashlib.sha256((tmp_path / store.DB_NAME).read_bytes()).hexdigest() == digest


def test_absent_store_reads_as_empty(tmp_path):
    assert store.read_results(tmp_path).empty


def test_a_version_1_store_is_migrated_without_losing_runs(tmp_path, monkeypatch):
    with monkeypatch.context() as m:  # a store written by the first release
        m.setattr(store, "MIGRATIONS", store.MIGRATIONS[:1])
        m.setattr(store, "SCHEMA_VERSION", 1)
        m.setattr(store, "RUN_COLUMNS", [c for c in store.RUN_COLUMNS if c != "skipped_images"])
        con = store.connect(tmp_path)
        store.ingest(con, [shard(tmp_path)])
        con.close()
    con = store.connect(tmp_path)
    versions = [r[0] for r in con.execute("SELECT version FROM schema_version ORDER BY version").fetchall()]
    assert versions == list(range(1, store.SCHEMA_VERSION + 1))
    assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 1
    assert con.execute("SELECT count(*) FROM attention_distance").fetchone()[0] == 0
    con.close()
