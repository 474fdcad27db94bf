"""vitbench: the transfer protocols of "An Image is Worth 16x16 Words" (ViT) for any backbone."""

import os

# Never touch the network: timm and huggingface_hub read this when they are imported, so it must be
# set before either is. Weights come from explicit files or an already-populated local cache only.
os.environ["HF_HUB_OFFLINE"] = "1"

try:
    from importlib.metadata import version as _version

    __version__ = _version("vitbench")
except Exception:  # running from a source tree that was never installed
    __version__ = "0.1.0+unknown"
