"""The check of the model a server's replies name (finecap.boost.served_model) across runs: the model the answers of
an earlier run record (ServedModel.expect) is held to the rule within a run."""

import logging

import pytest

from finecap.boost.engine import FatalBackendError
from finecap.boost.served_model import ServedModel


def _served() -> ServedModel:
    return ServedModel("m", "boost.llm_model", who="boost.llm", advice="serve one model")


def test_recorded_answers_make_the_first_model_and_a_reply_of_another_stops_naming_both():
    served = _served()
    served.expect("m-2024-08-06", where="the 3 answers kept", why="mixed", afresh="start afresh")
    assert (served.first, served.named) == ("m-2024-08-06", None)  # no reply of this run yet
    served.check("m-2024-08-06")
    assert served.named == "m-2024-08-06"
    served.expect("m-2024-08-06", where="the 2 answers of another step", why="mixed", afresh="afresh")  # the same
    with pytest.raises(FatalBackendError) as e:
        served.check("m")  # the undated name is another name, as within a run
    assert str(e.value) == ("a server answered as model 'm', but the 3 answers kept came from model 'm-2024-08-06' "
                            "(boost.llm_model='m'): mixed; serve 'm-2024-08-06' again to continue, or start "
                            "afresh")  # fmt: skip
    assert (served.first, served.named) == ("m-2024-08-06", "m-2024-08-06")


def test_recorded_answers_of_another_model_than_this_runs_replies_or_records_are_refused():
    served = _served()
    served.check("m")  # this run's replies named m (a step before)
    with pytest.raises(FatalBackendError) as e:
        served.expect("cheap", where="the 2 answers kept", why="mixed", afresh="start afresh")
    # this run kept none of m's answers (told by kept()): the cache holds cheap's alone, so serving it continues
    assert str(e.value) == ("the 2 answers kept came from model 'cheap', but a server answered as 'm' "
                            "(boost.llm_model='m'): mixed; serve 'cheap' again to continue, or start "
                            "afresh")  # fmt: skip
    served = _served()
    served.expect("m", where="the 2 answers of step 'blend'", why="mixed", afresh="start afresh")
    with pytest.raises(FatalBackendError) as e:
        served.expect("cheap", where="the 4 answers of step 'holistic'", why="mixed", afresh="start afresh")
    # the cache holds both models' answers: serving either would stop at the other's, so only starting afresh helps
    assert str(e.value) == ("the 4 answers of step 'holistic' came from model 'cheap', but the 2 answers of step "
                            "'blend' came from model 'm' (boost.llm_model='m'): mixed; the cache now holds answers of "
                            "'m' and 'cheap': serving one stops at another's, so start afresh")  # fmt: skip
    assert (served.first, served.named) == ("m", None)


def test_a_clash_after_this_run_kept_its_servers_answers_says_the_cache_holds_both_models():
    """The advice said "serve 'cheap' again to continue" when this run had already cached its server's answers (of m):
    a run serving cheap again stops at m's. The models this run kept (kept()) are the cache's too."""
    served = _served()
    served.check("m")
    served.kept("m")  # the engine and the judge keep each answer of m with its model
    served.kept(None)  # a reply that named no model: nothing to say of it
    assert served.cached == ["m"]
    with pytest.raises(FatalBackendError) as e:
        served.expect("cheap", where="the 2 answers kept", why="mixed", afresh="start afresh")
    assert str(e.value) == ("the 2 answers kept came from model 'cheap', but a server answered as 'm' "
                            "(boost.llm_model='m'): mixed; the cache now holds answers of 'm' and 'cheap': serving "
                            "one stops at another's, so start afresh")  # fmt: skip
    assert "again to continue" not in str(e.value)


def test_recorded_answers_of_a_model_other_than_the_one_asked_for_are_warned_of(caplog):
    caplog.set_level(logging.WARNING)
    for recorded, warned in (("m-2024-08-06", False), ("other", True)):
        caplog.clear()
        _served().expect(recorded, where="the 3 answers kept", why="mixed", afresh="start afresh")
        said = [r.getMessage() for r in caplog.records]
        assert said == ([f"boost.llm: the 3 answers kept came from model {recorded!r}, not boost.llm_model='m'; they "
                         "are used and reported under boost.llm_model"] if warned else [])  # fmt: skip
