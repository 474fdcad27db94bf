"""Names that reach a terminal, a figure or a spreadsheet are data, never instructions (issue 71,
items 14-16). A shared store may hold any model, weights or dataset name: before, a dataset named
`m$\\undefinedcmd{$x` ended `report` and every `plot` in a matplotlib mathtext traceback (no report
written); an OSC 52 sequence in a name reached the terminal raw (it wrote the clipboard and cleared
the screen); CSV cells began with `=` (a formula to a spreadsheet); a newline split a Markdown row
and a `[x](javascript:…)` link went through."""

from __future__ import annotations

import csv
import io
import logging

import pytest
from test_tables import FIXED, write_run

from vitbench import store
from vitbench.host.logs import configure_logging

MATHTEXT = "m$\\undefinedcmd{$x"
OSC52 = "clip\x1b]52;c;SGVsbG8=\x07board\x1b[2J"
FORMULA = '=HYPERLINK("http://example.invalid","open")'
MARKDOWN = "a|b\n[x](javascript:alert(1))"
NAMES = (MATHTEXT, OSC52, FORMULA, MARKDOWN)


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """Few-shot runs of a model named like a formula on datasets named like each hostile string."""
    results = tmp_path_factory.mktemp("hostile") / "results"
    for i, name in enumerate(NAMES):
        for seed in (0, 1):
            for shots in (1, 5):  # two values: the few-shot figure draws a line per dataset
                write_run(results, f"h{i}-{seed}-{shots}", {"accuracy": 0.5 + i / 10 + seed / 100 + shots / 100},
                          seed=seed, dataset=name, model="@SUM(1+1)*cmd|' /C calc'!A0", weights="random",
                          weights_sha256="random", random_init=True, protocol="fewshot",
                          protocol_version="fewshot-lsr/2", device_seconds=10.0,
                          hparams={"fewshot_l2": "1024", "res": 224, "shots": shots})  # fmt: skip
    con = store.connect(results)
    store.ingest_pending(con, results)
    con.close()
    assert FIXED  # the other fields: test_tables' fixed run
    return results


def _no_raw_controls(text: str) -> None:
    assert "\x1b" not in text and "\x07" not in text, repr(text[:400])


def test_figures_and_the_report_draw_names_as_written(cli, hostile, tmp_path):
    code, _, err = cli("plot", "--out", tmp_path / "plots", "--results", hostile)
    assert code == 0 and "Traceback" not in err and list((tmp_path / "plots").glob("*.png")), err
    code, _, err = cli("report", "--out", tmp_path / "r.html", "--results", hostile)
    assert code == 0 and (tmp_path / "r.html").is_file() and "Traceback" not in err, err


@pytest.mark.parametrize("fmt", ["rich", "md", "csv", "latex"])
def test_no_control_character_reaches_the_terminal_or_a_file(cli, hostile, fmt):
    code, out, err = cli("table", "--format", fmt, "--results", hostile)
    assert code == 0, err
    _no_raw_controls(out)
    _no_raw_controls(err)
    assert "x1b" in out and "52;c;SGVsbG8=" in out  # shown (\\x1b; in LaTeX its backslash escaped), not dropped


def test_csv_cells_never_start_a_formula(cli, hostile, tmp_path):
    code, out, _ = cli("table", "--format", "csv", "--results", hostile)
    assert code == 0
    exported = tmp_path / "runs.csv"
    assert cli("export", "--format", "csv", "--out", exported, "--results", hostile)[0] == 0
    for text in (out, exported.read_text()):
        cells = [cell for row in csv.reader(io.StringIO(text)) for cell in row]
        starts = [c for c in cells if c[:1] in ("=", "+", "-", "@", "\t", "\r")]
        for cell in starts:
            float(cell)  # only numbers may start so
        assert any(c.startswith("'=HYPERLINK") for c in cells) or any(c.startswith("'@SUM") for c in cells)


def test_a_markdown_row_stays_one_row_and_links_stay_text(cli, hostile):
    code, out, _ = cli("table", "--format", "md", "--results", hostile)
    assert code == 0
    rows = [line for line in out.splitlines() if line.startswith("|")]
    widths = {line.replace("\\|", "").count("|") for line in rows}
    assert len(widths) == 1, rows  # every row has the header's cells: no newline split one
    assert "[x](javascript:" not in out and "[x\\](javascript:" in out  # "](" escaped: text, no link


def test_a_log_line_shows_control_characters(capsys):
    configure_logging()
    logging.getLogger("vitbench").warning("images/%s.jpg: cannot be decoded", OSC52)
    err = capsys.readouterr().err
    _no_raw_controls(err)
    assert "\\x1b]52;c;SGVsbG8=\\x07board" in err
