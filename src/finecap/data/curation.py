"""Manual curation of TrueMatch candidate bags (the NDLB Sec. 3 step that took 680 candidate bags of size 3 down to
254): accept / reject decisions, saved as they are made, and the curated bag file they produce.

:class:`BagCuration` reads a bags file of ``finecap bags build`` (:func:`finecap.data.formats.read_bags` checks it)
and keeps two files next to each other, both rewritten atomically after every decision, so a crash or a closed
browser tab loses nothing and reopening the same output resumes where the review stopped:

- ``<out>``: the curated bags, in the layout of the input (``{"bags": {size: [{"images", "similarity"}, ...]}}`` plus
  the input's other keys), holding only the accepted bags, in their original order; ``finecap eval --bags <out>``
  reads it. A ``"curation"`` entry records the source file and the counts of accepted, rejected and pending bags.
- ``<out stem>.decisions.json``: ``{"source": BAGS.json, "decisions": {"<size>/<index>": "accept" | "reject"}}``,
  ``index`` being the bag's position in the input's list of that size.

Choices left open by the paper: a bag not yet decided is left out of the curated file (only reviewed, accepted bags
count), and a decision can be changed or withdrawn (``decide(key, None)``) at any time.

Example::

    >>> import json, tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "bags.json").write_text(json.dumps({"bags": {"2": [{"images": [1, 2]}, {"images": [3, 4]}]}}))
    >>> review = BagCuration(d / "bags.json", d / "curated.json")
    >>> review.decide("2/1", "accept")
    >>> json.loads((d / "curated.json").read_text())["bags"]
    {'2': [{'images': [3, 4]}]}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, get_args

from finecap.data.formats import DataError, read_bags
from finecap.utils import read_json, write_json

Decision = Literal["accept", "reject"]
DECISIONS: tuple[str, ...] = get_args(Decision)


def decisions_path(out: str | Path) -> Path:
    """The decisions file kept next to the curated bags file ``out``."""
    out = Path(out)
    return out.with_name(f"{out.stem}.decisions.json")


class BagCuration:
    """Accept/reject decisions on the bags of ``bags_path``, saved to ``out`` (and its decisions file) on every call
    of :meth:`decide`; existing decisions for the same source are loaded (resume)."""

    def __init__(self, bags_path: str | Path, out: str | Path) -> None:
        self.bags_path = Path(bags_path)
        self.out = Path(out)
        if self.out.resolve() == self.bags_path.resolve():
            raise ValueError(f"{self.out}: the curated file must differ from the candidate bags file it filters")
        read_bags(self.bags_path)  # validates the layout, errors name the file and the bag
        self.source: dict[str, Any] = read_json(self.bags_path)
        self.bags: dict[str, list[Any]] = self.source["bags"]
        self.decisions_file = decisions_path(self.out)
        self.decisions: dict[str, str] = {}
        if self.decisions_file.exists():
            saved = read_json(self.decisions_file)
            if not isinstance(saved, dict) or not isinstance(saved.get("decisions"), dict):
                raise DataError(f"{self.decisions_file}: expected {{'source': ..., 'decisions': {{key: decision}}}}")
            for key, value in saved["decisions"].items():
                self._check(key, value)
            self.decisions = dict(saved["decisions"])
        self._save()

    def keys(self) -> list[str]:
        """Every bag's key ``"<size>/<index>"``, sizes in increasing order."""
        return [f"{size}/{i}" for size in sorted(self.bags, key=int) for i in range(len(self.bags[size]))]

    def bag(self, key: str) -> list[Any]:
        """The image ids of bag ``key``."""
        size, index = self._check(key)
        entry = self.bags[size][index]
        return list(entry["images"] if isinstance(entry, dict) else entry)

    def similarity(self, key: str) -> float | None:
        size, index = self._check(key)
        entry = self.bags[size][index]
        return entry.get("similarity") if isinstance(entry, dict) else None

    def _check(self, key: str, decision: str | None = None) -> tuple[str, int]:
        size, _, index = str(key).partition("/")
        if size not in self.bags or not index.isdigit() or int(index) >= len(self.bags[size]):
            raise KeyError(f"no bag {key!r} in {self.bags_path} (keys look like '3/0')")
        if decision is not None and decision not in DECISIONS:
            raise ValueError(f"bag {key!r}: decision must be one of {', '.join(DECISIONS)}, got {decision!r}")
        return size, int(index)

    def decide(self, key: str, decision: str | None) -> None:
        """Record ``decision`` (``"accept"``, ``"reject"``, or None to withdraw it) for bag ``key`` and save."""
        self._check(key, decision)
        if decision is None:
            self.decisions.pop(key, None)
        else:
            self.decisions[key] = decision
        self._save()

    def counts(self) -> dict[str, int]:
        values = list(self.decisions.values())
        n = len(self.keys())
        return {"accepted": values.count("accept"), "rejected": values.count("reject"), "pending": n - len(values)}

    def next_pending(self, after: str | None = None) -> str | None:
        """The first undecided bag after ``after`` (wrapping around), or None when all are decided."""
        keys = self.keys()
        start = keys.index(after) + 1 if after in keys else 0
        for key in keys[start:] + keys[:start]:
            if key not in self.decisions:
                return key
        return None

    def curated(self) -> dict[str, Any]:
        """The curated bags file: the input with only the accepted bags, and a ``curation`` summary."""
        bags = {size: [b for i, b in enumerate(items) if self.decisions.get(f"{size}/{i}") == "accept"]
                for size, items in self.bags.items()}  # fmt: skip
        # Family purity describes the candidate bags, not the curated subset: left out rather than stale.
        out = {k: v for k, v in self.source.items() if k not in ("bags", "curation") and not k.startswith("family_")}
        out["bags"] = bags
        out["curation"] = {"source": str(self.bags_path), **self.counts()}
        return out

    def _save(self) -> None:
        write_json(self.decisions_file, {"source": str(self.bags_path), "decisions": self.decisions})
        write_json(self.out, self.curated())
