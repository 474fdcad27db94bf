"""Watching torchrun for `--devices N`: the ranks' own lines reach the terminal as they come, while
torchrun's report and the ranks' tracebacks go to a log file. A rank that dies (killed, or an
exception) was 130 lines of gloo and `ChildFailedError` tracebacks and no word of vitbench's; now
it is one line naming the rank and how it ended, saying that the stored runs are kept and that the
same command resumes."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from contextlib import suppress
from datetime import UTC, datetime
from pathlib import Path

from vitbench.errors import UserError

# torchrun prefixes a rank's traceback with `[rankN]:`; its agent logs as glog (`E1127 06:53:47 …`)
_RANK_TRACE = re.compile(r"^\[rank\d+\]:")
_AGENT_LOG = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d")
# the root cause torchrun reports: `rank : 1 (local_rank: 1)` then `exitcode : -9 (pid: 123)`
_ROOT = re.compile(r"Root Cause.*?rank\s*:\s*(?P<rank>\d+).*?exitcode\s*:\s*(?P<code>-?\d+)(?: \(pid: (?P<pid>\d+)\))?",
                   re.S)  # fmt: skip
_LAST_ERROR = re.compile(r"^\[rank(?P<rank>\d+)\]: (?P<line>\w[\w.]*(?:Error|Exception|Interrupt)\b.*)$", re.M)


def supervise(command: list[str], env: dict, log_dir: Path, world: int) -> int:
    """Run torchrun's `command`; its exit code, or a UserError naming the rank that died."""
    log_path = log_dir / f"torchrun-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}.log"
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
        log = open(log_path, "wb")  # noqa: SIM115 (closed below, after the process)
    except OSError:  # no log can be written there (a full disk): torchrun speaks for itself, as before
        return subprocess.call(command, env=env)
    with log:
        # bytes, split at "\n" only: the ranks' stderr is a pipe now, so they print log lines, not bars
        process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE)
        assert process.stderr is not None
        in_report = False
        for raw in process.stderr:
            with suppress(OSError):  # a full disk ends the log, never the ranks' lines nor the run
                log.write(raw)
                log.flush()
            line = raw.decode(errors="replace")
            in_report = in_report or line.startswith("Traceback (most recent call last)")  # torchrun's own
            if not (in_report or _RANK_TRACE.match(line) or _AGENT_LOG.match(line)):
                sys.stderr.buffer.write(raw)
                sys.stderr.flush()
        code = process.wait()
    if code == 0:
        log_path.unlink(missing_ok=True)
        return 0
    said = died(log_path.read_text(errors="replace"), world)
    if said is None:  # a rank's own error (a UserError: already printed by it, exit code 2)
        return code
    raise UserError(
        f"{said}; the runs stored before are kept, and the same command resumes (torchrun's log: {log_path})"
    )


def died(log: str, world: int) -> str | None:
    """How the first rank to fail ended, as torchrun's report says (None: a rank's own one-line
    error, which it printed itself)."""
    found = _ROOT.search(log)
    if found is None:
        return None
    rank, code = int(found["rank"]), int(found["code"])
    pid = f" (pid {found['pid']})" if found["pid"] else ""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"rank {rank} of {world}{pid} was killed by {name}, and the other rank(s) stopped with it"
    if code == UserError.exit_code:
        return None
    errors = [m["line"] for m in _LAST_ERROR.finditer(log) if int(m["rank"]) == rank]
    why = f": {errors[-1][:160]}" if errors else ""
    return f"rank {rank} of {world}{pid} failed (exit code {code}){why}"
