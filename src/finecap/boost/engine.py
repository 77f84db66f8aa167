"""The boosting engine: runs the steps of Visual Caption Boosting over a data set through any backend, with a
resumable cache, retries of malformed answers, a failure budget and a per-image failure log.

- **Cache** (:class:`AnswerCache`): an append-only JSONL file, one line ``{"key", "step", "image_id", "answer",
  "served_model"}`` per accepted answer, written and flushed as soon as the answer arrives. ``key`` is the SHA-256 of
  the backend's identity (backend, model, generation settings), the step, the chat messages (prompt + inputs) and, for
  the visual step, the image file's bytes. A killed or stopped run loses at most the answers in flight; re-running
  reads the file, skips every cached key and asks only for the rest. A last line cut by a kill is dropped from the
  file (else, ended by the next answer's newline, it would be a line of no JSON, and the folder would no longer read
  as boost's: :func:`finecap.boost.output.is_boost_file`); a key written twice keeps its first answer, so nothing is
  duplicated in the output.
- **Served model**: ``served_model`` is the model a server backend's replies named
  (:attr:`ServedModel.named <finecap.boost.served_model.ServedModel.named>`; ``null`` for an in-process backend, or
  before a reply named one). Before a step of a server backend uses cached answers, the model they record is checked
  by the rule within a run (:func:`check_cached_models`): a resumed run whose server now answers as another model
  stops at its first such reply, which is not cached. A line of an older finecap, without ``served_model``, is used
  unchecked, said once.
- **Answers** are kept whole (:func:`clean_answer`): white space runs (line breaks and paragraphs included) become
  one space, a pair of quotes or of markdown ``**`` around the whole answer and one leading label such as
  ``Caption:`` or ``**Caption:**`` (before the quotes or inside them) are dropped, nothing else (docs/boost.md#prompts:
  finecap's rule, not the paper's). An empty answer or a reply that is not a chat completion (:class:`MalformedReply`)
  is asked again, up to ``boost.retries`` times; a backend error that survived the backend's own retries
  (:class:`BackendError`: HTTP 5xx, time-outs, a refusal) fails the image at once, and so does an answer cut off at
  ``boost.max_new_tokens`` (:class:`CutOff`: every backend that can tell reports one; it is never a caption).
- **Failures** (:class:`Failure`): every image whose step failed, with the step, the reason and the attempts; the
  caller writes them to ``failures.jsonl`` and keeps the image's human captions for that field. A failed ``blend`` or
  ``visual`` step also fails the image's ``holistic`` step (its inputs are missing).
- **Images** (modes with the ``visual`` step): before any request of any step, every image to boost is checked as an
  image file (:func:`finecap.data.images.check_image_file`: a regular file PIL identifies and verifies, within the
  decompression-bomb limit and the image budget ``data.max_image_pixels`` / ``data.max_aspect_ratio``, as training
  reads it; each :class:`Task` carries the budget, so backends decode within it too). One that is not (a text file,
  a key, a damaged or oversized image) fails its ``visual`` step at once as a :class:`BadImage` (``attempts`` 0),
  counted in the failure budget like any failed image: nothing of it is hashed or sent. Backends send only a
  re-encoding of the decoded pixels (the ``openai`` backend decodes again when sending; a file that fails then is a
  :class:`BadImage` too).
- **Stopping** (:class:`FailureBudget`): the run stops as soon as more than ``boost.max_failure_rate`` of the images
  to boost failed (the fraction can then only be exceeded at the end too), after ``boost.max_consecutive_failures``
  requests in a row could not reach the server (:class:`ServerUnavailable`) or got no answer from an in-process
  engine that raised instead (:class:`EngineFailing`: a failed batch counts once), so that a dead server or
  engine fails a run whatever ``boost.max_failure_rate`` allows, when every image to boost failed (none boosted:
  ``boost.max_failure_rate=1`` tolerates failed images, not all of them), and at once on a
  :class:`FatalBackendError` (a refused API key, a wrong URL), whichever answer of the requests in flight arrives
  first: a request the backend did not send or retry because the run is stopping (:class:`Cancelled`) leaves its
  image not done, never failed. The result then carries ``stopped`` (the reason);
  :mod:`finecap.app.boost` turns it into :class:`BoostFailed` (exit code 2) after saving what was done.
- **Backends** implement :class:`Backend`: ``identity()`` for the cache key and ``run(tasks)`` yielding ``(position,
  answer or exception)`` as answers complete (so the progress bar and the cache advance while a remote server works).
  The engine closes ``run``'s generator when it stops early; a backend cancels the requests not yet sent. A server
  backend (``openai``) has a ``served`` attribute, the :class:`~finecap.boost.served_model.ServedModel` check of the
  model its replies name, which the engine reads for the cache and ``boost.json`` (:attr:`BoostResult.served_model`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tqdm.auto import tqdm

from finecap.boost.prompts import Prompts
from finecap.data.hashing import hub_revision
from finecap.data.images import DEFAULT_LIMITS, ImageLimits, check_image_file, load_record_image
from finecap.data.records import DataError, Record
from finecap.utils.files import open_append
from finecap.utils.reading import read_lines, unfinished_line
from finecap.utils.system import progress_enabled

log = logging.getLogger(__name__)

MODE_STEPS: dict[str, tuple[str, ...]] = {
    "blend": ("blend",),
    "visual": ("visual",),
    "holistic": ("blend", "visual", "holistic"),
}
"""Steps run for each ``boost.mode``, in order (HolisticCap needs BlendCap and VisualCap first)."""


class BackendError(RuntimeError):
    """A request failed for good (after the backend's own retries); the image is logged as failed."""


class ServerUnavailable(BackendError):
    """The server could not be reached (no connection, time-outs, 502/503/504, a proxy's 520-524, an overloaded 529:
    :data:`finecap.boost.openai_backend.UNAVAILABLE_STATUS`) after the backend's retries; counts towards
    ``boost.max_consecutive_failures``."""


class ServerFailing(BackendError):
    """The server was reached but answered every attempt with a failure until the backend's retries were spent (HTTP
    408, 409, 429, 500 or another retried 5xx, or an error body with HTTP 200), asked (``Retry-After``,
    ``retry-after-ms``) for a wait longer than its ``retry_max_wait``, or said not to retry (``x-should-retry:
    false``): no answer, though the server is up. ``status`` is the last attempt's HTTP status (200 for an error
    body). Boost fails the image (its failure budget counts it); a judge counts it, as
    :class:`ServerUnavailable`, towards ``judge.max_consecutive_failures``."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class EngineFailing(ServerFailing):
    """An in-process engine (boost's ``vllm`` backend's and the ``vllm`` judge's ``vllm.LLM``, boost's
    ``transformers`` backend's model) raised instead of answering a request it accepted: out of memory, its engine
    core dead, shut down. No answer, as a failing server's (``status`` ``None``): boost fails each image of the batch
    it was asked for, counted in ``boost.max_failure_rate`` and, as an unreachable server's request
    (:class:`ServerUnavailable`), towards ``boost.max_consecutive_failures``, once per batch (:class:`FailureBudget`:
    the batch's images share one :class:`EngineFailing`); a judge counts
    it towards ``judge.max_consecutive_failures``. A request the engine refuses (a prompt too long) is a plain
    :class:`BackendError`, that request's own."""


def engine_failing(error: BaseException, engine: str = "vLLM") -> EngineFailing:
    """The :class:`EngineFailing` of an in-process ``engine`` that raised ``error`` instead of answering, in one line
    naming the error (``error`` itself when it is one already).

    Example::

        >>> engine_failing(RuntimeError("CUDA out of memory.\\nTried to allocate 2.00 GiB"))
        EngineFailing('the vLLM engine failed: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB')
    """
    if isinstance(error, EngineFailing):
        return error
    return EngineFailing(f"the {engine} engine failed: {type(error).__name__}: {' '.join(str(error).split())}")


class MalformedReply(BackendError):
    """The server answered, but not with a chat completion (not JSON, no ``choices[0].message.content``); the engine
    asks again, as for an empty answer."""


class FatalBackendError(BackendError):
    """Every further request would fail the same way (HTTP 401/403: the key is refused; 404: wrong URL or model; an
    HTTP 429 saying ``insufficient_quota``: the account is out of credit): the run stops at once."""


class Cancelled(BackendError):
    """A request not sent, or not retried, because the run is stopping (another request's
    :class:`FatalBackendError`, or the engine closing the backend): its image is not done, never a failed image.
    ``sent``: whether the request went out before (then it counts in ``requested``)."""

    def __init__(self, message: str, *, sent: bool = False) -> None:
        super().__init__(message)
        self.sent = sent


class CutOff(BackendError):
    """The answer reached ``boost.max_new_tokens`` before the model ended it (``finish_reason: "length"`` from a
    server; no end-of-sequence token from an in-process model): a cut-off caption, never accepted or cached. Its image
    fails at once (the same settings would cut it again) and ``boost.json`` counts it under ``cut_off``."""


def cut_off(text: str, max_new_tokens: int, how: str) -> CutOff:
    """The :class:`CutOff` of the answer ``text``, cut at ``max_new_tokens`` tokens (``how``: what told it), naming the
    option to raise.

    Example::

        >>> error = cut_off("A red circle on the", 5, "finish_reason 'length'")
        >>> str(error).startswith("the answer reached boost.max_new_tokens=5 before the model ended it")
        True
        >>> str(error).endswith("(finish_reason 'length'): 'A red circle on the'; raise boost.max_new_tokens")
        True
    """
    tail = " ".join(text.split())
    shown = repr(tail if len(tail) <= 80 else "..." + tail[-77:])
    return CutOff(f"the answer reached boost.max_new_tokens={max_new_tokens} before the model ended it ({how}): "
                  f"{shown}; raise boost.max_new_tokens")  # fmt: skip


class BadImage(ValueError):
    """A record's image is not an image finecap may use (:func:`finecap.data.images.load_image`'s rule): its
    ``visual`` step fails and nothing of the file is sent."""


def image_problem(record: Record, limits: ImageLimits = DEFAULT_LIMITS) -> str | None:
    """Why the image of ``record`` may not be sent within the image budget ``limits`` (a one-line reason naming the
    file), or ``None``."""
    try:
        if not record.embedded:
            check_image_file(record.path, limits)
        else:
            load_record_image(record, limits=limits)
    except DataError as e:
        return str(e)
    return None


class BoostFailed(ValueError):
    """The boosting run failed (a stop or the failure budget): the command exits with code 2 and this message.

    A ``ValueError`` so that the command line prints it as a one-line error (``finecap: error: ...``)."""


@dataclass
class Task:
    """One request: ``step`` for the image of ``record`` (``index`` in the data set)."""

    index: int
    record: Record
    step: str
    messages: list[dict[str, Any]]
    inputs: dict[str, Any]
    """The step's variables: ``captions`` (human), ``blend`` and ``visual`` (earlier answers)."""
    limits: ImageLimits = DEFAULT_LIMITS
    """The image budget (``data.max_image_pixels``, ``data.max_aspect_ratio``) a backend decodes the image within."""

    @property
    def image(self) -> Path | None:
        return self.record.path if self.step == "visual" else None


def batch_seed(seed: int, tasks: Sequence[Task]) -> int:
    """The seed of the samples of ``tasks`` (``boost.temperature > 0``), below ``2**63``: a hash of ``seed``
    (``run.seed``) and each task's step, position and messages, so that the same batch draws the same samples in any
    run or process, and two batches of one run draw different ones: torch's generator while the ``transformers``
    backend samples a batch, and the seed of each ``openai`` and ``vllm`` request (of one task: :func:`request_seed`).

    Example::

        >>> from pathlib import Path
        >>> from finecap.data.records import Record
        >>> messages = [{"role": "user", "content": "a dog"}]
        >>> def task(i):
        ...     return Task(i, Record(i, Path(f"{i}.png"), "test", ["a dog"]), "blend", messages, {})
        >>> batch_seed(0, [task(0), task(1)]) == batch_seed(0, [task(0), task(1)])
        True
        >>> len({batch_seed(0, [task(0)]), batch_seed(1, [task(0)]), batch_seed(0, [task(1)])})
        3
    """
    content = json.dumps([seed, [(t.step, t.index, t.messages) for t in tasks]], sort_keys=True, default=str)
    return (
        int.from_bytes(hashlib.sha256(content.encode()).digest()[:8], "big") >> 1
    )  # within torch.manual_seed's range


def request_seed(seed: int, task: Task) -> int:
    """The seed of ``task``'s own samples (``boost.temperature > 0``): :func:`batch_seed` of the task alone, cut to
    31 bits (``[0, 2**31)``), a seed every server takes (llama.cpp's is 32-bit). The ``openai`` backend sends it as the
    request's ``seed``, the ``vllm`` backend as its ``SamplingParams.seed``: a task's samples depend on neither the
    batch it is asked in nor what the engine generated before it."""
    return batch_seed(seed, [task]) >> 32


class ServedCheck(Protocol):
    """The check of the model a server backend's replies name, its ``served`` attribute
    (:class:`finecap.boost.served_model.ServedModel`, which imports this module: the engine knows it by this face)."""

    option: str
    """The option naming the model asked for (``boost.llm_model``)."""
    first: str | None
    """The model every reply must name: the first named, or the one :meth:`expect` was told of."""
    named: str | None
    """The model this run's replies named; ``None`` before one did."""

    def expect(self, model: str, *, where: str, why: str, afresh: str) -> None:
        """Check ``model``, that earlier answers (``where``) record, as the first model named; a clash's error says
        ``why`` and what to do (``afresh``: how to start without the cache)."""
        ...

    def kept(self, model: str | None) -> None:
        """Note that an answer of ``model`` (this run's replies') was kept in the answer cache."""
        ...


class Backend(Protocol):
    def identity(self) -> dict[str, Any]:
        """JSON-able description of what determines the answers (backend, model, generation settings)."""
        ...

    def run(self, tasks: Sequence[Task]) -> Iterator[tuple[int, str | BaseException]]:
        """Answers ``(position in tasks, text or the exception)``, in completion order, one per task."""
        ...


def option_name(key: str, name: str) -> str:
    """The option ``name`` of ``key``, as the user writes it: of boost's role ``boost.llm``, ``boost.llm_<name>``; of a
    section (``judge``), ``judge.<name>``. Every backend names its options so in its messages (``key``: whose options
    it reads: boost's role, or the judge that runs it).

    Example::

        >>> option_name("boost.vlm", "model"), option_name("judge", "api_key_env")
        ('boost.vlm_model', 'judge.api_key_env')
    """
    return f"{key}_{name}" if "." in key else f"{key}.{name}"


MODEL_FILES = ("*.safetensors", "*.bin", "*.json", "*.jinja", "*.model", "*.txt")
"""The files of a model folder that decide its answers: weights, and the configuration, tokenizer, chat template and
``generation_config.json`` (decoding settings ``transformers`` and vLLM read from it) beside them."""


def weights_stamp(model: str | Path, patterns: Sequence[str] = MODEL_FILES) -> list[Any] | None:
    """``[(file, size, mtime_ns)]`` of the files ``patterns`` of a local model folder ``model`` (default
    :data:`MODEL_FILES`; ``None`` for a Hub name, which :func:`model_stamp` keys by its commit): part of a backend's
    :meth:`Backend.identity`, so that a folder trained or saved again in place, or whose chat template or generation
    settings were edited, is asked again rather than answered from the cache of its earlier files."""
    path = Path(model)
    if not path.is_dir():
        return None
    weights = sorted(w for pattern in patterns for w in path.rglob(pattern))
    return [(str(w.relative_to(path)), w.stat().st_size, w.stat().st_mtime_ns) for w in weights]


def model_stamp(model: str | Path) -> dict[str, Any]:
    """What identifies the files of a chat model in a backend's :meth:`Backend.identity` (docs/boost.md): for a local
    folder ``{"weights": weights_stamp(model)}``; for a Hub name ``{"revision": commit}``, the commit its ``main``
    resolves to in the local Hugging Face cache (:func:`finecap.data.hashing.hub_revision`; read after the model is
    loaded, which downloads it there), so that answers of the repository's earlier commit (other weights, another chat
    template) are not reused for a newer one; ``None`` when the cache holds no revision of it (nothing is downloaded
    here)."""
    weights = weights_stamp(model)
    return {"weights": weights} if weights is not None else {"revision": hub_revision(str(model))}


@dataclass
class Failure:
    image_id: Any
    step: str
    error: str
    attempts: int

    def to_dict(self) -> dict[str, Any]:
        return {"image_id": self.image_id, "step": self.step, "error": self.error, "attempts": self.attempts}


@dataclass
class FailureBudget:
    """When a run must stop (module docstring): ``n_images`` to boost, ``boost.max_failure_rate`` and
    ``boost.max_consecutive_failures``. :meth:`failed` and :meth:`succeeded` are called per answer, in completion
    order; each returns the reason to stop, or ``None``.

    Example (10 images, at most 10 % may fail: the second failed image stops the run)::

        >>> budget = FailureBudget(10, max_rate=0.1, max_consecutive=3)
        >>> budget.failed(0, BackendError("HTTP 500")) is None
        True
        >>> budget.failed(1, BackendError("HTTP 500"))
        '2 of 10 images failed, more than boost.max_failure_rate=0.1 allows; last error: HTTP 500'

    A budget of 100 % still stops a run whose every image failed (2 images: the second failure)::

        >>> budget = FailureBudget(2, max_rate=1.0, max_consecutive=3)
        >>> budget.failed(0, BackendError("HTTP 500")) is None
        True
        >>> budget.failed(1, BackendError("HTTP 500"))
        'all 2 images failed, none boosted, whatever boost.max_failure_rate=1 allows; last error: HTTP 500'
    """

    n_images: int
    max_rate: float = 0.01
    max_consecutive: int = 10
    failed_images: set[int] = field(default_factory=set)
    consecutive: int = 0
    """Requests in a row that got no answer from a server or engine that is gone, reset by any answer or other
    failure: a server not reached (:class:`ServerUnavailable`: each image's request), an in-process engine that
    raised instead of answering (:class:`EngineFailing`: one per failed batch, the one ``generate`` call its images
    share, so that one failed batch of ``boost.batch_size`` images counts once, not ``boost.batch_size`` times)."""
    _streak_error: BaseException | str | None = None
    """The failure last counted in :attr:`consecutive`: an image failing with that same :class:`EngineFailing` (the
    other images of an engine's failed batch) adds nothing."""

    def over_budget(self) -> bool:
        """More than ``max_rate`` of the images failed, or every one of them did: a run that was to boost images and
        boosted none failed, whatever ``max_rate`` allows (``boost.max_failure_rate=1`` tolerates failed images, not a
        run of nothing but failures, such as a dead engine on fewer images than ``max_consecutive``)."""
        failed = len(self.failed_images)
        return self.n_images > 0 and (failed / self.n_images > self.max_rate or failed == self.n_images)

    def budget_reason(self, last: str) -> str:
        failed, rate = len(self.failed_images), f"boost.max_failure_rate={self.max_rate:g}"
        if failed / self.n_images > self.max_rate:
            return f"{failed} of {self.n_images} images failed, more than {rate} allows; last error: {last}"
        return f"all {self.n_images} images failed, none boosted, whatever {rate} allows; last error: {last}"

    def failed(self, index: int, error: BaseException | str) -> str | None:
        self.failed_images.add(index)
        if isinstance(error, FatalBackendError):
            return str(error)
        unanswered = isinstance(error, ServerUnavailable | EngineFailing)
        if not unanswered:
            self.consecutive = 0
        elif not (isinstance(error, EngineFailing) and error is self._streak_error):  # a batch's images share
            self.consecutive += 1  # their engine's one failure (InProcessBackend.run): counted once
        self._streak_error = error if unanswered else None
        if self.consecutive >= self.max_consecutive:
            gone = "got no answer from the in-process engine" if isinstance(error, EngineFailing) else (
                "could not reach the server")  # fmt: skip
            return (
                f"{self.consecutive} requests in a row {gone} "
                f"(boost.max_consecutive_failures={self.max_consecutive}); last error: {error}"
            )
        if self.over_budget():
            return self.budget_reason(str(error))
        return None

    def succeeded(self) -> None:
        self.consecutive, self._streak_error = 0, None


@dataclass
class BoostResult:
    """Per record (data set order): ``fields[i][name] = [caption, ...]`` for ``original`` and every step run."""

    fields: list[dict[str, list[str]]]
    failures: list[Failure] = field(default_factory=list)
    requested: dict[str, int] = field(default_factory=dict)
    """Answers requested from the backends per step in this run (cached answers are not requested)."""
    cached: dict[str, int] = field(default_factory=dict)
    """Answers per step taken from the cache of an earlier run."""
    chosen: list[int] = field(default_factory=list)
    """Positions of the records to boost (the first ``boost.limit``)."""
    boosted: list[int] = field(default_factory=list)
    """Positions of the records whose every step was answered (their ``mode`` field is the boosted caption)."""
    failed: list[int] = field(default_factory=list)
    """Positions of the records with a failed step (they keep their human captions there)."""
    stopped: str | None = None
    """Why the run stopped before the end, or ``None``."""
    cut_off: dict[str, int] = field(default_factory=dict)
    """Answers per step cut off at ``boost.max_new_tokens`` (:class:`CutOff`; their images failed)."""
    served_model: dict[str, str | None] = field(default_factory=dict)
    """Per role of a server backend the run used (``llm``, ``vlm``), the model its replies named, or the one the cached
    answers it used record (:attr:`ServedModel.first <finecap.boost.served_model.ServedModel.first>`); ``None`` when
    neither names one. Roles of in-process backends, or of steps a stop left unreached, are absent."""


_LABEL_WORDS = r"(?:improved |blended |holistic |human |final |correct |new )?(?:caption|description|answer)"
_LABEL = re.compile(
    rf"^(?:(\*\*|__|\*){_LABEL_WORDS}\s*:\s*\1|(\*\*|__|\*){_LABEL_WORDS}\2\s*:|{_LABEL_WORDS}\s*:)\s*", re.I
)
"""A leading label, also in markdown emphasis as chat models write it: ``Caption:``, ``**Caption:**``,
``**Caption**:``."""
_EMPHASIS = ("**", "__")
"""Markdown strong emphasis around a whole answer (``**A dog runs.**``), dropped as a pair of quotes is."""
_QUOTE_PAIRS = {'"': '"', "'": "'", "`": "`", "“": "”", "‘": "’"}
"""Opening quote -> its closing quote, for :func:`clean_answer`."""
_APOSTROPHE = re.compile(r"(?<=\w)['’](?=\w)")
"""A single quote between two letters (``dog's``): an apostrophe, not a quote."""


def _unquoted(line: str) -> str:
    """``line`` without a pair of quotes around the whole of it: the same kind at both ends and none inside (an
    apostrophe inside a word aside); a quote that opens and one that closes two quotations inside stay."""
    close = _QUOTE_PAIRS.get(line[:1])
    if len(line) < 2 or close is None or line[-1] != close:
        return line
    inner = _APOSTROPHE.sub("", line[1:-1]) if close in "'’" else line[1:-1]
    return line if line[0] in inner or close in inner else line[1:-1].strip()


def clean_answer(text: Any) -> str | None:
    """The whole answer with white space normalised, without quotes or markdown strong emphasis (``**``, ``__``)
    around the whole of it (a matching pair with no other of that kind inside) or a leading label, plain or in
    markdown emphasis (before the quotes or inside them); ``None`` when nothing is left. Every line and paragraph is
    kept (a VLM's description runs to several).

    Example::

        >>> clean_answer('  Caption: A red circle on grass.\\n\\nA blue square is above it.')
        'A red circle on grass. A blue square is above it.'
        >>> clean_answer('"A red circle on grass.\\n  It is small."')
        'A red circle on grass. It is small.'
        >>> clean_answer('**Caption:** A red circle on grass.')
        'A red circle on grass.'
        >>> clean_answer('"STOP" is painted on a sign reading "SLOW"')  # two quotations, not one around it all
        '"STOP" is painted on a sign reading "SLOW"'
        >>> clean_answer("   ") is None
        True
    """
    if not isinstance(text, str):
        return None
    line = _LABEL.sub("", " ".join(text.split())).strip()
    mark = next((m for m in _EMPHASIS if line.startswith(m) and line.endswith(m) and len(line) > 2 * len(m)), None)
    if mark is not None and mark not in line[len(mark) : -len(mark)]:  # '**A dog.**', not '**A** dog and **B**'
        line = line[len(mark) : -len(mark)].strip()
    unquoted = _unquoted(line)
    if unquoted != line:  # a label inside the quotes: '"Caption: A dog."'
        unquoted = _LABEL.sub("", unquoted)
    return unquoted or None


def _sha256_file(path: Path, memo: dict[Path, str]) -> str:
    if path not in memo:
        with path.open("rb") as f:  # in chunks: an image file may be large
            memo[path] = hashlib.file_digest(f, "sha256").hexdigest()
    return memo[path]


class AnswerCache:
    """Append-only JSONL of accepted answers keyed by request hash (module docstring), with the model that gave each
    (``served_model``: :attr:`served_models`; a key it lacks: a line written before finecap recorded it)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.answers: dict[str, str] = {}
        self.served_models: dict[str, str | None] = {}
        """The model each cached answer's line records (``None``: no server named one); a key of :attr:`answers` it
        lacks is of a line with no ``served_model`` (written by an older finecap), or not a name."""
        self.said_unrecorded = False
        """Whether :func:`check_cached_models` has said that some answers record no model (it says so once)."""
        self.n_lines = 0
        if self.path.exists():
            for line in read_lines(self.path):  # line by line, each within LINE: a FileTooLarge names the file
                try:
                    row = json.loads(line)
                    key, answer = row["key"], row["answer"]
                except (json.JSONDecodeError, KeyError, TypeError):
                    continue  # a line cut by a kill
                if key not in self.answers:  # a key written twice keeps its first answer, and that answer's model
                    self.answers[key] = answer
                    model = row.get("served_model")
                    if "served_model" in row and (model is None or isinstance(model, str)):
                        self.served_models[key] = model
                self.n_lines += 1
        cut = unfinished_line(self.path) if self.path.exists() else b""
        self._file = open_append(self.path)  # never through a link planted at cache.jsonl
        if cut:  # dropped: the next answer starts its own line, and the file stays lines of JSON (is_boost_file)
            self._file.truncate(self.path.stat().st_size - len(cut))

    def __contains__(self, key: str) -> bool:
        return key in self.answers

    def get(self, key: str) -> str:
        return self.answers[key]

    def put(self, key: str, step: str, image_id: Any, answer: str, served_model: str | None = None) -> None:
        """Append the answer ``answer`` of ``key`` (of ``step`` for the image ``image_id``) and the model a server
        named for it (``served_model``; ``None``: none named), unless ``key`` is cached already."""
        if key in self.answers:
            return
        self.answers[key], self.served_models[key] = answer, served_model
        row = {"key": key, "step": step, "image_id": image_id, "answer": answer, "served_model": served_model}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def served_check(backend: Backend) -> ServedCheck | None:
    """The check of the model a server backend's replies name (its ``served``: module docstring), or ``None`` for a
    backend of no server (in-process)."""
    return getattr(backend, "served", None)


def served_models(backends: dict[str, Backend | None]) -> dict[str, str | None]:
    """Per role (``llm``, ``vlm``) of a server backend in ``backends``, the model its replies named, or the one the
    cached answers it used record (:attr:`ServedCheck.first`; ``None``: none yet): what ``boost.json`` of a run
    stopped midway (Ctrl-C) says, without a :class:`BoostResult`. Roles of in-process backends, or none, are
    absent."""
    checks = {role: served_check(backend) for role, backend in backends.items() if backend is not None}
    return {role: served.first for role, served in checks.items() if served is not None}


def check_cached_models(served: ServedCheck, cache: AnswerCache, step: str, keys: Sequence[str]) -> str | None:
    """Why the answers ``keys`` of ``step`` in ``cache`` may not be used with the server backend whose replies
    ``served`` checks, or ``None``: :meth:`~finecap.boost.served_model.ServedModel.expect` is told of each model they
    record (module docstring: the rule within a run, so that a reply naming another model stops the run before its
    answer is cached), and two models recorded, or one other than this run's replies named, are the reason. Answers
    recording no model (of an older finecap) are used as they are: said once per cache (a warning naming the file)."""
    unrecorded = sum(k not in cache.served_models for k in keys)
    if unrecorded and not cache.said_unrecorded:
        cache.said_unrecorded = True
        log.warning("%s: %d cached answer(s) of step %r were written by an earlier finecap, which did not record the "
                    "model that gave them (served_model); they are used as %s's, unchecked against the model the "
                    "server answers as now (said once)", cache.path, unrecorded, step, served.option)  # fmt: skip
    recorded: dict[str, int] = {}
    for k in keys:
        model = cache.served_models.get(k)
        if model is not None:
            recorded[model] = recorded.get(model, 0) + 1
    why = f"resumed, the run would mix two models' answers under {served.option}"
    afresh = f"boost into another folder (or move {cache.path} away) to start afresh"
    for model, n in recorded.items():
        try:
            served.expect(model, where=f"the {n} answer(s) of step {step!r} kept in {cache.path}", why=why,
                          afresh=afresh)  # fmt: skip
        except FatalBackendError as e:
            return str(e)
    return None


def request_key(backend: Backend, task: Task, image_hashes: dict[Path, str]) -> str:
    """SHA-256 of backend identity, step, messages, inputs and (visual step) image bytes."""
    content = {"backend": backend.identity(), "step": task.step, "messages": task.messages, "inputs": task.inputs}
    if task.image is not None:
        content["image"] = _sha256_file(task.image, image_hashes)
    return hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()


@dataclass
class StepResult:
    answers: dict[int, str]
    """``{task.index: text}`` of every answered task (cached or new)."""
    failures: list[Failure]
    sent: int
    """Requests sent to the backend (retries of malformed answers included)."""
    cached: int
    stopped: str | None = None
    cut_off: int = 0
    """Answers cut off at ``boost.max_new_tokens`` (:class:`CutOff`), among the failures."""


def run_step(
    step: str,
    tasks: list[Task],
    backend: Backend,
    cache: AnswerCache,
    retries: int,
    progress: bool = True,
    budget: FailureBudget | None = None,
) -> StepResult:
    """Answers of one step through ``backend`` (cached ones from ``cache``); stops early when ``budget`` says so."""
    budget = budget or FailureBudget(len(tasks), max_rate=1.0, max_consecutive=10**9)
    hashes: dict[Path, str] = {}
    keys = {t.index: request_key(backend, t, hashes) for t in tasks}
    answers = {t.index: cache.get(keys[t.index]) for t in tasks if keys[t.index] in cache}
    out = StepResult(answers, [], 0, len(answers))
    served = served_check(backend)
    if served is not None and answers:  # before any request: a server of another model stops at its first reply
        out.stopped = check_cached_models(served, cache, step, [keys[i] for i in answers])
    pending = [t for t in tasks if t.index not in answers]
    bar = tqdm(total=len(tasks), initial=len(answers), desc=f"boost [{step}]", unit="image",
               disable=not progress_enabled(progress))  # fmt: skip

    def fail(task: Task, error: BaseException | str, attempt: int) -> None:
        message = f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else error
        out.failures.append(Failure(task.record.image_id, step, message, attempt))
        out.cut_off += isinstance(error, CutOff)
        bar.update(1)
        out.stopped = out.stopped or budget.failed(task.index, error)

    try:  # the bar closed however the step ends (an interrupt, a backend's error)
        cancelled: Cancelled | None = None
        for attempt in range(1, retries + 2):
            if not pending or out.stopped:
                break
            malformed: list[tuple[Task, str]] = []
            out.sent += len(pending)
            last = attempt == retries + 1
            with closing(iter(backend.run(pending))) as results:  # closing stops the backend when the run stops
                for pos, answer in results:
                    task = pending[pos]
                    if isinstance(answer, Cancelled):  # the image is not done, and no failure of its own
                        if not answer.sent:
                            out.sent -= 1
                        cancelled = cancelled or answer
                        continue
                    if isinstance(answer, MalformedReply):
                        reason, text = f"malformed reply: {answer}", None
                    elif isinstance(answer, BaseException):
                        fail(task, answer, attempt)
                        if out.stopped:
                            break
                        continue
                    else:
                        reason, text = f"empty answer {answer!r:.200}", clean_answer(answer)
                    if text is None:
                        if last:
                            fail(task, reason, attempt)
                            if out.stopped:
                                break
                        else:
                            budget.succeeded()  # the server answered
                            malformed.append((task, reason))
                        continue
                    budget.succeeded()
                    named = served.named if served is not None else None  # the model its replies named
                    cache.put(keys[task.index], step, task.record.image_id, text, named)
                    if served is not None:  # what the cache holds, which a clash's advice says (clash_advice)
                        served.kept(named)
                    answers[task.index] = text
                    bar.update(1)
            pending = [t for t, _ in malformed]
        if cancelled is not None and not out.stopped:  # a backend stopped by something the engine was not told of
            out.stopped = f"the backend cancelled requests: {cancelled}"
    finally:
        bar.close()
    return out


def boost_records(
    records: Sequence[Record],
    mode: str,
    llm: Backend | None,
    vlm: Backend | None,
    cache: AnswerCache,
    prompts: Prompts,
    *,
    few_shot: bool = True,
    retries: int = 3,
    limit: int = 0,
    progress: bool = True,
    max_failure_rate: float = 1.0,
    max_consecutive_failures: int = 10**9,
    image_limits: ImageLimits = DEFAULT_LIMITS,
) -> BoostResult:
    """Run the steps of ``mode`` (:data:`MODE_STEPS`) over ``records`` (the first ``limit``; 0 = all), their images
    read within ``image_limits`` (:class:`~finecap.data.images.ImageLimits`: ``ImageLimits.of(cfg.data)``). Every
    record gets ``original`` and one field per step; a failed or unanswered step keeps the human captions in its
    field. The run stops early (``result.stopped``) as :class:`FailureBudget` says; the library default is no
    budget, but a run whose every image failed, or a fatal error (:class:`FatalBackendError`), still stops it."""
    if mode not in MODE_STEPS:
        raise ValueError(f"boost.mode: unknown mode {mode!r}; valid modes: {', '.join(MODE_STEPS)}")
    chosen = list(range(len(records)))[: limit or None]
    result = BoostResult(fields=[{"original": list(r.captions)} for r in records], chosen=chosen)
    budget = FailureBudget(len(chosen), max_rate=max_failure_rate, max_consecutive=max_consecutive_failures)
    answers: dict[str, dict[int, str]] = {step: {} for step in MODE_STEPS[mode]}
    bad_images: set[int] = set()
    if "visual" in MODE_STEPS[mode]:  # before any request: a file that is not an image is never sent
        for i in chosen:
            problem = image_problem(records[i], image_limits)
            if problem is not None:
                bad_images.add(i)
                result.failures.append(Failure(records[i].image_id, "visual", f"BadImage: {problem}", 0))
                result.stopped = result.stopped or budget.failed(i, BadImage(problem))
    for step in MODE_STEPS[mode]:
        if result.stopped:
            break
        backend = vlm if step == "visual" else llm
        if backend is None:
            raise ValueError(f"boost: step {step!r} needs a {'VLM' if step == 'visual' else 'LLM'} backend")
        tasks = []
        for i in chosen:
            r = records[i]
            if step == "visual" and i in bad_images:
                continue
            inputs: dict[str, Any] = {"captions": list(r.captions)}
            if step == "holistic":
                if i not in answers["blend"] or i not in answers["visual"]:
                    missing = [s for s in ("blend", "visual") if i not in answers[s]]
                    result.failures.append(Failure(r.image_id, step, f"no {' and no '.join(missing)} caption", 0))
                    budget.failed_images.add(i)  # already failed at that step: counted once
                    continue
                inputs |= {"blend": answers["blend"][i], "visual": answers["visual"][i]}
            messages = prompts.messages(step, few_shot=few_shot, **inputs)
            tasks.append(Task(i, r, step, messages, inputs, image_limits))
        done = run_step(step, tasks, backend, cache, retries, progress, budget)
        served = served_check(backend)
        if served is not None:
            result.served_model["vlm" if step == "visual" else "llm"] = served.first
        answers[step] = done.answers
        result.failures += done.failures
        result.requested[step], result.cached[step] = done.sent, done.cached
        if done.cut_off:
            result.cut_off[step] = done.cut_off
        result.stopped = done.stopped
    if result.stopped is None and budget.over_budget():  # checked at the end too
        result.stopped = budget.budget_reason(result.failures[-1].error if result.failures else "none")
    final = MODE_STEPS[mode][-1]
    result.boosted = [i for i in chosen if i in answers[final]]
    result.failed = sorted(budget.failed_images)
    for i, r in enumerate(records):
        for step in MODE_STEPS[mode]:
            text = answers[step].get(i)
            result.fields[i][step] = [text] if text is not None else list(r.captions)
    return result
