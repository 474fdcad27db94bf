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
"""

import os as _os
import time as _time

# when this process began, near enough (the first vitbench import): a dry run counts its start-up from here
STARTED = _time.perf_counter()

# Never touch the network: timm and huggingface_hub read this when they are imported, so it must be
# set before either is. Weights come from explicit files or an already-populated local cache only.
_os.environ["HF_HUB_OFFLINE"] = "1"

from vitbench import cpu_waiting as _cpu_waiting  # noqa: E402
from vitbench import deferred_dynamo as _deferred_dynamo  # noqa: E402
from vitbench.version import __version__  # noqa: E402

# timm and torchvision import torch._dynamo (and triton) for code that runs only under torch.compile:
# a second of every process's start, put off until something compiles (vitbench/deferred_dynamo.py)
_deferred_dynamo.install()
# torch's OpenMP threads spin briefly, not 300,000 iterations, before they sleep: beside other work a
# spinning thread held the cores others needed (vitbench/cpu_waiting.py; before torch is imported)
_cpu_waiting.choose()

API = ("plan", "request", "results", "run", "Summary")
__all__ = ["__version__", *API]


def __getattr__(name: str):
    if name in API:
        from vitbench import api

        return getattr(api, name)
    raise AttributeError(f"module 'vitbench' has no attribute {name!r}")


def __dir__() -> list[str]:
    """What tab completion offers: the API (loaded lazily, so not yet among the module's globals)."""
    return sorted(__all__)
