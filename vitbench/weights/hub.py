"""timm weight tags (`timm:<arch>.<tag>`) and Hugging Face Hub repositories (`hf-hub:<org>/<name>`,
timm's own prefix) from the Hugging Face cache. vitbench's own look-up reads the cache only
(`try_to_load_from_cache`), so nothing is fetched unless downloads are allowed (`--download`,
downloads.py), whatever the process's HF_HUB_OFFLINE says (vitbench leaves it as the user set it; a
download under the user's HF_HUB_OFFLINE=1 is refused in one line). Then huggingface_hub asks the
Hub for the file's metadata, and
vitbench fetches it itself (downloads.fetch: resumed, size- and md5-checked) into the cache's own
layout (blobs/<ETag>, snapshots/<commit>/<file>, refs/main), where huggingface_hub finds it
offline. The ETag and commit become folder and file names, so each must be a hash before anything
is written: huggingface_hub's own download wrote the body wherever a hostile server's
`ETag: "../../x"` pointed (issue 49). An LFS file's sha256 must then equal its ETag."""

from __future__ import annotations

import os
import re
from pathlib import Path

from vitbench.errors import UserError, one_line
from vitbench.files import downloads
from vitbench.files.atomic import write_atomic
from vitbench.files.downloads import hub_cache
from vitbench.models.backend import ModelSpec
from vitbench.provenance import sha256_file
from vitbench.weights.names import HF_PREFIX, TIMM_PREFIX

FILES = ("model.safetensors", "pytorch_model.bin")


def resolve_timm_tag(weights: str, spec: ModelSpec | None, download: bool = False) -> Path:
    """`timm:<arch>.<tag>` (or `timm:paper`: the paper's upstream weights of --model) -> a cached
    file (fetched first where `download`, --download)."""
    import timm

    name = weights.removeprefix(TIMM_PREFIX)
    if name == "paper":
        if spec is None or not spec.paper_tag:
            raise UserError(f"--weights {weights}: {spec.name if spec else 'this model'} has no paper upstream tag")
        name = spec.paper_tag
    cfg = timm.models.get_pretrained_cfg(name)
    if cfg is None or "." not in name:
        raise UserError(f"--weights {weights}: not a timm weights tag (expected timm:<architecture>.<tag>)")
    if spec is not None and name.split(".")[0] != spec.arch:
        raise UserError(f"--weights {weights}: weights for {name.split('.')[0]}, but {spec.name} is {spec.arch}")
    return cached_or_downloaded(cfg.hf_hub_id or f"timm/{name}", weights, download)


def resolve_hf_hub(weights: str, download: bool = False) -> Path:
    """`hf-hub:<org>/<name>`: the repository's model.safetensors (or pytorch_model.bin)."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    repo = weights.removeprefix(HF_PREFIX)
    expected = f"--weights {weights}: expected hf-hub:<organisation>/<repository>"
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", repo):
        raise UserError(expected)
    try:  # the Hub's own rule ('..', '--', a leading '.'): `hf-hub:../..` was its traceback
        validate_repo_id(repo)
    except HFValidationError as e:
        raise UserError(f"{expected} ({one_line(e, 120)})") from None
    return cached_or_downloaded(repo, weights, download)


def cached_or_downloaded(repo: str, weights: str, download: bool) -> Path:
    """The repository's weights file from the cache; fetched first where downloads are allowed."""
    from huggingface_hub import try_to_load_from_cache

    cache = hub_cache()
    for filename in FILES:
        found = try_to_load_from_cache(repo, filename, cache_dir=cache)
        if isinstance(found, str):
            return Path(found)
    if downloads.allowed(download):
        return _download(repo, weights)
    folder = cache / f"models--{repo.replace('/', '--')}"
    raise UserError(
        f"--weights {weights}: not in the local Hugging Face cache (looked in {folder}); add --download (or set "
        f"{downloads.ENV}=1) to fetch it, or download it on a connected machine (huggingface-cli download {repo}) "
        f"and copy that folder here, or pass --weights FILE"
    )


GIT_OR_LFS_HASH = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # a small file's git blob hash, an LFS file's sha256
COMMIT = re.compile(r"[0-9a-f]{40}")


def _download(repo: str, weights: str) -> Path:
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, RepositoryNotFoundError

    # HF_ENDPOINT (a mirror) read now, not when huggingface_hub was imported
    endpoint = (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")
    where = f"{endpoint}/{repo}"
    if constants.HF_HUB_OFFLINE:  # the user's own switch, which vitbench never lifts
        raise UserError(
            f"--weights {weights}: not in the local Hugging Face cache, and HF_HUB_OFFLINE is set in this "
            f"environment, so huggingface_hub may not ask {where}; unset it to --download"
        )
    for filename in FILES:
        url = hf_hub_url(repo, filename, endpoint=endpoint)
        try:
            meta = get_hf_file_metadata(url)
        except EntryNotFoundError:
            continue  # an older repository keeps pytorch_model.bin only
        except RepositoryNotFoundError:
            raise UserError(f"--weights {weights}: no repository {where} (or it is private)") from None
        except (HfHubHTTPError, OSError, ValueError) as e:
            raise UserError(
                f"--weights {weights}: cannot download from {where} ({one_line(e, 160)}); run the same command "
                f"again to resume, or offline: huggingface-cli download {repo} on a connected machine"
            ) from None
        path = _store(repo, filename, url, meta, weights, where)
        _check_blob(path, weights, where)
        return path
    raise UserError(f"--weights {weights}: {where} has neither {' nor '.join(FILES)}")


def _store(repo: str, filename: str, url: str, meta, weights: str, where: str) -> Path:
    """The file into the cache's layout, named by the hashes the Hub stated once they are hashes."""
    etag, commit = meta.etag or "", meta.commit_hash or ""
    if not GIT_OR_LFS_HASH.fullmatch(etag) or not COMMIT.fullmatch(commit):
        raise UserError(
            f"--weights {weights}: {where} stated ETag {etag[:80]!r} and commit {commit[:80]!r} for {filename}, "
            "which are not hashes (a hostile or broken server?); nothing was written"
        )
    folder = hub_cache() / f"models--{repo.replace('/', '--')}"
    blob = folder / "blobs" / etag
    if not blob.is_file():
        downloads.fetch(meta.location or url, blob, f"--weights {weights}")
    link = folder / "snapshots" / commit / filename
    link.parent.mkdir(parents=True, exist_ok=True)
    link.unlink(missing_ok=True)
    link.symlink_to(os.path.relpath(blob, link.parent))
    (folder / "refs").mkdir(exist_ok=True)
    write_atomic(folder / "refs" / "main", commit)
    return link


def _check_blob(path: Path, weights: str, where: str) -> None:
    """The cache names an LFS file's blob by its sha256 (the Hub's ETag): the bytes must match it.
    A mismatch removes the blob and its snapshot link, so the next try fetches it again."""
    blob = path.resolve()
    if not re.fullmatch(r"[0-9a-f]{64}", blob.name):
        return  # a small non-LFS file: named by its git hash, which huggingface_hub does not state per byte
    actual = sha256_file(blob)
    if actual != blob.name:
        blob.unlink(missing_ok=True)
        path.unlink(missing_ok=True)
        raise UserError(
            f"--weights {weights}: the file from {where} is corrupt (sha256 {actual[:16]}…, the Hub states "
            f"{blob.name[:16]}…); it was removed, nothing was used"
        )
