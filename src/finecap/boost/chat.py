"""What boost's in-process backends (``transformers``: :mod:`~finecap.boost.hf_backend`; ``vllm``:
:mod:`~finecap.boost.vllm_backend`) share: the chat model's tokenizer or processor and its chat template, a task's
conversation with its image, and the batches they generate in.

- **Chat template**: the LLM role reads the folder's tokenizer (``AutoTokenizer``; its transformers tokenizer where
  that is ``mistral-common``'s, which has no chat template: :func:`load_chat_tokenizer`), the VLM role its processor
  (``AutoProcessor``; its tokenizer beside it), never remote code; a model without a chat template is an error naming
  ``boost.llm_model`` / ``boost.vlm_model`` (boosting needs an instruction-tuned model). Templates are rendered under
  the bounds of :mod:`finecap.models.chat_templates` (a model's template is code: a hostile one stops with an error
  naming it). The LLM role's prompt is tokenised by :func:`prompt_ids`: the template's special tokens are tokens, a
  special token's text in a message (a caption holding ``<|im_end|>``) is text.
- **Images** (the VLM): the image joins the last user message as a ``{"type": "image"}`` content part, before the
  text, and the processor's chat template places its tokens. Each image is decoded by finecap's one rule
  (:func:`finecap.data.images.load_record_image`, within the task's image budget); an image that fails it fails alone
  (:class:`~finecap.boost.engine.BadImage`), unseen by the model.
- **Batches**: ``boost.batch_size`` tasks per :meth:`InProcessBackend.generate` call; their answers are yielded (and
  so cached by the engine) when the batch is done, so a killed run loses at most one batch.
- **An engine that fails**: a batch whose :meth:`InProcessBackend.generate` raises
  :class:`~finecap.boost.engine.EngineFailing` (the model or engine raised instead of answering: out of memory, a
  CUDA error, vLLM's engine core dead) or :class:`~finecap.utils.closing.UsedAfterClose` (the backend was closed)
  answers each of its tasks with that :class:`~finecap.boost.engine.EngineFailing`: the boost engine fails each
  image as a failing server's (:class:`~finecap.boost.engine.FailureBudget` stops the run by
  ``boost.max_failure_rate`` or ``boost.max_consecutive_failures``, where the batch's one failure counts once, the
  answers already cached kept), never a
  traceback out of :meth:`InProcessBackend.run`. Any other error (a chat template's) still stops the run as it is.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import Any

from finecap.boost.engine import BadImage, EngineFailing, Task, engine_failing, option_name
from finecap.data.images import load_record_image
from finecap.data.records import DataError
from finecap.data.targets import text_only
from finecap.models.chat_prompts import chat_prompt_ids
from finecap.models.chat_templates import apply_chat_template
from finecap.utils.closing import UsedAfterClose


def load_chat_tokenizer(model: str, *, vision: bool, key: str, backend: str) -> tuple[Any, Any]:
    """``(processor or None, tokenizer)`` of the chat model ``model`` (a Hub name or a folder): the processor for the
    VLM role (``vision``), the tokenizer alone for the LLM role; a ``ValueError`` naming the model's option (``key``'s:
    :func:`~finecap.boost.engine.option_name`, ``boost.llm_model``, ``judge.model``) when ``model`` is empty or has no
    chat template (``backend`` names the backend in the message).

    The LLM role's tokenizer is the folder's transformers tokenizer (``tokenizer.json`` and its chat template) in
    every environment: where ``mistral-common`` is installed (vLLM installs it), ``AutoTokenizer`` loads a Mistral
    checkpoint holding ``tekken.json`` (Mistral Small 3, Mistral Nemo, Ministral) as ``MistralCommonBackend``
    (:data:`~finecap.data.targets.TEXT_ONLY_TOKENIZERS`), which encodes chats with mistral-common's code and has no
    chat template; its folder is then read by transformers' ``TokenizersBackend``, as transformers'
    ``PixtralProcessor`` reads its tokenizer (the VLM role), so the prompt is the one the same folder gives where
    ``mistral-common`` is not installed (docs/boost.md#mistral-checkpoints-holding-tekkenjson)."""
    from transformers import AutoProcessor, AutoTokenizer, TokenizersBackend

    option = option_name(key, "model")
    if not model:
        raise ValueError(f"{option}: the {backend} backend needs a model name or path")
    if vision:
        processor = AutoProcessor.from_pretrained(model, trust_remote_code=False)
        tokenizer = processor.tokenizer
    else:
        processor, tokenizer = None, AutoTokenizer.from_pretrained(model, trust_remote_code=False)
        if text_only(tokenizer):  # mistral-common's: no chat template (docstring)
            tokenizer = TokenizersBackend.from_pretrained(model, trust_remote_code=False)
    if not getattr(processor or tokenizer, "chat_template", None):
        raise ValueError(f"{option}: {model} has no chat template (an instruction-tuned chat model is needed)")
    return processor, tokenizer


def conversation(task: Task, image: Any) -> list[dict[str, Any]]:
    """``task``'s messages with ``image`` (a PIL image) in the last user message, before its text."""
    messages = [dict(m) for m in task.messages]
    messages[-1]["content"] = [{"type": "image", "image": image}, {"type": "text", "text": messages[-1]["content"]}]
    return messages


def prompt_text(owner: Any, task: Task, image: Any = None) -> str:
    """``task``'s chat prompt rendered by the chat template of ``owner`` (the tokenizer, or the processor with
    ``image``), ending with the assistant's turn."""
    messages = task.messages if image is None else conversation(task, image)
    return apply_chat_template(owner, messages, tokenize=False, add_generation_prompt=True)


def prompt_ids(tokenizer: Any, task: Task) -> list[int]:
    """Token ids of ``task``'s chat prompt (the LLM role), ending with the assistant's turn: the special tokens the
    chat template writes are tokens, a special token's text in a message (a caption, a reference, an answer) is text
    (:func:`finecap.models.chat_prompts.chat_prompt_ids`; docs/boost.md#special-token-text-in-prompts)."""
    return chat_prompt_ids(tokenizer, task.messages, add_generation_prompt=True)


class InProcessBackend(ABC):
    """A chat model in this process answering boost's tasks in batches (module docstring). Subclasses name their
    :attr:`backend`, their :attr:`engine` and how their samples are drawn (:attr:`drawn`), keep their settings
    through :meth:`_settings`, set ``stamp`` (:func:`~finecap.boost.engine.model_stamp`) once the model is loaded,
    and implement :meth:`generate`."""

    backend: str
    """The backend's name: ``boost.llm_backend`` / ``boost.vlm_backend``'s value, and the cache key's."""
    engine: str
    """The engine's name in messages (``vLLM``: :func:`~finecap.boost.engine.engine_failing`)."""
    drawn: str
    """How a sample is drawn (``boost.temperature > 0``): ``"per batch"`` when the tasks of one batch are sampled
    from one generator seeded for the batch (:func:`~finecap.boost.engine.batch_seed`), so a task's samples depend on
    ``boost.batch_size``; ``"per task"`` when each task has a seed of its own
    (:func:`~finecap.boost.engine.request_seed`)."""

    def _settings(self, model: str, *, vision: bool, key: str, batch_size: int, max_new_tokens: int,
                  temperature: float, seed: int, refuse_cut_off: bool) -> None:  # fmt: skip
        """Keep the settings every in-process backend decodes with, and load ``model``'s tokenizer or processor
        (:func:`load_chat_tokenizer`)."""
        self.processor, self.tokenizer = load_chat_tokenizer(model, vision=vision, key=key, backend=self.backend)
        self.name, self.vision = model, vision
        self.batch_size, self.max_new_tokens, self.temperature = batch_size, max_new_tokens, temperature
        self.refuse_cut_off, self.seed = refuse_cut_off, seed

    def identity(self) -> dict[str, Any]:
        """What determines the answers (:class:`~finecap.boost.engine.Backend`): model, files and decoding settings;
        when it samples (``boost.temperature > 0``) also ``run.seed`` and how the samples are drawn (:attr:`drawn`,
        with ``boost.batch_size`` when per batch), so that another seed or batch size into the same ``--out`` asks
        again rather than mix samples drawn otherwise."""
        drawn = f"per batch of {self.batch_size}" if self.drawn == "per batch" else self.drawn
        return {"backend": self.backend, "model": self.name, "vision": self.vision,
                "max_new_tokens": self.max_new_tokens, "temperature": self.temperature,
                **({"seed": self.seed, "drawn": drawn} if self.temperature > 0 else {}),
                **self.stamp}  # fmt: skip

    @abstractmethod
    def generate(self, tasks: Sequence[Task], images: Sequence[Any] = ()) -> list[str | BaseException]:
        """Answers of ``tasks`` (or the exception that failed one); ``images``: their decoded images (the VLM)."""

    def run(self, tasks: Sequence[Task]) -> Iterator[tuple[int, str | BaseException]]:
        for start in range(0, len(tasks), self.batch_size):
            batch = list(range(start, min(start + self.batch_size, len(tasks))))
            images: dict[int, Any] = {}
            if self.vision:  # decoded by finecap's one rule: an image that fails it fails alone, unseen by the model
                for i in list(batch):
                    try:
                        images[i] = load_record_image(tasks[i].record, limits=tasks[i].limits)
                    except DataError as e:
                        batch.remove(i)
                        yield i, BadImage(str(e))
            if batch:
                batch_images = [images[i] for i in batch] if self.vision else ()
                try:
                    answers = self.generate([tasks[i] for i in batch], batch_images)
                except (EngineFailing, UsedAfterClose) as e:  # the engine's failure: each task's (module docstring)
                    failure = engine_failing(e, self.engine)  # one, shared: the budget counts the batch once
                    answers = [failure] * len(batch)
                yield from zip(batch, answers)
