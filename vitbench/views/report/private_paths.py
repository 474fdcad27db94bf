"""Paths on the user's disk, kept out of a page they may forward: each data folder, weights
folder, the results folder and the home folder are named by a placeholder (`<data-dir>/imagenet`,
`<weights-dir>/ViT-B_16.npz`, `<results>`, `~`), which the page explains once. The weights'
and data's fingerprints stay: they identify what ran without saying where it lies."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pandas as pd

DATA, WEIGHTS, RESULTS, HOME = "<data-dir>", "<weights-dir>", "<results>", "~"


def private_roots(df: pd.DataFrame, results: Path) -> list[tuple[str, str]]:
    """(absolute folder, placeholder), the longest first, so a weights folder inside a data folder
    is named as the weights folder."""
    roots: dict[str, str] = {}
    for folder in df["data_dir"].dropna().unique() if "data_dir" in df else ():
        roots[str(folder).rstrip("/")] = DATA
    for weights in df["weights"].dropna().unique() if "weights" in df else ():
        if str(weights).startswith("/"):
            roots.setdefault(str(Path(str(weights)).parent), WEIGHTS)
    roots[str(results.resolve())] = RESULTS
    roots.setdefault(str(Path.home()), HOME)
    return sorted(((k, v) for k, v in roots.items() if k.strip("/")), key=lambda kv: len(kv[0]), reverse=True)


_TAG = re.compile(r"(<[^>]*>)")  # markup, split from the text between it
_QUOTED = re.compile(r'(=")([^"]*)(")')  # an attribute's value inside a tag (hover texts)


def redact(page: str, roots: list[tuple[str, str]]) -> str:
    """`page` (HTML) with every root replaced by its placeholder where it is a whole path or starts
    one: never a root inside a longer name (`/data` in `/database`, or in `imagenet/data`), and only
    in the page's text and attribute values, never in its markup (a data folder named `/style` had
    turned `</style>` into `<&lt;data-dir&gt;>` and the page rendered blank)."""

    replacements = [  # compiled once: the page has a text part between every two tags
        # a replacement string: backslashes doubled
        (re.compile(r"(?<![\w.-])" + re.escape(form) + r"(?![\w.-])"), html.escape(placeholder).replace("\\", "\\\\"))
        for root, placeholder in roots
        for form in dict.fromkeys((root, html.escape(root)))
    ]

    def in_text(text: str) -> str:
        for pattern, shown in replacements:
            text = pattern.sub(shown, text)
        return text

    parts = _TAG.split(page)
    for i, part in enumerate(parts):  # odd positions are tags
        parts[i] = _QUOTED.sub(lambda m: m[1] + in_text(m[2]) + m[3], part) if i % 2 else in_text(part)
    return "".join(parts)


def explanation(roots: list[tuple[str, str]]) -> str:
    """The sentence that says what the placeholders stand for, without the paths."""
    used = list(dict.fromkeys(p for _, p in roots if p != HOME))
    names = {DATA: "a --data-dir", WEIGHTS: "a weights file's folder", RESULTS: "the results folder"}
    said = "; ".join(f"{p} is {names[p]}" for p in used)
    return f"Paths are shown without your disk's folders ({said}; ~ your home folder): --show-paths shows them."
