"""A warm launcher for the `vitbench` processes the tests start: an interpreter that has imported torch
and timm once forks a child per command, as multiprocessing's forkserver does (issue 105).

Every cold `vitbench` process pays Python's start and `import torch, timm` (timm brings torchvision and
torch._dynamo): 5.5 s of a core on this 2-core machine, over a hundred times a CI run. Here the
server pays it once per test worker, and each command is a fork of it: a real child process with its
own pid, argv, environment, working directory, umask, process group (or session), stdin, stdout and
stderr (the caller's own file descriptors, passed over a Unix socket), exit status and signals. It runs
the same code a cold process runs (`runpy` of `vitbench/__main__.py`, or of the console script, as
`python -m vitbench` and `vitbench` do) and ends the way an interpreter ends (atexit, threads, flushes).

`run()` and `Popen()` take the same arguments as `subprocess.run` and `subprocess.Popen`. A command
that is not `vitbench` (`[sys.executable, "-m", "vitbench", ...]` or the `vitbench` script), or asks for
what the launcher cannot give (`preexec_fn`, `pass_fds`, ...) runs cold, as `subprocess` would: nothing
is refused, nothing is pretended. A command whose environment the imports read differently (CUDA,
OpenMP, locale, Python's own variables: IMPORT_TIME) is served by a server started with it, up to
Launcher.MOST servers a worker; past them it runs cold too. VITBENCH_TEST_COLD=1 runs every
command cold (to compare the two).

What a child shares with its server and a cold process does not: the modules already imported (so
`sys.modules` holds torch where a cold `vitbench table` never loads it: the tests of imports and
start-up stay cold), Python's hash seed for str, and its parent (the server, not the test). Python's
`random` is reseeded at fork by CPython itself, numpy's global generator here; torch's default
generator is untouched in the server, as in a fresh one. tests/test_warm_launcher.py proves a child
equals a cold process on a sample: exit codes, output and stored results, SIGKILL and SIGTERM included.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import locale
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

SCRIPT = Path(sys.executable).with_name("vitbench")  # the console script pip installed beside python
MODULE_COMMAND = [sys.executable, "-m", "vitbench"]
# what the pre-imported modules (Python itself, torch, its OpenMP and BLAS, timm, huggingface_hub, W&B)
# read from the environment as they load: a command asking for other values of these runs cold
IMPORT_TIME = ("PYTHON", "LD_", "OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "MALLOC_", "TORCH", "PYTORCH",
               "CUDA", "NVIDIA", "CUBLAS", "NCCL", "HF_", "HUGGINGFACE", "TIMM", "WANDB", "XDG_", "LANG", "LC_",
               "TMPDIR", "HOME", "TF_", "TRITON", "DNNL_", "ONEDNN_", "NPY_", "NUMPY_")  # fmt: skip
# PYTHONPATH is read at start too, but only into sys.path: the child sets its own (the imported modules
# came from the server's, as they would from the caller's)
PER_CHILD = ("PYTHONPATH",)
# the keyword arguments of subprocess.Popen the launcher gives a child; any other runs cold
SUPPORTED = {"stdin", "stdout", "stderr", "cwd", "env", "text", "universal_newlines", "encoding", "errors",
             "start_new_session"}  # fmt: skip
# ... and those left at subprocess.Popen's defaults, which change nothing
DEFAULTS = {"preexec_fn": None, "pass_fds": (), "close_fds": True, "bufsize": -1, "shell": False, "executable": None,
            "restore_signals": True, "user": None, "group": None, "extra_groups": None, "umask": -1,
            "process_group": None, "timeout": None}  # fmt: skip
_HEADER = struct.Struct("!Q")


def import_time_environment(env) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME) and k not in PER_CHILD}


def is_vitbench(args) -> bool:
    """Whether `args` starts the `vitbench` command: `python -m vitbench` or the console script."""
    args = [str(a) for a in args] if isinstance(args, (list, tuple)) else None
    if not args:
        return False
    if args[:3] == MODULE_COMMAND:
        return True
    return args[0] == str(SCRIPT) or (args[0] == "vitbench" and Path(_which("vitbench") or "") == SCRIPT)


def _which(name: str) -> str | None:
    import shutil

    return shutil.which(name)


# --- the client: what a test calls --------------------------------------------------------------------


class Server:
    """One warm interpreter, started with one import-time environment; it ends when this process does."""

    def __init__(self, env: dict[str, str]) -> None:
        folder = tempfile.mkdtemp(prefix="vitbench-warm-")
        self.socket_path = os.path.join(folder, "socket")
        self.environment = import_time_environment(env)
        lifeline_read, self._lifeline = os.pipe()  # the server ends when this process does
        os.set_inheritable(lifeline_read, True)
        self.process = subprocess.Popen(
            [sys.executable, __file__, self.socket_path, str(lifeline_read)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, env=env, cwd=folder, pass_fds=(lifeline_read,),
        )  # fmt: skip
        os.close(lifeline_read)
        ready = self.process.stdout.readline()
        if ready.strip() != b"ready":
            raise RuntimeError(f"the warm launcher did not start: {ready!r}")

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        os.close(self._lifeline)
        self.process.wait(timeout=30)


class Launcher:
    """The servers of this process (a test worker), one per import-time environment its commands ask
    for, started on first use: a test that leaves such a variable changed (TensorFlow's log level, a
    tracker's variables) gets a server of its own, up to MOST; past them a command runs cold."""

    MOST = 3

    def __init__(self) -> None:
        self._servers: dict[tuple, Server] = {}
        self._lock = threading.Lock()
        self.forked = 0  # children started

    def serves(self, args, env, kwargs) -> bool:
        asked = {k for k, v in kwargs.items() if k not in SUPPORTED and not (k in DEFAULTS and v == DEFAULTS[k])}
        if os.environ.get("VITBENCH_TEST_COLD") == "1" or asked or not is_vitbench(args):
            return False
        env = os.environ if env is None else env
        # libgomp's spin is chosen as a cold command starts (host/cpu_waiting.py) unless the user set it
        if not any(name in env for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")):
            return False
        return self.server(env) is not None

    def server(self, env) -> Server | None:
        """The server for `env`'s import-time environment, started where there is none yet."""
        key = tuple(sorted(import_time_environment(env).items()))
        with self._lock:
            server = self._servers.get(key)
            if server is not None and server.alive():
                return server
            if server is None and len(self._servers) >= self.MOST:
                return None
            self._servers[key] = server = Server(dict(env))
            return server

    def popen(self, args, **kwargs) -> WarmProcess:
        self.forked += 1
        server = self.server(os.environ if kwargs.get("env") is None else kwargs["env"])
        return WarmProcess(server, [str(a) for a in args], **kwargs)

    def stop(self) -> None:
        with self._lock:
            for server in self._servers.values():
                server.stop()
            self._servers.clear()


LAUNCHER = Launcher()


def Popen(args, **kwargs):  # noqa: N802 (subprocess's name)
    """subprocess.Popen, warm where the launcher serves the command."""
    if LAUNCHER.serves(args, kwargs.get("env"), kwargs):
        return LAUNCHER.popen(args, **{k: v for k, v in kwargs.items() if k in SUPPORTED})
    return subprocess.Popen(args, **kwargs)


def run(args, *, input=None, capture_output=False, timeout=None, check=False, **kwargs):
    """subprocess.run, warm where the launcher serves the command (the same outcome either way)."""
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    if input is not None:
        kwargs["stdin"] = subprocess.PIPE
    if not LAUNCHER.serves(args, kwargs.get("env"), kwargs):
        return subprocess.run(args, input=input, timeout=timeout, check=check, **kwargs)
    kwargs = {k: v for k, v in kwargs.items() if k in SUPPORTED}  # the rest are Popen's defaults
    with LAUNCHER.popen(args, **kwargs) as process:
        try:
            out, err = process.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired as expired:
            process.kill()
            expired.output, expired.stderr = process.communicate()
            raise
        except BaseException:
            process.kill()
            raise
    code = process.returncode
    if check and code:
        raise subprocess.CalledProcessError(code, process.args, output=out, stderr=err)
    return subprocess.CompletedProcess(process.args, code, out, err)


class WarmProcess:
    """A forked `vitbench` child, driven as a subprocess.Popen is: pid, poll, wait, communicate,
    send_signal, terminate, kill, returncode, and stdin/stdout/stderr pipes where asked."""

    def __init__(self, server: Server, args: list[str], *, stdin=None, stdout=None, stderr=None, cwd=None,
                 env=None, text=None, universal_newlines=None, encoding=None, errors=None,
                 start_new_session=False) -> None:  # fmt: skip
        self.args = args
        self.returncode: int | None = None
        self.text_mode = bool(text or universal_newlines or encoding or errors)
        self._encoding = encoding or locale.getpreferredencoding(False)
        self._errors = errors or "strict"
        self.stdin = self.stdout = self.stderr = None
        self._readers: dict[str, threading.Thread] = {}
        self._read: dict[str, list[bytes]] = {}
        ours: list[int] = []  # the ends the child gets, closed here once sent
        child_in = self._end(stdin, 0, "stdin", ours)
        child_out = self._end(stdout, 1, "stdout", ours)
        child_err = child_out if stderr == subprocess.STDOUT else self._end(stderr, 2, "stderr", ours)
        request = {
            "argv": args,
            "env": dict(os.environ if env is None else env),
            "cwd": os.path.abspath(os.fspath(cwd)) if cwd is not None else os.getcwd(),
            "umask": _umask(),
            "new_session": bool(start_new_session),
            "pgid": os.getpgrp(),
            "ignored": [int(s) for s in _ignored_signals()],
        }
        self._connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._connection.connect(server.socket_path)
            body = json.dumps(request).encode()
            socket.send_fds(self._connection, [_HEADER.pack(len(body)) + body], [child_in, child_out, child_err])
            self.pid = _HEADER.unpack(_receive(self._connection, _HEADER.size))[0]
        finally:
            for fd in ours:
                os.close(fd)

    def _end(self, how, standard: int, name: str, ours: list[int]) -> int:
        """The file descriptor the child gets for `name`, opening the pipe's other end here where asked."""
        if how is None:
            return standard
        if how == subprocess.DEVNULL:
            fd = os.open(os.devnull, os.O_RDWR)
            ours.append(fd)
            return fd
        if how == subprocess.PIPE:
            read, write = os.pipe()
            if name == "stdin":
                ours.append(read)
                raw = open(write, "wb")  # noqa: SIM115 (the pipe stays open for the caller, as Popen's)
                text = self.text_mode
                self.stdin = io.TextIOWrapper(raw, self._encoding, self._errors, write_through=True) if text else raw
                return read
            ours.append(write)
            raw = open(read, "rb")  # noqa: SIM115 (the pipe stays open for the caller, as Popen's)
            setattr(self, name, io.TextIOWrapper(raw, self._encoding, self._errors) if self.text_mode else raw)
            return write
        return how if isinstance(how, int) else how.fileno()

    # -- as subprocess.Popen --

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                ready = self._connection.recv(_HEADER.size, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            except BlockingIOError:
                return None
            if len(ready) == _HEADER.size or not ready:
                self._status()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self._connection.settimeout(timeout)
            try:
                self._status()
            except TimeoutError:
                raise subprocess.TimeoutExpired(self.args, timeout) from None
            finally:
                if self.returncode is None:
                    self._connection.settimeout(None)
        return self.returncode

    def _status(self) -> None:
        """The child's wait status, which the server sends once it has reaped it."""
        try:
            status = _HEADER.unpack(_receive(self._connection, _HEADER.size))[0]
        except ConnectionError:
            raise RuntimeError(f"the warm launcher ended before its child {self.pid} did") from None
        self.returncode = os.waitstatus_to_exitcode(status)
        self._connection.close()

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, input=None, timeout: float | None = None):
        """As Popen.communicate: feed `input`, read stdout and stderr to their ends, wait. Each pipe is
        read by a thread of its own (so a child filling one while the other waits never blocks); a
        timeout leaves them reading, for the next call."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if self.stdin is not None and "stdin" not in self._readers:
            self._readers["stdin"] = _thread(self._feed, input)
        for name in ("stdout", "stderr"):
            stream = getattr(self, name)
            if stream is not None and name not in self._readers:
                self._read[name] = []
                self._readers[name] = _thread(_drain, stream, self._read[name])
        for thread in self._readers.values():
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        out, err = (self._output(name) for name in ("stdout", "stderr"))
        return out, err

    def _feed(self, data) -> None:
        try:
            if data:
                self.stdin.write(data)
            self.stdin.close()
        except BrokenPipeError:
            pass

    def _output(self, name: str):
        if getattr(self, name) is None:
            return None
        getattr(self, name).close()
        # text mode reads through the TextIOWrapper (universal newlines, as Popen's text mode), so what
        # a test read of it line by line before is not read twice nor lost
        return ("" if self.text_mode else b"").join(self._read[name])

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        for stream in (self.stdout, self.stderr, self.stdin):
            if stream is not None and not stream.closed:
                with contextlib.suppress(BrokenPipeError):
                    stream.close()
        self.wait()


def _thread(target, *args) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, daemon=True)
    thread.start()
    return thread


def _drain(stream, into: list) -> None:
    into.append(stream.read())


def _receive(connection: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the warm launcher closed the connection")
        data += chunk
    return data


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _ignored_signals():
    """The signals this process ignores: a cold child inherits them (Popen restores SIGPIPE and SIGXFSZ,
    which Python itself ignores)."""
    for number in signal.valid_signals():
        if number in (signal.SIGKILL, signal.SIGSTOP, signal.SIGPIPE, signal.SIGXFSZ):
            continue
        try:
            if signal.getsignal(number) == signal.SIG_IGN:
                yield number
        except (OSError, ValueError):
            continue


# --- the server: this file run as a script ------------------------------------------------------------


def serve(socket_path: str, lifeline: int) -> dict | None:
    """Accept commands until the lifeline closes; returns only in a forked child, with its request."""
    import timm  # noqa: F401 (what every vitbench process that builds a model imports: torch, torchvision)
    import torch  # noqa: F401

    assert threading.active_count() == 1, "forking a process with threads"
    # what the imports made is live for the process's life: frozen out of the collector's reach, a
    # child's collections no longer walk (and copy, page by page) the server's heap (gc.freeze's use)
    gc.freeze()
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_write)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(64)
    children: dict[int, socket.socket] = {}
    with os.fdopen(1, "wb", closefd=False) as out:
        out.write(b"ready\n")
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(wake_read, selectors.EVENT_READ)
    selector.register(lifeline, selectors.EVENT_READ)
    while True:
        for key, _ in selector.select():
            if key.fileobj == lifeline:
                sys.exit(0)  # the test worker ended: children still running go on, as cold ones would
            if key.fileobj == wake_read:
                while True:
                    try:
                        os.read(wake_read, 4096)
                    except BlockingIOError:
                        break
                    break
                _reap(children)
                continue
            connection, _ = listener.accept()
            request, fds = _request(connection)
            # as subprocess.Popen returns once its child has exec'd: the pid is sent once the child
            # has taken its session, group, descriptors and working directory
            set_up, set_up_write = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(set_up)
                selector.close()
                for fd in (wake_read, wake_write, lifeline):
                    os.close(fd)
                for other in children.values():
                    other.close()
                listener.close()
                connection.close()
                _become_the_command(request, fds)
                os.write(set_up_write, b"1")
                os.close(set_up_write)
                return request
            os.close(set_up_write)
            os.read(set_up, 1)  # b"" where the child failed before: its exit status says so
            os.close(set_up)
            for fd in set(fds):
                os.close(fd)
            connection.sendall(_HEADER.pack(pid))
            children[pid] = connection
            _reap(children)


def _reap(children: dict[int, socket.socket]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        connection = children.pop(pid, None)
        if connection is not None:
            with contextlib.suppress(OSError):  # the caller went away
                connection.sendall(_HEADER.pack(status))
            connection.close()


def _request(connection: socket.socket) -> tuple[dict, list[int]]:
    first, fds, _, _ = socket.recv_fds(connection, 1 << 16, 3)
    size = _HEADER.unpack(first[: _HEADER.size])[0]
    body = first[_HEADER.size :]
    if len(body) < size:
        body += _receive(connection, size - len(body))
    return json.loads(body), fds


def _become_the_command(request: dict, fds: list[int]) -> None:
    """In the forked child: the process state a cold `vitbench` process starts with."""
    signal.set_wakeup_fd(-1)
    for number in signal.valid_signals():  # a fresh interpreter's handlers, and the caller's ignored ones
        if number in (signal.SIGKILL, signal.SIGSTOP):
            continue
        fresh = signal.SIG_IGN if number in (signal.SIGPIPE, signal.SIGXFSZ) else signal.SIG_DFL
        if number == signal.SIGINT:
            fresh = signal.default_int_handler
        if number in request["ignored"]:
            fresh = signal.SIG_IGN
        with contextlib.suppress(OSError, ValueError):
            signal.signal(number, fresh)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    if request["new_session"]:
        os.setsid()
    else:
        os.setpgid(0, request["pgid"])  # the caller's process group, as a child of its own would be
    for standard, fd in enumerate(fds):
        os.dup2(fd, standard)
    for fd in set(fds):
        if fd > 2:
            os.close(fd)
    os.umask(request["umask"])
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again
    import numpy

    numpy.random.seed()  # its global generator, seeded afresh as a new process seeds it
    _fresh_standard_streams()
    argv = request["argv"]
    module = argv[:3] == MODULE_COMMAND
    sys.argv = ["-m", *argv[3:]] if module else list(argv)
    # sys.path as that interpreter builds it: the script's folder (or the working directory for -m),
    # then PYTHONPATH, then the rest of the server's (site-packages)
    own = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    server_own = [p for p in _SERVER_PYTHONPATH if p]
    rest = sys.path[1 + len(server_own) :]
    first = os.getcwd() if module else os.path.dirname(os.path.realpath(argv[0]))
    sys.path[:] = [first, *[os.path.abspath(p) for p in own], *rest]


def _fresh_standard_streams() -> None:
    """sys.stdin, stdout and stderr over fds 0-2 as CPython makes them at start (its create_stdio):
    line-buffered where a terminal (stderr always), write-through where unbuffered (-u, PYTHONUNBUFFERED)."""
    encoding = os.environ.get("PYTHONIOENCODING", "").partition(":")[0] or locale.getpreferredencoding(False)
    strict = "surrogateescape" if locale.setlocale(locale.LC_CTYPE) in ("C", "POSIX") else "strict"
    unbuffered = _SERVER_UNBUFFERED
    streams = []
    for fd, mode in ((0, "rb"), (1, "wb"), (2, "wb")):
        buffered = mode == "rb" or not unbuffered
        try:
            raw = open(fd, mode, buffering=-1 if buffered else 0, closefd=False)  # noqa: SIM115 (sys.std*)
        except OSError:
            streams.append(None)  # a closed standard descriptor: None, as CPython leaves it
            continue
        interactive = os.isatty(fd)
        errors = "backslashreplace" if fd == 2 else strict
        stream = io.TextIOWrapper(raw, encoding, errors, newline=None if fd == 0 else "\n",
                                  line_buffering=mode == "wb" and buffered and (interactive or fd == 2),
                                  write_through=not buffered)  # fmt: skip
        stream.mode = "r" if fd == 0 else "w"
        streams.append(stream)
    sys.stdin, sys.stdout, sys.stderr = streams
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = streams


_SERVER_PYTHONPATH = os.environ.get("PYTHONPATH", "").split(os.pathsep)
# CPython makes stdout write-through where unbuffered (-u, PYTHONUNBUFFERED); sys.flags does not say it
_SERVER_UNBUFFERED = bool(getattr(sys.__stdout__, "write_through", False))

if __name__ == "__main__":
    _request_of_this_child = serve(sys.argv[1], int(sys.argv[2]))
    del _request_of_this_child
    import runpy

    if sys.argv[0] == "-m":
        runpy.run_module("vitbench", run_name="__main__", alter_sys=True)
    else:
        runpy.run_path(sys.argv[0], run_name="__main__")
