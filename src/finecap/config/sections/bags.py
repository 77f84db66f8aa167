"""The ``bags`` section: bags of similar images (``finecap bags``)."""

from __future__ import annotations

from dataclasses import dataclass

from finecap.config.fields import Section, doc
from finecap.config.sections.choices import CaptionField


@dataclass
class BagsConfig(Section, name="bags"):
    text_from: CaptionField = doc(
        "original", "Captions whose mean text embedding builds TrueMatch bags (NDLB: holistic, from `finecap boost`)."
    )
    keep_hardest: float = doc(
        1.0,
        "Share of the curated bags kept, highest intra-bag similarity first (NDLB kept 254 of 680 by hand; demo: 1).",
        gt=0,
        le=1,
    )
