"""The accelerator a run uses: which one, its name and bf16 peak, and device-seconds spent on it."""

from __future__ import annotations

import functools
import logging
import os
import platform
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitbench.errors import UserError

log = logging.getLogger("vitbench")

if TYPE_CHECKING:  # torch is imported where a device is used: the commands that only read results never pay for it
    import torch


def resolve_device(name: str) -> torch.device:
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        device = torch.device("meta")  # refused below with the same message
    if device.type not in ("cpu", "cuda"):  # vitbench runs on CPUs and CUDA GPUs (meta holds no data)
        raise UserError(f"--device {name}: expected auto, cpu, cuda or cuda:N")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {name}: no CUDA device is visible to torch")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise UserError(f"--device {name}: torch sees {torch.cuda.device_count()} CUDA device(s)")
    if device.type == "cuda":
        # fp32 means fp32: cuDNN runs fp32 convolutions (ViT's patch embedding, every BiT layer) in
        # TF32 unless told not to, 10 bits of mantissa where the CPU keeps 23 (torch's matmuls are
        # fp32 already). bf16 runs are autocast and never reach these kernels in fp32.
        torch.backends.cudnn.allow_tf32 = False
    return device


PRECISIONS = ("auto", "bf16", "fp32")
# --input-pipeline: where images are decoded and augmented (engine/device_data.py chooses for auto)
# DataLoader workers unless asked: half the cores (the other half feed the model), at most 4
DEFAULT_WORKERS = min(4, (os.cpu_count() or 2) // 2)
# workers: PIL decodes and resizes in DataLoader processes; device: PIL decodes there, the device
# resizes with the same arithmetic (the same pixels); nvjpeg: the GPU decodes too (other pixels, keyed)
PIPELINES = ("auto", "workers", "device", "nvjpeg")


def check_pipeline(pipeline: str, device: torch.device) -> None:
    """nvjpeg is a GPU's decoder: asked for on a CPU, one line says so (not a silent other decoder)."""
    if pipeline == "nvjpeg" and device.type != "cuda":
        raise UserError(f"--input-pipeline nvjpeg: decodes on a CUDA GPU, and this run's device is {device.type}")


def resolve_precision(precision: str, device_type: str) -> str:
    """`auto`: bf16 on a GPU, fp32 on a CPU (which has no fast bf16 path)."""
    if precision not in PRECISIONS:
        raise UserError(f"--precision {precision}: expected auto, bf16 or fp32")
    if precision == "auto":
        return "bf16" if device_type == "cuda" else "fp32"
    return precision


def autocast(device: torch.device, precision: str) -> AbstractContextManager:
    """bf16 autocast for `precision` bf16; nothing for fp32."""
    import torch

    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return nullcontext()


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        import torch

        return torch.cuda.get_device_name(device)
    return cpu_name()


# the environment variables by which a user sets the CPU threads of torch's kernels themselves
USER_THREADS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


@contextmanager
def cpu_threads(count: int | None, device_type: str) -> Iterator[None]:
    """torch's intra-op threads pinned to `count` on a CPU for the block (then as they were): a
    trained result on a CPU changes with the thread count (the demo's 10-shot accuracy: 77.29 % at 2
    threads, 79.13 % at 1), so a suite whose figures are quoted pins it. Nothing on a GPU, and
    nothing where the user set a thread count of their own (OMP_NUM_THREADS, MKL_NUM_THREADS): theirs
    holds (each run records the threads it ran on), and a line says the quoted figures used `count`."""
    if count is None or device_type != "cpu":
        yield
        return
    chosen = [name for name in USER_THREADS if os.environ.get(name, "").strip()]
    if chosen:
        log.info("%s=%s: the runs use it (this suite's quoted figures were made on %d CPU threads)", chosen[0],
                 os.environ[chosen[0]].strip(), count)  # fmt: skip
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def cpu_name() -> str:
    """This machine's CPU as runs on it record it: `CPU: <model name> (<n> cores)`."""
    name = cpu_info().get("model name") or platform.processor() or platform.machine()
    return f"CPU: {name} ({os.cpu_count()} cores)"


# the vector extensions by which torch's CPU kernels (ATen's AVX2/AVX-512 builds), MKL's GEMMs and
# oneDNN's convolutions pick their code: two CPUs that differ in one round a trained model's sums
# another way (so do the vendor, MKL taking other paths on AMD, and the generation, oneDNN choosing
# its blocking by the model)
ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile")


@functools.cache  # one CPU a process: read once, not at every run a sweep records
def cpu_kernels() -> str:
    """What decides a CPU-trained number's last bits, beside the thread count a run records:
    `VENDOR FAMILY/MODEL flag flag …` (of ISA_FLAGS), e.g. `AuthenticAMD 25/17 avx2 avx512f …`;
    "unknown" where /proc/cpuinfo is not there. Runs on a CPU record it (execution/recorder.py)."""
    info = cpu_info()
    if not info:
        return "unknown"
    flags = set(info.get("flags", "").split())
    generation = f"{info.get('cpu family', '?')}/{info.get('model', '?')}"
    return " ".join([info.get("vendor_id", "unknown"), generation, *[f for f in ISA_FLAGS if f in flags]])


def cpu_info() -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo ("model name", "vendor_id", "flags", …); {}
    where there is none (not Linux)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    first = text.split("\n\n", 1)[0]
    return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in first.splitlines()) if _}


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
            import torch

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


@dataclass(frozen=True)
class Runtime:
    """How this process computes, resolved once from the request (the runner makes it and hands
    it to the protocol and, through it, to the engine): speed and memory choices, none of which is
    in a run key except the precision, which protocols record."""

    device: torch.device
    precision: str  # resolved: bf16 or fp32
    input_pipeline: str  # as asked (PIPELINES): engine/device_data.choose picks per split
    workers: int
    extraction_batch: int  # images per forward pass when extracting features
    compile: bool
    skip_corrupt: bool
    cache_root: Path  # <results>/cache

    @classmethod
    def of(cls, req: Any, device: torch.device | None = None) -> Runtime:
        """From a Request (protocols/base.py; read by its field names, this module being below it)."""
        found = device if device is not None else resolve_device(req.device)
        check_pipeline(req.input_pipeline, found)
        return cls(
            found,
            resolve_precision(req.precision, found.type),
            req.input_pipeline,
            req.workers,
            req.extraction_batch,
            req.compile,
            req.skip_corrupt,
            Path(req.results) / "cache",
        )
