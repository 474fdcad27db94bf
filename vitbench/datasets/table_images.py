"""Images in a column of parquet files or Arrow files, read by row: what `hf:` datasets (Hub parquet
folders, `save_to_disk` folders) hold. A parquet file is read a row group at a time (a large one a
few rows at a time), an Arrow file memory-mapped; a cell is a {bytes, path} struct or binary data,
and a cell that names an image file by its absolute path instead is read from that file (its path
is then part of the split's fingerprint: `image_paths`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from vitbench.datasets import store_clients
from vitbench.datasets.records import Container, is_remote, open_binary, store_errors
from vitbench.errors import UserError, one_line


def pyarrow_module():
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise UserError("hf: datasets need pyarrow: pip install 'vitbench[hf]'") from None
    return pyarrow


def image_bytes(value: Any, where: Callable[[], str]) -> bytes:
    """The encoded image of one cell: a {bytes, path} struct's bytes (or, as the datasets library
    reads a local dataset that refers to its files, the file at its absolute path), or the binary value."""
    data = value.get("bytes") if isinstance(value, dict) else value
    if not data and isinstance(value, dict) and value.get("path") and Path(value["path"]).is_absolute():
        try:
            return Path(value["path"]).read_bytes()
        except OSError as e:
            raise OSError(f"{where()}: its image file {value['path']}: {e.strerror or e}") from None
    if not data:
        raise UserError(f"{where()}: the row has no image bytes")
    return bytes(data)


# a parquet row group up to this (uncompressed, from its footer) is read whole and kept while its rows
# are read; a larger one a few rows at a time, so memory follows the rows read, not the row group
# (one 480 MB row group peaked at 2.9 GB). The datasets library writes row groups of ~100 images.
WHOLE_GROUP_BYTES = 64 << 20
STREAMED_ROWS = 16  # the rows a large row group is read by (restarted for a row behind the last read)


class TableImages(Container):
    """Images in a column of parquet files (read a row group at a time, or a few rows at a time from
    a large one) or Arrow files (memory-mapped)."""

    def __init__(self, files: list[str], column: str, blocks: list[tuple[int, int, int]], total: int, arrow: bool):
        """`blocks`: (file, row group, first row) of each row group (an Arrow file is one block)."""
        self.files = tuple(files)
        self.column = column
        self.arrow = arrow
        self.blocks = blocks
        self.starts = np.asarray([b[2] for b in blocks], dtype=np.int64)
        self.total = total

    def __len__(self) -> int:
        return self.total

    def _block(self, k: int):
        cached = getattr(self, "_open_block", None)
        if cached is not None and cached[0] == k:
            return cached[1]
        pa = pyarrow_module()
        file, group, _ = self.blocks[k]
        if self.arrow:
            tables = getattr(self, "_open_tables", None) or {}
            if file not in tables:  # memory-mapped: the pages are read as rows are
                tables[file] = pa.ipc.open_stream(pa.memory_map(self.files[file])).read_all()
                self._open_tables = tables
            column = tables[file].column(self.column)
        else:
            # one row group, one array: its `bytes` child read directly (a struct scalar's as_py() built
            # a dict per image, and parquet then decoded 5 % slower than the same JPEGs as files)
            column = self._parquet(file).read_row_group(group, columns=[self.column]).column(0).combine_chunks()
            if pa.types.is_struct(column.type) and column.null_count == 0 and column.field("bytes").null_count == 0:
                column = column.field("bytes")
        self._open_block = (k, column)
        return column

    def _parquet(self, file: int, streamed: bool = False):
        """The file opened once a process (its footer parsed once), a few kept open. `streamed`: for
        reading a large row group a few rows at a time, its column chunks through a 1 MiB buffer and
        not fetched whole first (pyarrow's pre-buffering held the whole chunk: 3x the rows read)."""
        options = {"pre_buffer": False, "buffer_size": 1 << 20} if streamed else {}
        url = self.files[file]

        def parquet_file():
            return pyarrow_module().parquet.ParquetFile(open_binary(url), **options)

        if is_remote(url):  # kept by vitbench's store clients: closed with them when a library call returns
            return store_clients.kept_open((url, streamed), parquet_file)
        opened: dict[tuple[int, bool], Any] = self.__dict__.setdefault("_open_files", {})
        if (file, streamed) not in opened:
            if len(opened) >= 8:
                opened.pop(next(iter(opened))).close()
            opened[file, streamed] = parquet_file()
        return opened[file, streamed]

    def _large(self, k: int) -> bool:
        if self.arrow:
            return False
        file, group, _ = self.blocks[k]
        return self._parquet(file).metadata.row_group(group).total_byte_size > WHOLE_GROUP_BYTES

    def _streamed(self, k: int, offset: int):
        """Row `offset` of large row group `k`: from the rows read last, read on to it, or read again
        from the group's start for a row behind them."""
        state = getattr(self, "_open_stream", None)
        if state is None or state[0] != k or offset < state[2]:
            file, group, _ = self.blocks[k]
            batches = self._parquet(file, streamed=True).iter_batches(
                batch_size=STREAMED_ROWS, row_groups=[group], columns=[self.column], use_threads=False
            )
            state = [k, batches, 0, next(batches).column(0)]
        while offset >= state[2] + len(state[3]):
            state[2] += len(state[3])
            state[3] = next(state[1]).column(0)
        self._open_stream = state
        return state[3][offset - state[2]]

    def groups(self, rows: np.ndarray) -> np.ndarray:
        """A parquet row group (read whole), or an Arrow file."""
        return np.searchsorted(self.starts, rows, side="right").astype(np.int64) - 1

    def _locate(self, row: int) -> tuple[int, int]:
        k = int(np.searchsorted(self.starts, row, side="right")) - 1
        return k, row - int(self.starts[k])

    def read(self, row: int) -> bytes:
        k, offset = self._locate(row)
        file = self.files[self.blocks[k][0]]
        try:
            with store_errors(file) if is_remote(file) else contextlib.nullcontext():
                value = (self._streamed(k, offset) if self._large(k) else self._block(k)[offset]).as_py()
        except OSError as e:
            raise OSError(f"{self.where(row)}: {one_line(e, 200)}") from None
        return image_bytes(value, lambda: self.where(row))

    def where(self, row: int) -> str:
        k, offset = self._locate(row)
        file, group, _ = self.blocks[k]
        within = offset if self.arrow else int(self.starts[k] - self._file_start(file)) + offset
        return f"{self.files[file]}:row {within}"

    def _file_start(self, file: int) -> int:
        return int(next(b[2] for b in self.blocks if b[0] == file))


def parquet_image_paths(parquet, image: str) -> list[str]:
    """The image files a parquet file's cells name by path instead of holding their bytes: read
    only from row groups whose footer counts null `bytes` (the datasets library's own files hold
    bytes: nothing is read), so a replaced file changes the split's fingerprint."""
    schema = parquet.metadata.schema
    leaf = next((i for i in range(len(schema)) if schema.column(i).path == f"{image}.bytes"), None)
    if leaf is None:  # binary cells: bytes only
        return []
    paths: list[str] = []
    for g in range(parquet.metadata.num_row_groups):
        stats = parquet.metadata.row_group(g).column(leaf).statistics
        if stats is not None and stats.has_null_count and stats.null_count == 0:
            continue
        column = parquet.read_row_group(g, columns=[image]).column(0).combine_chunks()
        paths += image_paths(column)
    return paths


def image_paths(column) -> list[str]:
    """The absolute paths of a {bytes, path} column's cells without bytes (what `image_bytes` reads)."""
    if not pyarrow_module().types.is_struct(column.type) or column.field("bytes").null_count == 0:
        return []
    no_bytes = column.field("bytes").is_null().to_numpy(zero_copy_only=False)
    named = column.field("path").to_pylist()
    return [p for p, empty in zip(named, no_bytes, strict=True) if empty and p and Path(p).is_absolute()]
