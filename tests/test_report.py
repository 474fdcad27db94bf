"""`vitbench report`: one self-contained page, tested as a person would use it — opened in a real
headless browser (Chromium from the distribution's packages; .ci/run installs it where it can),
with no console errors, the Table 2 cells equal to `vitbench table --format csv`, a click-sort
that reorders rows, and a screenshot kept as the test's artefact."""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest
from test_tables import build_store, check_golden

from vitbench import store
from vitbench.views.report import report_html

NOW = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


class Outline(HTMLParser):
    """The page's structure: sections, headings, tables (id, header cells, row count), figures and
    script/link tags — everything but the bytes that carry the date or a number."""

    def __init__(self):
        super().__init__()
        self.lines: list[str] = []
        self.stack: list[str] = []
        self.text = ""
        self.rows = 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.stack.append(tag)
        if tag in ("section", "table", "figure", "details", "script", "link", "img", "iframe"):
            self.lines.append(f"<{tag}{' #' + a['id'] if a.get('id') else ''}{' src' if 'src' in a else ''}>")
        if tag == "tr":
            self.rows += 1
        self.text = ""

    def handle_endtag(self, tag):
        if tag in ("h1", "h2", "summary") or (tag == "th" and "thead" in self.stack):
            self.lines.append(f"  {tag}: {self.text.strip()}")
        if tag == "table":
            self.lines.append(f"  rows: {self.rows}")
            self.rows = 0
        if self.stack:
            self.stack.pop()

    def handle_data(self, data):
        self.text += data


def outline(page: str) -> str:
    parser = Outline()
    parser.feed(page)
    return "\n".join(parser.lines) + "\n"


@pytest.fixture
def stored(tmp_path: Path) -> Path:
    return build_store(tmp_path / "results")


def test_report_structure_golden(stored):
    page = report_html(stored, compare=["bit-l"], now=NOW)
    assert "Made 2026-11-24 12:00 UTC" in page
    assert not re.search(r'(src|href)="(https?:|//)', page)  # no external asset (SVG namespaces are names, not fetches)
    check_golden("report_outline.txt", outline(page))


def test_a_store_with_nothing_in_it_says_so(cli, tmp_path):
    out = tmp_path / "r.html"
    code, text, err = cli("report", "--out", out, "--results", tmp_path / "none")
    assert code == 0, err
    assert "This store holds no results yet" in out.read_text()


def test_the_report_reads_while_a_run_holds_the_database(cli, stored, tmp_path):
    """Another process holds the database for writing: the report reads the shards meanwhile."""
    db = stored / store.DB_NAME
    before = db.stat().st_mtime_ns
    hold = f"import duckdb, time; c = duckdb.connect({str(db)!r}); print('held', flush=True); time.sleep(60)"
    holder = subprocess.Popen([sys.executable, "-c", hold], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        code, _, err = cli("report", "--out", tmp_path / "r.html", "--results", stored)
        assert code == 0, err
        assert "Table 2 layout" in (tmp_path / "r.html").read_text()
    finally:
        holder.kill()
        holder.wait()
    assert db.stat().st_mtime_ns == before  # read-only


def browser() -> str:
    found = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    if found is None:
        pytest.skip("no Chromium or Chrome on PATH (.ci/run installs the distribution's chromium where apt-get can)")
    return found


def headless(binary: str, *args: str) -> subprocess.CompletedProcess:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0", "--hide-scrollbars"]
    return subprocess.run([binary, *flags, *args], capture_output=True, text=True, timeout=120)


def table2_values(dom: str) -> dict[tuple[str, int], float]:
    body = dom[dom.index('id="table2-table"') :]
    body = body[: body.index("</table>")]
    values = {}
    for row in re.findall(r"<tr><th>(.*?)</th>(.*?)</tr>", body, flags=re.S):
        for i, cell in enumerate(re.findall(r"<td[^>]*?>", row[1])):
            number = re.search(r'data-value="([^"]+)"', cell)
            if number:
                values[(row[0].replace("&amp;", "&"), i)] = float(number.group(1))
    return values


def test_the_report_in_a_real_browser(cli, stored, tmp_path):
    binary = browser()
    page = tmp_path / "report.html"
    code, _, err = cli("report", "--out", page, "--compare", "bit-l", "--results", stored)
    assert code == 0, err
    assert page.stat().st_size < 5_000_000
    loaded = headless(binary, "--virtual-time-budget=3000", "--dump-dom", page.as_uri())
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    console = [line for line in loaded.stderr.splitlines() if ":CONSOLE" in line]
    assert not console, console  # no error, no warning, no log line from the page's script
    # the cells the browser shows are the numbers `vitbench table --format csv` gives
    code, csv, _ = cli("table", "--compare", "bit-l", "--format", "csv", "--results", stored)
    table = pd.read_csv(io.StringIO(csv)).dropna(subset=["mean"])
    shown = table2_values(loaded.stdout)
    header = re.search(r'id="table2-table".*?<thead><tr><th></th>(.*?)</tr>', loaded.stdout, flags=re.S).group(1)
    columns = [re.sub(r"<[^>]+>", "", c).replace("&amp;", "&") for c in re.findall(r"<th[^>]*>.*?</th>", header)]
    expected = {(r.row, columns.index(r.column)): float(f"{r.mean:.6g}") for r in table.itertuples()}
    assert shown == expected
    # clicking a column's header (what the page's #sort link does) orders the rows by it
    sorted_dom = headless(
        binary, "--virtual-time-budget=3000", "--dump-dom", page.as_uri() + "#sort=table2-table:1"
    ).stdout
    order = [
        v
        for (row, i), v in sorted(table2_values(sorted_dom).items(), key=lambda kv: _row_position(sorted_dom, kv[0][0]))
        if i == 0
    ]
    assert order == sorted(order, reverse=True) and len(order) >= 2
    artefacts = Path(os.environ.get("VITBENCH_TEST_ARTIFACTS", tmp_path))
    artefacts.mkdir(parents=True, exist_ok=True)
    shot = artefacts / "report.png"
    headless(binary, f"--screenshot={shot}", "--window-size=1366,1800", page.as_uri())
    for _ in range(20):  # the file appears when the browser has written it
        if shot.exists() and shot.stat().st_size:
            break
        time.sleep(0.1)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


def _row_position(dom: str, row: str) -> int:
    body = dom[dom.index('id="table2-table"') :]
    return body.index(f"<tr><th>{row.replace('&', '&amp;')}</th>")


# each one sets an attribute on <html> if it ever runs (1+1 and 2+2 so that the payload's own text,
# escaped and shown, never reads as the attribute it would set)
HOSTILE = (
    '<img src=x onerror="document.documentElement.dataset.pwned=1+1">'
    "<script>document.documentElement.dataset.pwned=2+2</script>"
    '"><svg onload="document.documentElement.dataset.pwned=3+3">'
)
RAN = re.compile(r"<html[^>]*data-pwned=")
TEXT_FIELDS = ("model", "arch", "backend", "weights", "weights_sha256", "data_source", "data_dir", "data_fingerprint",
               "protocol_version", "device", "device_name", "git_sha", "vitbench_version", "torch_version",
               "timm_version", "python_version", "hostname", "command")  # fmt: skip


def _hostile_store(results: Path) -> Path:
    """build_store's runs, and beside them runs whose every text field, hparams and notes key and
    value, metric name and dataset carries script, as a shared results folder can; and an
    attention-distance measurement named likewise."""
    from test_tables import write_run

    build_store(results)
    evil = {name: f"x{HOSTILE}" for name in TEXT_FIELDS}
    for i, protocol in enumerate(("fewshot", "finetune", "eval", f"p{HOSTILE}")):
        write_run(results, f"evil-{i}", {"accuracy": 0.5, f"m{HOSTILE}": 0.25}, protocol=protocol, shots=10,
                  dataset=f"d{HOSTILE}" if i % 2 else "cifar10", hparams={"res": 224, f"k{HOSTILE}": HOSTILE},
                  notes={HOSTILE: HOSTILE}, **evil)  # fmt: skip
    con = store.connect(results)
    try:
        store.ingest_pending(con, results)
        con.executemany(
            "INSERT INTO attention_distance (inspect_key, model, weights, weights_sha256, random_init, res, images,"
            " images_fingerprint, n_images, layer, head, distance_px)"
            " VALUES (?, ?, ?, ?, false, 224, ?, ?, 8, ?, ?, ?)",
            [
                (HOSTILE, HOSTILE, HOSTILE, HOSTILE, HOSTILE, HOSTILE, layer, head, 10.0 + layer)
                for layer in range(2)
                for head in range(2)
            ],  # fmt: skip
        )
    finally:
        con.close()
    return results


def test_script_in_any_stored_value_never_runs_in_the_report(cli, tmp_path):
    """Values from a store are text, everywhere on the page; and the page's Content-Security-Policy
    stops an inline handler or script that ever slipped past the escaping (the second test below
    plants one by hand)."""
    binary = browser()
    results = _hostile_store(tmp_path / "results")
    page = tmp_path / "report.html"
    code, _, err = cli("report", "--out", page, "--results", results)
    assert code == 0, err
    text = page.read_text()
    assert "&lt;script&gt;" in text and text.count("<script>") == 1  # shown as text; the page's own script only
    loaded = headless(binary, "--virtual-time-budget=3000", "--dump-dom", page.as_uri())
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert not RAN.search(loaded.stdout)
    assert not [line for line in loaded.stderr.splitlines() if ":CONSOLE" in line]
    # the second wall: the same page with the payload planted raw after <body> runs none of it
    planted = tmp_path / "planted.html"
    planted.write_text(text.replace("<body>", f"<body>{HOSTILE}", 1))
    loaded = headless(binary, "--virtual-time-budget=3000", "--dump-dom", planted.as_uri())
    assert loaded.returncode == 0 and "<body>" in text
    assert not RAN.search(loaded.stdout)
    assert "Content Security Policy" in loaded.stderr  # the browser says what it refused
