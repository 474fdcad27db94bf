"""`--where` on times and numbers (issue 49, item 4): an ISO time compares as a time, a word on a
numeric field or an unreadable date is one line, never a silent text comparison."""

import pandas as pd
import pytest

from vitbench.errors import UserError
from vitbench.store.query import apply_where


@pytest.fixture
def runs() -> pd.DataFrame:
    finished = pd.to_datetime(["2026-11-25 18:30:00", "2026-11-25 19:30:00", "2026-11-26 08:00:00"])
    return pd.DataFrame(
        {"run_key": ["a", "b", "c"], "finished_at": finished, "shots": [1, 10, 25], "model": ["x", "y", "z"]}
    )


def keys(df: pd.DataFrame) -> set[str]:
    return set(df["run_key"])


def test_an_iso_time_selects_by_time_with_a_t_or_a_space(runs):
    # as text, '2026-11-25 19:30:00' < '2026-11-25T19:02:00' (' ' sorts before 'T'): b was selected
    assert keys(apply_where(runs, ["finished_at<2026-11-25T19:02:00"])) == {"a"}
    assert keys(apply_where(runs, ["finished_at<2026-11-25 19:02:00"])) == {"a"}
    assert keys(apply_where(runs, ["finished_at>=2026-11-25T19:02:00+00:00"])) == {"b", "c"}
    assert keys(apply_where(runs, ["date>=2026-11-26"])) == {"c"} and keys(apply_where(runs, ["date<2026-11-26"])) == {
        "a",
        "b",
    }


@pytest.mark.parametrize(
    "clause, message",
    [
        ("shots>1x", r"--where shots>1x: shots holds numbers; expected a number"),
        ("date>=yesterday", r"--where date>=yesterday: expected a date \(2026-11-25\) or an ISO time"),
        ("finished_at<soon", r"--where finished_at<soon: expected a date"),
    ],
)
def test_a_value_the_field_cannot_hold_is_one_line(runs, clause, message):
    with pytest.raises(UserError, match=message):
        apply_where(runs, [clause])


def test_numbers_and_text_still_compare_as_before(runs):
    assert keys(apply_where(runs, ["shots>=10"])) == {"b", "c"} and keys(apply_where(runs, ["model>x"])) == {"b", "c"}


def test_a_stored_setting_is_a_field_by_its_bare_name():
    """Few-shot's shots is one of its runs' hparams (issue 48): `shots=10` selects as it did when it
    was a column of its own, in every command that takes --where (export reads no axis columns)."""
    runs = pd.DataFrame({"run_key": ["a", "b", "c"], "hparams": ['{"shots": 10}', '{"shots": 25}', '{"res": 32}']})
    assert list(apply_where(runs, ["shots=10"])["run_key"]) == ["a"]
    assert list(apply_where(runs, ["shots>5"])["run_key"]) == ["a", "b"]
    with pytest.raises(UserError, match="--where colour: not a stored field"):
        apply_where(runs, ["colour=red"])
