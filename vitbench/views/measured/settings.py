"""What tells stored runs apart, and how a view names it: the one rule every view groups by.

A run's *setting* is its hparams without what differs between the runs of one setting (the seed,
an LR sweep's stages, the splits they learned from). Runs are one cell when they share the backbone
(model, weights, random init), the dataset, the protocol and its version, and the setting: a cell
is a mean over seeds (and an LR sweep's stages), never over settings. A column (a table's), a line
(a figure's) or a unit (`compare`'s) is named by the settings that differ among the runs it stands
beside — `res=64`, `k=20`, `precision=bf16`, `decoder=nvjpeg` — and only by those that another
named setting does not already explain (the preprocessing text follows from `res`), never cut; a
run decoded by nvjpeg says so wherever it is shown (not the reference's pixels).
`views/measured/columns.py` labels every run by this rule; the tables, figures, the report, `compare`, the
run summary and `vitbench.results` read those labels (docs/tables.md, "One number, one meaning").
"""

from __future__ import annotations

import hashlib
import json

import pandas as pd

from vitbench.protocols.registry import protocols
from vitbench.provenance import LIBJPEG
from vitbench.store.query import json_field
from vitbench.views.cells import RANDOM_MARK, SMOKE_MARK

# hparams that differ between the runs of one setting (seeds, the LR sweep's stages)
PER_RUN_HPARAMS = {"stage", "splits", "lr_grid", "test_fingerprint", "seed", "recipe"}


def run_setting(hparams) -> dict:
    """A run's hparams without what differs between the runs of one setting; a sweep run belongs
    to the setting whose final runs chose their LR on the dev split."""
    h = dict(json_field(hparams))
    if h.get("stage") == "sweep":
        h["lr"] = "best-on-dev"
    return {k: v for k, v in h.items() if k not in PER_RUN_HPARAMS}


# settings the command sets for every backbone alike (`--res`, `--precision`, the decoder, `--gelu`):
# a label names them wherever they differ anywhere in the view, across backbones too (a plugin run
# only at 32 px says `res=32` beside DeiT-Ti's `res=32` and `res=224`); where they do not differ, the
# view says them once (`common_settings`). Any other setting is named where it differs and the
# backbone and the settings named do not already explain it (the preprocessing's mean and std, the
# representation, a fine-tuning recipe chosen per family follow from the backbone).
INPUT_SETTINGS = ("res", "precision", "decoder", "gelu")
# a setting whose stored text explains itself at length, named by its first word in a label
FIRST_WORD = {"decoder"}
# settings a label names wherever a run's value is not the default, differing or not: nvjpeg's
# pixels are not the reference's
NAMED_UNLESS_DEFAULT = {"decoder": LIBJPEG}


LABEL_VALUE_MAX = 80  # characters of a setting's value a label shows; a longer one is cut and hashed
LISTED_VALUE_MAX = 1000  # characters of a setting's value a list of a run's settings shows (the report's provenance)


def value_text(value, name: str | None = None, limit: int = LABEL_VALUE_MAX) -> str:
    """A setting's value as a label writes it: `decoder=nvjpeg`. One longer than `limit` is its start
    and its hash (`…#1a2b3c4d`): two values stay two labels, and a 50 MB setting no longer went into
    every label (`table` took 104 s and wrote 100 MB). Exports keep the value whole."""
    text = _whole_text(value, name)
    if len(text) <= limit:
        return text
    return f"{text[: limit - 12]}…#{hashlib.sha256(text.encode('utf-8', 'replace')).hexdigest()[:8]}"


def _whole_text(value, name: str | None) -> str:
    if value is None:
        return "none"
    if isinstance(value, list | dict):
        return json.dumps(value, sort_keys=True)
    return str(value).split(" ", 1)[0] if name in FIRST_WORD else str(value)


def settings_listed(settings: dict) -> str:
    """A run's settings, each whole where it is of a readable size (`precision=fp32, res=224`); a value
    over LISTED_VALUE_MAX characters is cut and hashed as a label cuts it (a 50 MB setting made a
    100 MB report page), and the text says which: `vitbench export` has every value whole."""
    text = ", ".join(f"{name}={value_text(value, limit=LISTED_VALUE_MAX)}" for name, value in settings.items())
    cut = [name for name, value in settings.items() if len(_whole_text(value, None)) > LISTED_VALUE_MAX]
    return text + (f" ({', '.join(cut)} cut: `vitbench export` has the whole value)" if cut else "")


def setting_text(protocol: str, name: str, value) -> str:
    """`name=value`, or as the protocol's axis writes it when it is that axis (k-NN's `knn_k`: `k=20`)."""
    axis = getattr(protocols().get(protocol), "axis", None)
    return axis.setting(value) if axis is not None and axis.name == name else f"{name}={value}"


def explaining(keys: set[str], settings: list[dict], identities: list | None = None) -> list[str]:
    """Of the setting names that differ among `settings`, those a label names: the input settings
    (INPUT_SETTINGS) always, then the others, short ones first, each kept unless what is known
    already determines it: the settings kept and, given `identities` (each setting's backbone), the
    backbone (`preprocessing` follows from `res` and the model; DeiT-Ti's representation from DeiT-Ti).
    In name order."""
    known_of = identities if identities is not None else [None] * len(settings)

    def width(name: str) -> tuple[int, str]:
        return max(len(value_text(s.get(name), name)) for s in settings), name

    kept = sorted(k for k in keys if k in INPUT_SETTINGS)
    for name in sorted(keys - set(kept), key=width):
        seen: dict[tuple, str] = {}
        for s, identity in zip(settings, known_of, strict=True):
            known = (identity, tuple(value_text(s.get(k), k) for k in kept))
            if seen.setdefault(known, value_text(s.get(name), name)) != value_text(s.get(name), name):
                kept.append(name)
                break
    return sorted(kept)


def differing(settings: list[dict]) -> set[str]:
    """The setting names whose values differ among `settings`, a name's absence counting as a value."""
    names = set().union(*settings) if settings else set()
    return {k for k in names if len({json.dumps(s.get(k), sort_keys=True, default=str) for s in settings}) > 1}


def default_columns(df: pd.DataFrame, finals: pd.Series) -> tuple[pd.Series, pd.Series, pd.Series, dict[str, str]]:
    """One label per run (row of `df`: its column), its condition and its series, and the input
    settings every column shares (`{"res": "224", "precision": "fp32", …}`: a view says them once).
    The names a label gives are the view's (`viewed_names`): every column names each of them that
    its runs record. The condition is what the column measured apart from the backbone (protocol,
    shots, version and those settings), the same for two columns that differ in model or weights
    alone: what `--ci`'s marks, the report and `compare` pair (views/statistics/significance.py). The series is
    the named settings other than the protocol's axis (`res=64`): a figure's line runs along the
    axis within one series. `finals` marks the runs with a scored accuracy. The work is done once
    per distinct (column identity, hparams text), then mapped back to the runs."""
    codes, texts = pd.factorize(df["hparams"], use_na_sentinel=False)
    settings = [run_setting(t) for t in texts]
    work = pd.DataFrame({"base": df["base"].to_numpy(), "dataset": df["dataset"].to_numpy(), "code": codes})
    distinct_finals = work[finals.to_numpy()].drop_duplicates(["base", "dataset", "code"])
    named = viewed_names(distinct_finals, settings)
    bases = list(dict.fromkeys(work["base"]))
    several_protocols = len({b[3] for b in bases}) > 1
    versions: dict[tuple, set[str]] = {}
    for base in bases:
        versions.setdefault(base[:-1], set()).add(base[-1])
    pairs = list(dict.fromkeys(zip(work["base"], work["code"], strict=True)))  # in order of first appearance
    labels, identities, conditions, series = [], [], [], []
    for base, code in pairs:
        model, sha, random_init, protocol, shots, version = base
        setting = settings[code]
        # the weights are in the provenance footnote (and a mark where two columns look alike); † with the model
        label = model + (RANDOM_MARK if random_init else "")
        identities.append((model, sha, random_init))
        if shots is not None:
            label += f" · {shots}-shot"
        elif several_protocols:
            label += f" · {protocol}"
        if len(versions[base[:-1]]) > 1:
            label += f" · {version}"
        keys = sorted(
            {k for k in named if k in setting}
            | {k for k, default in NAMED_UNLESS_DEFAULT.items() if setting.get(k, default) != default}
        )
        if keys:
            label += " · " + ", ".join(setting_text(protocol, k, value_text(setting.get(k), k)) for k in keys)
        label += SMOKE_MARK if _is_smoke(texts[code]) else ""
        labels.append(label)
        conditions.append(_condition(protocol, shots, version, {k: setting.get(k) for k in keys}, texts[code]))
        axis = getattr(protocols().get(protocol), "axis", None)
        series.append(
            ", ".join(
                setting_text(protocol, k, value_text(setting.get(k), k)) for k in keys if not axis or k != axis.name
            )
        )
    by_pair = dict(zip(pairs, zip(_told_apart(labels, identities), conditions, series, strict=True), strict=True))
    rows = [by_pair[p] for p in zip(work["base"], work["code"], strict=True)]
    label, condition, line = (pd.Series([r[i] for r in rows], index=df.index) for i in range(3))
    return label, condition, line, common_settings([settings[c] for c in set(distinct_finals["code"])], named)


def viewed_names(finals: pd.DataFrame, settings: list[dict]) -> set[str]:
    """The setting names the columns of a view name (`finals`: its distinct (base, dataset, code)
    with a scored accuracy, `settings` indexed by code): an input setting (INPUT_SETTINGS) that
    differs anywhere in the view (fine-tuning at 384 px beside eval at 224 px), and per dataset,
    protocol, version and shots the other settings that differ among its runs, across backbones,
    where the backbone and the names kept do not determine them (`explaining`); the union over the
    view, so that a setting that differs anywhere is named everywhere it is recorded."""
    everywhere = [settings[c] for c in dict.fromkeys(finals["code"])]
    named = {name for name in differing(everywhere) if name in INPUT_SETTINGS}
    # a group: one dataset, protocol, shots and version (a base without its backbone)
    groups = [(dataset, *base[3:]) for base, dataset in zip(finals["base"], finals["dataset"], strict=True)]
    rest = finals.assign(_group=groups)
    for _, part in rest.groupby("_group", sort=False):
        found = [settings[c] for c in part["code"]]
        named.update(explaining(differing(found) - {"smoke", "shots"}, found, [b[:3] for b in part["base"]]))
    return named


def common_settings(settings: list[dict], named: set[str]) -> dict[str, str]:
    """The input settings (INPUT_SETTINGS) that no label names because every run of the view has one
    value of them: said once under the table (`precision=fp32`), so that none is left to a default."""
    common: dict[str, str] = {}
    for name in INPUT_SETTINGS:
        values = {value_text(s[name], name) for s in settings if name in s}
        if name not in named and len(values) == 1:
            common[name] = values.pop()
    return common


def common_text(common: dict[str, str]) -> str | None:
    """The footnote that says the settings every column shares, or None where there are none."""
    return "every column: " + ", ".join(f"{k}={v}" for k, v in common.items()) if common else None


# settings the command sets for every backbone alike that a pair across backbones may still differ in:
# the legend says so beside the pair's p-value (each backbone at its own resolution is Table 2's way,
# so `res` is not among them; a preprocessing that follows from the model and `res` is the backbone's)
NOT_THE_BACKBONES = ("precision", "decoder", "gelu")


def pairing(protocol: str, shots, version: str, hparams) -> str:
    """What a cell must share with its baseline's cell (besides the dataset's test images) to be
    compared with it, as a researcher compares backbones (Table 2: each at its own resolution): the
    protocol, its version, the point on its axis (shots, k) and whether it is a smoke run. The
    backbone, weights, resolution, precision and decoder may differ (`also_differ` says which of the
    latter two did)."""
    setting = run_setting(hparams)
    parts = [str(protocol), str(version)]
    if shots is not None and not pd.isna(shots):
        parts.append(f"{int(shots)}-shot")
    axis = getattr(protocols().get(protocol), "axis", None)
    if axis is not None and axis.name != "shots" and axis.name in setting:
        parts.append(setting_text(protocol, axis.name, value_text(setting[axis.name], axis.name)))
    return " · ".join(parts + (["smoke"] if setting.get("smoke") else []))


def also_differ(protocol: str, cell: list[dict], base: list[dict], same_backbone: bool) -> list[str]:
    """The settings other than the backbone's own that a cell's runs and its baseline's differ in
    (`precision=bf16 vs fp32`): the command's (NOT_THE_BACKBONES), the protocol's options beyond its
    axis, and, between runs of one backbone at one resolution, the preprocessing."""
    known = protocols().get(protocol)  # None: a protocol this checkout does not have
    options = set(known.Options.names()) - {"shots", "seeds", "knn_k"} if known is not None else set()
    names = set(NOT_THE_BACKBONES) | options
    if same_backbone and {value_text(s.get("res")) for s in cell + base} == {value_text(cell[0].get("res"))}:
        names.add("preprocessing")
    found = []
    for name in sorted(names):
        mine, theirs = {value_text(s.get(name), name) for s in cell}, {value_text(s.get(name), name) for s in base}
        if mine != theirs:
            found.append(f"{name}={'/'.join(sorted(mine))} vs {'/'.join(sorted(theirs))}")
    return found


def _is_smoke(hparams) -> bool:
    return bool(json_field(hparams).get("smoke"))


def _condition(protocol: str, shots: int | None, version: str, named: dict, hparams) -> str:
    """What a column measured apart from its backbone, in words (`fewshot · 10-shot · fewshot-lsr/3 ·
    res=96`): equal for two columns that differ in model or weights alone."""
    parts = [protocol, *([f"{shots}-shot"] if shots is not None else []), version]
    parts += [setting_text(protocol, k, value_text(v, k)) for k, v in named.items()]
    return " · ".join(parts + (["smoke"] if _is_smoke(hparams) else []))


def _told_apart(labels: list[str], identities: list[tuple]) -> list[str]:
    """Labels that two weights (or random and trained) would share get a mark each, (a), (b), …,
    in order of appearance; the provenance footnote says which weights a mark stands for."""
    owners: dict[str, list[tuple]] = {}
    for label, identity in zip(labels, identities, strict=True):
        if identity not in owners.setdefault(label, []):
            owners[label].append(identity)
    marks: dict[tuple, str] = {}
    for label, identity in zip(labels, identities, strict=True):
        if len(owners[label]) > 1:
            marks.setdefault(identity, f" ({letters(len(marks))})")
    return [label + marks.get(identity, "") for label, identity in zip(labels, identities, strict=True)]


def letters(n: int) -> str:
    """The n-th mark, as spreadsheets name columns: a … z, aa, ab, …. Never reused: the marks wrapped
    at 26, and a sweep of 30 checkpoints showed 26 columns, the other runs folded into them."""
    out = ""
    n += 1
    while n:
        n, r = divmod(n - 1, 26)
        out = chr(ord("a") + r) + out
    return out
