"""The four papers and finecap's GRPO check page by key (``--paper``)."""

from __future__ import annotations

from .discritune import DISCRITUNE
from .grpo import GRPO
from .ndlb import NDLB
from .schema import Paper
from .sle import SLE
from .smile import SMILE

PAPERS: dict[str, Paper] = {p.key: p for p in (SMILE, SLE, NDLB, DISCRITUNE, GRPO)}
