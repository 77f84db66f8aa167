"""The ``vllm`` judge (issue 66): the ``openai`` judge's prompts, parsing, cache and counters over an in-process
chat backend. Here with a stand-in backend (no vLLM): what it is asked, what it answers, re-asks and failures; the
real engine on a tiny chat LM runs in ``.venv-vllm`` (tests/engines/test_vllm_judge_engine.py)."""

from __future__ import annotations

import sqlite3

import pytest

from finecap.boost.engine import BackendError
from finecap.config import load
from finecap.judges import get_judge
from finecap.judges.base import CANNOT_ANSWER, Ask, JudgeFailed, JudgeUnavailable, Question
from finecap.judges.cache import AnswerCache
from finecap.utils.closing import UsedAfterClose

Q = Question("0/color", "What colour is the circle?", ("red", "blue", "green"), "red")
OPTIONS = ("blue", "red", "green", CANNOT_ANSWER)


class StandIn:
    """An in-process chat backend answering from a script: ``replies`` in order (an exception is a refusal)."""

    def __init__(self, *replies):
        self.replies, self.seen = list(replies), []

    def generate(self, tasks, images=()):
        self.seen.append([t.messages for t in tasks])
        reply = self.replies.pop(0)
        return [reply]

    def close(self):
        self.replies = None


def judge_with(backend, tmp_path=None, **options):
    cfg = load(None, ["judge.name=vllm", "judge.model=my-chat-lm", f"judge.cache={'true' if tmp_path else 'false'}"])
    extra = {"cache_path": tmp_path / "answers.sqlite"} if tmp_path else {}
    return get_judge("vllm", cfg, backend=backend, **extra, **options)


def test_asks_with_the_versioned_prompt_and_parses_the_letter():
    backend = StandIn("B")
    judge = judge_with(backend)
    assert judge.answer([Ask(Q, OPTIONS, "a red circle")]) == ["red"]
    (messages,) = backend.seen[0]
    assert [m["role"] for m in messages] == ["system", "user"] and "a red circle" in messages[-1]["content"]
    assert judge.identity()["judge"] == "vllm" and judge.identity()["model"] == "my-chat-lm"


def test_an_unparsable_answer_is_counted_failed_without_asking_the_engine_again():
    # the engine decodes greedily, one prompt a call: asked again, it gives the same text (the real engine's
    # tests/engines/test_vllm_judge_engine.py), yet the judge asked it judge.retries more times (3) for nothing
    backend = StandIn("no idea", "no idea", "no idea", "no idea")
    judge = judge_with(backend)
    (out,) = judge.answer([Ask(Q, OPTIONS, "a red circle")])
    assert isinstance(out, JudgeFailed) and "unparsable answer after 1 attempt(s)" in str(out), out
    assert len(backend.seen) == 1
    # what a results file and a training log say of it (Judge.tallies); an engine in process is never rate-limited
    assert judge.tallies() == {"calls": 1, "cache_hits": 0, "unparsable": 1, "failed": 1, "rate_limited": 0}


def test_a_prompt_vllm_refuses_fails_its_call():
    judge = judge_with(StandIn(BackendError("vLLM refused the request: prompt too long")))
    (out,) = judge.answer([Ask(Q, OPTIONS, "a red circle")])
    assert isinstance(out, JudgeFailed) and "refused" in str(out)


class Failing:
    """An in-process chat backend whose engine fails every call: raising ``error`` from ``generate`` (an engine core
    dead, out of memory: what boost's VllmBackend lets through), or returning it in the task's place (``returned``);
    ``calls`` counts the calls."""

    def __init__(self, error, returned=False):
        self.error, self.returned, self.calls = error, returned, 0

    def generate(self, tasks, images=()):
        self.calls += 1
        if self.returned:
            return [self.error]
        raise self.error

    def close(self):
        pass


@pytest.mark.parametrize(
    ("error", "returned"),
    [(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), False),
     (RuntimeError("EngineCore encountered an issue"), True),  # returned in the task's place, not raised
     (UsedAfterClose("judge.name=vllm: this backend was closed"), False)],
)  # fmt: skip
def test_an_engine_failing_every_call_stops_the_judge_after_max_consecutive_failures(error, returned):
    # the engine's errors stopped nothing: one raised (vLLM's EngineDeadError, a CUDA out of memory) escaped the
    # judge as a traceback of the first call, one returned was read as that prompt's refusal (an HTTP 400), which
    # answers the call, and every caption of every later step failed without the run stopping
    backend = Failing(error, returned)
    judge = judge_with(backend, max_consecutive_failures=3)
    asks = [Ask(Q, OPTIONS, f"a red circle {i}") for i in range(6)]
    below = judge.answer(asks[:2])  # below the limit: counted failures, each naming the engine's error
    assert all(isinstance(a, JudgeFailed) and str(error) in str(a) for a in below), below
    with pytest.raises(JudgeUnavailable) as stopped:
        judge.answer(asks[2:])
    message = str(stopped.value)
    assert message.startswith("judge vllm: 3 calls in a row got no answer from its in-process engine "
                              "(judge.max_consecutive_failures=3); its engine fails every call"), message  # fmt: skip
    assert message.endswith(f"Last error: the vLLM engine failed: {type(error).__name__}: {error}"), message
    assert backend.calls == 3 and judge.counts["failed"] == 2  # one engine call each; the third raised
    with pytest.raises(JudgeUnavailable):  # every call after it raises without asking the engine
        judge.answer(asks[:1])
    assert backend.calls == 3


def test_the_vllm_judge_reads_judge_max_consecutive_failures():
    cfg = load(None, ["judge.name=vllm", "judge.model=my-chat-lm", "judge.cache=false",
                      "judge.max_consecutive_failures=2"])  # fmt: skip
    judge = get_judge("vllm", cfg, backend=Failing(RuntimeError("CUDA out of memory")))
    assert isinstance(judge.answer([Ask(Q, OPTIONS, "a red circle")])[0], JudgeFailed)
    with pytest.raises(JudgeUnavailable, match=r"^judge vllm: 2 calls in a row .*max_consecutive_failures=2\)"):
        judge.answer([Ask(Q, OPTIONS, "a blue circle")])


def test_a_refusal_or_an_answer_between_engine_failures_resets_the_streak():
    # a prompt vLLM refuses (too long) is that prompt's own: it answers the call, as an HTTP 400 does, and so does an
    # answer; neither judge stops while calls are answered
    error = RuntimeError("CUDA out of memory")
    script = [error, error, BackendError("vLLM refused the request: prompt too long"), error, error, "B", error, error]

    class Mixed(StandIn):
        def generate(self, tasks, images=()):
            reply = self.replies.pop(0)
            if reply is error:  # raised; the refusal is returned, as boost's VllmBackend returns it
                raise reply
            return [reply]

    judge = judge_with(Mixed(*script), max_consecutive_failures=3)
    out = judge.answer([Ask(Q, OPTIONS, f"a red circle {i}") for i in range(len(script))])
    assert out[5] == "red" and sum(isinstance(a, JudgeFailed) for a in out) == 7
    assert "refused" in str(out[2]) and "out of memory" in str(out[7])


def test_answers_are_cached_and_not_asked_again(tmp_path):
    backend = StandIn("B")
    assert judge_with(backend, tmp_path).answer([Ask(Q, OPTIONS, "a red circle")]) == ["red"]
    again = StandIn()  # asked nothing: an empty script would fail
    assert judge_with(again, tmp_path).answer([Ask(Q, OPTIONS, "a red circle")]) == ["red"] and again.seen == []
    assert AnswerCache(tmp_path / "answers.sqlite") is not None


def test_an_answer_of_one_max_tokens_is_not_served_under_another(tmp_path):
    """``judge.max_tokens`` is part of the cache key: an answer cut off (and parsed) under a low limit is asked again
    under a higher one."""
    assert judge_with(StandIn("B"), tmp_path, max_tokens=1).answer([Ask(Q, OPTIONS, "a red circle")]) == ["red"]
    roomy = StandIn("A")
    assert judge_with(roomy, tmp_path, max_tokens=512).answer([Ask(Q, OPTIONS, "a red circle")]) == ["blue"]
    assert len(roomy.seen) == 1


def test_a_missing_model_is_named():
    with pytest.raises(ValueError, match="judge.model"):
        get_judge("vllm", load(None, ["judge.name=vllm"]), backend=StandIn())


def test_close_frees_the_engine_and_closes_the_answer_cache(tmp_path):
    # the vllm judge's close once freed the engine only, leaving the SQLite cache open until the process ended
    backend = StandIn("B")
    judge = judge_with(backend, tmp_path)
    assert judge.answer([Ask(Q, OPTIONS, "a red circle")]) == ["red"] and len(judge.cache) == 1
    judge.close()
    assert backend.replies is None
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        len(judge.cache)
    assert len(AnswerCache(tmp_path / "answers.sqlite")) == 1


def test_a_folder_saved_again_in_place_is_asked_again(tmp_path):
    """The cache key holds the weight files' names, sizes and times of a local model folder, as boost's vLLM backend
    keys its own: answers of the earlier weights are not reused for the new ones."""
    import os

    folder = tmp_path / "judge-lm"
    folder.mkdir()
    weights = folder / "model.safetensors"
    weights.write_bytes(b"first weights")
    cfg = load(None, ["judge.name=vllm", f"judge.model={folder}", "judge.cache=true"])
    first = get_judge("vllm", cfg, backend=StandIn("B"), cache_path=tmp_path / "answers.sqlite")
    assert first.answer([Ask(Q, OPTIONS, "a red circle")]) == ["red"]
    first.close()
    weights.write_bytes(b"second weights, trained further")
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    backend = StandIn("C")
    again = get_judge("vllm", cfg, backend=backend, cache_path=tmp_path / "answers.sqlite")
    assert again.answer([Ask(Q, OPTIONS, "a red circle")]) == ["green"] and len(backend.seen) == 1
    assert again.identity()["weights"][0][0] == "model.safetensors"
    again.close()


def test_a_hub_name_is_asked_again_at_another_commit(tmp_path, monkeypatch):
    """A Hub name is keyed by the commit its main resolves to in the local Hugging Face cache (refs/main): answers
    given at one commit are not served for another (the Hub's weights or chat template changed), and a revision the
    cache does not hold is keyed as unknown, never as the cached one."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    repo = tmp_path / "hub" / "models--org--chat-lm"
    (repo / "snapshots" / "aaaa1111").mkdir(parents=True)
    (repo / "snapshots" / "aaaa1111" / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("aaaa1111")
    cfg = load(None, ["judge.name=vllm", "judge.model=org/chat-lm", "judge.cache=true"])
    first = get_judge("vllm", cfg, backend=StandIn("B"), cache_path=tmp_path / "answers.sqlite")
    assert first.identity()["revision"] == "aaaa1111" and "weights" not in first.identity()
    assert first.answer([Ask(Q, OPTIONS, "a red circle")]) == ["red"]
    first.close()
    same = get_judge("vllm", cfg, backend=StandIn(), cache_path=tmp_path / "answers.sqlite")
    assert same.answer([Ask(Q, OPTIONS, "a red circle")]) == ["red"]  # the same commit: from the cache, not asked
    same.close()
    (repo / "snapshots" / "bbbb2222").mkdir()
    (repo / "snapshots" / "bbbb2222" / "config.json").write_text("{}")
    (repo / "refs" / "main").write_text("bbbb2222\n")
    backend = StandIn("C")
    again = get_judge("vllm", cfg, backend=backend, cache_path=tmp_path / "answers.sqlite")
    assert again.answer([Ask(Q, OPTIONS, "a red circle")]) == ["green"] and len(backend.seen) == 1
    assert again.identity()["revision"] == "bbbb2222"
    again.close()
    (repo / "refs" / "main").unlink()
    assert get_judge("vllm", cfg, backend=StandIn()).identity()["revision"] is None


def test_closing_the_judge_shuts_its_engine_down_once(monkeypatch):
    # the judge's in-process engine (boost's VllmBackend on a stand-in vllm.LLM): its close once only dropped the
    # engine, which kept its GPU memory (weights and KV cache) until the garbage collector found it
    from finecap.judges import vllm as vllm_judge
    from helpers.vllm_stand_in import StandInLLM, stand_in_vllm

    with stand_in_vllm(monkeypatch):
        monkeypatch.setattr(vllm_judge, "model_stamp", lambda model: {})
        judge = judge_with(None)
        (llm,) = StandInLLM.built
        assert llm.shutdowns == 0
        judge.close()
        judge.close()
        assert llm.shutdowns == 1


def test_a_judge_that_fails_to_start_after_its_engine_started_shuts_it_down(monkeypatch):
    # the model's stamp is read once the engine has started (minutes, most of a GPU): a failure there left it up
    from finecap.judges import vllm as vllm_judge
    from helpers.vllm_stand_in import StandInLLM, stand_in_vllm

    def fail(model):
        raise OSError("the model's files could not be listed")

    with stand_in_vllm(monkeypatch):
        monkeypatch.setattr(vllm_judge, "model_stamp", fail)
        with pytest.raises(OSError, match="could not be listed"):
            judge_with(None)
        (llm,) = StandInLLM.built
        assert llm.shutdowns == 1


def test_messages_name_the_judges_own_options(tmp_path, monkeypatch):
    # the judge passed boost's backend the key "judge.name=vllm: judge.model", to which boost appended its role
    # option's suffix: "judge.name=vllm: judge.model_backend=vllm needs vLLM" and "...: judge.model_model: ... has no
    # chat template", options that do not exist. They name judge.name=vllm and judge.model now.
    import sys

    from finecap.engines import vllm as engines_vllm
    from finecap.models.tokenizer import world_tokenizer
    from finecap.utils.system import MissingExtra

    monkeypatch.setitem(sys.modules, "vllm", None)  # as on a machine without the extra
    with pytest.raises(MissingExtra) as e:
        judge_with(None)
    assert str(e.value).startswith("judge.name=vllm needs vLLM, which is not installed ("), str(e.value)
    world_tokenizer(["a"]).save_pretrained(tmp_path)  # a tokenizer with no chat template
    monkeypatch.setattr(engines_vllm, "import_vllm", lambda option="": None)  # vLLM there: the model is read
    with pytest.raises(ValueError) as e:
        judge_with(None, model=str(tmp_path))
    assert str(e.value) == f"judge.model: {tmp_path} has no chat template (an instruction-tuned chat model is needed)"


@pytest.mark.parametrize(("text", "error"), [("just: words\n", "a judge prompts file needs a 'version'"),
                                             (None, "No such file")])  # fmt: skip
def test_a_bad_prompts_file_is_refused_before_the_engine_starts(tmp_path, monkeypatch, text, error):
    # the prompts file was read after the engine started: a typo in it cost an engine start (minutes on a GPU)
    from finecap.boost import vllm_backend

    built = []
    monkeypatch.setattr(vllm_backend, "VllmBackend", lambda *args, **kwargs: built.append((args, kwargs)))
    path = tmp_path / "prompts.yaml"
    if text is not None:
        path.write_text(text)
    with pytest.raises((ValueError, OSError), match=error):
        judge_with(None, prompts=path)
    assert built == []


class Closing(StandIn):
    """A stand-in backend counting its closes."""

    closes = 0

    def close(self):
        self.closes += 1
        super().close()


@pytest.mark.parametrize("cached", [False, True])
def test_a_closed_judge_refuses_calls_by_name_and_closes_once(tmp_path, cached):
    # a call after close failed deep inside: an AttributeError of the closed engine, or sqlite's "closed database"
    from finecap.utils.closing import UsedAfterClose

    backend = Closing("B")
    judge = judge_with(backend, tmp_path if cached else None)
    judge.close()
    judge.close()
    assert backend.closes == 1
    with pytest.raises(UsedAfterClose, match=r"^judge vllm: this judge was closed .*; build another"):
        judge.answer([Ask(Q, OPTIONS, "a red circle")])


def test_an_option_of_the_openai_judge_is_refused_saying_whose_it_is(tmp_path, monkeypatch):
    # VllmJudge(..., retries=3) was Python's "unexpected keyword argument 'retries'", though judge.retries is an
    # option of the judge section (the openai judge's): now the error says what the configuration says of it, before
    # any engine starts, through the registry's factory too (whose answer cache is then closed)
    from finecap.boost import vllm_backend
    from finecap.judges.vllm import VllmJudge

    monkeypatch.setattr(vllm_backend, "VllmBackend", lambda *a, **k: pytest.fail("the engine started"))
    said = ("VllmJudge: retries= is judge.retries, read with judge.name=openai, not by the vllm judge. judge.retries: "
            "openai: retries of a failed request, and re-asks of an unparsable answer until one repeats, before the "
            "call counts as failed (vllm asks once: its greedy engine repeats its answers).")  # fmt: skip
    with pytest.raises(TypeError) as refused:
        VllmJudge("my-chat-lm", retries=3)
    assert str(refused.value) == said
    closed, close = [], AnswerCache.close
    monkeypatch.setattr(AnswerCache, "close", lambda self: (closed.append(self), close(self)))
    with pytest.raises(TypeError) as refused:
        judge_with(None, tmp_path, retries=3)
    assert str(refused.value) == said and len(closed) == 1
    with pytest.raises(TypeError, match="^VllmJudge: concurrency= is judge.concurrency, read with judge.name=openai"):
        VllmJudge("my-chat-lm", concurrency=2)
    with pytest.raises(TypeError, match="^VllmJudge: noise= is judge.noise, read with judge.name=world, not by"):
        VllmJudge("my-chat-lm", noise=0.1)
    with pytest.raises(TypeError, match=r"^VllmJudge.__init__\(\) got an unexpected keyword argument 'retry'$"):
        VllmJudge("my-chat-lm", retry=3)  # a name of no judge's option: Python's own words


def test_a_judge_seed_given_to_the_factory_is_refused_saying_who_reads_it(tmp_path, monkeypatch):
    # get_judge("vllm", cfg, seed=1) passed VllmJudge seed= twice (the factory's run.seed, the engine's, and the
    # option): Python's "got multiple values for keyword argument 'seed'". A factory's options override the judge
    # keys, so it is judge.seed, which the callers read: refused saying so, before the answer cache is opened
    from finecap.boost import vllm_backend

    monkeypatch.setattr(vllm_backend, "VllmBackend", lambda *a, **k: pytest.fail("the engine started"))
    opened, init = [], AnswerCache.__init__
    monkeypatch.setattr(AnswerCache, "__init__", lambda self, *a, **k: opened.append(init(self, *a, **k)))
    with pytest.raises(TypeError) as refused:
        judge_with(None, tmp_path, seed=1)
    said = ("VllmJudge: seed= is judge.seed, which the judge's callers read from the configuration (its judge "
            "section), not an option of the vllm judge. judge.seed: Seed of the option shuffles of QA questions "
            "(every judge) and of world's flipped answers.")  # fmt: skip
    assert str(refused.value) == said and opened == []
