"""The installed vitbench's version (recorded with every result)."""

try:
    from importlib.metadata import version as _version

    __version__ = _version("vitbench")
except Exception:  # running from a source tree that was never installed
    __version__ = "0.1.0+unknown"
