"""The four papers and finecap's check pages (GRPO, judges) by key (``--paper``)."""

from __future__ import annotations

from .discritune import DISCRITUNE
from .grpo import GRPO
from .judges import JUDGES
from .ndlb import NDLB
from .schema import Paper
from .sle import SLE
from .smile import SMILE

PAPERS: dict[str, Paper] = {p.key: p for p in (SMILE, SLE, NDLB, DISCRITUNE, GRPO, JUDGES)}
