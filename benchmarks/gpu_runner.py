"""benchmarks/gpu.py's runner and inputs: `Suite` runs each step's commands with a time limit and
keeps their figures and log (written after every step), and the data the steps make (JPEG folders,
a CIFAR-10-sized set in CIFAR's pickle format)."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


class Suite:
    """Runs the steps, keeps their figures and the log, writes both after every step (a machine
    taken back mid-way still leaves what was measured)."""

    def __init__(self, out: Path, quick: bool, deadline: float):
        self.out = out
        self.deadline = time.monotonic() + deadline  # a machine lent for a while: stop each command in time
        self.quick = quick
        self.profile = False  # --profile: the few-shot runs under cProfile, stats into OUT
        self.results = out / "results"
        self.work = Path(os.environ.get("VITBENCH_GPU_WORK", "/tmp/vitbench-gpu"))
        self.work.mkdir(parents=True, exist_ok=True)
        self.summary: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "quick": quick, "steps": {}}
        self.log = open(out / "log.txt", "a")  # noqa: SIM115 (open for the whole suite)

    def say(self, text: str) -> None:
        print(text, flush=True)
        self.log.write(text + "\n")
        self.log.flush()

    def sh(self, args: list[str], limit: float, env: dict | None = None) -> dict:
        """One command, its output to the log; {command, rc, seconds, tail}."""
        self.say("$ " + " ".join(args))
        limit = min(limit, self.deadline - time.monotonic() - 20)  # 20 s left to archive what was stored
        if limit <= 0:
            return {"command": " ".join(args), "rc": 124, "seconds": 0, "tail": "not started: --deadline reached"}
        start = time.perf_counter()
        try:
            done = subprocess.run(
                args, cwd=ROOT, capture_output=True, text=True, timeout=limit, env={**os.environ, **(env or {})}
            )
            rc, text = done.returncode, done.stdout + done.stderr
        except subprocess.TimeoutExpired as e:
            rc = 124
            text = (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(errors="replace")
            text += f"\n[stopped after {limit:.0f} s]"
        seconds = time.perf_counter() - start
        self.log.write(text + f"\n[rc {rc}, {seconds:.1f} s]\n")
        self.log.flush()
        print(text[-3000:], flush=True)
        return {"command": " ".join(args), "rc": rc, "seconds": round(seconds, 2), "tail": text[-600:]}

    def step(self, name: str, fn) -> None:
        self.say(f"\n=== {name} ===")
        start = time.perf_counter()
        try:
            figures = fn()
            ok = all(c.get("rc", 0) == 0 for c in figures.get("commands", []))
            self.summary["steps"][name] = {"ok": ok, **figures}
        except Exception as e:  # one step's failure must not cost the others' figures
            self.summary["steps"][name] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
            self.say(f"{name} failed: {type(e).__name__}: {e}")
        self.summary["steps"][name]["wall_seconds"] = round(time.perf_counter() - start, 1)
        self.save()

    def save(self) -> None:
        (self.out / "summary.json").write_text(json.dumps(self.summary, indent=1, default=str))

    def vitbench(self, *args: str, limit: float, profile: str | None = None) -> dict:
        """`vitbench ARGS`; under cProfile when `profile` names the stats file (in OUT)."""
        prefix = ["-m", "cProfile", "-o", str(self.out / profile)] if profile else []
        return self.sh([sys.executable, *prefix, "-m", "vitbench", *args], limit)


# --- inputs the steps make ------------------------------------------------------------------------


def write_jpeg_folder(root: Path, train: int, test: int, classes: int = 10) -> Path:
    """An ImageFolder tree of camera-sized JPEGs (500 x 375, quality 90), the real pipeline's input."""
    from PIL import Image

    if (root / "done").exists():
        return root
    rng = np.random.default_rng(0)
    base = rng.integers(0, 256, (classes, 3), dtype=np.uint8)
    for split, n in (("train", train), ("test", test)):
        for i in range(n):
            c = i % classes
            folder = root / split / f"class{c:02d}"
            folder.mkdir(parents=True, exist_ok=True)
            # smooth structure plus noise: JPEG sizes like a photo's, not like flat colour or pure noise
            small = rng.integers(0, 256, (12, 16, 3), dtype=np.uint8) // 2 + base[c] // 2
            image = Image.fromarray(small).resize((500, 375), Image.BICUBIC)
            noise = rng.integers(-12, 13, (375, 500, 3))
            pixels = np.clip(np.asarray(image, dtype=np.int16) + noise, 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(folder / f"{i:06d}.jpg", quality=90)
    (root / "done").touch()
    return root


def write_cifar10(root: Path, train: int, test: int) -> Path:
    """CIFAR-10's python pickles (data_batch_1..5, test_batch, batches.meta) of generated images:
    each class a colour layout plus noise, so the few-shot accuracies are above chance."""
    folder = root / "cifar-10-batches-py"
    if (folder / "test_batch").exists():
        return root
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    layouts = rng.integers(0, 256, (10, 3, 4, 4)).astype(np.float32)

    def batch(n: int, label: str) -> dict:
        labels = rng.integers(0, 10, n)
        coarse = np.repeat(np.repeat(layouts[labels], 8, axis=2), 8, axis=3)  # (n, 3, 32, 32)
        data = np.clip(coarse + rng.normal(0, 40, coarse.shape), 0, 255).astype(np.uint8)
        return {"batch_label": label, "labels": labels.tolist(), "data": data.reshape(n, 3072)}

    per = train // 5
    for b in range(5):
        with open(folder / f"data_batch_{b + 1}", "wb") as f:
            pickle.dump(batch(per, f"training batch {b + 1} of 5"), f)
    with open(folder / "test_batch", "wb") as f:
        pickle.dump(batch(test, "testing batch 1 of 1"), f)
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": names, "num_cases_per_batch": per, "num_vis": 3072}, f)
    return root
