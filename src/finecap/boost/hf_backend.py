"""The ``transformers`` backend: an in-process chat model, by Hub name or local path, prompted through the model's
own chat template and generated in batches (``boost.batch_size`` prompts, left-padded).

- LLM steps (``blend``, ``holistic``): ``AutoTokenizer`` + ``AutoModelForCausalLM``;
  ``tokenizer.apply_chat_template(messages, add_generation_prompt=True)``, under the bounds of
  :mod:`finecap.models.chat_templates` (a model's template is code: a hostile one stops with an error naming it).
- The VLM step (``visual``): ``AutoProcessor`` + ``AutoModelForImageTextToText``; the image joins the last user
  message as a ``{"type": "image"}`` content part and the processor's chat template places its tokens. Both paths
  are tested on tiny models saved by the tests (a Llama chat model; a LLaVA with a tiny CLIP vision tower).

Greedy decoding at ``boost.temperature=0``, sampling otherwise; at most ``boost.max_new_tokens`` new tokens. A model
without a chat template is an error naming ``boost.llm_model`` / ``boost.vlm_model``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch

from finecap.boost.engine import BadImage, Task
from finecap.data.images import load_record_image
from finecap.data.records import DataError
from finecap.models.chat_templates import apply_chat_template


class TransformersBackend:
    """A chat model run in this process (module docstring)."""

    def __init__(
        self,
        model: str,
        *,
        vision: bool = False,
        batch_size: int = 8,
        max_new_tokens: int = 120,
        temperature: float = 0.0,
        key: str = "boost.llm",
    ) -> None:
        from transformers import (
            AutoModelForCausalLM,
            AutoModelForImageTextToText,
            AutoProcessor,
            AutoTokenizer,
        )

        if not model:
            raise ValueError(f"{key}_model: the transformers backend needs a model name or path")
        self.name, self.vision = model, vision
        self.batch_size, self.max_new_tokens, self.temperature = batch_size, max_new_tokens, temperature
        if vision:
            self.processor = AutoProcessor.from_pretrained(model, trust_remote_code=False)
            self.tokenizer = self.processor.tokenizer
            self.model = AutoModelForImageTextToText.from_pretrained(model, trust_remote_code=False)
        else:
            self.processor = None
            self.tokenizer = AutoTokenizer.from_pretrained(model, trust_remote_code=False)
            self.model = AutoModelForCausalLM.from_pretrained(model, trust_remote_code=False)
        template = getattr(self.processor or self.tokenizer, "chat_template", None)
        if not template:
            raise ValueError(f"{key}_model: {model} has no chat template (boosting needs an instruction-tuned model)")
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model.eval()

    def identity(self) -> dict[str, Any]:
        return {"backend": "transformers", "model": self.name, "vision": self.vision,
                "max_new_tokens": self.max_new_tokens, "temperature": self.temperature}  # fmt: skip

    def _inputs(self, tasks: Sequence[Task], images: Sequence[Any] = ()) -> dict[str, torch.Tensor]:
        if not self.vision:
            texts = [apply_chat_template(self.tokenizer, t.messages, tokenize=False, add_generation_prompt=True)
                     for t in tasks]  # fmt: skip
            return self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        conversations = []
        for t, image in zip(tasks, images, strict=True):
            messages = [dict(m) for m in t.messages]
            messages[-1]["content"] = [{"type": "image", "image": image},
                                       {"type": "text", "text": messages[-1]["content"]}]  # fmt: skip
            conversations.append(messages)
        assert self.processor is not None
        options = dict(return_dict=True, return_tensors="pt", processor_kwargs={"padding": True})
        return apply_chat_template(self.processor, conversations, add_generation_prompt=True, tokenize=True, **options)

    @torch.no_grad()
    def generate(self, tasks: Sequence[Task], images: Sequence[Any] = ()) -> list[str]:
        """Answers of ``tasks``; ``images``: their decoded images (the VLM)."""
        inputs = self._inputs(tasks, images)
        sampling = (
            {"do_sample": True, "temperature": self.temperature} if self.temperature > 0 else {"do_sample": False}
        )
        out = self.model.generate(
            **inputs, max_new_tokens=self.max_new_tokens, pad_token_id=self.tokenizer.pad_token_id, **sampling
        )  # (B, T_in + T_new)
        new = out[:, inputs["input_ids"].shape[1] :]  # (B, T_new)
        return self.tokenizer.batch_decode(new, skip_special_tokens=True)

    def run(self, tasks: Sequence[Task]) -> Iterator[tuple[int, str | BaseException]]:
        for start in range(0, len(tasks), self.batch_size):
            batch = list(range(start, min(start + self.batch_size, len(tasks))))
            images: dict[int, Any] = {}
            if self.vision:  # decoded by finecap's one rule: an image that fails it fails alone, unseen by the model
                for i in list(batch):
                    try:
                        images[i] = load_record_image(tasks[i].record)
                    except DataError as e:
                        batch.remove(i)
                        yield i, BadImage(str(e))
            if batch:
                answers = self.generate([tasks[i] for i in batch], [images[i] for i in batch] if self.vision else ())
                yield from zip(batch, answers)
