"""What a reward's ``setup`` reads: one :class:`RewardInputs`, built from a training context
(:meth:`RewardInputs.from_context`), from a configuration and its training records (:meth:`RewardInputs.of_run`:
the reward server, without an accelerator or a training context) or from an adapter's options (the fields given as
keyword arguments: :func:`finecap.rewards.reward_of`). A reward reads the fields it needs and says which it misses.

Example::

    >>> inputs = RewardInputs(references={1: ["a red circle"]})
    >>> inputs.gather(torch.tensor([1.0])).tolist()  # one process: the identity
    [1.0]
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from finecap.config import Config
    from finecap.contract import TrainContext
    from finecap.judges.base import Question
    from finecap.world.scene import Scene


def identity(values: torch.Tensor) -> torch.Tensor:
    """``gather`` of one process: the values themselves."""
    return values


def references_of(records: Sequence[Any]) -> dict[Hashable, list[str]]:
    """``{image_id: [captions]}`` of data-set records (an image's records pooled, in order)."""
    refs: dict[Hashable, list[str]] = {}
    for record in records:
        refs.setdefault(record.image_id, []).extend(record.captions)
    return refs


@dataclass
class RewardInputs:
    """The data a reward is set up with (every field optional; a reward that misses one it needs says so).

    Attributes:
        references: ``{image_id: [reference captions]}`` (CIDEr-D's corpus; CHAIR's extra ground truth).
        records: data-set records whose image files a reward embeds (the training split; disk-cached in
            ``cache_dir``).
        images: ``{image_id: PIL image}`` to embed; embeddings: ``{image_id: tensor (D,)}`` already embedded.
        retriever: a :class:`finecap.models.retriever.Retriever` (self-retrieval).
        scenes: ``{image_id: Scene}``, the world's scene graphs (the listener; CHAIR's ground truth on the world).
        objects: ``{image_id: annotated categories}`` (CHAIR outside a run).
        questions: ``{image_id: [Question]}``, multiple-choice questions (:class:`finecap.judges.base.Question`) about
            each image (``qa_utility``; in a run the data set's own (:func:`finecap.judges.questions.questions_of` of
            the training records), else ``judge.questions`` or the world's scene graphs are read by the reward:
            :func:`finecap.judges.questions.pick_questions`).
        gather: ``gather(tensor) -> tensor`` over processes, for a reward scoring against the global batch (the
            accelerator's; the identity outside a multi-process run).
        device: where set-up models and tables compute (``None``: leave a given model where it is; the CPU).
        main_process_first: a context in which the main process fills a shared cache before the others read it.
        cache_dir, run_dir, tokenizer: the run's cache folder, run directory and tokenizer, when there is a run.
    """

    references: Mapping[Hashable, Sequence[str]] | None = None
    records: Sequence[Any] | None = None
    images: Mapping[Hashable, Any] | None = None
    embeddings: Mapping[Hashable, torch.Tensor] | None = None
    retriever: Any = None
    scenes: Mapping[Hashable, Scene] | None = None
    objects: Mapping[Hashable, frozenset[str]] | None = None
    questions: Mapping[Hashable, Sequence[Question]] | None = None
    gather: Callable[[torch.Tensor], torch.Tensor] = identity
    device: torch.device | None = None
    main_process_first: Callable[[], AbstractContextManager] = nullcontext
    cache_dir: Path | None = None
    run_dir: Path | None = None
    tokenizer: Any = None

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The fields' names (the data options an adapter passes through)."""
        return tuple(f.name for f in fields(cls))

    @classmethod
    def of_run(cls, cfg: Config, records: Sequence[Any], needs: frozenset[str] = frozenset(), **given: Any
               ) -> RewardInputs:  # fmt: skip
        """The inputs of a run's configuration ``cfg`` and training ``records``: their references, the world's scenes
        (``data.format=world``), the cache folder, and the retriever (``retriever.*``) when ``needs`` names it
        (prepared already), loaded on ``given``'s ``device`` (a CUDA device's weights read straight onto it:
        :func:`finecap.models.retriever.load_retriever`). ``given``: the other fields (device, gather, ...)."""
        from finecap.data.references import world_scenes
        from finecap.home import cache_dir

        records = list(records)
        retriever = None
        if "retriever" in needs:
            from finecap.models.retriever import load_retriever

            retriever = load_retriever(cfg, device=given.get("device"))  # where the retrieval reward runs it
        from finecap.judges.questions import questions_of

        given.setdefault("questions", questions_of(records))
        return cls(references=references_of(records), records=records, scenes=world_scenes(cfg), retriever=retriever,
                   cache_dir=cache_dir(cfg.run), **given)  # fmt: skip

    @classmethod
    def from_context(cls, ctx: TrainContext, needs: frozenset[str] = frozenset()) -> RewardInputs:
        """The inputs of a training run (:class:`finecap.contract.TrainContext`): :meth:`of_run` with the context's
        device, ``gather`` (the accelerator's), ``main_process_first``, run directory and tokenizer."""
        acc = ctx.accelerator
        return cls.of_run(ctx.cfg, ctx.train_records, needs, gather=identity if acc is None else acc.gather,
                          device=ctx.device, main_process_first=ctx.main_process_first, run_dir=ctx.run_dir,
                          tokenizer=ctx.tokenizer)  # fmt: skip
