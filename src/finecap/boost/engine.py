"""The boosting engine: runs the steps of Visual Caption Boosting over a data set through any backend, with a
resumable cache, retries of malformed answers and a per-image failure log.

- **Cache** (:class:`AnswerCache`): an append-only JSONL file, one line ``{"key", "step", "image_id", "answer"}`` per
  accepted answer, written and flushed as soon as the answer arrives. ``key`` is the SHA-256 of the backend's
  identity (backend, model, generation settings), the step, the chat messages (prompt + inputs) and, for the visual
  step, the image file's bytes. A killed run loses at most the answers in flight; re-running reads the file, skips
  every cached key and asks only for the rest. A last line cut by the kill is ignored; a key written twice (two
  processes on one cache) keeps its first answer, so nothing is duplicated in the output.
- **Answers** are cleaned (:func:`clean_answer`): surrounding white space and quotes, a leading label such as
  ``Caption:`` and everything after the first line are dropped (the prompts ask for one sentence). An empty answer is
  malformed and asked again, up to ``boost.retries`` times; a backend error that survived the backend's own retries
  (HTTP 5xx, time-outs) fails the image at once.
- **Failures**: every image whose step failed is returned with the step, the reason and the attempts
  (:class:`Failure`); the caller writes them to ``failures.jsonl`` and keeps the image's human captions for that
  field. A failed ``blend`` or ``visual`` step also fails the image's ``holistic`` step (its inputs are missing).
- **Backends** implement :class:`Backend`: ``identity()`` for the cache key and ``run(tasks)`` yielding ``(position,
  answer or exception)`` as answers complete (so the progress bar and the cache advance while a remote server works).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tqdm.auto import tqdm

from finecap.boost.prompts import Prompts
from finecap.data.formats import Record

MODE_STEPS: dict[str, tuple[str, ...]] = {
    "blend": ("blend",),
    "visual": ("visual",),
    "holistic": ("blend", "visual", "holistic"),
}
"""Steps run for each ``boost.mode``, in order (HolisticCap needs BlendCap and VisualCap first)."""


class BackendError(RuntimeError):
    """A request failed for good (after the backend's own retries); the image is logged as failed."""


@dataclass
class Task:
    """One request: ``step`` for the image of ``record`` (``index`` in the data set)."""

    index: int
    record: Record
    step: str
    messages: list[dict[str, Any]]
    inputs: dict[str, Any]
    """The step's variables: ``captions`` (human), ``blend`` and ``visual`` (earlier answers)."""

    @property
    def image(self) -> Path | None:
        return self.record.path if self.step == "visual" else None


class Backend(Protocol):
    def identity(self) -> dict[str, Any]:
        """JSON-able description of what determines the answers (backend, model, generation settings)."""
        ...

    def run(self, tasks: Sequence[Task]) -> Iterator[tuple[int, str | BaseException]]:
        """Answers ``(position in tasks, text or the exception)``, in completion order, one per task."""
        ...


@dataclass
class Failure:
    image_id: Any
    step: str
    error: str
    attempts: int

    def to_dict(self) -> dict[str, Any]:
        return {"image_id": self.image_id, "step": self.step, "error": self.error, "attempts": self.attempts}


@dataclass
class BoostResult:
    """Per record (data set order): ``fields[i][name] = [caption, ...]`` for ``original`` and every step run."""

    fields: list[dict[str, list[str]]]
    failures: list[Failure] = field(default_factory=list)
    requested: dict[str, int] = field(default_factory=dict)
    """Answers requested from the backends per step in this run (cached answers are not requested)."""


_LABEL = re.compile(r"^\s*(?:improved |blended |holistic |human |final )?(?:caption|description|answer)\s*:\s*", re.I)


def clean_answer(text: Any) -> str | None:
    """The answer's first non-empty line without quotes or a leading label; ``None`` when nothing is left.

    Example::

        >>> clean_answer('  Caption: "A red circle on grass."\\nI hope this helps!')
        'A red circle on grass.'
        >>> clean_answer("   ") is None
        True
    """
    if not isinstance(text, str):
        return None
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    if not lines:
        return None
    line = _LABEL.sub("", lines[0]).strip().strip("\"'`“”").strip()
    return line or None


def _sha256_file(path: Path, memo: dict[Path, str]) -> str:
    if path not in memo:
        memo[path] = hashlib.sha256(path.read_bytes()).hexdigest()
    return memo[path]


class AnswerCache:
    """Append-only JSONL of accepted answers keyed by request hash (module docstring)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.answers: dict[str, str] = {}
        self.n_lines = 0
        if self.path.exists():
            with self.path.open() as f:
                for line in f:
                    try:
                        row = json.loads(line)
                        key, answer = row["key"], row["answer"]
                    except (json.JSONDecodeError, KeyError, TypeError):
                        continue  # a line cut by a kill
                    self.answers.setdefault(key, answer)
                    self.n_lines += 1
            if self.path.stat().st_size and not self.path.read_bytes().endswith(b"\n"):
                with self.path.open("a") as f:
                    f.write("\n")  # the next answer starts on its own line
        self._file = self.path.open("a")

    def __contains__(self, key: str) -> bool:
        return key in self.answers

    def get(self, key: str) -> str:
        return self.answers[key]

    def put(self, key: str, step: str, image_id: Any, answer: str) -> None:
        if key in self.answers:
            return
        self.answers[key] = answer
        self._file.write(json.dumps({"key": key, "step": step, "image_id": image_id, "answer": answer}) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def request_key(backend: Backend, task: Task, image_hashes: dict[Path, str]) -> str:
    """SHA-256 of backend identity, step, messages, inputs and (visual step) image bytes."""
    content = {"backend": backend.identity(), "step": task.step, "messages": task.messages, "inputs": task.inputs}
    if task.image is not None:
        content["image"] = _sha256_file(task.image, image_hashes)
    return hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()


def run_step(
    step: str,
    tasks: list[Task],
    backend: Backend,
    cache: AnswerCache,
    retries: int,
    progress: bool = True,
) -> tuple[dict[int, str], list[Failure], int]:
    """Answers ``{task.index: text}`` of one step, the failures, and how many requests were sent."""
    hashes: dict[Path, str] = {}
    keys = {t.index: request_key(backend, t, hashes) for t in tasks}
    answers = {t.index: cache.get(keys[t.index]) for t in tasks if keys[t.index] in cache}
    pending = [t for t in tasks if t.index not in answers]
    failures: list[Failure] = []
    sent = 0
    bar = tqdm(total=len(tasks), initial=len(answers), desc=f"boost [{step}]", unit="image", disable=not progress)
    for attempt in range(1, retries + 2):
        if not pending:
            break
        malformed: list[tuple[Task, str]] = []
        sent += len(pending)
        for pos, answer in backend.run(pending):
            task = pending[pos]
            if isinstance(answer, BaseException):
                failures.append(Failure(task.record.image_id, step, f"{type(answer).__name__}: {answer}", attempt))
                bar.update(1)
                continue
            text = clean_answer(answer)
            if text is None:
                malformed.append((task, f"malformed or empty answer {answer!r:.200}"))
                continue
            cache.put(keys[task.index], step, task.record.image_id, text)
            answers[task.index] = text
            bar.update(1)
        pending = [t for t, _ in malformed]
        if attempt == retries + 1:
            failures += [Failure(t.record.image_id, step, reason, attempt) for t, reason in malformed]
            bar.update(len(malformed))
    bar.close()
    return answers, failures, sent


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
) -> BoostResult:
    """Run the steps of ``mode`` (:data:`MODE_STEPS`) over ``records`` (the first ``limit``; 0 = all). Every record
    gets ``original`` and one field per step; a failed step keeps the human captions in its field."""
    if mode not in MODE_STEPS:
        raise ValueError(f"boost.mode: unknown mode {mode!r}; valid modes: {', '.join(MODE_STEPS)}")
    chosen = list(range(len(records)))[: limit or None]
    result = BoostResult(fields=[{"original": list(r.captions)} for r in records])
    answers: dict[str, dict[int, str]] = {}
    for step in MODE_STEPS[mode]:
        backend = vlm if step == "visual" else llm
        if backend is None:
            raise ValueError(f"boost: step {step!r} needs a {'VLM' if step == 'visual' else 'LLM'} backend")
        tasks = []
        for i in chosen:
            r = records[i]
            inputs: dict[str, Any] = {"captions": list(r.captions)}
            if step == "holistic":
                if i not in answers["blend"] or i not in answers["visual"]:
                    missing = [s for s in ("blend", "visual") if i not in answers[s]]
                    result.failures.append(Failure(r.image_id, step, f"no {' and no '.join(missing)} caption", 0))
                    continue
                inputs |= {"blend": answers["blend"][i], "visual": answers["visual"][i]}
            messages = prompts.messages(step, few_shot=few_shot, **inputs)
            tasks.append(Task(i, r, step, messages, inputs))
        answers[step], failures, sent = run_step(step, tasks, backend, cache, retries, progress)
        result.failures += failures
        result.requested[step] = sent
    for i, r in enumerate(records):
        for step in MODE_STEPS[mode]:
            text = answers[step].get(i)
            result.fields[i][step] = [text] if text is not None else list(r.captions)
    return result
