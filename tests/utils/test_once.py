"""Notes said once per command (:mod:`finecap.utils.once`): a :class:`SaidOnce` says a key's note the first time in
a command; each call of the Python API is a command, whose notes are said as in a fresh process, and a call inside
another is part of it."""

from __future__ import annotations

from finecap.utils.once import SaidOnce, said_afresh


def test_a_note_is_said_once_in_a_command_and_again_in_the_next():
    said = SaidOnce()
    assert said.first("a") and not said.first("a") and said.first("b")  # outside any call: once per process
    with said_afresh():  # a call of the API: what was said before is said again, once
        assert said.first("a") and not said.first("a")
        with said_afresh():  # a call inside the call: part of it, forgets nothing
            assert not said.first("a")
        assert not said.first("a")
    with said_afresh():  # the next call
        assert said.first("a") and said.first("b")


def test_a_command_that_fails_still_ends():
    said = SaidOnce()
    try:
        with said_afresh():
            said.first("a")
            raise RuntimeError("the call failed")
    except RuntimeError:
        pass
    with said_afresh():  # not taken for a call inside the failed one
        assert said.first("a")
