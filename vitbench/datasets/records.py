"""Images kept inside containers — parquet files, Arrow files, tar shards, TFRecord files — read by
index. A split of them holds one int64 row number per image (`Records.rows`), never a Python
object per image, and reads one image's encoded bytes only when it is asked for: a split of
ImageNet-21k's 14M images costs its labels and row numbers (16 bytes an image), not a listing.

A `Container` is one format's files: `read(row)` gives the encoded image at a row of the whole
split, `where(row)` names it ("train-000003.tar:n0142/img_17.jpg") for errors and predictions.
Containers open their files lazily in each process (a DataLoader worker reopens them), so they
pickle cheaply."""

from __future__ import annotations

import contextlib
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vitbench.datasets import store_clients
from vitbench.errors import UserError, one_line
from vitbench.files import downloads
from vitbench.files.atomic import write_atomic
from vitbench.provenance import sha256_text


class Container(ABC):
    """The files of one split in one container format, read by row."""

    files: tuple[str, ...]

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def read(self, row: int) -> bytes:
        """The encoded image (JPEG, PNG, ...) at `row`, as stored."""

    @abstractmethod
    def where(self, row: int) -> str:
        """The file and member (or row) holding `row`, as an error or a prediction names it."""

    @abstractmethod
    def groups(self, rows: np.ndarray) -> np.ndarray:
        """The unit each row is read with (its shard, file or row group), numbered 0.., for `rows`."""

    def __getstate__(self) -> dict[str, Any]:
        # open files and cached blocks stay in the process that opened them
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_open")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


@dataclass(frozen=True)
class Records:
    """Some rows of a container, in split order."""

    container: Container
    rows: np.ndarray  # (N,) int64 rows of the container

    def __len__(self) -> int:
        return len(self.rows)

    def read(self, index: int) -> bytes:
        return self.container.read(int(self.rows[index]))

    def where(self, index: int) -> str:
        return self.container.where(int(self.rows[index]))

    def take(self, indices: np.ndarray) -> Records:
        return Records(self.container, self.rows[indices])

    @property
    def files(self) -> tuple[str, ...]:
        return self.container.files


def open_binary(url: str):
    """A local path's file, or a remote one's (`s3://`, `gs://`, any fsspec protocol) opened for
    ranged reads: only the bytes asked for are fetched."""
    if "://" not in url:
        return open(url, "rb")
    with store_errors(url):
        return remote_fs(url)[0].open(url, "rb")


def store_timeout() -> float:
    """Seconds an object store may take to connect or to answer one request (VITBENCH_STORE_TIMEOUT,
    default 20) before vitbench gives up on it, saying so: a store that stopped answering hung a run."""
    raw = os.environ.get("VITBENCH_STORE_TIMEOUT", "20")
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise UserError(f"VITBENCH_STORE_TIMEOUT={raw!r}: expected a number of seconds above 0")
    return value


def remote_fs(url: str):
    """(fsspec filesystem, path) for a URL; fsspec and the protocol's package are optional extras.
    S3 (s3fs, botocore) gets bounded connect and read timeouts and two attempts a request. An
    asynchronous filesystem runs on vitbench's own loop (store_clients.py)."""
    try:
        import fsspec  # noqa: F401
    except ImportError:
        raise UserError(f"{url}: reading from an object store needs fsspec: pip install 'vitbench[remote]'") from None
    options: dict[str, Any] = {}
    if url.split("://", 1)[0] in ("s3", "s3a"):
        timeout = store_timeout()
        options = {"config_kwargs": {"connect_timeout": timeout, "read_timeout": timeout,
                                     "retries": {"max_attempts": 2, "mode": "standard"}}}  # fmt: skip
    try:
        return store_clients.filesystem(url, options)
    except (ImportError, ValueError) as e:
        raise UserError(f"{url}: {e} (pip install 'vitbench[remote]' installs s3fs and gcsfs)") from None


# the packages an object store's failures come from (s3fs and gcsfs wrap some, not all, as OSError)
_STORE_PACKAGES = {"botocore", "aiobotocore", "aiohttp", "s3fs", "gcsfs", "fsspec", "google", "urllib3", "requests"}


@contextlib.contextmanager
def store_errors(where: str):
    """An object store's failures inside the block as one line naming `where` and the store's reason:
    a missing bucket, refused credentials, an endpoint that is gone or silent were tracebacks."""
    try:
        yield
    except UserError:
        raise
    except Exception as e:
        package = type(e).__module__.split(".")[0]
        if not (isinstance(e, OSError | TimeoutError) or package in _STORE_PACKAGES):
            raise
        raise UserError(f"{where}: the object store {_store_reason(e)}") from None


def _store_reason(error: Exception) -> str:
    name = type(error).__name__
    if isinstance(error, FileNotFoundError):
        return f"has no such bucket or object ({one_line(error, 160)})"
    if isinstance(error, PermissionError):
        return f"refused access: check the credentials (AWS_ACCESS_KEY_ID, AWS_PROFILE, …) ({one_line(error, 160)})"
    if isinstance(error, TimeoutError) or "Timeout" in name:
        return (f"did not answer within {store_timeout():g} s (VITBENCH_STORE_TIMEOUT) at "
                f"{os.environ.get('AWS_ENDPOINT_URL', 'its endpoint')}")  # fmt: skip
    if "Connect" in name or isinstance(error, ConnectionError):
        return f"cannot be reached ({name}: {one_line(error, 160)})"
    return f"failed ({name}: {one_line(error, 160)})"


def is_remote(url: str) -> bool:
    return "://" in url and not url.startswith("file://")


def file_size(url: str) -> int:
    if is_remote(url):
        fs, path = remote_fs(url)
        with store_errors(url):
            return int(fs.size(path))
    return os.stat(url).st_size


class OffsetContainer(Container):
    """Records at known byte offsets of their files (tar members, TFRecord records): one seek and
    one read each, a few files kept open (a shuffled stream touches every file)."""

    KEEP_OPEN = 8

    def __init__(self, files: list[str], which: np.ndarray, offset: np.ndarray, size: np.ndarray):
        self.files = tuple(files)
        self.which, self.offset, self.size = which, offset, size
        self.first = np.searchsorted(which, np.arange(len(files)), side="left")  # each file's first row

    def __len__(self) -> int:
        return len(self.offset)

    def raw(self, row: int) -> bytes:
        k = int(self.which[row])
        url = self.files[k]
        remote = is_remote(url)  # (asked once a row: this is every image's read)
        handle = store_clients.kept_open(url, lambda: open_binary(url)) if remote else self._local(k)
        with store_errors(url) if remote else contextlib.nullcontext():
            handle.seek(int(self.offset[row]))
            data = handle.read(int(self.size[row]))
        if len(data) != int(self.size[row]):
            raise OSError(f"{self.where(row)}: the file ends inside it")
        return data

    def _local(self, k: int):
        """File `k` (a local one), kept open by this container in this process, the KEEP_OPEN last opened."""
        handles: dict[int, Any] = self.__dict__.setdefault("_open_handles", {})
        if k not in handles:
            if len(handles) >= self.KEEP_OPEN:
                handles.pop(next(iter(handles))).close()
            handles[k] = open_binary(self.files[k])
        return handles[k]

    def read(self, row: int) -> bytes:
        return self.raw(row)

    def groups(self, rows: np.ndarray) -> np.ndarray:
        return np.asarray(self.which[rows], dtype=np.int64)

    def within(self, row: int) -> int:
        """`row`'s position in its own file."""
        return row - int(self.first[int(self.which[row])])


def concatenated(parts: list[dict[str, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(file of each row, offsets, sizes, labels) of per-file indexes, in file order."""
    which = np.concatenate([np.full(len(p["offset"]), i, dtype=np.int32) for i, p in enumerate(parts)])
    return which, *(np.concatenate([p[k] for p in parts]) for k in ("offset", "size", "label"))  # type: ignore[return-value]


def kept_index(
    kind: str,
    url: str,
    settings: str,
    build: Callable[[], dict[str, np.ndarray]],
    keys: tuple[str, ...] = (),
    fresh: bool = False,
) -> dict[str, np.ndarray]:
    """A file's index (`build()`'s arrays), kept in vitbench's cache under `kind`, keyed by the file's
    path, size and time (an S3 object's ETag) and `settings`: built once, never beside the data,
    rebuilt when the file changes or the kept copy is damaged. `keys`: only those arrays are read
    back (a split needs offsets, sizes and labels; member names only when one is named). `fresh`
    (--verify-data): built from the bytes whatever is kept, since an in-place rewrite can keep the
    path, size and time the kept copy is found by (and kept again)."""
    if is_remote(url):
        fs, path = remote_fs(url)
        with store_errors(url):
            info = fs.info(path)
        stamp = f"{url}|{info.get('size')}|{info.get('ETag') or info.get('etag') or info.get('mtime') or ''}"
    else:
        stat = os.stat(url)
        stamp = f"{os.path.abspath(url)}|{stat.st_size}|{stat.st_mtime_ns}"
    kept = downloads.cache_root() / kind / f"{sha256_text(f'{stamp}|{settings}')[:24]}.npz"
    if kept.is_file() and not fresh:
        try:
            with np.load(kept) as f:
                return {k: f[k] for k in (keys or f.files)}
        except (OSError, ValueError, KeyError):
            pass  # damaged: built again
    with store_errors(url) if is_remote(url) else contextlib.nullcontext():
        index = build()

    def save(tmp: Path) -> None:
        with tmp.open("wb") as f:
            np.savez(f, **index)  # type: ignore[arg-type]

    with contextlib.suppress(UserError):  # a read-only cache: built again next time, nothing is lost
        write_atomic(kept, save)
    return {k: index[k] for k in keys} if keys else index
