"""The one exception type that reaches the user as a one-line message instead of a traceback."""


class UserError(Exception):
    """A mistake in the user's input (a name, a path, a file) that they can fix.

    The CLI prints `error: <message>` and exits non-zero; the message must name the offending
    option or file and say what was expected.
    """

    exit_code = 2

    def __init__(self, message: object = "", *args: object) -> None:
        super().__init__(_raised_in_worker(message), *args)


def _raised_in_worker(message: object) -> object:
    """A UserError a DataLoader worker raised, as torch raises it again in the main process
    (`Caught UserError in DataLoader worker process 0.` and the worker's whole traceback): its own
    one line, the last of that traceback. Before, `--workers 1` printed the 30 lines (issue 89)."""
    if not isinstance(message, str) or not message.startswith("Caught ") or "\nOriginal Traceback" not in message:
        return message
    last = message.rstrip().rsplit("\n", 1)[-1]
    name, said, rest = last.partition(": ")
    return rest if said and name.replace(".", "").replace("_", "").isalnum() else message


def one_line(error: BaseException, limit: int = 200) -> str:
    """A library's error message folded onto one line and cut to `limit` characters, for the
    `(...)` after a UserError's own words."""
    return " ".join(str(error).split())[:limit]


_SYSTEM_REASONS = ("No space left on device", "Disk quota exceeded", "File too large", "Read-only file system",
                   "Permission denied", "Input/output error")  # fmt: skip


def system_reason(error: BaseException) -> str | None:
    """The operating system's reason inside a library's error (DuckDB wraps "No space left on device"
    in JSON after a hundred characters of its own), if it holds one."""
    text = str(error).lower()
    return next((reason for reason in _SYSTEM_REASONS if reason.lower() in text), None)


def io_reason(error: BaseException, limit: int = 120) -> str:
    """system_reason, else the message on one line."""
    return system_reason(error) or one_line(error, limit)


def listed(items, joiner: str = "or") -> str:
    """Items as a sentence names them: `a`, `a or b`, `a, b or c` (`joiner` "and" for `a, b and c`)."""
    names = [str(item) for item in items]
    return f"{', '.join(names[:-1])} {joiner} {names[-1]}" if len(names) > 1 else "".join(names)
