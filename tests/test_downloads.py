"""Opt-in downloads (`--download`), tested against a server each test starts on 127.0.0.1
(tests/loopback.py); nothing else is contacted. The paper's .npz files go through vitbench's own
fetch (resume, size and md5 checks, no partial file under the final name); timm / Hugging Face
Hub weights through huggingface_hub with HF_ENDPOINT at the server; TFDS builds through TFDS's
own download_and_prepare."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from loopback import COMMIT, Server

from vitbench import store
from vitbench.catalog import registry
from vitbench.errors import UserError
from vitbench.files import downloads
from vitbench.weights import check_weights_arg

B16 = "/vit_models/imagenet21k/ViT-B_16.npz"
FINETUNED = "/vit_models/imagenet21k%2Bimagenet2012/ViT-B_16-224.npz"


@pytest.fixture
def server(monkeypatch, tmp_path):
    """The loopback server as the paper bucket and the Hub; vitbench's and the Hub's caches in tmp."""
    monkeypatch.setenv("VITBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv(downloads.ENV, raising=False)
    with Server() as s:
        monkeypatch.setenv("VITBENCH_PAPER_WEIGHTS_URL", s.url)
        monkeypatch.setenv("HF_ENDPOINT", s.url)
        yield s
    assert len(s.state.requests) < 50  # bounded: no test loops on the server


def payload(n: int = 3_000_000, seed: int = 0) -> bytes:
    """Random bytes after a zip's magic: what an .npz starts with (the fetch checks it)."""
    return downloads.ZIP_MAGIC + np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def cached(tmp_path: Path, name: str) -> Path:
    return tmp_path / "cache" / "weights" / name


def test_paper_weights_are_fetched_only_when_asked_then_checked_against_their_record(server, tmp_path):
    data = server.state.files[B16] = payload()
    offline = r"paper:ViT-B_16: not downloaded yet \(looked for .*ViT-B_16\.npz\); add --download \(or set "
    offline += r"VITBENCH_DOWNLOAD=1\) to fetch http://127\.0\.0\.1:\d+/vit_models/"
    with pytest.raises(UserError, match=offline):
        check_weights_arg("paper:ViT-B_16", registry.get_model("vit-b/16"))
    assert server.state.requests == []  # offline by default: nothing was asked of the server
    path = Path(check_weights_arg("paper:ViT-B_16", registry.get_model("vit-b/16"), download=True))
    assert path == cached(tmp_path, "vit_models/imagenet21k/ViT-B_16.npz") and path.read_bytes() == data
    record = json.loads(path.with_name("ViT-B_16.npz.json").read_text())
    assert record["size"] == len(data) and record["sha256"] == hashlib.sha256(data).hexdigest()
    assert record["url"].endswith(B16)
    # `paper` alone is --model's own ImageNet-21k checkpoint; used from the cache, with no request
    before = len(server.state.requests)
    assert Path(check_weights_arg("paper", registry.get_model("vit-b/16"))) == path
    assert len(server.state.requests) == before
    # a file changed after its download is refused, not used
    path.write_bytes(data[:-1] + b"\0")
    with pytest.raises(UserError, match="is no longer the file that was downloaded"):
        check_weights_arg("paper:ViT-B_16", registry.get_model("vit-b/16"))


def test_a_broken_off_download_resumes_where_it_stopped(server, tmp_path, caplog):
    data = server.state.files[FINETUNED] = payload(seed=1)
    server.state.cut_after[FINETUNED] = 1_000_000
    name = "paper:imagenet21k+imagenet2012/ViT-B_16-224"
    final = cached(tmp_path, "vit_models/imagenet21k+imagenet2012/ViT-B_16-224.npz")
    broke_off = r"broke off at 1,000,000 bytes of 3\.0 MB .*run the same command again"
    with caplog.at_level("INFO", logger="vitbench"), pytest.raises(UserError, match=broke_off):
        check_weights_arg(name, registry.get_model("vit-b/16"), download=True)
    assert "downloaded" not in caplog.text  # before: "downloaded ViT-B_16-224.npz" just before "broke off"
    assert not final.exists() and final.with_name(final.name + ".part").stat().st_size == 1_000_000
    path = Path(check_weights_arg(name, registry.get_model("vit-b/16"), download=True))
    assert path == final and path.read_bytes() == data
    assert [r[2] for r in server.state.requests] == [None, "bytes=1000000-"]  # the second asked for the rest only
    assert not final.with_name(final.name + ".part").exists()


def test_a_stalled_download_keeps_what_arrived_and_says_so(server, tmp_path, monkeypatch):
    """Before: a server that went quiet after 1,000 bytes gave "broke off at 0 bytes" and kept
    nothing to resume from (the read waited for a whole chunk) (issue 49's notes)."""
    monkeypatch.setattr(downloads, "TIMEOUT_S", 1)
    data = server.state.files[B16] = payload(seed=6)
    server.state.stall_after[B16] = 1_000
    with pytest.raises(UserError, match=r"broke off at 1,000 bytes of 3\.0 MB \(.*timed out"):
        check_weights_arg("paper:ViT-B_16", registry.get_model("vit-b/16"), download=True)
    part = cached(tmp_path, "vit_models/imagenet21k/ViT-B_16.npz.part")
    assert part.read_bytes() == data[:1_000]
    assert Path(check_weights_arg("paper:ViT-B_16", registry.get_model("vit-b/16"), download=True)).read_bytes() == data
    assert server.state.requests[-1][2] == "bytes=1000-"


def test_a_corrupt_download_is_refused_and_removed(server, tmp_path):
    server.state.files[B16] = payload(seed=2)
    server.state.corrupt.add(B16)  # one byte differs from the md5 the server states
    refused = r"is corrupt \(its md5 differs from the one the server states \(x-goog-hash\)\); it was removed"
    with pytest.raises(UserError, match=refused):
        check_weights_arg("paper:ViT-B_16", None, download=True)
    assert list(cached(tmp_path, "vit_models/imagenet21k").iterdir()) == []  # no file, no .part


def test_an_html_page_is_not_kept_as_weights(server, tmp_path):
    """Before: a 200 answer with an HTML body and no checksum was kept as ViT-B_16.npz with its
    record; every later run said 'not a readable .npz' and --download did not fetch again (issue 49)."""
    spec = registry.get_model("vit-b/16")
    server.state.files[B16] = b"<!DOCTYPE html><html><body>Service unavailable</body></html>"
    with pytest.raises(UserError, match=r"is corrupt \(it is an HTML page, not a \.npz file\); it was removed"):
        check_weights_arg("paper:ViT-B_16", spec, download=True)
    folder = cached(tmp_path, "vit_models/imagenet21k")
    assert not folder.exists() or not list(folder.iterdir())
    # one cached by an older vitbench: named, and fetched again with --download
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ViT-B_16.npz").write_bytes(server.state.files[B16])
    with pytest.raises(UserError, match=r"ViT-B_16\.npz is cached but it is an HTML page.*add --download"):
        check_weights_arg("paper:ViT-B_16", spec)
    data = server.state.files[B16] = payload(seed=4)
    assert Path(check_weights_arg("paper:ViT-B_16", spec, download=True)).read_bytes() == data


def test_a_missing_file_is_one_line_naming_the_url(server):
    with pytest.raises(UserError) as e:
        check_weights_arg("paper:ViT-L_32", None, download=True)
    assert "cannot download http://127.0.0.1:" in str(e.value) and "/vit_models/imagenet21k/ViT-L_32.npz (HTTP 404" \
        in str(e.value) and "\n" not in str(e.value)  # fmt: skip
    with pytest.raises(UserError, match="not a released checkpoint"):
        check_weights_arg("paper:ViT-Q_16", None)
    with pytest.raises(UserError, match="the checkpoint of vit-l/32, but --model is vit-b/16"):
        check_weights_arg("paper:ViT-L_32", registry.get_model("vit-b/16"))


def test_hub_weights_download_into_the_hugging_face_cache(server, tmp_path):
    """timm:<tag> and hf-hub:<repo> into the Hugging Face cache's layout; a transfer that breaks off
    is resumed by the next command; a blob whose bytes are not the Hub's is removed."""
    repo = "timm/vit_tiny_patch16_224.augreg_in21k"
    data = payload(2_000_000, seed=3)
    server.state.hub_repos |= {repo, "org/corrupt", "org/empty"}
    server.state.files[f"/{repo}/resolve/main/model.safetensors"] = data
    server.state.cut_after[f"/{repo}/resolve/main/model.safetensors"] = 500_000
    with pytest.raises(UserError, match="not in the local Hugging Face cache .*add --download"):
        check_weights_arg(f"timm:{repo.split('/')[1]}", registry.get_model("vit-ti/16"))
    assert server.state.requests == []
    with pytest.raises(
        UserError, match=r"broke off at 500,000 bytes of 2\.0 MB .*run the same command again to resume"
    ):
        check_weights_arg(f"timm:{repo.split('/')[1]}", registry.get_model("vit-ti/16"), download=True)
    path = Path(check_weights_arg(f"timm:{repo.split('/')[1]}", registry.get_model("vit-ti/16"), download=True))
    assert ("GET", f"/{repo}/resolve/main/model.safetensors", "bytes=500000-") in server.state.requests
    assert path.read_bytes() == data and str(path).startswith(str(tmp_path / "hub" / "models--timm--"))
    assert path.resolve().name == hashlib.sha256(data).hexdigest()  # the blob, named by the Hub's sha256
    assert Path(check_weights_arg(f"hf-hub:{repo}")) == path  # the same cache entry, now offline
    server.state.files["/org/corrupt/resolve/main/model.safetensors"] = data
    server.state.corrupt.add("/org/corrupt/resolve/main/model.safetensors")
    with pytest.raises(UserError, match=r"hf-hub:org/corrupt: the (file from|download of) .* is corrupt \("):
        check_weights_arg("hf-hub:org/corrupt", download=True)
    assert not any((tmp_path / "hub" / "models--org--corrupt" / "blobs").iterdir())
    with pytest.raises(UserError, match=r"hf-hub:org/missing: no repository http://127\.0\.0\.1:\d+/org/missing"):
        check_weights_arg("hf-hub:org/missing", download=True)
    with pytest.raises(UserError, match="has neither model.safetensors nor pytorch_model.bin"):
        check_weights_arg("hf-hub:org/empty", download=True)
    with pytest.raises(UserError, match="expected hf-hub:<organisation>/<repository>"):
        check_weights_arg("hf-hub:no-slash")
    for name in ("../..", "org/..x", "a--b/c"):  # before: huggingface_hub's HFValidationError, a traceback (issue 49)
        with pytest.raises(UserError, match=r"expected hf-hub:<organisation>/<repository> \(Repo id must|Cannot have"):
            check_weights_arg(f"hf-hub:{name}", download=True)


def test_the_users_own_hf_hub_offline_holds_even_with_download(server, monkeypatch):
    """vitbench never lifts the process's HF_HUB_OFFLINE=1 (huggingface_hub reads it as it is
    imported): `--download` then says so in one line, and nothing is asked of the server."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # as HF_HUB_OFFLINE=1 at its import
    server.state.hub_repos |= {"org/model"}
    with pytest.raises(UserError, match=r"hf-hub:org/model: not in the local Hugging Face cache, and HF_HUB_OFFLINE"):
        check_weights_arg("hf-hub:org/model", download=True)
    assert server.state.requests == []


def test_a_hostile_hub_cannot_write_outside_the_cache(server, tmp_path):
    """Before: with `ETag: "../../../../tmp/x/PWNED"` huggingface_hub wrote the body to that path
    (its blob is blobs/<ETag>), linked the snapshot to it and vitbench loaded it (issue 49, item 1).
    ETag and commit name files in the cache: anything but a hash is refused before a byte is written."""
    repo, data = "org/evil", payload(100_000, seed=5)
    file = f"/{repo}/resolve/main/model.safetensors"
    server.state.hub_repos.add(repo)
    server.state.files[file] = data
    outside = tmp_path / "outside" / "PWNED"
    hostile = [
        {"ETag": f'"../../../../../../../../..{outside}"', "X-Linked-Etag": f'"../../../../../../../../..{outside}"'},
        {"ETag": f'"{outside}"', "X-Linked-Etag": f'"{outside}"'},
        {"X-Repo-Commit": f"../../../../../../../../..{outside.parent}"},
    ]
    for headers in hostile:
        server.state.headers[file] = headers
        with pytest.raises(UserError, match=r"hf-hub:org/evil: .* which are not hashes .*nothing was written"):
            check_weights_arg(f"hf-hub:{repo}", download=True)
        assert not (tmp_path / "outside").exists()
        hub = tmp_path / "hub"
        assert not hub.exists() or not [p for p in hub.rglob("*") if p.is_file() and "models--org--evil" in str(p)]
    del server.state.headers[file]  # the same repository from an honest server
    path = Path(check_weights_arg(f"hf-hub:{repo}", download=True))
    assert path.read_bytes() == data and path.resolve().parent == tmp_path / "hub" / "models--org--evil" / "blobs"


def test_run_with_download_fetches_hub_weights_and_runs(server, tmp_path, cli):
    """`vitbench run --download`: a ViT-Ti's weights from the (loopback) Hub, then a few-shot run
    that records them by their sha256; without --download the same command is one line."""
    from safetensors.torch import save_file

    spec = registry.get_model("vit-ti/16")
    model = spec.backend.create(spec, num_classes=0, img_size=224)
    weights_file = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(weights_file))
    server.state.hub_repos.add("lab/vit-ti")
    server.state.files["/lab/vit-ti/resolve/main/model.safetensors"] = weights_file.read_bytes()
    args = ("run", "--model", "vit-ti/16", "--weights", "hf-hub:lab/vit-ti", "--dataset", "digits", "--shots", "1",
            "--seeds", "0", "--res", "32", "--results", tmp_path / "results")  # fmt: skip
    code, _, err = cli(*args)
    assert code == 2 and err.count("\n") == 1 and "add --download" in err
    code, out, err = cli(*args, "--download")
    assert code == 0, err
    from vitbench.store import read_results

    stored = read_results(tmp_path / "results")
    assert set(stored["weights_sha256"]) == {hashlib.sha256(weights_file.read_bytes()).hexdigest()}


def test_tfds_builds_are_downloaded_and_prepared_by_tfds(server, tmp_path, cli, monkeypatch):
    """`--data-source tfds --download`: a builder that is not prepared is built by TFDS's own
    download_and_prepare (a small builder whose source file the loopback server serves, in place
    of DTD's), then read through vitbench's VTAB-1k split arithmetic."""
    pytest.importorskip("tensorflow_datasets")
    from vitbench.datasets import vtab_tfds
    from vitbench.datasets.vtab import TASKS_BY_KEY

    rng = np.random.default_rng(0)
    arrays = {s: (rng.integers(0, 255, (n, 8, 8, 3), dtype=np.uint8), np.arange(n) % 4)
              for s, n in {"train": 900, "validation": 210, "test": 20}.items()}  # fmt: skip
    source = tmp_path / "source.npz"
    np.savez(source, **{f"{s}_{k}": v for s, (x, y) in arrays.items() for k, v in (("x", x), ("y", y))})
    server.state.files["/tiny/source.npz"] = source.read_bytes()
    loopback_tfds = pytest.importorskip("loopback_tfds")  # imports TensorFlow Datasets
    loopback_tfds.SOURCE_URL = f"{server.url}/tiny/source.npz"

    task = TASKS_BY_KEY["dtd"]
    rule = vtab_tfds.TfdsTask("vitbench_loopback_tiny:1.0.0", "validation", 0, "test", (), vtab_tfds.field("label"))
    load, fetch = _with_rule(vtab_tfds, task, rule)
    data_dir = tmp_path / "tfds"
    data_dir.mkdir()
    with pytest.raises(UserError, match="is not prepared under .*; add --download"):
        load(data_dir, "test")  # reading never fetches
    assert server.state.requests == []
    fetch(data_dir)  # what --download runs before the task is read
    train = load(data_dir, "train800")
    import tensorflow_datasets as tfds

    direct = list(tfds.as_numpy(tfds.load("vitbench_loopback_tiny", split="train[:800]", data_dir=str(data_dir))))
    assert len(train) == 800 and train.labels.tolist() == [int(r["label"]) for r in direct]
    assert all(np.array_equal(r["image"], image) for r, image in zip(direct, train.images, strict=True))
    served = {arrays["train"][0][i].tobytes() for i in range(900)}
    assert all(image.tobytes() in served for image in train.images)  # the server's images, built by TFDS
    assert [r[:2] for r in server.state.requests] == [("GET", "/tiny/source.npz")]
    # `vitbench run --download` fetches while planning, a dry run never (the planner hands the flag down)
    from vitbench.catalog.registry import get_dataset

    spec, fresh = get_dataset("vtab/dtd"), tmp_path / "fresh"
    monkeypatch.setitem(spec.other_sources, "tfds", load)
    monkeypatch.setitem(spec.fetchers, "tfds", fetch)
    run = ("run", "--dataset", "vtab/dtd", "--data-source", "tfds", "--data-dir", fresh, "--model", "vit-ti/16",
           "--weights", "random", "--res", "32", "--shots", "1", "--seeds", "0", "--workers", "0", "--download",
           "--results", tmp_path / "results")  # fmt: skip
    fresh.mkdir()
    code, _, err = cli(*run, "--dry-run")
    assert code == 2 and "is not prepared under" in err and len(server.state.requests) == 1
    code, _, err = cli(*run)
    assert code == 0, err
    assert len(server.state.requests) == 2 and len(store.read_results(tmp_path / "results")) == 1
    del server.state.files["/tiny/source.npz"]
    with pytest.raises(UserError) as e:
        fetch(tmp_path / "elsewhere")
    assert "download_and_prepare into" in str(e.value) and "\n" not in str(e.value)


def _with_rule(vtab_tfds, task, rule):
    """vitbench's TFDS reader and fetcher for `task` with `rule` in place of its registered recipe."""
    original = vtab_tfds.TFDS_TASKS[task.key]
    vtab_tfds.TFDS_TASKS[task.key] = rule
    try:
        return vtab_tfds.tfds_loader(task), vtab_tfds.tfds_fetcher(task)
    finally:
        vtab_tfds.TFDS_TASKS[task.key] = original


def test_a_hub_dataset_is_read_from_the_cache_and_fetched_only_with_download(server, tmp_path, cli):
    """`hf:<owner>/<name>`: the local Hub cache only (no request), one line saying how to fetch it;
    with --download, huggingface_hub's snapshot of its parquet files into the Hub cache, then a run."""
    from container_data import samples, write_parquet

    repo = "someone/tiny-pets"
    folder = write_parquet(samples({"train": 4, "test": 2}), tmp_path / "made")
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.parquet"))
    server.state.hub_repos.add(repo)
    listing = [{"type": "file", "path": f, "size": (folder / f).stat().st_size, "oid": "0" * 40} for f in files]
    server.state.files[f"/api/datasets/{repo}/revision/main"] = json.dumps(
        {"id": repo, "sha": COMMIT, "siblings": [{"rfilename": f} for f in files]}
    ).encode()
    server.state.files[f"/api/datasets/{repo}/tree/{COMMIT}?recursive=true&expand=false"] = json.dumps(listing).encode()
    for f in files:
        server.state.files[f"/datasets/{repo}/resolve/{COMMIT}/{f}"] = (folder / f).read_bytes()
    run = ("run", "--model", "vit-ti/16", "--weights", "random", "--dataset", f"hf:{repo}", "--res", "32",
           "--workers", "0", "--protocol", "knn", "--results", str(tmp_path / "results"))  # fmt: skip
    code, _, err = cli(*run)
    assert code == 2 and err.strip().splitlines()[-1] == (
        f"error: hf:{repo}: not in the local Hub cache; add --download (or set VITBENCH_DOWNLOAD=1) to fetch it, "
        f"or give the folder: hf:<path>"
    )
    assert server.state.requests == []  # the cache only: nothing was asked of the Hub
    code, _, err = cli(*run, "--download")
    assert code == 0, err
    snapshot = tmp_path / "hub" / "datasets--someone--tiny-pets" / "snapshots" / COMMIT
    assert sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*.parquet")) == files
    asked = len(server.state.requests)
    code, _, err = cli(*run, "--rerun")  # now from the cache, offline
    assert code == 0, err
    assert len(server.state.requests) == asked
    (row,) = store.read_results(tmp_path / "results").drop_duplicates("run_key").itertuples()
    assert row.dataset.startswith("hf:tiny-pets@") and row.data_source == "hf"
