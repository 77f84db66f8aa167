"""Manual curation of TrueMatch candidate bags (the NDLB Sec. 3 step that took 680 candidate bags of size 3 down to
254): accept / reject decisions, saved as they are made, and the curated bag file they produce.

:class:`BagCuration` reads a bags file of ``finecap bags build`` (:func:`finecap.data.bags_file.read_bags` checks it)
and keeps two files next to each other, both rewritten atomically after every decision, so a crash, a ``kill -9``
or a closed browser tab loses nothing and reopening the same output resumes where the review stopped:

- ``<out>``: the curated bags, in the layout of the input (``{"bags": {size: [{"images", "similarity"}, ...]}}`` plus
  the input's other keys), holding only the accepted bags, in their original order; ``finecap eval --bags <out>``
  reads it. A ``"curation"`` entry records the source file and the counts of accepted, rejected and pending bags.
  It is derived from the decisions file and rebuilt from it on opening.
- ``<out stem>.decisions.json``: ``{"version": 2, "source": BAGS.json, "decisions": [{"images": [...], "decision":
  "accept" | "reject"}, ...]}``. Decisions are keyed by the bag's **content** (its set of image ids), never by its
  position, so a rebuilt or reordered bags file cannot hand a decision to another bag. A decisions file holding a
  decision for a bag that is no longer in the bags file (the bags file changed) is refused with an error naming
  both files; so is a decisions file of the older, position-keyed layout (no ``"version"``), which cannot be checked.
  A curated file that records decisions whose decisions file is missing is refused too (rebuilt from no decisions,
  its accepted bags would be lost).

Concurrency: :meth:`BagCuration.decide` takes a lock (a thread lock, then an operating-system file lock on
``.<out name>.lock`` through ``filelock``, so two review servers on the same output also take turns; a symbolic link
there is refused, as at either file: :func:`finecap.utils.files.refuse_link`), **reads the
decisions file after taking it**, applies the one decision, and writes both files atomically
(:func:`finecap.utils.files.write_json`) before releasing it. A decision that :meth:`~BagCuration.decide` returned from
is therefore on disk, whatever other writers did at the same time.

Choices left open by the paper: a bag not yet decided is left out of the curated file (only reviewed, accepted bags
count), a decision can be changed or withdrawn (``decide(key, None)``) at any time, and two bags of a bags file with
the same images share one decision (they are the same bag).

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

import json
import os
import threading
from collections.abc import Hashable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal, get_args

from filelock import FileLock, Timeout

from finecap.data.bags_file import read_bags
from finecap.data.records import DataError
from finecap.utils.files import refuse_link, write_json
from finecap.utils.reading import DATA_FILE, read_json
from finecap.utils.text import short_repr

Decision = Literal["accept", "reject"]
DECISIONS: tuple[str, ...] = get_args(Decision)
VERSION = 2
"""Layout version of the decisions file (1, position-keyed, had no ``"version"`` entry)."""
LOCK_TIMEOUT = 30.0
"""Seconds :meth:`BagCuration.decide` waits for another writer of the same output before giving up."""


class CurationBusy(RuntimeError):
    """Another process held the output's lock for longer than :data:`LOCK_TIMEOUT`."""


def decisions_path(out: str | Path) -> Path:
    """The decisions file kept next to the curated bags file ``out``."""
    out = Path(out)
    return out.with_name(f"{out.stem}.decisions.json")


def lock_path(out: str | Path) -> Path:
    """The lock file of the curated bags file ``out`` (``.<name>.lock`` next to it)."""
    out = Path(out)
    return out.with_name(f".{out.name}.lock")


def content_key(images: Sequence[Hashable]) -> str:
    """A bag's identity: its image ids as a set, in a canonical text form (order and repeats do not matter).

    Example::

        >>> content_key([3, 1, 2]) == content_key([1, 2, 3]), content_key([1, "1"])
        (True, '["1", 1]')
    """
    texts = sorted({json.dumps(i) for i in images})
    return "[" + ", ".join(texts) + "]"


def _read_source(path: Path) -> dict[str, Any]:
    """The bags file, checked (:func:`read_bags`: its image ids too, :func:`finecap.data.records.check_id`); every
    error names the file."""
    try:
        read_bags(path, disjoint=False)  # any bags can be reviewed; the metrics refuse overlapping ones
        source = read_json(path, DATA_FILE)
    except RecursionError:
        raise DataError(f"{path}: JSON nested too deeply to be a bags file") from None
    except IsADirectoryError:
        raise DataError(f"{path}: a folder, not a bags file") from None
    return source


class BagCuration:
    """Accept/reject decisions on the bags of ``bags_path``, saved to ``out`` (and its decisions file) on every call
    of :meth:`decide`; existing decisions for the same bags are loaded (resume).

    Opening checks both files and rebuilds the curated file from the decisions file (:meth:`rebuild`); with
    ``rebuild=False`` it only reads, and writes nothing until :meth:`rebuild` or the first :meth:`decide` (the review
    command checks its data and images first, so a failed start leaves no file behind)."""

    def __init__(self, bags_path: str | Path, out: str | Path, *, rebuild: bool = True) -> None:
        self.bags_path = Path(bags_path)
        self.out = Path(out)
        if self.out.resolve() == self.bags_path.resolve():
            raise ValueError(f"{self.out}: the curated file must differ from the candidate bags file it filters")
        self.source: dict[str, Any] = _read_source(self.bags_path)
        self.bags: dict[str, list[Any]] = self.source["bags"]
        self.decisions_file = decisions_path(self.out)
        if self.decisions_file.resolve() == self.bags_path.resolve():
            raise ValueError(f"{self.out}: its decisions file would be the candidate bags file {self.bags_path}")
        # each bag's key and place (size, index), sizes in increasing order: the keys as keys() spells them
        self._places = {
            f"{size}/{i}": (size, i) for size in sorted(self.bags, key=int) for i in range(len(self.bags[size]))
        }
        self._keys = list(self._places)
        self._content = {key: content_key(self.bag(key)) for key in self._keys}
        self._thread_lock = threading.Lock()
        self._file_lock = FileLock(str(lock_path(self.out)), timeout=LOCK_TIMEOUT, poll_interval=0.005)
        self._check_out_is_ours()
        self.decisions: dict[str, str] = {}
        """``{"<size>/<index>": decision}`` of the bags file as last read or written (replaced, never mutated)."""
        if rebuild:
            self.rebuild()
        else:  # read only (the file is written atomically), so no lock file is made either
            self.decisions = self._by_key(self._read_decisions())

    def rebuild(self) -> None:
        """Write the decisions file and the curated file derived from it, as they stand on disk (e.g. after a kill
        between the two writes of :meth:`decide`)."""
        with self._locked():
            self._save(self._read_decisions())

    # --- reading the bags -------------------------------------------------------------------------------------------

    def keys(self) -> list[str]:
        """Every bag's key ``"<size>/<index>"``, sizes in increasing order."""
        return list(self._keys)

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
        """``(size, index)`` of bag ``key`` spelled exactly as :meth:`keys` spells it, else :class:`KeyError`:
        ``"3/00"`` and an index in other digits (Arabic-Indic, superscript: ``str.isdigit`` took them) name no bag."""
        place = self._places.get(key) if isinstance(key, str) else None
        if place is None:
            raise KeyError(f"no bag {short_repr(key)} in {self.bags_path} (keys look like '3/0')")
        if decision is not None and decision not in DECISIONS:
            raise ValueError(
                f"bag {short_repr(key)}: decision must be one of {', '.join(DECISIONS)}, got {short_repr(decision)}"
            )
        return place

    # --- deciding ---------------------------------------------------------------------------------------------------

    def decide(self, key: str, decision: str | None) -> None:
        """Record ``decision`` (``"accept"``, ``"reject"``, or None to withdraw it) for bag ``key``; both files are on
        disk when this returns (module docstring: lock, read, write)."""
        self._check(key, decision)
        content = self._content[key]
        with self._locked():
            by_content = self._read_decisions()
            if decision is None:
                by_content.pop(content, None)
            else:
                by_content[content] = decision
            self._save(by_content)

    def counts(self) -> dict[str, int]:
        values = list(self.decisions.values())
        return {"accepted": values.count("accept"), "rejected": values.count("reject"),
                "pending": len(self._keys) - len(values)}  # fmt: skip

    def next_pending(self, after: str | None = None) -> str | None:
        """The first undecided bag after ``after`` (wrapping around), or None when all are decided."""
        keys, decisions = self._keys, self.decisions
        start = keys.index(after) + 1 if after in keys else 0
        for key in keys[start:] + keys[:start]:
            if key not in decisions:
                return key
        return None

    def curated(self) -> dict[str, Any]:
        """The curated bags file: the input with only the accepted bags, and a ``curation`` summary."""
        decisions = self.decisions
        bags = {size: [b for i, b in enumerate(items) if decisions.get(f"{size}/{i}") == "accept"]
                for size, items in self.bags.items()}  # fmt: skip
        # Family purity describes the candidate bags, not the curated subset: left out rather than stale.
        out = {k: v for k, v in self.source.items() if k not in ("bags", "curation") and not k.startswith("family_")}
        out["bags"] = bags
        out["curation"] = {"source": os.path.abspath(self.bags_path), **self.counts()}
        return out

    # --- files ------------------------------------------------------------------------------------------------------

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the thread lock, then the file lock (:data:`LOCK_TIMEOUT`); a link at the lock file (planted after the
        start) is refused (:func:`~finecap.utils.files.refuse_link`)."""
        with self._thread_lock:
            refuse_link(lock_path(self.out))  # filelock would not follow it, but fail with a bare OSError (ELOOP)
            try:
                self._file_lock.acquire()
            except Timeout:
                raise CurationBusy(
                    f"{self.out}: another process has held {lock_path(self.out)} for {LOCK_TIMEOUT:.0f} s "
                    "(a second review of the same output?)"
                ) from None
            try:
                yield
            finally:
                self._file_lock.release()

    def _check_out_is_ours(self) -> None:
        """Refuse to replace an ``out`` that is not a curated bags file (users' data is never overwritten), and a link
        at either file or at the lock file (never written through: refused here, before the decisions file is written
        and ``out`` refused)."""
        refuse_link(self.out)
        refuse_link(self.decisions_file)
        refuse_link(lock_path(self.out))
        if not self.out.exists():
            return
        try:
            existing = read_json(self.out, DATA_FILE)
        except (ValueError, OSError, RecursionError):
            existing = None
        if not isinstance(existing, dict) or not isinstance(existing.get("curation"), dict):
            raise DataError(f"{self.out}: exists and is not a curated bags file of `finecap bags review`; "
                            "choose another --out")  # fmt: skip

    def _check_nothing_decided(self) -> None:
        """Refuse to start afresh (the decisions file is missing) over a curated file that records decisions: the
        curated file is rebuilt from the decisions file, so its accepted bags would be replaced by none."""
        try:
            existing = read_json(self.out, DATA_FILE)
        except (ValueError, OSError, RecursionError):  # none yet (or not ours: _check_out_is_ours named it)
            return
        summary = existing.get("curation") if isinstance(existing, dict) else None
        if not isinstance(summary, dict):
            return
        decided = sum(n for n in (summary.get("accepted"), summary.get("rejected")) if isinstance(n, int))
        bags = existing.get("bags")
        accepted = isinstance(bags, dict) and any(isinstance(b, list) and b for b in bags.values())
        if decided > 0 or accepted:
            raise DataError(f"{self.out}: records {decided} decision(s) but its decisions file {self.decisions_file} "
                            "is missing, and the curated file is rebuilt from it (its accepted bags would be lost); "
                            "put the decisions file back, or choose another --out")  # fmt: skip

    def _read_decisions(self) -> dict[str, str]:
        """``{content key: decision}`` from the decisions file (empty when there is none, refused when there is none
        but the curated file records decisions: :meth:`_check_nothing_decided`), checked against the bags
        file: refused when it is not ours, position-keyed, or decides a bag the bags file no longer holds."""
        path = self.decisions_file
        if not path.exists():
            self._check_nothing_decided()
            return {}
        try:
            saved = read_json(path, DATA_FILE)
        except RecursionError:
            raise DataError(f"{path}: JSON nested too deeply to be a decisions file") from None
        start_over = f"keep the bags file it was made for, or choose another --out to review {self.bags_path} afresh"
        if isinstance(saved, dict) and isinstance(saved.get("decisions"), dict) and "version" not in saved:
            raise DataError(f"{path}: decisions keyed by bag position (made by an older finecap), which cannot be "
                            f"matched to the bags safely; {start_over}")  # fmt: skip
        entries = saved.get("decisions") if isinstance(saved, dict) else None
        if not isinstance(saved, dict) or saved.get("version") != VERSION or not isinstance(entries, list):
            raise DataError(f"{path}: expected {{'version': {VERSION}, 'source': ..., 'decisions': [{{'images': "
                            "[...], 'decision': 'accept' | 'reject'}, ...]}")  # fmt: skip
        known = set(self._content.values())
        out: dict[str, str] = {}
        missing: list[list[Any]] = []
        for j, entry in enumerate(entries):
            images = entry.get("images") if isinstance(entry, dict) else None
            value = entry.get("decision") if isinstance(entry, dict) else None
            if not isinstance(images, list) or value not in DECISIONS:
                raise DataError(f"{path}: decisions[{j}] must be {{'images': [...], 'decision': 'accept' | 'reject'}}")
            key = content_key(images)
            if key not in known:
                missing.append(images)
            out[key] = value
        if missing:
            raise DataError(f"{path}: made for a different version of {self.bags_path}: {len(missing)} decided "
                            f"bag(s) are not in it (e.g. images {missing[0]}); {start_over}")  # fmt: skip
        return out

    def _by_key(self, by_content: dict[str, str]) -> dict[str, str]:
        """``{content key: decision}`` -> ``{bag key: decision}`` (bags with the same images share the decision)."""
        return {key: by_content[c] for key, c in self._content.items() if c in by_content}

    def _save(self, by_content: dict[str, str]) -> None:
        """Write the decisions file, then the curated file (derived from it); caller holds the lock. The output is
        checked to be finecap's again first: replaced by a file of the user's while the server ran, it is refused, and
        nothing is written."""
        self._check_out_is_ours()
        decisions = self._by_key(by_content)
        entries, seen = [], set()
        for key, c in self._content.items():  # in bag order, each content once
            if c in by_content and c not in seen:
                seen.add(c)
                entries.append({"images": self.bag(key), "decision": by_content[c]})
        write_json(
            self.decisions_file, {"version": VERSION, "source": os.path.abspath(self.bags_path), "decisions": entries}
        )
        self.decisions = decisions
        write_json(self.out, self.curated())
