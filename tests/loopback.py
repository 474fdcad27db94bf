"""A file server on 127.0.0.1 that the download tests start themselves (no other address is ever
contacted): plain files with Google Cloud Storage's headers (`x-goog-hash: md5=`), Range requests
for resuming, and the Hugging Face Hub's `/<repo>/resolve/<revision>/<file>` answers (the
X-Repo-Commit / X-Linked-Etag headers huggingface_hub reads), for model and dataset repos (a
dataset repo's listings, `/api/datasets/<repo>/revision/main` and `.../tree/<commit>`, are files the
test serves). A file can be served corrupt (other
bytes than its stated checksum) or cut off after some bytes, once, to test a resumed download."""

from __future__ import annotations

import base64
import hashlib
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STALL_S = 3.0  # how long a stalled answer goes quiet
MAX_REQUESTS = 200  # bounded: a client that loops is stopped, and the test fails on the count
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class Files:
    """What the server serves, and what it saw."""

    files: dict[str, bytes] = field(default_factory=dict)
    corrupt: set[str] = field(default_factory=set)  # served with one byte changed, checksums of the true bytes
    cut_after: dict[str, int] = field(default_factory=dict)  # the next GET stops after this many bytes
    stall_after: dict[str, int] = field(default_factory=dict)  # the next GET goes quiet after this many bytes
    hub_repos: set[str] = field(default_factory=set)  # repositories that exist (a missing file: EntryNotFound)
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)  # (method, path, Range)
    headers: dict[str, dict[str, str]] = field(default_factory=dict)  # a path's headers replaced (a hostile Hub)


def _handler(state: Files):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet
            pass

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def do_GET(self) -> None:
            self._answer(body=True)

        def _answer(self, body: bool) -> None:
            state.requests.append((self.command, self.path, self.headers.get("Range")))
            if len(state.requests) > MAX_REQUESTS:
                return self._fail(429, "")
            path, hub = self.path, re.fullmatch(r"/(?:datasets/)?([\w.-]+/[\w.-]+)/resolve/[\w.-]+/(.+)", self.path)
            if hub and hub.group(1) not in state.hub_repos:
                return self._fail(404, "RepoNotFound")
            if path not in state.files:
                return self._fail(404, "EntryNotFound" if hub else "")
            data = state.files[path]
            sent = data[:-1] + bytes([data[-1] ^ 0xFF]) if path in state.corrupt else data
            start = 0
            found = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")
            if found and int(found.group(1)) < len(data):
                start = int(found.group(1))
            self.send_response(206 if start else 200)
            self.send_header("Content-Length", str(len(data) - start))
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.send_header("Accept-Ranges", "bytes")
            md5 = base64.b64encode(hashlib.md5(data).digest()).decode()
            self.send_header("x-goog-hash", f"crc32c=AAAAAA==,md5={md5}")
            if hub:
                sha = hashlib.sha256(data).hexdigest()
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("X-Linked-Etag", f'"{sha}"')
                self.send_header("ETag", f'"{sha}"')
                self.send_header("X-Linked-Size", str(len(data)))
            for name, value in state.headers.get(path, {}).items():
                self.send_header(name, value)
            self.end_headers()
            if not body:
                return
            stop = len(data)
            if self.command == "GET" and path in state.cut_after:
                stop = start + state.cut_after.pop(path)
                self.close_connection = True
            if self.command == "GET" and path in state.stall_after:
                quiet_from = start + state.stall_after.pop(path)
                self.wfile.write(sent[start:quiet_from])
                self.wfile.flush()
                time.sleep(STALL_S)  # longer than the client's read timeout in the test
                self.close_connection = True
                return
            self.wfile.write(sent[start:stop])
            self.wfile.flush()

        def _fail(self, code: int, error_code: str) -> None:
            self.send_response(code)
            if error_code:
                self.send_header("X-Error-Code", error_code)
            self.send_header("Content-Length", "0")
            self.end_headers()

    return Handler


class Server:
    def __init__(self) -> None:
        self.state = Files()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self.state))
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> Server:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
