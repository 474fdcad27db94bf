"""Where a number came from: environment capture, weights and data fingerprints, the device clock."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

_SOURCE_DIR = Path(__file__).resolve().parent.parent


def canonical_json(obj: object) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def sha256_file(path: Path, cache_dir: Path | None = None) -> str:
    """sha256 of a (possibly multi-GB) weights file, cached by (absolute path, size, mtime)."""
    stat = path.stat()
    cache_file = cache_dir / "sha256.json" if cache_dir else None
    cache: dict[str, str] = {}
    entry = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    if cache_file and cache_file.exists():
        try:
            cache = json.loads(cache_file.read_text())
        except ValueError:
            cache = {}  # a damaged cache is only a cache: recompute
        if entry in cache:
            return cache[entry]
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    value = digest.hexdigest()
    if cache_file:
        cache[entry] = value
        write_atomic(cache_file, json.dumps(cache, indent=0))
    return value


def fingerprint_files(root: Path, files: Iterable[str | Path], content: bool) -> str:
    """A dataset fingerprint from relative names and sizes (plus contents where `content`):
    changes whenever the file set changes, without reading every image of a large dataset.
    Plain strings and os.stat keep it at seconds for ImageNet's 1.28M files (pathlib is ~10x slower)."""
    digest = hashlib.sha256()
    prefix = os.path.join(os.fspath(root), "")
    for f in sorted(str(f) for f in files):
        relative = f[len(prefix) :] if f.startswith(prefix) else os.path.relpath(f, root)
        digest.update(f"{relative}|{os.stat(f).st_size}\n".encode())
        if content:
            digest.update(bytes.fromhex(sha256_file(Path(f))))
    return digest.hexdigest()[:16]


def write_atomic(path: Path, text: str | Callable[[Path], object]) -> None:
    """Readers see the old file or the new one, never half of one (temp file + os.replace).
    `text` is the content, or a function that writes the file it is given (e.g. torch.save)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    if isinstance(text, str):
        tmp.write_text(text)
    else:
        text(tmp)
    os.replace(tmp, path)


def git_sha() -> str:
    """The vitbench code version: its git commit (+ '-dirty' with local edits), if run from a checkout."""
    try:
        sha = subprocess.run(
            ["git", "-C", str(_SOURCE_DIR), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        ).stdout.strip()
        if not sha:
            return "unknown"
        dirty = subprocess.run(
            [
                "git",
                "-C",
                str(_SOURCE_DIR),
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                "vitbench",
                "plugins",
            ],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def environment() -> dict[str, str]:
    import timm

    import vitbench

    return {
        "git_sha": git_sha(),
        "vitbench_version": vitbench.__version__,
        "torch_version": torch.__version__,
        "timm_version": timm.__version__,
        "python_version": platform.python_version(),
        "hostname": socket.gethostname(),
        "command": " ".join(Path(sys.argv[0]).name.split() + sys.argv[1:]),
    }


def resolve_device(name: str) -> torch.device:
    from vitbench.errors import UserError

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"--device {name}: expected auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {name}: no CUDA device is visible to torch")
    return device


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"CPU: {line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
    except OSError:
        pass
    return f"CPU: {platform.processor() or platform.machine()} ({os.cpu_count()} cores)"


class Clock:
    """Accumulates device-seconds across `with clock:` blocks (big_vision's Chrono, in spirit):
    only time spent on device work counts, and CUDA is synchronised at the edges so the time is
    the kernels', not the launches'."""

    def __init__(self, device: torch.device, devices: int = 1, seconds: float = 0.0):
        # `seconds`: what earlier processes of the same run counted (a resumed fine-tune keeps counting)
        self.device, self.devices, self.seconds = device, devices, seconds
        self._start: float | None = None

    def elapsed(self) -> float:
        """Device-seconds so far, including the block in progress (what a checkpoint saves)."""
        running = (time.perf_counter() - self._start) * self.devices if self._start is not None else 0.0
        return self.seconds + running

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def __enter__(self) -> Clock:
        self._sync()
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self._sync()
        assert self._start is not None
        self.seconds += (time.perf_counter() - self._start) * self.devices
        self._start = None


# Dense bf16 tensor-core peaks (FLOP/s, no sparsity) from the vendors' data sheets, matched against
# torch.cuda.get_device_name() in order (more specific names first). A device not listed records
# throughput only: no MFU is better than one against a guessed peak.
PEAK_BF16_FLOPS: list[tuple[str, float]] = [
    ("H200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),  # SXM
    ("GH200", 989e12),
    ("B200", 2250e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
    ("A10G", 70e12),
    ("A10", 125e12),
    ("RTX 4090", 165e12),
    ("RTX 3090", 71e12),
]


def peak_flops(name: str) -> float | None:
    """The device's dense bf16 peak, or None when it is not in the table (a CPU, say)."""
    return next((peak for key, peak in PEAK_BF16_FLOPS if key in name), None)
