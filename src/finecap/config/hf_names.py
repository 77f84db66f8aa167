"""The names Hugging Face's libraries give finecap's options (:data:`HF_NAMES`), for the error of an unknown key
(:func:`hf_hint`): ``decode.num_beams=3`` is told ``decode.beam_size``, not the key closest by spelling
(``decode.finished_beams``). The names are suggested, never read: one spelling per value
(docs/configuration.md#names-from-hugging-face)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

TRL = "TRL's"


@dataclass(frozen=True)
class HFName:
    """What a name of transformers' ``generate`` and ``TrainingArguments``, or of TRL's ``GRPOConfig``, is here."""

    key: str | None
    """finecap's option holding the value (``section.key``); ``None``: finecap has no counterpart."""
    value: str = ""
    """For a switch (``do_sample=true``): the value of :attr:`key` it stands for (``sample``)."""
    note: str = ""
    """What else it needs, or how its meaning differs; empty when it is the same value under another name."""
    whose: str = "Hugging Face's"
    """Whose name it is, as the message says it."""


HF_NAMES: dict[str, HFName] = {
    # generate (GenerationConfig); temperature, top_k, top_p, length_penalty, early_stopping and
    # num_return_sequences are finecap's names too
    "num_beams": HFName(
        "decode.beam_size",
        note="read with decode.strategy=beam; transformers' rule of finished beams is decode.finished_beams=set_aside",
    ),
    "max_new_tokens": HFName(
        "decode.max_length",
        note="generated tokens, EOS included, as max_new_tokens counts them; the prompt is never counted",
    ),
    "do_sample": HFName("decode.strategy", "sample", "do_sample=false is decode.strategy=greedy or beam"),
    "repetition_penalty": HFName(None),
    "no_repeat_ngram_size": HFName(None),
    "min_new_tokens": HFName(None),
    "min_length": HFName(None),
    # TrainingArguments; max_steps, warmup_steps, weight_decay, gradient_checkpointing and tf32 are finecap's too
    "learning_rate": HFName("train.lr"),
    "per_device_train_batch_size": HFName("train.batch_size"),
    "num_train_epochs": HFName("train.epochs"),
    "gradient_accumulation_steps": HFName("train.grad_accum_steps"),
    "max_grad_norm": HFName("train.grad_clip"),
    "warmup_ratio": HFName("train.warmup_steps", note="a number of steps, not a fraction"),
    "lr_scheduler_type": HFName(
        "train.schedule",
        note="linear, cosine or constant, each after train.warmup_steps: constant_with_warmup is constant, "
        "transformers' constant is constant with train.warmup_steps=0",
    ),
    "logging_steps": HFName("train.log_every", note="a number of steps, not a fraction"),
    "eval_steps": HFName("train.eval_every", note="0 evaluates once per epoch"),
    "save_steps": HFName("train.save_every", note="0 saves at each evaluation"),
    "metric_for_best_model": HFName("train.best_metric", note="a metric's name without transformers' eval_ prefix"),
    "greater_is_better": HFName("train.best_mode", note="max for true, min for false"),
    "bf16": HFName("train.mixed_precision", "bf16"),
    "fp16": HFName("train.mixed_precision", "fp16"),
    "report_to": HFName("train.log_with", note="a list of trackers; jsonl is finecap's metrics.jsonl"),
    "use_cpu": HFName("train.cpu"),
    "output_dir": HFName("run.dir"),
    # TRL's GRPOConfig (the grpo section's docs name each key's TRL name); scale_rewards is finecap's too
    "num_generations": HFName("rl.samples", whose=TRL),
    "max_completion_length": HFName("decode.max_length", whose=TRL),
    "beta": HFName("grpo.kl_coef", whose=TRL, note="read with grpo.policy_loss=clipped"),
    "epsilon": HFName("grpo.clip_low", whose=TRL, note="read with grpo.policy_loss=clipped"),
    "epsilon_high": HFName("grpo.clip_high", whose=TRL, note="read with grpo.policy_loss=clipped"),
    "num_iterations": HFName("grpo.iterations", whose=TRL, note="read with grpo.policy_loss=clipped"),
}
"""A name of Hugging Face's libraries that is no option of finecap -> what it is here."""


def hf_hint(name: str, spell: Callable[[str], str] = str) -> str:
    """`` (...)``: what the Hugging Face name ``name`` is here, for the message of an unknown key, or ``""`` when
    ``name`` is none of :data:`HF_NAMES`; ``spell`` writes finecap's key as the caller takes it (``train.lr``, a
    keyword's ``train__lr``).

    >>> hf_hint("num_beams")
    " (Hugging Face's num_beams is 'decode.beam_size' here; read with decode.strategy=beam; transformers' rule of \
finished beams is decode.finished_beams=set_aside)"
    >>> hf_hint("do_sample", spell=lambda key: key.split(".", 1)[1])
    " (Hugging Face's do_sample=true is 'strategy=sample' here; do_sample=false is decode.strategy=greedy or beam)"
    >>> hf_hint("repetition_penalty"), hf_hint("beam_size")
    (" (Hugging Face's repetition_penalty has no counterpart in finecap)", '')
    """
    hf = HF_NAMES.get(name)
    if hf is None:
        return ""
    if hf.key is None:
        return f" ({hf.whose} {name} has no counterpart in finecap)"
    said = f"{name}=true is {spell(hf.key) + '=' + hf.value!r}" if hf.value else f"{name} is {spell(hf.key)!r}"
    return f" ({hf.whose} {said} here" + (f"; {hf.note}" if hf.note else "") + ")"
