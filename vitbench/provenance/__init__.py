"""Where a number came from: canonical run keys, weights and data fingerprints, the code and
software environment (here), and which code a plugin backbone ran (plugin_code.py).

May import: vitbench.files, vitbench.version and vitbench.errors; everything that stores or shows a
number imports it."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shlex
import socket
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from stat import S_ISREG

from vitbench.errors import UserError
from vitbench.files.atomic import write_atomic
from vitbench.version import __version__

_SOURCE_DIR = Path(__file__).resolve().parents[2]  # the source tree (vitbench/provenance/ is two below it)


def canonical_json(obj: object) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


# A key is a run's identity (its shard, predictions, checkpoint and weights file are named by it),
# so storing a setting otherwise must not change it: a key hashes a spec in the form keys were
# first made in, and shards and databases written before are read in today's (store/shards.py,
# schema 2; store/schema.py, migration 7). KEYED_AS: {protocol: {stored name: the name hashed}};
# KEYED_APART: the hparam that was a field of the spec of its own (few-shot's shots), hashed there.
KEYED_AS = {"knn": {"knn_k": "k"}, "fewshot": {"fewshot_l2": "l2"}, "linear": {"linear_features": "features"}}
KEYED_APART = {"fewshot": "shots"}


# Settings that runs once recorded only where they were not the default, so that a reader had to
# know the default (an fp32 run had no `precision`, and `--where precision=fp32` found nothing).
# Every run records them now, the default too (shard schema 3, migration 8 fill in runs stored
# before), and a key hashes them as keys were first made: without a default value. {protocol, or
# ANY for every protocol: {setting: the value a run that recorded none ran with}}.
ANY = "*"
LIBJPEG = "libjpeg (the references' pixels: PIL's decode on the CPU, or the arrays as stored)"
CPU_FIT = "on the CPU: scikit-learn lbfgs"
WHOLE_TRAIN = "all of train"
DEFAULT_SETTINGS: dict[str, dict[str, str]] = {
    ANY: {"precision": "fp32", "decoder": LIBJPEG},
    "fewshot": {"fewshot_train": WHOLE_TRAIN},
    "linear": {"linear_fit": CPU_FIT},
    "finetune": {"polyak_warmup": "none"},
}
# the settings whose default a protocol's keys always held (fine-tuning and pre-training recorded
# `precision` from the start): they stay in its key whatever their value
KEYED_WITH_DEFAULT = {"finetune": {"precision"}, "pretrain": {"precision"}}


def defaults_of(protocol: str) -> dict[str, str]:
    """Every setting with a default that a run of `protocol` records, and that default."""
    return {**DEFAULT_SETTINGS[ANY], **DEFAULT_SETTINGS.get(protocol, {})}


def explicit_hparams(protocol: str, hparams: dict) -> dict:
    """`hparams` with every defaulted setting it leaves out at its default value: what a run records."""
    return {**defaults_of(protocol), **hparams}


def keyed_hparams(protocol: str, hparams: dict) -> dict:
    """`hparams` in the form keys hash: a defaulted setting at its default left out (as runs once
    recorded it), unless the protocol's keys always held it."""
    always = KEYED_WITH_DEFAULT.get(protocol, set())
    defaults = defaults_of(protocol)
    return {k: v for k, v in hparams.items() if k in always or k not in defaults or v != defaults[k]}


def run_key_of(spec: dict) -> str:
    """The run key of a spec's fields (protocols/base.RunSpec), in the form keys were first made in."""
    renamed, apart = KEYED_AS.get(spec["protocol"], {}), KEYED_APART.get(spec["protocol"])
    stored = keyed_hparams(spec["protocol"], spec["hparams"])
    hparams = {renamed.get(name, name): value for name, value in stored.items() if name != apart}
    keyed = {**spec, "hparams": hparams, "shots": spec["hparams"].get(apart) if apart else None}
    return sha256_text(canonical_json(keyed))


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def sha256_file(path: Path, cache_dir: Path | None = None) -> str:
    """sha256 of a (possibly multi-GB) weights file, cached by (absolute path, size, mtime). A path
    that is not a regular file is a UserError: /dev/zero or a FIFO would be read forever."""
    stat = path.stat()
    if not S_ISREG(stat.st_mode):
        raise UserError(f"{path}: not a regular file (a device, FIFO or folder), expected a file to read")
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
    """A dataset fingerprint from relative names, sizes and modification times (whole seconds, as
    copies that keep times keep them), or from contents where `content` (--verify-data): it
    changes whenever a file is added, removed, resized or rewritten, without reading every image
    of a large dataset. Plain strings and os.stat keep it at seconds for ImageNet's 1.28M files
    (pathlib is ~10x slower)."""
    digest = hashlib.sha256()
    prefix = os.path.join(os.fspath(root), "")
    for f in sorted(str(f) for f in files):
        relative = f[len(prefix) :] if f.startswith(prefix) else os.path.relpath(f, root)
        try:
            stat = os.stat(f)
        except OSError as e:  # vanished, a dangling link, a symlink loop
            raise UserError(f"{f}: cannot be read ({e.strerror or e})") from None
        if content:
            digest.update(f"{relative}|{stat.st_size}\n".encode())
            digest.update(bytes.fromhex(sha256_file(Path(f))))  # no cache: the bytes are read each time
        else:
            digest.update(f"{relative}|{stat.st_size}|{int(stat.st_mtime)}\n".encode())
    return digest.hexdigest()[:16]


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
    import torch

    return {
        "git_sha": git_sha(),
        "vitbench_version": __version__,
        "torch_version": torch.__version__,
        "timm_version": timm.__version__,
        "python_version": platform.python_version(),
        "hostname": socket.gethostname(),
        "command": command_line(),
    }


# the command a cluster job's runs were submitted with: the job's own argv is submitit's
# (`_submit.py /…/jobs/<date>`), not what the user typed (execution/job_process.py sets it)
_submitted_command: str | None = None


def command_line() -> str:
    """The command that made this process's runs, shell-quoted (a value with spaces or quotes reads
    back as the command that ran): this process's, or the one a cluster job was submitted with."""
    return _submitted_command or shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]])


def submitted_as(command: str | None) -> None:
    """A cluster job's runs record `command`, the one typed where it was submitted (None: its own)."""
    global _submitted_command
    _submitted_command = command
