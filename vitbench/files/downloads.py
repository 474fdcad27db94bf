"""Opt-in downloads (`--download`, or VITBENCH_DOWNLOAD=1). Off by default: vitbench then reads
only files already on disk, and a name that is not there is one line saying where to get it.

`fetch` is the one HTTP download of a plain file (the paper's .npz checkpoints): it resumes a
partial file (an HTTP Range request), shows a progress bar, checks the size and the checksums the
server states (Google Cloud Storage's `x-goog-hash: md5=`) before the file gets its final name,
returns its sha256 (both hashed as the bytes arrive), and never leaves a partial file under that name. Hugging Face Hub
weights and TFDS builds go through their own libraries (weights/hub.py, datasets/vtab_tfds.py)."""

from __future__ import annotations

import base64
import hashlib
import http.client
import logging
import os
import re
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from vitbench.errors import UserError, one_line

log = logging.getLogger("vitbench")

ENV = "VITBENCH_DOWNLOAD"
TIMEOUT_S = 60  # per connect and per read: a stalled server ends the download (resumable) instead of hanging
CHUNK = 1 << 20


def allowed(requested: bool) -> bool:
    """Whether to download: `requested` (a request's --download, handed down by the planner), or
    VITBENCH_DOWNLOAD=1 in the environment (on everywhere)."""
    return requested or os.environ.get(ENV, "").strip().lower() in ("1", "true", "yes", "on")


def cache_root() -> Path:
    """Where vitbench keeps what it downloads itself: VITBENCH_CACHE, else $XDG_CACHE_HOME/vitbench,
    else ~/.cache/vitbench."""
    if os.environ.get("VITBENCH_CACHE"):
        return Path(os.environ["VITBENCH_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "vitbench"


def hub_cache() -> Path:
    """Where huggingface_hub keeps downloads: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub
    (read when asked: the environment of the moment, not of huggingface_hub's import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    return Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub"


def hub_endpoint() -> str | None:
    """The Hub the user points huggingface_hub at (HF_ENDPOINT), read when asked."""
    return os.environ.get("HF_ENDPOINT") or None


@dataclass(frozen=True)
class Fetched:
    url: str
    path: Path
    size: int
    sha256: str


def fetch(url: str, dest: Path, label: str) -> Fetched:
    """`url` -> `dest`, through `dest.part` (kept when the transfer breaks off, so the next call
    resumes it; removed when the bytes are wrong). `label` names the option in errors."""
    part = dest.with_name(dest.name + ".part")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{label}: cannot write to {dest.parent} ({e.strerror or e})") from None
    offset = part.stat().st_size if part.exists() else 0
    response = _open(url, offset, label)
    if response is None:  # 416: nothing after `offset` (a stale or complete partial file): start over
        part.unlink()
        offset, response = 0, _open(url, 0, label)
    with response:
        if offset and response.status != 206:  # the server ignored the Range: start over
            offset = 0
        total = _total_size(response, offset)
        stated_md5 = _stated_md5(response.headers.get_all("x-goog-hash") or [])
        digests: dict[str, str] = {}
        try:
            digests = _copy(response, part, offset, total, dest.name)
            error = None
        except (OSError, http.client.HTTPException) as e:  # a dropped connection, a timeout, a full disk
            error = one_line(e, 120)
    size = part.stat().st_size
    if error is not None or (total is not None and size < total):  # what arrived is kept for the next try
        why = error or "the connection closed early"
        raise UserError(
            f"{label}: the download of {url} broke off at {size:,} bytes of {_mb(total)} ({why}); run the same "
            f"command again to resume it"
        )
    problem = None
    if total is not None and size != total:
        problem = f"{size:,} bytes where the server stated {total:,}"
    if problem is None and stated_md5 is not None and digests["md5"] != stated_md5:
        problem = "its md5 differs from the one the server states (x-goog-hash)"
    if problem is None:
        problem = format_problem(part, dest.suffix)
    if problem is not None:
        part.unlink(missing_ok=True)
        raise UserError(f"{label}: the download of {url} is corrupt ({problem}); it was removed, nothing was used")
    os.replace(part, dest)
    log.info("downloaded %s (%s)", dest.name, _mb(size))  # only once checked: it was said before "broke off"
    return Fetched(url, dest, size, digests["sha256"])


ZIP_MAGIC = b"PK\x03\x04"  # .npz archives and torch's zip-format .pth/.bin


def format_problem(path: Path, suffix: str) -> str | None:
    """Why the file at `path` cannot be a `suffix` file (None when it can): a server that answers an
    error with status 200 and an HTML page (no checksum to catch it) once left that page cached as
    `ViT-L_16.npz`, and every later run failed on it."""
    with open(path, "rb") as f:
        head = f.read(16)
    if suffix == ".npz" and head.startswith(ZIP_MAGIC):
        return None
    if suffix in (".pth", ".bin", ".pt") and (head.startswith(ZIP_MAGIC) or head[:1] == b"\x80"):  # zip or pickle
        return None
    if suffix == ".safetensors" and len(head) >= 9 and head[8:9] == b"{":  # 8-byte header length, then JSON
        return None
    if suffix not in (".npz", ".pth", ".bin", ".pt", ".safetensors"):
        return None  # a format vitbench does not know by its first bytes
    text = head.lstrip().lower()
    what = "an HTML page" if text.startswith(b"<") else f"bytes {head[:8]!r}"  # <!doctype, <html, <head
    return f"it is {what}, not a {suffix} file"


def _open(url: str, offset: int, label: str):
    request = urllib.request.Request(url, headers={"Range": f"bytes={offset}-"} if offset else {})
    try:
        return urllib.request.urlopen(request, timeout=TIMEOUT_S)
    except urllib.error.HTTPError as e:
        if e.code == 416 and offset:
            return None
        raise UserError(
            f"{label}: cannot download {url} (HTTP {e.code} {e.reason}); offline, fetch it on a connected "
            f"machine and pass the file with --weights FILE"
        ) from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise UserError(
            f"{label}: cannot reach {url} ({one_line(reason, 120)}); offline, fetch it on a connected machine "
            f"and pass the file with --weights FILE"
        ) from None


def _total_size(response, offset: int) -> int | None:
    """The whole file's size: from Content-Range on a resumed (206) answer, else Content-Length."""
    found = re.match(r"bytes \d+-\d+/(\d+)", response.headers.get("Content-Range", ""))
    if response.status == 206 and found:
        return int(found.group(1))
    length = response.headers.get("Content-Length")
    return int(length) + offset if length is not None and length.isdigit() else None


def _stated_md5(values: list[str]) -> str | None:
    """The hex md5 in Google Cloud Storage's `x-goog-hash: crc32c=…, md5=<base64>` header(s)."""
    for value in values:
        for item in value.split(","):
            name, _, encoded = item.strip().partition("=")
            if name == "md5" and encoded:
                return base64.b64decode(encoded).hex()
    return None


def _copy(response, part: Path, offset: int, total: int | None, name: str) -> dict[str, str]:
    """The body into `part` (appended after `offset` bytes): a rich bar on a terminal, log lines
    otherwise. Returns the whole file's md5 and sha256, hashed as the bytes arrive (a resumed
    file's first part is read once for it), so the file is never read again to check it."""
    md5, sha = hashlib.md5(usedforsecurity=False), hashlib.sha256()
    if offset:
        with open(part, "rb") as kept:
            while block := kept.read(CHUNK):
                md5.update(block)
                sha.update(block)
    with open(part, "ab" if offset else "wb") as f:
        # read1: what has arrived, at most CHUNK; read(CHUNK) waits for a whole chunk, so a server that
        # stalled after 1,000 bytes left 0 written and "broke off at 0 bytes" (nothing kept to resume)
        read = getattr(response, "read1", response.read)

        def chunks():
            while chunk := read(CHUNK):
                f.write(chunk)
                md5.update(chunk)
                sha.update(chunk)
                yield len(chunk)

        if sys.stderr.isatty():
            from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

            columns = (BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn())
            with Progress("{task.description}", *columns, transient=True) as bar:
                task = bar.add_task(f"downloading {name}", total=total, completed=offset)
                for size in chunks():
                    bar.advance(task, size)
        else:
            log.info("downloading %s (%s)%s", name, _mb(total), f", resuming at {_mb(offset)}" if offset else "")
            for _ in chunks():
                pass
    return {"md5": md5.hexdigest(), "sha256": sha.hexdigest()}


def _mb(size: int | None) -> str:
    return "size unknown" if size is None else f"{size / 1e6:,.1f} MB"
