"""CLIPScore and RefCLIPScore (Hessel et al., EMNLP 2021), with any CLIP-style retriever.

- ``CLIP-S(c, v) = w * max(cos(E_c, E_v), 0)`` with ``w = 2.5``, the caption prefixed by ``"A photo depicts "``.
- ``ClipSc(c, v) = 100 * cos(E_c, E_v)``: the "ClipSc" of No Detail Left Behind (Gaur et al. 2024, Tables 2-3),
  whose code computes it as torchmetrics' ``CLIPScore`` does (weight 1, times 100, no per-caption clipping; the
  corpus mean is clipped at 0). Same embeddings and prefix as CLIP-S; only the scale and the clipping differ, so
  ``ClipSc = 40 * CLIP-S`` whenever the cosine is positive. Reported next to ``CLIPScore`` under its own name so
  that numbers are never compared across the two conventions.
- ``RefCLIP-S(c, R, v) = H-Mean(CLIP-S(c, v), max(max_{r in R} cos(E_c, E_r), 0))`` (harmonic mean; 0 when both
  parts are 0). References get the same prefix as candidates, as in the authors' code.

Example::

    >>> import numpy as np
    >>> clip_score(np.array([[1.0, 0.0]]), np.array([[0.6, 0.8]]))  # 2.5 * max(0.6, 0)
    array([1.5])

Choices the paper leaves open:

- **Prefix for the world tokenizer.** The world's word-level vocabulary has no "photo" or "depicts", so the prefix
  would become ``<unk>`` tokens. ``prefix=None`` (the default) means *auto*: Hessel's prefix when the retriever's
  tokenizer knows every word of it (any BPE tokenizer, e.g. real CLIP), otherwise no prefix (the world encoder).
  Pass a string to force a prefix, ``""`` for none.
- **Clipping of the reference part.** The paper clips ``max_r cos`` at 0; the authors' script does not. We follow
  the paper; the two differ only when every reference has a negative cosine with the candidate.
- **ClipSc's prefix.** torchmetrics' ``CLIPScore`` encodes the caption as written; finecap gives ClipSc the
  embedding CLIP-S uses (with the prefix), so that the two differ only in scale and clipping. ClipSc is therefore
  not torchmetrics' number for the same captions when a prefix is used.
- **w** is calibrated for ViT-B/32 cosines; it is kept at 2.5 for every model (configurable), so world-encoder scores
  are comparable across our runs but not to published numbers.
- **Captions longer than the text window** (with the prefix: 77 tokens for CLIP) are scored as
  ``retriever.long_text`` says; the corpus scores then count them (``clipscore/truncated``, or
  ``clipscore/chunked``: :mod:`finecap.models.text_window`).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from finecap.data.records import id_keys, refuse_repeated_ids, some_ids
from finecap.models.text_window import TextEncoding, encode_texts, log_note

W = 2.5
NDLB_SCALE = 100.0
"""NDLB's ClipSc: ``100 * cos`` (weight 1, as percentages)."""
HESSEL_PREFIX = "A photo depicts"


def _np(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().float().numpy()
    return np.asarray(x, dtype=np.float64)


def _unit(x: Any, what: str, names: Sequence[Hashable] | None = None) -> np.ndarray:
    """``x`` scaled to unit norm along its last axis. An embedding that is not finite (NaN or infinite: a half
    precision overflow) is a ``ValueError`` naming ``what`` and its row (its image id when ``names`` gives the rows'),
    as self-retrieval refuses such scores (:func:`finecap.metrics.retrieval.as_score_matrix`): its cosine is NaN,
    which the clipping of RefCLIP-S would turn into a made-up 0."""
    x = _np(x)
    bad = ~np.isfinite(x).reshape(-1, x.shape[-1]).all(axis=-1) if x.size else np.zeros(0, dtype=bool)  # (rows,)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        first = f"image {names[row]!r}" if names is not None else f"row {row}"
        raise ValueError(f"{what}: {int(bad.sum())} embedding(s) are not finite, the first of {first}; is the "
                         "retriever's output finite?")  # fmt: skip
    norm = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.maximum(norm, 1e-12)


def clip_score(image_emb: Any, text_emb: Any, w: float = W) -> np.ndarray:
    """Per-pair CLIP-S ``(N,)`` = ``w * max(cos(image_n, text_n), 0)`` (inputs need not be normalised)."""
    image_emb, text_emb = _unit(image_emb, "image embeddings"), _unit(text_emb, "caption embeddings")
    if image_emb.shape != text_emb.shape:
        raise ValueError(f"image embeddings {image_emb.shape} and caption embeddings {text_emb.shape} must match")
    return w * np.clip((image_emb * text_emb).sum(axis=-1), 0.0, None)


def ref_clip_score(clip_scores: Any, text_emb: Any, ref_embs: Sequence[Any]) -> np.ndarray:
    """Per-caption RefCLIP-S ``(N,)``: harmonic mean of CLIP-S and the clipped max cosine to the references.

    Args:
        clip_scores: ``(N,)`` CLIP-S values (from :func:`clip_score`, i.e. already multiplied by ``w``).
        text_emb: ``(N, D)`` candidate caption embeddings.
        ref_embs: per candidate, a ``(R_n, D)`` array of its reference embeddings (``R_n >= 1``).
    """
    clip_scores, text_emb = _np(clip_scores), _unit(text_emb, "caption embeddings")
    if len(ref_embs) != len(text_emb):
        raise ValueError(f"{len(text_emb)} candidates but {len(ref_embs)} reference sets")
    ref_part = np.empty(len(text_emb))
    for n, refs in enumerate(ref_embs):
        refs = _unit(refs, f"reference embeddings of candidate {n}").reshape(-1, text_emb.shape[-1])  # (R_n, D)
        if not len(refs):
            raise ValueError(f"candidate {n} has no references")
        ref_part[n] = max(float((refs @ text_emb[n]).max()), 0.0)
    total = clip_scores + ref_part
    with np.errstate(invalid="ignore", divide="ignore"):
        hm = np.where(total > 0, 2 * clip_scores * ref_part / total, 0.0)
    return hm


def resolve_prefix(tokenizer: Any, prefix: str | None) -> str:
    """The prefix to use: ``prefix`` if given, else Hessel's unless the tokenizer maps one of its words to unknown."""
    if prefix is not None:
        return prefix
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is None:
        return HESSEL_PREFIX
    ids = tokenizer(HESSEL_PREFIX, add_special_tokens=False)["input_ids"]
    return "" if unk in ids else HESSEL_PREFIX


def with_prefix(captions: Sequence[str], prefix: str) -> list[str]:
    """Prepend ``prefix`` and one space (as the authors' code does) unless the prefix is empty."""
    if not prefix:
        return list(captions)
    prefix = prefix if prefix.endswith(" ") else prefix + " "
    return [prefix + c for c in captions]


class CLIPScore:
    """CLIPScore / RefCLIPScore of ``{image_id: caption}`` predictions with a retriever.

    Args:
        retriever: a :class:`~finecap.models.retriever.Retriever` (any CLIP checkpoint or the world encoder).
        records: the images (objects with ``image_id`` and ``path``) the predictions describe.
        cache_dir: feature cache folder for the image embeddings and the references' text embeddings (None = no cache).
        w: the CLIP-S weight (2.5).
        prefix: caption prefix; None = auto (see the module docstring).

    Example (``retriever``: a tiny random CLIP, so the numbers mean nothing; ``records``: images 0, 1, 2)::

        >>> cs = CLIPScore(retriever, records)
        >>> scores = cs({0: "a red circle"}, {0: ["a red circle on grass"]})
        >>> {name: round(value, 2) for name, value in scores.items()}
        {'CLIPScore': 0.9, 'ClipSc': 35.95, 'RefCLIPScore': 0.87}
        >>> cs({0: "a red circle"})  # no references: no RefCLIPScore
        {'CLIPScore': 0.89..., 'ClipSc': 35.95...}
    """

    def __init__(
        self,
        retriever: Any,
        records: Sequence[Any],
        cache_dir: str | Path | None = None,
        w: float = W,
        prefix: str | None = None,
    ) -> None:
        self.retriever = retriever
        self.records = list(records)
        refuse_repeated_ids([r.image_id for r in self.records], "CLIPScore records")  # 1 and "1": one image
        self.row = {r.image_id: i for i, r in enumerate(self.records)}
        self.cache_dir = cache_dir
        self.image_emb = _np(retriever.image_embeddings(self.records, cache_dir))  # (N, D)
        self.w = w
        self.prefix = resolve_prefix(retriever.tokenizer, prefix)

    def per_item(
        self, predictions: Mapping[Hashable, str], references: Mapping[Hashable, Sequence[str]] | None = None
    ) -> dict[Hashable, dict[str, float]]:
        """``{image_id: {"CLIPScore": s, "ClipSc": 100 * cos, "RefCLIPScore": r}}`` (RefCLIPScore only with
        references)."""
        return self._scored(predictions, references)[0]

    def _scored(
        self, predictions: Mapping[Hashable, str], references: Mapping[Hashable, Sequence[str]] | None
    ) -> tuple[dict[Hashable, dict[str, float]], TextEncoding]:
        """:meth:`per_item` and the captions' encoding (their lengths; the note of long ones is logged). No caption
        is a ``ValueError`` (a mean of none would be NaN), and so are two predictions, or references, keyed by ids
        naming one image (``1`` and ``"1"``: :func:`~finecap.data.records.refuse_repeated_ids`)."""
        ids = list(predictions)
        if not ids:
            raise ValueError("CLIPScore: no captions to score")
        refuse_repeated_ids(ids, "CLIPScore predictions")  # one image's two captions: scored twice in the means
        if references is not None:
            refuse_repeated_ids(references, "CLIPScore references")  # which of two lists scores: no silent choice
        rows, missing = id_keys(ids, self.row)  # an id written as an int or as its string: one image
        if missing:
            raise KeyError(f"predictions for images not among the CLIPScore images: {missing[:5]}; their ids are e.g. "
                           f"{some_ids(self.row)}")  # fmt: skip
        encoding = encode_texts(self.retriever, with_prefix([predictions[i] for i in ids], self.prefix), ids)
        log_note(encoding, "clipscore")
        text_emb = _unit(encoding.embeddings, "caption embeddings", ids)
        image_emb = _unit(self.image_emb[[self.row[rows[i]] for i in ids]], "image embeddings", ids)
        cs = clip_score(image_emb, text_emb, self.w)
        cos = (image_emb * text_emb).sum(axis=-1)  # (N,) unclipped cosines for NDLB's ClipSc
        out = {i: {"CLIPScore": float(s), "ClipSc": NDLB_SCALE * float(c)} for i, s, c in zip(ids, cs, cos)}
        if references is not None:
            of, _ = id_keys(ids, references)
            refs_of = {i: references[of[i]] if i in of else None for i in ids}
            no_refs = [i for i in ids if not refs_of[i]]
            if no_refs:
                raise KeyError(f"no references for images {no_refs[:5]}")
            flat = [r for i in ids for r in refs_of[i]]
            # the references are the same for every system scored on a data set: cached with the image features
            flat_emb = _unit(self.retriever.text_embeddings(with_prefix(flat, self.prefix), self.cache_dir),
                             "reference embeddings", [i for i in ids for _ in refs_of[i]])  # fmt: skip
            bounds = np.cumsum([0] + [len(refs_of[i]) for i in ids])
            refs = [flat_emb[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
            for i, r in zip(ids, ref_clip_score(cs, text_emb, refs)):
                out[i]["RefCLIPScore"] = float(r)
        return out, encoding

    def __call__(
        self, predictions: Mapping[Hashable, str], references: Mapping[Hashable, Sequence[str]] | None = None
    ) -> dict[str, float]:
        """Corpus means: ``CLIPScore``, ``ClipSc`` (mean clipped at 0, as torchmetrics) and, with references,
        ``RefCLIPScore``; ``clipscore/truncated`` (or ``/chunked``) counts the captions longer than the text window
        when there is one."""
        return self.corpus_and_items(predictions, references)[0]

    def corpus_and_items(
        self, predictions: Mapping[Hashable, str], references: Mapping[Hashable, Sequence[str]] | None = None
    ) -> tuple[dict[str, float], dict[Hashable, dict[str, float]]]:
        """The corpus scores (:meth:`__call__`) and the per-image scores they average (:meth:`per_item`)."""
        items, encoding = self._scored(predictions, references)
        keys = ["CLIPScore", "ClipSc"] + (["RefCLIPScore"] if references is not None else [])
        out = {k: float(np.mean([v[k] for v in items.values()])) for k in keys}
        out["ClipSc"] = max(out["ClipSc"], 0.0)
        return out | encoding.counts("clipscore"), items
