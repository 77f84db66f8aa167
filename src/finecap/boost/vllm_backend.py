"""The ``vllm`` backend: a chat model served by a ``vllm.LLM`` in this process (``boost.llm_backend=vllm`` /
``boost.vlm_backend=vllm``), the in-process counterpart of an OpenAI-compatible vLLM server.

``boost.<role>_model`` is a transformers folder or a Hub name, as for the ``transformers`` backend, and everything
but the generation is shared with it (:mod:`finecap.boost.chat`): the tokenizer or processor and its chat template
(rendered under finecap's bounds), the image in the last user message, ``boost.batch_size`` tasks per call to
``LLM.generate`` (vLLM schedules the batch's requests together; the engine caches the answers when the batch ends,
so a killed run loses at most one batch).

- **LLM role**: the prompt is the chat template's text tokenized as the ``transformers`` backend tokenizes it
  (:func:`~finecap.boost.chat.prompt_ids`: the template's special tokens are tokens, none added; a special token's
  text in a message is text), sent as token ids.
- **VLM role**: the processor's rendered text with the decoded image as ``multi_modal_data``; vLLM's processing of
  the folder expands the image placeholder (at most one image per prompt).
- **Decoding**: greedy at ``boost.temperature=0``, else sampling at that temperature; at most
  ``boost.max_new_tokens`` tokens; every other setting (stop tokens, ``top_k``, ``top_p``, ``repetition_penalty``)
  is the folder's ``generation_config.json``, as ``transformers.generate`` and a vLLM server read it
  (``generation_config="auto"``). Each task samples from a seed of its own
  (:func:`~finecap.boost.engine.request_seed` of ``run.seed`` and the task, the ``seed`` the ``openai`` backend
  sends), so its samples depend on neither ``boost.batch_size`` nor what the engine generated before it: a
  resumed run draws what an uninterrupted one would. Answers are the generated
  tokens decoded as the ``transformers`` backend decodes them (special tokens skipped); one that vLLM stopped at
  ``boost.max_new_tokens`` (``finish_reason`` ``"length"``) was cut off: a :class:`~finecap.boost.engine.CutOff`,
  unless the backend is made with ``refuse_cut_off=False``.
- **Engine**: built once per role in the model's saved dtype (``config.json``'s, as transformers loads it; vLLM's
  own default would run a float32 model in half precision), with the ``vllm`` section's memory and parallelism
  settings (``max_model_len``, ``kv_cache_memory_bytes``, ``gpu_memory_utilization``, ``tensor_parallel_size``,
  ``enforce_eager``; :func:`finecap.engines.vllm.start_llm`). Two roles on vLLM are two engines in one process,
  each taking ``vllm.gpu_memory_utilization`` of the GPU's memory (and ``vllm.kv_cache_memory_bytes`` of KV cache).
  :meth:`VllmBackend.close` (the end of a boost run, the ``vllm`` judge's close) shuts the engine down and so gives
  that memory back, as a start that fails after vLLM started does (:func:`finecap.engines.vllm.shutdown_llm`).
- **A request vLLM refuses** (a prompt longer than ``vllm.max_model_len``: vLLM raises its ``VLLMClientError``, an
  HTTP 4xx on its server, or a ``ValueError``, before generating) fails its image as a
  :class:`~finecap.boost.engine.BackendError`, as an HTTP 400 does with the ``openai`` backend: the batch is asked
  again one task at a time, so only the refused tasks fail.
- **An engine that raises instead of answering** (out of memory, vLLM's ``EngineDeadError``, any other error of
  ``LLM.generate``) raises :class:`~finecap.boost.engine.EngineFailing` from :meth:`VllmBackend.generate`, naming
  the engine's error (:func:`~finecap.boost.engine.engine_failing`); the batch is not asked again prompt by prompt.
  Boost's :meth:`~finecap.boost.chat.InProcessBackend.run` fails each task of the batch with it, as a failing
  server's request fails its image (``failures.jsonl``; the run stops by ``boost.max_failure_rate`` or
  ``boost.max_consecutive_failures``, exit code 2, the answers already cached kept), and so does a use after
  :meth:`VllmBackend.close`; the ``vllm`` judge counts it towards ``judge.max_consecutive_failures``.

Greedy answers equal the ``transformers`` backend's in float32 on tiny Llama and Idefics3 chat models
(``tests/engines/test_vllm_boost.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from finecap.boost.chat import InProcessBackend, prompt_ids, prompt_text
from finecap.boost.engine import BackendError, Task, cut_off, engine_failing, model_stamp, option_name, request_seed

if TYPE_CHECKING:
    from finecap.config import VllmConfig


def saved_dtype(model: str) -> str:
    """The dtype ``model``'s ``config.json`` names (what ``from_pretrained`` loads it in), or ``"auto"``."""
    from transformers import AutoConfig

    dtype = getattr(AutoConfig.from_pretrained(model, trust_remote_code=False), "dtype", None)
    return "auto" if dtype is None else str(dtype).removeprefix("torch.")


class VllmBackend(InProcessBackend):
    """A chat model served by an in-process ``vllm.LLM`` (module docstring). ``key``: whose options it reads, named in
    its messages (:func:`~finecap.boost.engine.option_name`: boost's role ``boost.llm`` / ``boost.vlm``, or
    ``judge``); ``option``: the option and value that chose it, named when vLLM is missing or the engine was closed
    (default ``<key>_backend=vllm``, boost's; the ``vllm`` judge's is ``judge.name=vllm``)."""

    backend, engine = "vllm", "vLLM"
    drawn = "per task"  # each request's SamplingParams.seed

    def __init__(
        self,
        model: str,
        *,
        vision: bool = False,
        section: VllmConfig | None = None,
        batch_size: int = 8,
        max_new_tokens: int = 120,
        temperature: float = 0.0,
        seed: int = 0,
        key: str = "boost.llm",
        refuse_cut_off: bool = True,
        option: str = "",
    ) -> None:
        from finecap.config import VllmConfig
        from finecap.engines.vllm import import_vllm, start_llm

        option = self.option = option or f"{option_name(key, 'backend')}=vllm"
        import_vllm(option)  # a missing vLLM is named before anything loads
        self._settings(model, vision=vision, key=key, batch_size=batch_size, max_new_tokens=max_new_tokens,
                       temperature=temperature, seed=seed, refuse_cut_off=refuse_cut_off)  # fmt: skip
        images = {"limit_mm_per_prompt": {"image": 1}} if vision else {}
        self.llm, self.environment = None, contextlib.ExitStack()  # the variables start_llm set, removed by close
        try:
            self.llm = start_llm(model, section or VllmConfig(), dtype=saved_dtype(model), seed=seed,
                                 environment=self.environment, generation_config="auto", option=option,
                                 **images)  # fmt: skip
            self.stamp = model_stamp(model)  # read once, after loading: the identity of every request
        except BaseException:  # a start that failed: the engine, if vLLM started, shut down and its variables removed
            self.close()
            raise

    def sampling_params(self, task: Task | None = None) -> Any:
        """The folder's generation settings (module docstring) with ``boost.temperature`` and ``max_new_tokens``;
        when sampling, ``task``'s own seed (:func:`~finecap.boost.engine.request_seed`)."""
        from vllm import SamplingParams

        defaults = self._running().model_config.get_diff_sampling_param()
        settings = {**defaults, "temperature": self.temperature, "max_tokens": self.max_new_tokens}
        if self.temperature > 0 and task is not None:
            settings["seed"] = request_seed(self.seed, task)
        return SamplingParams.from_optional(**settings, detokenize=False)

    def prompt(self, task: Task, image: Any = None) -> dict[str, Any]:
        """vLLM's prompt of ``task`` (module docstring)."""
        if not self.vision:
            return {"prompt_token_ids": prompt_ids(self.tokenizer, task)}  # a message's special-token text is text
        return {"prompt": prompt_text(self.processor, task, image), "multi_modal_data": {"image": image}}

    def _answers(self, prompts: list[dict[str, Any]], tasks: Sequence[Task]) -> list[str | BaseException]:
        """Answers of ``prompts`` (those of ``tasks``) in one call; after a refusal, of each prompt alone (module
        docstring)."""
        from vllm.exceptions import VLLMClientError

        from finecap.engines.vllm import autocast_off

        params = [self.sampling_params(t) for t in tasks]
        try:
            with autocast_off():  # a judged reward asks during a training step, under its bf16 autocast
                outputs = self.llm.generate(prompts, params, use_tqdm=False)
        except (VLLMClientError, ValueError) as e:  # the request's fault (vLLM's 4xx), found before generating
            if len(prompts) > 1:
                return [answer for p, t in zip(prompts, tasks, strict=True) for answer in self._answers([p], [t])]
            return [BackendError(f"vLLM refused the request: {' '.join(str(e).split())[:300]}")]
        except Exception as e:  # the engine's failure, no request's: not asked again prompt by prompt (docstring)
            raise engine_failing(e, self.engine) from e
        texts = self.tokenizer.batch_decode([list(o.outputs[0].token_ids) for o in outputs], skip_special_tokens=True)
        return [
            cut_off(text, self.max_new_tokens, "no end-of-sequence token")  # as the transformers backend says it
            if self.refuse_cut_off and o.outputs[0].finish_reason == "length"
            else text
            for o, text in zip(outputs, texts, strict=True)
        ]

    def generate(self, tasks: Sequence[Task], images: Sequence[Any] = ()) -> list[str | BaseException]:
        """Answers of ``tasks`` (a :class:`BackendError` for a prompt vLLM refuses); ``images``: their decoded
        images (the VLM). An engine that raises instead of answering raises
        :class:`~finecap.boost.engine.EngineFailing` naming its error; after :meth:`close`, a
        :class:`~finecap.utils.closing.UsedAfterClose` saying so (module docstring)."""
        self._running()
        prompts = [self.prompt(t, im) for t, im in zip(tasks, images or [None] * len(tasks), strict=True)]
        return self._answers(prompts, tasks)

    def _running(self) -> Any:
        """The ``vllm.LLM``; after :meth:`close`, :class:`~finecap.utils.closing.UsedAfterClose`
        (:func:`finecap.engines.vllm.running`)."""
        from finecap.engines.vllm import running

        return running(self.llm, f"{self.option}: this backend", "build another (finecap.boost.backends.make_backend)")

    def close(self) -> None:
        """Shut the engine down, giving back its memory now, and remove the environment variables finecap set for it
        (:func:`finecap.engines.vllm.shutdown_llm`); a second call does nothing, a use after it is a
        :class:`~finecap.utils.closing.UsedAfterClose`."""
        from finecap.engines.vllm import shutdown_llm

        llm, self.llm = self.llm, None
        shutdown_llm(llm, self.environment)
