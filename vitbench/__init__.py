"""vitbench: the transfer protocols of "An Image is Worth 16x16 Words" (ViT) for any backbone.

The Python API is `vitbench.run(...)` and `vitbench.results(...)` (vitbench/api.py), loaded on
first use so that `import vitbench` stays light.
"""

import os

# Never touch the network: timm and huggingface_hub read this when they are imported, so it must be
# set before either is. Weights come from explicit files or an already-populated local cache only.
os.environ["HF_HUB_OFFLINE"] = "1"

from vitbench.version import __version__  # noqa: E402

__all__ = ["__version__", "plan", "results", "run"]


def __getattr__(name: str):
    if name in ("run", "results", "plan"):
        from vitbench import api

        return getattr(api, name)
    raise AttributeError(f"module 'vitbench' has no attribute {name!r}")
