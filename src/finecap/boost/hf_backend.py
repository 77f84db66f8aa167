"""The ``transformers`` backend: an in-process chat model, by Hub name or local path, prompted through the model's
own chat template and generated in batches (``boost.batch_size`` prompts, left-padded). The chat template, the
image's place in the conversation and the batches are :mod:`finecap.boost.chat`'s, shared with the ``vllm`` backend.

- LLM steps (``blend``, ``holistic``): ``AutoTokenizer`` + ``AutoModelForCausalLM``;
  ``tokenizer.apply_chat_template(messages, add_generation_prompt=True)``, under the bounds of
  :mod:`finecap.models.chat_templates` (a model's template is code: a hostile one stops with an error naming it),
  tokenised by :func:`~finecap.boost.chat.prompt_ids`: the template's special tokens are tokens, a special token's
  text in a message (a caption holding ``<|im_end|>``) is text.
- The VLM step (``visual``): ``AutoProcessor`` + ``AutoModelForImageTextToText``; the image joins the last user
  message as a ``{"type": "image"}`` content part and the processor's chat template places its tokens. Both paths
  are tested on tiny models saved by the tests (a Llama chat model; a LLaVA with a tiny CLIP vision tower).

Greedy decoding at ``boost.temperature=0``, sampling otherwise; at most ``boost.max_new_tokens`` new tokens; the
rest of the decoding settings are the folder's ``generation_config.json`` (``transformers.generate``'s own reading).
Samples follow ``run.seed``: each batch draws from torch's generator seeded by ``run.seed`` and the batch's tasks
(:func:`~finecap.boost.engine.batch_seed`; the process's generators are left as they were), so a run repeats its
samples whatever ran before it in the process, and the cache key holds the seed and ``boost.batch_size`` when sampling
(another ``run.seed`` or batch size into the same ``--out`` asks again: a batch's tasks draw from one generator).
An answer with no end-of-sequence token (the generation config's ``eos_token_id``, else the tokenizer's) in its
``boost.max_new_tokens`` tokens was cut off: a :class:`~finecap.boost.engine.CutOff`, unless the backend is made with
``refuse_cut_off=False``.
A model without a chat template is an error naming ``boost.llm_model`` / ``boost.vlm_model``. The model runs on
``device`` (:func:`~finecap.boost.backends.make_backend`: the GPU, as ``finecap eval``'s models, unless ``train.cpu``).
A model that raises instead of answering (``torch.OutOfMemoryError``, a CUDA error: any error of moving the batch to
the device or of ``generate``) raises :class:`~finecap.boost.engine.EngineFailing` naming it
(:func:`~finecap.boost.engine.engine_failing`), the ``vllm`` backend's rule: :meth:`InProcessBackend.run
<finecap.boost.chat.InProcessBackend.run>` fails each task of the batch with it, as a failing server's request fails
its image (``failures.jsonl``, counted in ``boost.max_failure_rate`` and ``boost.max_consecutive_failures``; exit
code 2 when the run stops, the answers already cached kept), never a traceback leaving ``boost.json`` ``running``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from finecap.boost.chat import InProcessBackend, conversation, prompt_ids
from finecap.boost.engine import Task, batch_seed, cut_off, engine_failing, model_stamp
from finecap.models.chat_templates import apply_chat_template
from finecap.models.vlm import model_stop_tokens
from finecap.utils.rng import rng_preserved


class TransformersBackend(InProcessBackend):
    """A chat model run in this process (module docstring)."""

    backend = engine = "transformers"
    drawn = "per batch"  # one torch generator per batch: transformers' generate takes no seed per sequence

    def __init__(
        self,
        model: str,
        *,
        vision: bool = False,
        batch_size: int = 8,
        max_new_tokens: int = 120,
        temperature: float = 0.0,
        seed: int = 0,
        key: str = "boost.llm",
        refuse_cut_off: bool = True,
        device: str | torch.device | None = None,
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

        from finecap.models.memory import loading_onto, placement

        self._settings(model, vision=vision, key=key, batch_size=batch_size, max_new_tokens=max_new_tokens,
                       temperature=temperature, seed=seed, refuse_cut_off=refuse_cut_off)  # fmt: skip
        auto = AutoModelForImageTextToText if vision else AutoModelForCausalLM
        with loading_onto(device):  # a CUDA device's weights read straight onto it, not into host memory
            self.model = auto.from_pretrained(model, trust_remote_code=False, **placement())
        if device is not None:
            self.model.to(device)
        self.stamp = model_stamp(model)  # read once, after loading: the identity of every request
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model.eval()

    def _inputs(self, tasks: Sequence[Task], images: Sequence[Any] = ()) -> dict[str, torch.Tensor]:
        if not self.vision:
            rows = [prompt_ids(self.tokenizer, t) for t in tasks]  # a message's special-token text is text
            return self.tokenizer.pad({"input_ids": rows}, padding=True, return_tensors="pt")  # left-padded
        conversations = [conversation(t, image) for t, image in zip(tasks, images, strict=True)]
        options = dict(return_dict=True, return_tensors="pt", processor_kwargs={"padding": True})
        return apply_chat_template(self.processor, conversations, add_generation_prompt=True, tokenize=True, **options)

    @torch.no_grad()
    def generate(self, tasks: Sequence[Task], images: Sequence[Any] = ()) -> list[str | BaseException]:
        """Answers of ``tasks``; ``images``: their decoded images (the VLM). A model that raises instead of answering
        (out of memory, a CUDA error) raises :class:`~finecap.boost.engine.EngineFailing` naming its error (module
        docstring); a chat template's error is raised as it is."""
        inputs = self._inputs(tasks, images)
        sampling = (
            {"do_sample": True, "temperature": self.temperature} if self.temperature > 0 else {"do_sample": False}
        )
        try:
            inputs = inputs.to(self.model.device)
            with rng_preserved():  # the process's generators as they were after the batch
                if self.temperature > 0:
                    torch.manual_seed(batch_seed(self.seed, tasks))
                out = self.model.generate(
                    **inputs, max_new_tokens=self.max_new_tokens, pad_token_id=self.tokenizer.pad_token_id, **sampling
                )  # (B, T_in + T_new)
        except Exception as e:  # the engine's failure, no request's: the batch fails (module docstring)
            raise engine_failing(e, self.engine) from e
        new = out[:, inputs["input_ids"].shape[1] :]  # (B, T_new)
        texts: list[str | BaseException] = list(self.tokenizer.batch_decode(new, skip_special_tokens=True))
        if self.refuse_cut_off and new.shape[1] >= self.max_new_tokens:  # a shorter batch ended every answer
            ends = torch.isin(new, torch.tensor(self.eos_ids(), dtype=new.dtype, device=new.device)).any(dim=1)  # (B,)
            for b in (~ends).nonzero().flatten().tolist():
                texts[b] = cut_off(str(texts[b]), self.max_new_tokens, "no end-of-sequence token")
        return texts

    def eos_ids(self) -> list[int]:
        """The tokens that end an answer: the generation config's ``eos_token_id`` (one or a list), else the
        tokenizer's."""
        eos = self.tokenizer.eos_token_id
        return model_stop_tokens(self.model) or ([] if eos is None else [int(eos)])
