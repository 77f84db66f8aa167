"""pycocoevalcap's ``PTBTokenizer`` on :mod:`finecap.metrics.ptb_tokenize`, in Python (no Java;
:mod:`finecap.compat.pycocoevalcap`)."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

from finecap.metrics.ptb_tokenize import PUNCTUATIONS, ptb_tokenize

__all__ = ["PUNCTUATIONS", "PTBTokenizer"]


class PTBTokenizer:
    """Stanford PTBTokenizer ``-preserveLines -lowerCase`` and pycocoevalcap's punctuation removal.

    >>> PTBTokenizer().tokenize({1: [{"caption": "A man's dog, running."}], 2: [{"caption": "Two CATS!"}]})
    {1: ["a man 's dog running"], 2: ['two cats']}
    """

    def tokenize(self, captions_for_image: Mapping[Hashable, Sequence[dict]]) -> dict[Hashable, list[str]]:
        """``{id: [{"caption": str, ...}, ...]}`` -> ``{id: [tokenised caption, ...]}``, all captions as one batch in
        this order (pycocoevalcap's; an id with no caption is left out, as there). Plain strings are taken too, in
        the list. An id whose value is a string, not a list, is a ``ValueError`` naming it (its characters would be
        its captions; pycocoevalcap fails on it with a ``TypeError``)."""
        for key, caps in captions_for_image.items():
            if isinstance(caps, str):
                raise ValueError(f"PTBTokenizer.tokenize: captions_for_image[{key!r}]: expected a list of captions, "
                                 f"got a string ({caps[:40]!r})")  # fmt: skip
            for j, c in enumerate(caps):
                if isinstance(c, dict) and not isinstance(c.get("caption"), str):
                    raise ValueError(f"PTBTokenizer.tokenize: captions_for_image[{key!r}][{j}]: no 'caption' string")
        # pycocoevalcap joins the captions as lines after replacing their newlines with spaces
        flat = {k: [(c["caption"] if isinstance(c, dict) else c).replace("\n", " ") for c in caps]
                for k, caps in captions_for_image.items() if len(caps)}  # fmt: skip
        return ptb_tokenize(flat)
