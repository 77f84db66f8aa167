"""The ``decode`` section: how captions are decoded (greedy, beam, sampling) and by which engine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from finecap.config.fields import Section, check, doc
from finecap.config.sections.limits import (
    MAX_BATCH,
    MAX_DECODE_POSITIONS,
    MAX_TOKENS,
)
from finecap.config.sections.train import objective_without
from finecap.registry import ENGINES, RL_OBJECTIVES

if TYPE_CHECKING:
    from finecap.config import Config

DecodeStrategy = Literal["greedy", "beam", "sample"]
FinishedBeams = Literal["keep", "set_aside"]
EarlyStopping = Literal[False, True, "never"]


SAMPLE_ONLY = ("temperature", "top_k", "top_p")
"""``decode`` options only sampling reads (``decode.strategy=sample``; RL rollouts sample at ``rl.temperature``)."""
BEAM_ONLY = ("beam_size", "length_penalty", "finished_beams", "early_stopping")
"""``decode`` options only beam search reads (``decode.strategy=beam``, or RL rollouts with ``rl.strategy=beam``)."""


@dataclass
class DecodeConfig(Section, name="decode"):
    engine: str = doc(
        "finecap",
        f"What generates: {', '.join(ENGINES)} (finecap's decoder, every backbone; a colocated vLLM, VLMs, the vllm "
        "section: docs/scaling.md), or a dotted path 'pkg.module:Class' to one's own GenerationEngine "
        "(docs/architecture.md#generation-engines).",
    )
    strategy: DecodeStrategy = doc("greedy", "Decoding strategy.")
    max_length: int = doc(
        24,
        "Maximum generated tokens (EOS included).",
        ge=1,
        le=MAX_TOKENS,
        why="tokens per caption; dense VLM captions reach ~1,000, GPT-2 reads 1,024",
    )
    beam_size: int = doc(
        5, "Beam width for strategy=beam.", ge=1, le=100, why="captioning papers search 3 to 10 beams"
    )
    length_penalty: float = doc(1.0, "Beam score = logprob / length**length_penalty.")
    finished_beams: FinishedBeams = doc(
        "keep", "Beam search: keep a finished caption in its beam (ClipCap) or set it aside as transformers' generate."
    )
    early_stopping: EarlyStopping = doc(
        False, "generate's early_stopping (false, true or never) for decode.finished_beams=set_aside."
    )
    temperature: float = doc(1.0, "Sampling temperature.", gt=0)
    top_k: int = doc(0, "Sample from the k most likely tokens (0 = off).", ge=0)
    top_p: float = doc(1.0, "Nucleus sampling mass (1.0 = off).", gt=0, le=1)
    num_return_sequences: int = doc(1, "Captions returned per image.", ge=1, le=4096, why="captions kept per image")
    stop_at_period: bool = doc(False, "Also stop a caption at a period token.")
    batch_size: int = doc(
        128,
        "Sequences decoded at once: images x beams (beam) or x num_return_sequences (sample), at least one image; "
        f"decode.batch_size x decode.max_length at most {MAX_DECODE_POSITIONS:,} token positions (the decoder caches "
        "every position of every layer).",
        ge=1,
        le=MAX_BATCH,
        why="sequences decoded at once; twice CLIP's contrastive batch of 32,768",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        # decode.batch_size counts the sequences of a decoding batch (finecap.decode.chunk_images); beams and samples
        # never multiply it. (One image's rows, at most 100 beams or 4,096 samples x 4,096 tokens, stay far below.)
        positions = self.batch_size * self.max_length
        check(
            positions <= MAX_DECODE_POSITIONS,
            "decode.batch_size",
            f"decode.batch_size x decode.max_length = {positions:,} token positions in one decoding batch, more than "
            f"{MAX_DECODE_POSITIONS:,} (the decoder caches every position of every layer); lower decode.batch_size",
        )
        check(
            self.strategy != "beam" or self.num_return_sequences <= self.beam_size,
            "decode.num_return_sequences",
            "must be <= decode.beam_size for beam search",
        )
        check(
            self.strategy != "greedy" or self.num_return_sequences == 1,
            "decode.num_return_sequences",
            f"{self.num_return_sequences} needs decode.strategy=sample or beam (greedy decoding returns one "
            "caption per image)",
        )
        check(
            isinstance(self.early_stopping, bool) or self.early_stopping == "never",
            "decode.early_stopping",
            f"invalid value {self.early_stopping!r}; valid choices: false, true, never",
        )
        check(
            not (self.engine == "vllm" and self.strategy == "beam" and self.stop_at_period),
            "decode.stop_at_period",
            "vLLM's beam search (decode.engine=vllm) stops at EOS only; use decode.engine=finecap to stop beams at "
            "a period",
        )
        check(
            self.early_stopping is False or self.finished_beams == "set_aside",
            "decode.early_stopping",
            "is a setting of decode.finished_beams=set_aside (the keep rule ends when every beam has finished)",
        )

    def unread_options(self, cfg: Config) -> dict[str, tuple[str, str]]:
        """Sampling's options under greedy or beam search, beam search's when neither captions nor rollouts search
        beams (an objective that rewards no captions decodes no rollouts). A checkpoint's stored beam settings stay
        when a caption command asks for greedy: hence a warning."""
        have = f"decode.strategy={self.strategy}"
        out = {}
        if self.strategy != "sample":
            out |= {f"decode.{k}": ("decode.strategy=sample", have) for k in SAMPLE_ONLY}
        rollouts_beam = cfg.rl.strategy == "beam" and objective_without(cfg, RL_OBJECTIVES) is None
        if self.strategy != "beam" and not rollouts_beam:
            out |= {f"decode.{k}": ("decode.strategy=beam", have) for k in BEAM_ONLY}
        return out
