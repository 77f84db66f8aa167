"""``finecap.utils.system.environment_defaults``: variables set for a block where unset, removed when it ends; the
user's values, and values changed inside the block by someone else, are left as they are."""

from __future__ import annotations

import os

import pytest

from finecap.utils.system import environment_defaults

A, B = "FINECAP_TEST_ENV_A", "FINECAP_TEST_ENV_B"


@pytest.fixture(autouse=True)
def unset(monkeypatch):
    """Neither variable set at the start; both put back as they were after the test."""
    for name in (A, B):
        monkeypatch.setenv(name, "")  # recorded, so that teardown restores what was there before
        monkeypatch.delenv(name)


def test_a_variable_is_set_in_the_block_and_removed_after_even_when_it_raises():
    with pytest.raises(KeyError), environment_defaults({A: "1", B: "2"}):
        assert (os.environ[A], os.environ[B]) == ("1", "2")
        raise KeyError("the block failed")
    assert A not in os.environ and B not in os.environ


def test_the_users_value_wins_and_is_left_after_the_block(monkeypatch):
    monkeypatch.setenv(A, "mine")
    with environment_defaults({A: "1", B: "2"}):
        assert (os.environ[A], os.environ[B]) == ("mine", "2")
    assert os.environ[A] == "mine" and B not in os.environ


def test_a_value_changed_inside_the_block_is_not_removed():
    with environment_defaults({A: "1"}):
        os.environ[A] = "changed"
    assert os.environ[A] == "changed"


def test_overlapping_blocks_ended_in_either_order_leave_nothing():
    first, second = environment_defaults({A: "1"}), environment_defaults({A: "1"})
    first.__enter__()
    second.__enter__()  # finds A set: not its to remove
    first.__exit__(None, None, None)
    assert A not in os.environ
    second.__exit__(None, None, None)
    assert A not in os.environ


def test_an_empty_value_is_kept_unless_empty_counts_as_unset_and_is_put_back_after(monkeypatch):
    monkeypatch.setenv(A, "")
    with environment_defaults({A: "1"}) as added:  # empty is a value (CUDA_VISIBLE_DEVICES="": no GPU)
        assert os.environ[A] == "" and added == {}
    with environment_defaults({A: "1"}, empty_is_unset=True) as added:  # mlflow's URI, TQDM_DISABLE
        assert os.environ[A] == "1" and added == {A: "1"}
    assert os.environ[A] == ""  # as the block found it, not removed


def test_override_sets_the_users_value_for_the_block_and_gives_it_back(monkeypatch):
    monkeypatch.setenv(A, "mine")
    with environment_defaults({A: "1", B: "2"}, override=True) as added:
        assert (os.environ[A], os.environ[B]) == ("1", "2") and added == {A: "1", B: "2"}
    assert os.environ[A] == "mine" and B not in os.environ
