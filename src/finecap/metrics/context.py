"""The evaluation context: the inputs of :func:`finecap.metrics.suite.evaluate` and the values metric groups share
(tokenised text, the retriever, caption-image scores), computed once per evaluation (:class:`EvalContext`).

Importing it imports no torch: the retriever (torch, transformers) is loaded when a group first asks for it.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from finecap.data.records import id_key
from finecap.home import cache_dir
from finecap.metrics.ptb_tokenize import ptb_tokenize, tokenize_all
from finecap.utils.closing import close_all

if TYPE_CHECKING:
    from finecap.config import Config
    from finecap.data.records import Record
    from finecap.judges.base import Question
    from finecap.world.scene import Scene


@dataclass
class EvalContext:
    """What a metric group's ``compute`` gets: the evaluation's inputs (``predictions`` ``{image id: caption}``,
    ``references``, ``images``, ``scenes``, ``bags``, ``samples``, ``instances`` (``{image id: annotated object
    categories}`` of a COCO instances file, :func:`finecap.metrics.hallucination.read_instances`), ``questions``
    (``{image id: [Question]}``, the data set's own: :func:`finecap.judges.questions.questions_of`): None when not
    given; read them with :meth:`need`, which says what is missing), the configuration ``cfg``, the group names
    ``requested`` together, and the values the groups share, computed once: PTB-tokenised text
    (:meth:`tok_predictions`, :meth:`tok_references`), the retriever and its caption-image scores. A group records
    its per-image scores with :meth:`add_items`."""

    predictions: dict[Hashable, str]
    references: dict[Hashable, list[str]] | None
    cfg: Config
    retriever: Any = None
    images: list[Record] | None = None
    scenes: Mapping[Hashable, Scene] | None = None
    bags: dict[int, list[list[Hashable]]] | None = None
    samples: dict[Hashable, list[str]] | None = None
    instances: Mapping[Hashable, frozenset[str]] | None = None
    questions: Mapping[Hashable, Sequence[Question]] | None = None
    requested: tuple[str, ...] = ()
    items: dict[Hashable, dict[str, float]] | None = None  # per-image scores, when asked for (evaluate_items)
    about: dict[str, Any] = field(default_factory=dict)  # what made the scores, beyond cfg: the judge (evaluate_items)
    cache: dict[str, Any] = field(default_factory=dict)
    opened: list[Any] = field(default_factory=list)  # what the groups opened and the evaluation closes (a judge)

    def own(self, resource: Any) -> Any:
        """``resource`` (anything with ``close()``), closed by :meth:`close` when the evaluation ends."""
        self.opened.append(resource)
        return resource

    def close(self) -> None:
        """Close what the groups opened (a judge's connections and answer cache, an in-process judge's engine), the
        last opened first, each even when another's close fails; called by the evaluation however it ends."""
        opened, self.opened = self.opened[::-1], []
        close_all(opened)

    def add_items(self, per_item: Mapping[Hashable, Mapping[str, float]], keys: Sequence[str]) -> None:
        """Record the per-image scores ``keys`` of ``per_item`` (when per-image scores are asked for) in the row of
        each image, whichever way a group writes its id (``1`` or ``"1"``: :func:`~finecap.data.records.id_key`), so
        the rows keep the ids the evaluation was given."""
        if self.items is not None:
            for i, scores in per_item.items():
                key = id_key(i, self.items)  # i itself when its row is there
                row = self.items.setdefault(i if key is None else key, {})
                row.update({k: float(scores[k]) for k in keys if k in scores})

    def need(self, what: str, group: str, hint: str) -> Any:
        """The input ``what`` (``"references"``, ``"images"``, ``"scenes"``, ``"bags"``, ``"samples"``,
        ``"instances"``); when it was
        not given, a ``ValueError`` naming the metric ``group`` and what to do (``hint``)."""
        value = getattr(self, what)
        if value is None:
            raise ValueError(f"metric {group!r} needs {what}: {hint}")
        return value

    # tokenised text -------------------------------------------------------------------------------------------------

    def tok_predictions(self) -> dict[Hashable, str]:
        """The captions PTB-tokenised as pycocoevalcap's scorers see them (lower case, no punctuation)."""
        if "tok_pred" not in self.cache:
            preds = self.predictions
            self.cache["tok_pred"] = dict(zip(preds, tokenize_all(preds.values())))
        return self.cache["tok_pred"]

    def tok_references(self, group: str) -> dict[Hashable, list[str]]:
        """The references of the predicted images, PTB-tokenised; every predicted image must have some (errors name
        the metric ``group``)."""
        if "tok_refs" not in self.cache:
            self.cache["tok_refs"] = ptb_tokenize(self.predicted_references(group))
        return self.cache["tok_refs"]

    def predicted_references(self, group: str) -> dict[Hashable, list[str]]:
        """``{image id: references}`` of the predicted images, in the order of the predictions; a ``ValueError``
        naming the metric ``group`` when references were not given or a predicted image has none (a score over the
        images that have some would be another corpus's, with no sign of it)."""
        refs = self.need("references", group, "pass the reference captions")
        missing = [i for i in self.predictions if not refs.get(i)]
        if missing:
            raise ValueError(f"metric {group!r}: no references for {len(missing)} image(s), e.g. {missing[:5]}")
        return {i: list(refs[i]) for i in self.predictions}

    # self-retrieval -------------------------------------------------------------------------------------------------

    def get_retriever(self) -> Any:
        """The retriever given to :func:`~finecap.metrics.suite.evaluate`, else the configured one (``retriever.*``),
        loaded once on :func:`~finecap.models.memory.eval_device`."""
        if self.retriever is None:
            # Deferred: the retriever module imports torch and transformers, which text-only evaluation never needs
            # (`finecap eval --metrics bleu,...` must not import them; tests/app/test_cli.py checks).
            from finecap.models.memory import eval_device
            from finecap.models.retriever import load_retriever

            self.retriever = load_retriever(self.cfg, device=eval_device(self.cfg))
        return self.retriever

    def retrieval_scores(self, group: str) -> tuple[Any, list[Hashable], Any]:
        """(SelfRetrieval, query image ids, cosine scores (Q, N)), computed once for 'retrieval' and 'bags' (and the
        count of captions longer than the retriever's text window, :meth:`long_captions`)."""
        if "retrieval" not in self.cache:
            from finecap.metrics.retrieval import SelfRetrieval

            images = self.need("images", group, "pass the image records (the retrieval pool)")
            e = self.cfg.eval
            sr = SelfRetrieval(self.get_retriever(), images, cache_dir=cache_dir(self.cfg.run),
                               n_distractors=e.n_distractors, draws=e.draws, seed=e.seed)  # fmt: skip
            ids, encoding = sr.encode(self.predictions)
            self.cache["retrieval"] = (sr, ids, sr.score_matrix(encoding))
            self.cache["long captions"] = encoding.counts("retrieval")
        return self.cache["retrieval"]

    def long_captions(self) -> dict[str, float]:
        """``{"retrieval/truncated": n}`` (``/chunked``) when n of the captions :meth:`retrieval_scores` encoded were
        longer than the retriever's text window, else ``{}``
        (:meth:`finecap.models.text_window.TextEncoding.counts`)."""
        return dict(self.cache.get("long captions", {}))
