"""The README as a program: its commands in order, in one results folder, and the output it quotes.

README.md, and the pages of docs/ that show commands (WALKED), mark what the docs test
(tests/test_readme.py, tests/test_docs_walk.py) runs and compares with HTML comments, which GitHub
does not show:

- a fenced ```bash block: each `vitbench …` command in it runs, in order (`pip …` and `nox …` do
  not: the test is already in the installed environment). A full-line `# …` comment under a
  command is a line of that command's output;
- a fenced ```python block runs as a script;
- a fenced ```text block is the output of the block of commands just above it;
- `<!-- docs-test: output of `COMMAND` -->` … `<!-- /docs-test -->`: the Markdown between the two
  is what COMMAND prints at that point (it runs then; such a command only reads results);
- `<!-- docs-test: tolerance N -->` before a quote: its numbers may differ from the printed ones by
  up to N (results trained on a CPU: see the README for why);
- `<!-- docs-test: tolerance N on cpu "FINGERPRINT", any on others -->`: a quote of numbers trained
  on a CPU. On a CPU of that fingerprint (`vitbench.host.devices.cpu_kernels()`: the vendor, generation
  and vector extensions torch's, MKL's and oneDNN's kernels choose their code by) its numbers hold
  within N; on another the float sums of training round another way and the trained numbers come
  out elsewhere (the README's demo: up to 12 points), so there the quote is an example whose words
  and shape are held, and a test of its own holds what it claims on every CPU (tests/test_readme.py).
  `…, any on others; exact where "TEXT"` keeps the numbers of the quote's lines that hold TEXT
  exact on every CPU (what is not trained, e.g. a random-init row: the same everywhere);
- `<!-- docs-test: skip … -->` before a block: not run (it needs a GPU, or data CI does not have).

A quote matches when its words appear, in order and consecutively, among the words the command
printed (stdout and stderr as they interleave); numbers within the quote's tolerance.
"""

from __future__ import annotations

import io
import math
import re
import shlex
import sys
import time
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path

MARKER = re.compile(r"<!-- docs-test: (.*?) -->")
NUMBER = re.compile(r"^[-+−]?\d[\d,]*(\.\d+)?(e[-+]?\d+)?$")
PUNCTUATION = "()[]:%"


@dataclass
class Quote:
    text: str
    tolerance: float
    line: int  # in its page, for the failure message
    cpu: str | None = None  # the CPU fingerprint the numbers hold on; on another, only the words
    exact_where: str | None = None  # ... save the lines holding this text: exact on every CPU
    page: str = "README.md"

    def tolerances(self) -> list[float]:
        """Each of the quote's words' tolerance here: the quote's own on its CPU (or on any, where
        it names none), any on another CPU, 0 in the lines that must be exact everywhere."""
        here = self.tolerance if self.cpu in (None, cpu_fingerprint()) else math.inf
        return [
            0.0 if self.exact_where and self.exact_where in line else here
            for line in self.text.splitlines()
            for _ in _words(line)
        ]


@dataclass
class Step:
    kind: str  # "vitbench" or "python"
    source: str  # the command line or the script
    line: int
    quotes: list[Quote] = field(default_factory=list)
    page: str = "README.md"
    output: str = ""
    code: int | None = None
    seconds: float = 0.0


ROOT = Path(__file__).resolve().parents[1]
# the pages the docs test walks: the README, then (in a folder of their own) the pages of docs/ that
# show commands and what they print
README = ROOT / "README.md"
WALKED_DOCS = tuple(ROOT / "docs" / name for name in ("finetune.md", "pretraining.md", "downloads.md"))


def parse(readme: Path) -> tuple[list[Step], list[str]]:
    """A page's steps in order, and the blocks it marks as not run (with their reasons)."""
    page = str(readme.resolve().relative_to(ROOT))
    steps, skipped = _parse(readme.read_text().splitlines(), page)
    for step in steps:
        step.page = page
        for quote in step.quotes:
            quote.page = page
    return steps, skipped


def _parse(lines: list[str], page: str) -> tuple[list[Step], list[str]]:
    steps: list[Step] = []
    skipped: list[str] = []
    pending: dict[str, str] = {}
    block: list[Step] = []  # the steps of the last block of commands, which a ```text block quotes
    i = 0
    while i < len(lines):
        line = lines[i]
        marker = MARKER.search(line)
        if marker and marker.group(1).startswith("output of `"):
            command = marker.group(1).removeprefix("output of `").removesuffix("`")
            end = next(j for j in range(i + 1, len(lines)) if "<!-- /docs-test -->" in lines[j])
            quote = _quote(lines[i + 1 : end], pending, i + 1)
            steps.append(Step("vitbench", command, i + 1, [quote]))
            pending, i = {}, end + 1
            continue
        if marker:
            key, _, value = marker.group(1).partition(" ")
            pending[key] = value
        elif line.startswith("```") and line.strip() != "```":
            language = line.strip("`").strip()
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            body = lines[i + 1 : end]
            if "skip" in pending:
                skipped.append(f"{page}:{i + 1}: {pending['skip']}")
            elif language == "bash":
                block = _bash_steps(body, i + 2)
                steps += block
            elif language == "python":
                block = [Step("python", "\n".join(body), i + 1)]
                steps += block
            elif language == "text" and block:
                block[-1].quotes.append(_quote(body, pending, i + 1))
            pending, i = {}, end + 1
            continue
        i += 1
    return steps, skipped


ON_CPU = re.compile(r'^(\S+) on cpu "([^"]+)", any on others(?:; exact where "([^"]+)")?')


def _quote(body: list[str], pending: dict[str, str], line: int) -> Quote:
    """A quote with the tolerance its marker gives, the CPU fingerprint it holds on (None: every
    CPU) and the text of its lines that are exact on every CPU."""
    value = pending.get("tolerance", "0")
    on_cpu = ON_CPU.match(value)
    if on_cpu:
        return Quote("\n".join(body), float(on_cpu.group(1)), line, on_cpu.group(2), on_cpu.group(3))
    return Quote("\n".join(body), float(value.split()[0]), line)


def cpu_fingerprint() -> str:
    """This machine's CPU as a quote's marker names it: `VENDOR FAMILY/MODEL flag flag …`."""
    from vitbench.host.devices import cpu_kernels

    return cpu_kernels()


def _bash_steps(body: list[str], first_line: int) -> list[Step]:
    """`vitbench` commands (continuation lines joined), each with the `# ` output lines under it."""
    steps: list[Step] = []
    logical: list[tuple[int, str]] = []
    for n, text in enumerate(body, first_line):
        if logical and logical[-1][1].endswith("\\"):
            logical[-1] = (logical[-1][0], logical[-1][1][:-1] + " " + text.strip())
        else:
            logical.append((n, text))
    for n, text in logical:
        stripped = text.strip()
        if stripped.startswith("# ") and steps:
            steps[-1].quotes.append(Quote(stripped[2:], 0.0, n))
            continue
        command = re.split(r"\s{2,}#", stripped, maxsplit=1)[0]  # a trailing comment annotates, it is not output
        command = command.split("&&")[-1].strip()
        if command.startswith("vitbench"):
            steps.append(Step("vitbench", command, n))
    return steps


def run_step(step: Step) -> None:
    """Run one step in this process and keep what it printed (stdout and stderr, interleaved)."""
    printed = io.StringIO()
    with redirect_stdout(printed), redirect_stderr(printed):
        if step.kind == "python":
            exec(compile(step.source, step.page, "exec"), {"__name__": "__readme__"})
            step.code = 0
        else:
            step.code = _vitbench(shlex.split(step.source)[1:])
    step.output = printed.getvalue()


def _vitbench(args: list[str]) -> int:
    from vitbench.cli import main

    argv = sys.argv
    sys.argv = ["vitbench", *args]
    try:
        main()
    except SystemExit as done:
        return int(done.code or 0)
    finally:
        sys.argv = argv
    return 0


def mismatch(quote: Quote, printed: str) -> str | None:
    """None when the quote's words appear consecutively among the printed words (numbers within
    the tolerance, any on a CPU other than the quote's; `…` stands for what differs from machine to
    machine: a bare `…` for one to twelve words, `(git …)` for one word); else what the closest
    stretch of output says instead."""
    want, have, tolerances = _words(quote.text), _words(printed), quote.tolerances()
    if not want:
        return None
    best, best_at = -1, 0
    for start in range(len(have)):
        agree = _agree(want, have, start, tolerances)
        if agree == len(want):
            return None
        if agree > best:
            best, best_at = agree, start
    if best < 0:
        return f"{quote.page}:{quote.line}: the command printed nothing"
    return (
        f"{quote.page}:{quote.line}: after {' '.join(want[max(0, best - 6) : best])!r} the page says "
        f"{' '.join(want[best : best + 12])!r}; the closest output, from its word {best_at}, goes on "
        f"{' '.join(have[best_at + best : best_at + best + 12])!r}"
    )


def _words(text: str) -> list[str]:
    """Words, with commas and semicolons words of their own (a quote may end where a line goes on)."""
    return re.findall(r"[^\s,;]+|[,;]", text)


def _agree(want: list[str], have: list[str], at: int, tolerances: list[float], i: int = 0) -> int:
    """How many of `want[i:]` match `have` from `at` on (all of them: len(want) - i); `tolerances`
    is each wanted word's."""
    while i < len(want):
        if want[i] == "…":  # one to twelve words: the longest agreement over the choices
            tries = [_agree(want, have, at + n, tolerances, i + 1) for n in range(1, 13) if at + n <= len(have)]
            return max(tries, default=i)
        if at >= len(have) or not _same(want[i], have[at], tolerances[i]):
            return i
        i, at = i + 1, at + 1
    return i


def _same(quoted: str, printed: str, tolerance: float) -> bool:
    if quoted == printed or (_rule(quoted) and _rule(printed)):  # a table's border: its width follows the cells
        return True
    a, b = quoted.strip(PUNCTUATION), printed.strip(PUNCTUATION)
    if a == "…":  # one word that differs between machines or commits, its punctuation kept
        return quoted.replace(a, "") == printed.replace(b, "")
    if not (NUMBER.match(a) and NUMBER.match(b)) or quoted.replace(a, "") != printed.replace(b, ""):
        return False
    return abs(_number(a) - _number(b)) <= tolerance + 1e-9


def _rule(word: str) -> bool:
    return all("\u2500" <= c <= "\u257f" for c in word)


def _number(text: str) -> float:
    return float(text.replace(",", "").replace("−", "-"))


def walk(pages: tuple[Path, ...], root: Path) -> tuple[list[Step], list[str]]:
    """Every step of `pages`, in order, run in root/checkout laid out as a checkout with ../shared
    beside it (the steps that read ../shared are left out where it is not there), with what a pipe
    receives: no results or data folder of the caller's, and no COLUMNS (pytest-xdist sets COLUMNS=80
    in its workers; a table honours it, split to fit). Returns the steps run and those left out."""
    import os
    from contextlib import chdir

    checkout = root / "checkout"
    checkout.mkdir(parents=True, exist_ok=True)
    shared = ROOT.parent / "shared"
    if shared.exists() and not (root / "shared").exists():
        (root / "shared").symlink_to(shared, target_is_directory=True)
    ran, left_out = [], []
    env = {k: os.environ.pop(k) for k in ("VITBENCH_RESULTS", "VITBENCH_DATA", "COLUMNS") if k in os.environ}
    try:
        with chdir(checkout):
            for page in pages:
                for step in parse(page)[0]:
                    if "../shared" in step.source and not (root / "shared").exists():
                        left_out.append(f"{step.page}:{step.line}: reads ../shared/data, which is not present")
                        continue
                    began = time.perf_counter()
                    run_step(step)
                    step.seconds = time.perf_counter() - began
                    ran.append(step)
    finally:
        os.environ.update(env)
    return ran, left_out


def failed_steps(ran: list[Step]) -> list[str]:
    """What a walk's failed commands printed last, each under its page and line."""
    return [f"{s.page}:{s.line}: {s.source} exited {s.code}\n{s.output[-2000:]}" for s in ran if s.code != 0]


def check_quote(ran: list[Step], step: Step, quote: Quote) -> None:
    """A test's assertion that `quote` is what its step printed in the walk `ran` (skipped where the
    walk left the step out: it reads ../shared/data, which is not present)."""
    import pytest

    done = next((s for s in ran if (s.page, s.line) == (step.page, step.line)), None)
    if done is None:
        pytest.skip("reads ../shared/data, which is not present")
    problem = mismatch(quote, done.output)
    assert problem is None, f"{problem}\n(the command: {step.source})"


def main() -> None:
    """`python tests/readme_walk.py [FOLDER]`: walk the README (in FOLDER/readme) and the walked
    pages of docs/ (in FOLDER/docs), FOLDER a fresh temporary one by default, and print what each
    step printed under the line it belongs to: what to paste when a quote must change."""
    import tempfile

    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="readme-"))
    for name, pages in (("readme", (README,)), ("docs", WALKED_DOCS)):
        ran, left_out = walk(pages, root / name)
        for step in ran:
            head = f"{step.page}:{step.line}: {step.source.splitlines()[0]}"
            print(f"===== {head} (exit {step.code}, {step.seconds:.1f} s)", file=sys.__stdout__)
            print(step.output, file=sys.__stdout__)
            for quote in step.quotes:
                print(f"----- quote at {quote.page}:{quote.line}: {mismatch(quote, step.output) or 'matches'}",
                      file=sys.__stdout__)  # fmt: skip
        skipped = [reason for page in pages for reason in parse(page)[1]]
        print("\n".join(f"not run: {reason}" for reason in skipped + left_out), file=sys.__stdout__)


if __name__ == "__main__":
    main()
