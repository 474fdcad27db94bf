"""Validation at the door (issue: one bad input must not take the store down, nor store a number
that does not mean what its label says): values the store cannot hold, a resolution of 0, and a
dataset named twice."""

import pytest

import vitbench
from vitbench import store
from vitbench.errors import UserError

RUN = ("run", "--model", "vit-ti/16", "--weights", "random", "--dataset", "digits", "--res", "32", "--workers", "0")


@pytest.mark.parametrize(
    "args,message",
    [
        (("--seeds", "2147483648"), "--seeds 2147483648: expected integers from 0 to 2147483647"),
        (("--seeds", "99999999999999999999"), "--seeds 99999999999999999999: expected integers from 0 to"),
        (("--shots", "2147483648"), "--shots 2147483648: expected integers from 0 to 2147483647"),
        (("--protocol", "knn", "--knn-k", "2147483648"), "--knn-k 2147483648: expected integers from 0 to"),
    ],
)
def test_values_the_store_cannot_hold_are_refused_before_any_work(cli, results, args, message):
    """Before: the run wrote its shard, then DuckDB's INT64 -> INT32 conversion failed, and from then
    on every command on the results folder failed with that traceback."""
    code, _, err = cli(*RUN, *args, "--results", results)
    assert code == 2 and message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (results / "runs").exists() and not (results / store.DB_NAME).exists()
    code, _, err = cli(*RUN, "--shots", "1", "--seeds", "0", "--results", results)
    assert code == 0, err  # the folder still works


def test_the_python_api_refuses_them_too():
    with pytest.raises(UserError, match="--seeds 2147483648: expected integers"):
        vitbench.run(model="vit-ti/16", weights="random", datasets="digits", seeds=(2147483648,))


def test_res_zero_is_an_error_not_the_default(cli, results):
    """Before: `--res 0` quietly ran at the model's default resolution."""
    code, _, err = cli("run", "--model", "vit-ti/16", "--weights", "random", "--res", "0", "--results", results)
    assert code == 2 and "--res 0: expected a positive image size in pixels" in err


def test_a_dataset_named_twice_runs_once(cli, results, caplog):
    """Before: `digits,digits` printed [1/2], [2/2] and stored one run."""
    code, out, err = cli(*RUN, "--dataset", "digits,digits", "--shots", "1", "--seeds", "0", "--results", results,
                         "--dry-run")  # fmt: skip
    assert code == 0 and out.count("todo") == 1
    assert "1 runs planned" in err and "--dataset names digits more than once; each runs once" in err
