"""vitbench: the transfer protocols of "An Image is Worth 16x16 Words" (ViT) for any backbone.

The Python API (vitbench/api.py), loaded on first use so that `import vitbench` stays light:

- `vitbench.run(model=..., datasets=..., ...)`: what `vitbench run` does, with its options as
  keyword arguments; returns a `Summary` (planned specs, runs done now, runs already stored).
- `vitbench.plan(...)`: the planned groups of runs, nothing run.
- `vitbench.request(...)`: the typed `Request` those options make (checked, with its suite's
  defaults), to read or to pass to `run(req)` / `plan(req)`.
- `vitbench.results("results", where=[...])`: every stored run with its provenance, as a pandas
  DataFrame: a row per run, a column per metric and per stored setting (`long=True`: a row per
  run x metric).
- `vitbench.UserError`: what every call raises for a mistake in its input (a name, a path, a
  file), its message one line naming it, as the CLI prints it; anything else is vitbench's bug.
"""

import time as _time

# when this process began, near enough (the first vitbench import): a dry run counts its start-up from here
STARTED = _time.perf_counter()
STARTED_CPU = _time.process_time()  # and this process's CPU time then (execution/machine_load.Stopwatch)

# A library changes nothing of its host: importing vitbench sets no environment variable, installs
# no import hook and replaces nothing of torch's. Reaching the network is a property of vitbench's
# own calls (local files only, unless `--download`); tuning the process (the OpenMP spin count) is
# the `vitbench` command's, in its own entry (vitbench/cli/__init__.py: entry).
from vitbench.errors import UserError  # noqa: E402  (a light module: an exception class)
from vitbench.version import __version__  # noqa: E402

API = ("plan", "request", "results", "run", "Summary")
__all__ = ["__version__", "UserError", *API]


def __getattr__(name: str):
    if name in API:
        from vitbench import api

        return getattr(api, name)
    raise AttributeError(f"module 'vitbench' has no attribute {name!r}")


def __dir__() -> list[str]:
    """What tab completion offers: the API (loaded lazily, so not yet among the module's globals)."""
    return sorted(__all__)
