"""`vitbench report`: one self-contained page, tested as a person would use it — opened in a real
headless browser (Chromium from the distribution's packages; .ci/run installs it where it can) at
1400 px: the summary first and a section per protocol, nothing wider than the window outside a
table's own scroll box, no request beyond the page itself, no console message, the fine-tuning
cells equal to `vitbench table --format csv`, a click-sort that reorders rows, and a screenshot
kept as the test's artefact."""

from __future__ import annotations

import base64
import hashlib
import html
import io
import json
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
from loopback import Server
from test_tables import add_pretraining, build_store, check_golden, write_run

from vitbench import store
from vitbench.reference import paper
from vitbench.views.report import summary
from vitbench.views.report.report import report_html
from vitbench.views.report.report_page import CONTENT_SECURITY_POLICY, SCRIPT
from vitbench.views.tables.table import PAPER_COST_ROW

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
        if tag != "span":  # a header's parts (render._wrapping) are one header's text
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


def build_report_store(root: Path) -> Path:
    """build_store's fine-tuning, eval and random-init few-shot runs; a pre-training run and the
    few-shot runs of the weights it wrote; k-NN and linear probes of the fine-tuned model's weights
    (data and weights in folders under `root`, as on a user's disk)."""
    results = add_pretraining(build_store(root / "results"))
    weights = str(root / "weights" / "ViT-B_16.npz")
    for protocol, acc, hparams in (("knn", 0.912, {"knn_k": 20, "res": 224}), ("linear", 0.955, {"res": 224})):
        write_run(results, f"{protocol}-0", {"accuracy": acc}, protocol=protocol, protocol_version=f"{protocol}/3",
                  hparams=hparams, weights=weights, data_dir=str(root / "data"), device_seconds=30.0)  # fmt: skip
    con = store.connect(results)
    store.ingest_pending(con, results)
    con.close()
    return results


@pytest.fixture(scope="module")
def stored(tmp_path_factory) -> Path:
    return build_report_store(tmp_path_factory.mktemp("report"))


def sections(page: str) -> list[str]:
    return re.findall(r'<section id="([^"]+)">', page)


def test_report_structure_golden(stored):
    page = report_html(stored, compare=["bit-l"], now=NOW)
    assert "Made 2026-11-24 12:00 UTC" in page
    assert not re.search(r'(src|href)="(https?:|//)', page)  # no external asset (SVG namespaces are names, not fetches)
    check_golden("report_outline.txt", outline(page))


def test_the_summary_comes_first_then_every_protocol_the_store_holds(stored):
    page = report_html(stored, compare=["bit-l", "vit-b/16-i21k"], now=NOW)
    assert sections(page) == ["summary", "fewshot", "finetune", "eval", "knn", "linear", "pretrain", "provenance"]
    assert "not shown" not in page  # nothing sent away to a CLI flag
    summary = page[page.index('<section id="summary">') : page.index('<section id="fewshot">')]
    protocols_said = (
        "few-shot (6), fine-tuned (11), own classifier (eval) (1), k-NN (1), linear-probe (1), pre-trained (1)"
    )
    for said in ("<dt>Runs</dt><dd>21, finished 2026-11-20", protocols_said, "NVIDIA H100 80GB HBM3",
                 "vitbench 0.1.0 (git 0123abcd)"):  # fmt: skip
        assert said in summary, said
    headline = summary_cells(summary)
    # the fine-tuned vit-b/16 on CIFAR-10 across protocols, beside the paper's vit-b/16 in the same setting
    row = "vit-b/16 (ViT-B_16 [ab12cd34]) · CIFAR-10"
    assert headline[(row, "fine-tuned")].startswith("99.02 ± 0.07")
    assert headline[(row, "k-NN, k=20")].startswith("91.20") and headline[(row, "linear-probe")].startswith("95.50")
    i21k = paper.cells("vit-b/16-i21k")
    paper_c10 = i21k[(i21k["dataset"] == "cifar10") & (i21k["res"] == 384)]["value"].iloc[0]
    assert headline[(row, "vit-b/16-i21k (paper)")] == f"{paper_c10:.2f}"
    # another model's --compare column (issue 45: the report dropped it): the paper's cell on each dataset
    assert headline[(row, "bit-l (paper)")].startswith("99.37")
    # few-shot at 10 shots where a model has them, else its most, said in the cell
    assert headline[("vit-ti/16 (random init)† · CIFAR-10", "few-shot, 10-shot")].startswith("35.00 ± 7.07")
    pre = "vit-ti/16 (vit-ti16-digits [9e9e9e9e]) · CIFAR-10"
    assert headline[(pre, "few-shot, 10-shot")].startswith("60.50 ± 0.71")


def test_a_summary_of_one_protocol_is_a_row_per_model_and_a_column_per_dataset(tmp_path):
    results = tmp_path / "results"
    for model, sha, base in (("vit-b/16", "b1" * 32, 0.6), ("vit-s/16", "51" * 32, 0.5)):
        for dataset, extra in (("cifar10", 0.1), ("pets", 0.0)):
            for seed in (0, 1):
                write_run(results, f"{model[-4:-3]}-{dataset}-{seed}", {"accuracy": base + extra + seed / 100},
                          model=model, weights_sha256=sha, dataset=dataset, seed=seed, shots=10, protocol="fewshot",
                          protocol_version="fewshot-lsr/3", hparams={"fewshot_l2": "1024", "res": 224})  # fmt: skip
    store.ingest_pending(store.connect(results), results)
    headline = summary.summarise(store.read_results(results)).headline
    assert headline.title == "Headline numbers: few-shot, 10-shot top-1 accuracy (%)"
    assert headline.columns == ["CIFAR-10", "Oxford-IIIT Pets"]
    assert headline.rows == ["vit-b/16 (ViT-B_16 [b1b1b1b1])", "vit-s/16 (ViT-B_16 [51515151])"]
    assert round(headline.cells[("vit-s/16 (ViT-B_16 [51515151])", "Oxford-IIIT Pets")].mean, 2) == 50.5


def test_a_headline_whose_cells_all_show_another_shot_count_is_titled_with_it(tmp_path):
    """Issue 89: a store of 25-shot runs alone was titled "few-shot, 10-shot" over 25-shot values."""
    results = tmp_path / "results"
    for dataset in ("cifar10", "pets"):
        for seed in (0, 1):
            write_run(results, f"{dataset}-{seed}", {"accuracy": 0.5 + seed / 100}, model="vit-b/16",
                      weights_sha256="b1" * 32, dataset=dataset, seed=seed, shots=25, protocol="fewshot",
                      protocol_version="fewshot-lsr/3", hparams={"fewshot_l2": "1024", "res": 224})  # fmt: skip
    store.ingest_pending(store.connect(results), results)
    headline = summary.summarise(store.read_results(results)).headline
    assert headline.columns == ["few-shot, 25-shot"], headline.columns
    assert all("shot" not in cell.marks for cell in headline.cells.values())
    assert not any("no 10-shot runs" in f for f in headline.footnotes), headline.footnotes


def summary_cells(summary: str) -> dict[tuple[str, str], str]:
    header = re.search(r"<thead><tr><th></th>(.*?)</tr>", summary, flags=re.S).group(1)
    columns = [html.unescape(re.sub(r"<[^>]+>", "", c)) for c in re.findall(r"<th[^>]*>.*?</th>", header)]
    cells = {}
    tbody = summary[summary.index("<tbody>") :]
    for row, body in re.findall(r"<tr><th>(.*?)</th>(.*?)</tr>", tbody, flags=re.S):
        for col, cell in zip(columns, re.findall(r"<td[^>]*>(.*?)</td>", body), strict=True):
            if cell:
                cells[(html.unescape(row), col)] = html.unescape(re.sub(r"<[^>]+>", "", cell))
    return cells


def test_paths_on_the_users_disk_stay_off_the_page_unless_asked(cli, stored, tmp_path):
    root = str(stored.parent.resolve())
    code, _, err = cli("report", "--out", tmp_path / "r.html", "--results", stored)
    assert code == 0, err
    page = (tmp_path / "r.html").read_text()
    assert root not in page  # results, data and weights folders are all under it
    assert "&lt;weights-dir&gt;/ViT-B_16.npz" in page and "&lt;results&gt;/vitbench.duckdb" in page
    assert "--show-paths shows them" in page
    assert "ab12cd34ab12" in page  # the weights' fingerprint stays: it says what ran, not where it lies
    code, _, err = cli("report", "--out", tmp_path / "full.html", "--results", stored, "--show-paths")
    assert code == 0, err
    full = (tmp_path / "full.html").read_text()
    assert f"{root}/weights/ViT-B_16.npz" in full and "&lt;weights-dir&gt;" not in full


def test_a_store_with_nothing_in_it_says_so(cli, tmp_path):
    out = tmp_path / "r.html"
    code, text, err = cli("report", "--out", out, "--results", tmp_path / "none")
    assert code == 0, err
    assert "This store holds no results yet" in out.read_text()


def test_the_report_reads_while_a_run_holds_the_database(cli, tmp_path):
    """Another process holds the database for writing: the report reads the shards meanwhile."""
    stored = build_store(tmp_path / "results")
    db = stored / store.DB_NAME
    before = db.stat().st_mtime_ns
    hold = f"import duckdb, time; c = duckdb.connect({str(db)!r}); print('held', flush=True); time.sleep(60)"
    holder = subprocess.Popen([sys.executable, "-c", hold], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        code, _, err = cli("report", "--out", tmp_path / "r.html", "--results", stored)
        assert code == 0, err
        assert sections((tmp_path / "r.html").read_text())[:2] == ["summary", "fewshot"]
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


def table_values(dom: str, table_id: str) -> dict[tuple[str, int], float]:
    body = dom[dom.index(f'id="{table_id}"') :]
    body = body[: body.index("</table>")]
    values = {}
    for row in re.findall(r"<tr><th>(.*?)</th>(.*?)</tr>", body, flags=re.S):
        for i, cell in enumerate(re.findall(r"<td[^>]*?>", row[1])):
            number = re.search(r'data-value="([^"]+)"', cell)
            if number:
                values[(html.unescape(row[0]), i)] = float(number.group(1))
    return values


# Run inside the page (the test's copy, its hash added to the policy): what a person at 1400 px would
# meet — anything reaching past the window's right edge, a table that scrolls sideways in its box, a
# header or cell whose text is wider than it (it overlaps its neighbour) — which sections the page
# has, every figure line drawn (its SVG id), and every resource it fetched. Its answer lands in
# <body data-probe>.
PROBE = """
const width = document.documentElement.clientWidth;
const outside = [...document.body.querySelectorAll("*")]
  .filter(e => !(e.parentElement && e.parentElement.closest("div.scroll")))
  .filter(e => e.getBoundingClientRect().right > width + 1).map(e => e.tagName + (e.id ? "#" + e.id : ""));
const overflowing = [...document.querySelectorAll("table.view th, table.view td")]
  .filter(c => c.scrollWidth > c.clientWidth + 1).map(c => c.textContent.slice(0, 80));
const lines = [...document.querySelectorAll('figure [id^="vitbench-line-"]')]
  .filter(e => e.getBoundingClientRect().width > 0).map(e => e.closest("figure").id + "/" + e.id);
document.body.dataset.probe = JSON.stringify({width: width, pageWidth: document.documentElement.scrollWidth,
  outside: outside.slice(0, 20), sections: [...document.querySelectorAll("section")].map(s => s.id),
  scrolls: [...document.querySelectorAll("div.scroll")].filter(d => d.scrollWidth > d.clientWidth + 1)
    .map(d => d.querySelector("table").id), overflowing: overflowing.slice(0, 20), lines: lines,
  fetched: performance.getEntriesByType("resource").map(r => r.name)});
"""


def probed(page: str) -> str:
    script = SCRIPT + PROBE
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    policy = re.sub(r"'sha256-[^']+'", f"'sha256-{digest}'", CONTENT_SECURITY_POLICY)
    assert page.count(CONTENT_SECURITY_POLICY) == 1 and page.count(f"<script>{SCRIPT}</script>") == 1
    page = page.replace(CONTENT_SECURITY_POLICY, policy)
    return page.replace(f"<script>{SCRIPT}</script>", f"<script>{script}</script>")


def test_the_report_in_a_real_browser(cli, stored, tmp_path):
    binary = browser()
    page = tmp_path / "report.html"
    compare = ["--compare", "bit-l", "--compare", "vit-b/16-i21k"]
    code, _, err = cli("report", "--out", page, *compare, "--results", stored)
    assert code == 0, err
    assert page.stat().st_size < 5_000_000
    # served from 127.0.0.1 (the test's own server), so that every request the page makes reaches it
    with Server() as server:
        server.state.files["/report.html"] = probed(page.read_text()).encode()
        loaded = headless(binary, "--window-size=1400,1000", "--virtual-time-budget=3000", "--dump-dom",
                          f"{server.url}/report.html")  # fmt: skip
        requests = list(server.state.requests)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert requests == [("GET", "/report.html", None)]  # the page, and nothing it asked for
    console = [line for line in loaded.stderr.splitlines() if ":CONSOLE" in line]
    assert not console, console  # no error (a request the policy refused would be one), no warning, no log line
    probe = json.loads(html.unescape(re.search(r'data-probe="([^"]*)"', loaded.stdout).group(1)))
    assert probe["fetched"] == []  # nothing loaded from anywhere
    assert probe["width"] == 1400 and probe["pageWidth"] <= 1400 and probe["outside"] == [], probe
    assert probe["scrolls"] == [] and probe["overflowing"] == [], probe  # every table fits, no label overlaps
    assert probe["sections"] == sections(page.read_text()) and probe["sections"][0] == "summary"
    assert {"fewshot", "finetune", "eval", "knn", "linear", "pretrain", "provenance"} <= set(probe["sections"])
    # the cells the browser shows are the numbers `vitbench table --protocol finetune --format csv` gives
    code, csv, _ = cli("table", "--protocol", "finetune", *compare, "--format", "csv", "--results", stored)
    table = pd.read_csv(io.StringIO(csv)).dropna(subset=["mean"])
    measured = set(table.loc[table["source"] == "vitbench", "row"])
    table = table[table["row"].isin(measured | {PAPER_COST_ROW})]  # the report shows the rows measured (and cost)
    shown = table_values(loaded.stdout, "finetune-table")
    header = re.search(r'id="finetune-table".*?<thead><tr><th></th>(.*?)</tr>', loaded.stdout, flags=re.S).group(1)
    columns = [html.unescape(re.sub(r"<[^>]+>", "", c)) for c in re.findall(r"<th[^>]*>.*?</th>", header)]
    expected = {(r.row, columns.index(r.column)): float(f"{r.mean:.6g}") for r in table.itertuples()}
    assert shown == expected and len(shown) >= 6
    # clicking a column's header (what the page's #sort link does) orders the rows by it
    sorted_dom = headless(
        binary, "--virtual-time-budget=3000", "--dump-dom", page.as_uri() + "#sort=finetune-table:1"
    ).stdout
    order = [
        v
        for (row, i), v in sorted(
            table_values(sorted_dom, "finetune-table").items(), key=lambda kv: _row_position(sorted_dom, kv[0][0])
        )
        if i == 0
    ]
    assert order == sorted(order, reverse=True) and len(order) >= 2
    artefacts = Path(os.environ.get("VITBENCH_TEST_ARTIFACTS", tmp_path))
    artefacts.mkdir(parents=True, exist_ok=True)
    shot = artefacts / "report.png"
    headless(binary, f"--screenshot={shot}", "--window-size=1400,2400", page.as_uri())
    for _ in range(20):  # the file appears when the browser has written it
        if shot.exists() and shot.stat().st_size:
            break
        time.sleep(0.1)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


def _row_position(dom: str, row: str) -> int:
    body = dom[dom.index('id="finetune-table"') :]
    return body.index(f"<tr><th>{html.escape(row, quote=False)}</th>")


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


def test_hidden_paths_never_touch_the_pages_markup():
    """Before: a data folder named /style turned `</style>` into `<&lt;data-dir&gt;>` (a blank page),
    /td broke the table's cells and /script the page's script (issue 49, item 5)."""
    from vitbench.views.report.private_paths import DATA, redact

    page = (
        "<html><head><style>td { color: red }</style><script>let a = 1;</script></head><body><table><tr>"
        '<td title="data /style/imagenet">/td/cifar10</td><td>/script</td></tr></table></body></html>'
    )
    roots = [("/style", DATA), ("/td", DATA), ("/script", DATA)]
    found = redact(page, roots)
    markup = ["<style>", "</style>", "<script>", "</script>", "<td ", "</td>", "<table>"]
    assert all(found.count(tag) == page.count(tag) for tag in markup)
    assert 'title="data &lt;data-dir&gt;/imagenet"' in found and ">&lt;data-dir&gt;/cifar10</td>" in found
    assert "<td>&lt;data-dir&gt;</td>" in found
