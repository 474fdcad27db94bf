"""What tells stored runs apart, and how a view names it: the one rule every view groups by.

A run's *setting* is its hparams without what differs between the runs of one setting (the seed,
an LR sweep's stages, the splits they learned from). Runs are one cell when they share the backbone
(model, weights, random init), the dataset, the protocol and its version, and the setting: a cell
is a mean over seeds (and an LR sweep's stages), never over settings. A column (a table's), a line
(a figure's) or a unit (`compare`'s) is named by the settings that differ among the runs it stands
beside — `res=64`, `k=20`, `precision=bf16`, `decoder=nvjpeg` — and only by those that another
named setting does not already explain (the preprocessing text follows from `res`), never cut; a
run decoded by nvjpeg says so wherever it is shown (not the reference's pixels).
`views/columns.py` labels every run by this rule; the tables, figures, the report, `compare`, the
run summary and `vitbench.results` read those labels (docs/tables.md, "One number, one meaning").
"""

from __future__ import annotations

import json

import pandas as pd

from vitbench.protocols.registry import protocols
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


# what a run that does not record a setting ran with (the key holds only where it is not the default)
ABSENT = {"precision": "fp32", "decoder": "libjpeg"}
# a setting whose stored text explains itself at length, named by its first word in a label
FIRST_WORD = {"decoder"}
# settings a label names wherever a run records them, differing or not: not the reference's pixels
ALWAYS_NAMED = {"decoder"}


def value_text(value, name: str | None = None) -> str:
    """A setting's value as a label writes it, whole (a label is never cut): `decoder=nvjpeg`,
    `precision=fp32` where the run recorded none."""
    if value is None:
        return ABSENT.get(name or "", "none")
    if isinstance(value, list | dict):
        return json.dumps(value, sort_keys=True)
    return str(value).split(" ", 1)[0] if name in FIRST_WORD else str(value)


def setting_text(protocol: str, name: str, value) -> str:
    """`name=value`, or as the protocol's axis writes it when it is that axis (k-NN's `knn_k`: `k=20`)."""
    axis = getattr(protocols().get(protocol), "axis", None)
    return axis.setting(value) if axis is not None and axis.name == name else f"{name}={value}"


def explaining(keys: set[str], settings: list[dict]) -> list[str]:
    """Of the setting names that differ among `settings`, those a label names: the short ones
    first, each kept unless the ones kept already determine it (`preprocessing` follows from
    `res` when both differ together). In name order."""

    def width(name: str) -> tuple[int, str]:
        return max(len(value_text(s.get(name), name)) for s in settings), name

    kept: list[str] = []
    for name in sorted(keys, key=width):
        seen: dict[tuple, str] = {}
        determined = bool(kept)
        for s in settings:
            known = tuple(value_text(s.get(k), k) for k in kept)
            if seen.setdefault(known, value_text(s.get(name), name)) != value_text(s.get(name), name):
                determined = False
                break
        if not determined:
            kept.append(name)
    return sorted(kept)


def differing(settings: list[dict]) -> set[str]:
    """The setting names whose values differ among `settings`, a name's absence counting as a value."""
    names = set().union(*settings) if settings else set()
    return {k for k in names if len({json.dumps(s.get(k), sort_keys=True, default=str) for s in settings}) > 1}


def default_columns(df: pd.DataFrame, finals: pd.Series) -> tuple[pd.Series, pd.Series, pd.Series]:
    """One label per run (row of `df`: its column), its condition and its series. The condition is
    what the column measured apart from the backbone (protocol, shots, version and the settings its
    label names), the same for two columns that differ in model or weights alone (what `--ci`'s
    marks and `compare` pair). The series is the named settings other than the protocol's axis
    (`res=64`): a figure's line runs along the axis within one series. `finals` marks the runs with a
    scored accuracy. The work is done once per distinct (column identity, hparams text), then
    mapped back to the runs."""
    codes, texts = pd.factorize(df["hparams"], use_na_sentinel=False)
    settings = [run_setting(t) for t in texts]
    work = pd.DataFrame({"base": df["base"].to_numpy(), "dataset": df["dataset"].to_numpy(), "code": codes})
    splitting: dict[tuple, set[str]] = {}  # base key → hparams that differ within one dataset
    distinct_finals = work[finals.to_numpy()].drop_duplicates(["base", "dataset", "code"])
    for (base, _dataset), part in distinct_finals.groupby(["base", "dataset"], sort=False):
        # a setting recorded only where it is not the default (precision: bf16, decoder: nvjpeg) differs
        # from its absence: before, runs with and without it fell into one column
        splitting.setdefault(base, set()).update(differing([settings[code] for code in set(part["code"])]))
    named: dict[tuple, list[str]] = {}
    for base, differ in splitting.items():
        of_base = [settings[c] for c in set(work.loc[work["base"] == base, "code"])]
        named[base] = explaining(differ - {"smoke"}, of_base)
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
        label = model  # the weights are in the provenance footnote (and a mark where two columns look alike)
        identities.append((model, sha, random_init))
        if shots is not None:
            label += f" · {shots}-shot"
        elif several_protocols:
            label += f" · {protocol}"
        if len(versions[base[:-1]]) > 1:
            label += f" · {version}"
        keys = sorted(set(named.get(base, [])) | (ALWAYS_NAMED & set(setting)))
        if keys:
            label += " · " + ", ".join(setting_text(protocol, k, value_text(setting.get(k), k)) for k in keys)
        label += (RANDOM_MARK if random_init else "") + (SMOKE_MARK if _is_smoke(texts[code]) else "")
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
    return label, condition, line


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
            marks.setdefault(identity, f" ({'abcdefghijklmnopqrstuvwxyz'[len(marks) % 26]})")
    return [label + marks.get(identity, "") for label, identity in zip(labels, identities, strict=True)]
