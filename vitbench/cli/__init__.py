"""The `vitbench` command: one module per command group, each parsing its options and calling the
Python API (vitbench/api.py) or a view. No protocol logic lives here.

May import: everything below it (the API, the views, execution and down); nothing imports it but
`__main__.py`."""

from __future__ import annotations

import errno
import logging
import os
import signal
import sys

import typer

import vitbench
from vitbench.cli import backbones, bench, compare, dedup, info, jobs, report, run, tables  # noqa: F401  (each registers its commands)
from vitbench.cli.app import app, err, mark_process_start, out
from vitbench.datasets import native_stderr
from vitbench.engine import loader_workers
from vitbench.errors import UserError
from vitbench.execution.machine_load import Stopwatch
from vitbench.host import cpu_waiting
from vitbench.host.logs import configure_logging

__all__ = ["app", "entry", "err", "main", "out"]

# `vitbench --help` lists the commands in the order a person reaches for them (typer keeps the order
# of registration, which is the order of the imports above)
ORDER = (
    "run",
    "submit",
    "table",
    "report",
    "compare",
    "plot",
    "export",
    "ingest",
    "jobs",
    "bench",
    "dedup",
    "inspect",
    "ls",
    "doctor",
)


def _place(command) -> int:
    name = command.name or command.callback.__name__  # `@app.command()` names it after its function
    return ORDER.index(name) if name in ORDER else len(ORDER)


app.registered_commands.sort(key=_place)


def entry() -> None:
    """The `vitbench` command (and `python -m vitbench`): the process is the command's own, so it is
    tuned for it here, before torch loads, and never by `import vitbench` in someone else's process:
    how long torch's OpenMP threads spin before they sleep (vitbench/host/cpu_waiting.py), and TensorFlow's
    start-up chatter where `--data-source tfds` loads it (unless the user set its level)."""
    cpu_waiting.choose()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    native_stderr.claim()
    # its lines once, through its own handler: a library that gives the root logger a handler
    # (TensorFlow Datasets' absl) printed each progress line again as `INFO:vitbench:…` (issue 89)
    logging.getLogger("vitbench").propagate = False
    sys.meta_path.insert(0, loader_workers.HeldImports())  # DuckDB's initialisation runs whole
    signals_interrupt()
    try:
        main()
    except KeyboardInterrupt:  # a signal while main's own exit was on its way out: still its one line
        err.print("interrupted")
        sys.exit(loader_workers.interrupted_code())
    finally:
        late_signals_ignored()


def late_signals_ignored() -> None:
    """Once the command has said how it ended, a SIGTERM, SIGHUP or Ctrl-C changes nothing of it:
    ignored. Python puts the default action back for handlers of its own as the interpreter shuts
    down, so a SIGTERM 50-100 ms after `wrote …` killed the finished command (exit 143, no line)."""
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(number) is loader_workers.interrupt:
            signal.signal(number, signal.SIG_IGN)


def signals_interrupt() -> None:
    """SIGTERM (what a scheduler, `timeout` or `kill` sends) and SIGHUP (a closed terminal) end the
    command as Ctrl-C does: the same "interrupted" line, leases released, temp files removed, the
    store consistent and DataLoader workers reaped, by the same code path. Before, SIGTERM killed
    `vitbench run` in 0.2 s with its leases, the store's WAL and a zombie worker left behind. Set in
    the command's own entry: a program that imports vitbench keeps its own handlers. Ctrl-C's own
    SIGINT gets the same handler: it holds a signal while a DataLoader starts its workers
    (engine/loader_workers.py `started`), where torch's iterator is half-built. A signal the command
    was started ignoring stays ignored: `nohup vitbench run …` outlives its terminal."""
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(number) is not signal.SIG_IGN:
            signal.signal(number, loader_workers.interrupt)


def main() -> None:
    """The command line's work on `sys.argv`, in this process as it is (tests call it in-process)."""
    # a dry run's start-up: this process's imports included
    mark_process_start(Stopwatch(vitbench.STARTED, vitbench.STARTED_CPU))
    loader_workers.forget_interruption()  # an earlier command's signal (tests call main in one process)
    configure_logging()
    try:
        code = app(standalone_mode=False)
    except UserError as e:
        err.print(f"error: {e}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(e.exit_code)
    except typer.TyperException as e:  # click's usage errors (typer vendors click: no direct import)
        message = e.format_message() if hasattr(e, "format_message") else str(e)
        context = getattr(e, "ctx", None)  # an unknown option that `vitbench submit` takes: say so
        message = run.moved_to_submit(getattr(context, "info_name", None), getattr(e, "option_name", None)) or message
        err.print(f"error: {message} (see -h)", markup=False, highlight=False, soft_wrap=True)
        sys.exit(getattr(e, "exit_code", 2))
    except OSError as e:
        if e.errno not in (errno.ENAMETOOLONG,):
            raise
        # a path the file system cannot hold (a name over 255 bytes, a path over 4,096) is the user's
        # option, not a fault: one line naming it, as for every other bad path
        name = str(e.filename or "")
        shown = name if len(name) <= 120 else f"{name[:60]}…{name[-40:]} ({len(name.encode())} bytes)"
        reason = (e.strerror or "File name too long").lower()
        err.print(f"error: {shown}: {reason} for this file system", markup=False, soft_wrap=True)
        sys.exit(2)
    except (KeyboardInterrupt, typer.Abort):
        err.print("interrupted")
        sys.exit(loader_workers.interrupted_code())
    except Exception as e:  # a signal inside a DuckDB query or a native import: their own ways of saying it
        if not (_duckdb_interrupted(e) or _interrupted_inside(e)):
            raise
        err.print("interrupted")
        sys.exit(loader_workers.interrupted_code())
    if code == INTERRUPTED:  # typer turns a KeyboardInterrupt into exit code 130 and says nothing
        err.print("interrupted")
        code = loader_workers.interrupted_code()
    sys.exit(code if isinstance(code, int) else 0)


def _interrupted_inside(e: BaseException) -> bool:
    """Whether `e` wraps a KeyboardInterrupt: a signal during a native extension's import turns into
    its error (duckdb's `ImportError: Encountered an error while initializing the extension`, caused
    by the KeyboardInterrupt: `report` killed by SIGHUP 1 s after its start printed that traceback)."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


INTERRUPTED = 130  # 128 + SIGINT: typer's code for a KeyboardInterrupt, whichever signal raised it


def _duckdb_interrupted(e: Exception) -> bool:
    """Whether `e` is DuckDB's answer to Ctrl-C, SIGTERM or SIGHUP mid-query (`InterruptException`, or
    a RuntimeError "Query interrupted"): `plot` read the store when SIGTERM came and printed a traceback."""
    if type(e).__name__ == "InterruptException":
        return True
    return isinstance(e, RuntimeError) and str(e).strip().lower().startswith("query interrupted")
