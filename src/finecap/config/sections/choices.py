"""Allowed values of string options used by several sections. Each is defined once: a section's own are in its
module, and the modules that dispatch on one derive their runtime tuples with ``typing.get_args`` (e.g.
``finecap.objectives.smile.SUBSETS``)."""

from __future__ import annotations

from typing import Literal

CaptionField = Literal["original", "blend", "visual", "holistic", "dense"]
