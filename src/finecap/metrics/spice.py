"""SPICE through pycocoevalcap's ``spice-1.0.jar`` (Java), optional: only where all its jars are present.

SPICE needs, next to ``spice-1.0.jar``, the Stanford CoreNLP 3.6.0 jars ``lib/stanford-corenlp-3.6.0.jar`` and
``lib/stanford-corenlp-3.6.0-models.jar``, which pycocoevalcap downloads at first use (``get_stanford_models``).
finecap never downloads anything: when Java or any jar is missing, :func:`spice` raises
:class:`~finecap.metrics.meteor.MetricUnavailable` naming the missing file and how to get it, so that callers can skip
SPICE and run the other metrics. Where everything is present it runs exactly pycocoevalcap's command
(``java -jar -Xmx8G spice-1.0.jar IN -cache DIR -out OUT -subset -silent``), with temporary files and the parse cache
outside the installed package.

The SPICE directory is ``$FINECAP_SPICE_DIR`` if set, else pycocoevalcap's ``spice/`` folder.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import tempfile
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path

import numpy as np

from finecap.data.records import id_number, id_text
from finecap.metrics.meteor.inputs import check_inputs
from finecap.metrics.meteor.resources import MetricUnavailable, pycocoevalcap_file

__all__ = ["SPICE_ENV", "find_spice_dir", "spice", "spice_per_item", "spice_results", "spice_unavailable_reason"]

SPICE_ENV = "FINECAP_SPICE_DIR"
SPICE_JAR = "spice-1.0.jar"
CORENLP_JARS = ("lib/stanford-corenlp-3.6.0.jar", "lib/stanford-corenlp-3.6.0-models.jar")


def find_spice_dir(spice_dir: str | Path | None = None) -> Path | None:
    """Folder holding ``spice-1.0.jar`` and ``lib/``: ``spice_dir``, ``$FINECAP_SPICE_DIR`` or pycocoevalcap's."""
    return pycocoevalcap_file(spice_dir, SPICE_ENV, "spice")


def spice_unavailable_reason(spice_dir: str | Path | None = None, java: str = "java") -> str | None:
    """Why SPICE cannot run (``None`` when it can)."""
    if shutil.which(java) is None:
        return f"SPICE needs a Java runtime, but {java!r} is not on PATH (install a JRE, e.g. openjdk-17-jre-headless)"
    root = find_spice_dir(spice_dir)
    if root is None:
        return f"SPICE not found: install pycocoevalcap (pip install pycocoevalcap) or set ${SPICE_ENV}"
    if not (root / SPICE_JAR).is_file():
        return f"{SPICE_JAR} not found in {root} (set ${SPICE_ENV} or pass spice_dir=...)"
    missing = [j for j in CORENLP_JARS if not (root / j).is_file()]
    if missing:
        return (
            f"SPICE needs the Stanford CoreNLP 3.6.0 jars, missing: {', '.join(str(root / j) for j in missing)}. "
            "finecap does not download them; fetch them once where the network is available, e.g. "
            "`python -c 'from pycocoevalcap.spice.get_stanford_models import get_stanford_models as g; g()'` "
            f"(stanford-corenlp-full-2015-12-09.zip), or copy them into {root / 'lib'}"
        )
    return None


def spice_float(x: object) -> float:
    """A value of the SPICE jar's results as a float, ``nan`` where it is none (``"NaN"``, ``null``, a missing
    score), as pycocoevalcap's ``Spice.float_convert``."""
    try:
        return float(x)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan


def jar_order(ids: Sequence[Hashable]) -> list[int]:
    """The positions of ``ids`` in the order the jar scores them: the ids sorted, as pycocoevalcap sorts them, where
    they compare (ids of one type); ids that do not (ints beside strings, which pycocoevalcap cannot sort) by the
    image each names: those naming an integer first, by it (:func:`~finecap.data.records.id_number`: ``7`` and
    ``"7"`` are the number 7), then the others by their text (:func:`~finecap.data.records.id_text`), so
    ``{"0": ..., 2: ..., 10: ...}`` is scored as ``{0: ..., 2: ..., 10: ...}`` is
    (docs/evaluation.md#ids-written-as-an-int-or-as-a-string).

    >>> jar_order([10, 2, 0]), jar_order(["10", "2", "0"]), jar_order(["10", 2, "0", "x"])
    ([2, 1, 0], [2, 0, 1], [2, 1, 0, 3])
    """
    try:
        return sorted(range(len(ids)), key=ids.__getitem__)  # pycocoevalcap sorts the image ids
    except TypeError:

        def image(j: int) -> tuple[int, int | str]:
            number = id_number(ids[j])
            return (0, number) if number is not None else (1, id_text(ids[j]))

        return sorted(range(len(ids)), key=image)


def spice_per_item(
    predictions: Mapping[Hashable, str],
    references: Mapping[Hashable, Sequence[str]],
    *,
    spice_dir: str | Path | None = None,
    cache_dir: str | Path | None = None,
    java: str = "java",
    memory: str = "8G",
    timeout: float | None = None,
) -> tuple[dict[str, float], dict[Hashable, dict[str, float]]]:
    """Corpus SPICE (key ``SPICE``: mean of the per-image F-scores in sorted id order (:func:`jar_order`), NaNs
    included, taken with ``np.mean`` as pycocoevalcap does: its pairwise sum differs from a running one in the last
    bits) and per-image SPICE F-score. Raises :class:`MetricUnavailable` when Java or a jar is missing."""
    ids, order, results = spice_results(predictions, references, spice_dir=spice_dir, cache_dir=cache_dir,
                                        java=java, memory=memory, timeout=timeout)  # fmt: skip
    per: dict[Hashable, dict[str, float]] = {}
    for i, scores in results.items():
        per[i] = {"SPICE": spice_float(scores["All"]["f"])}
    values = [per[ids[j]]["SPICE"] for j in order]
    return {"SPICE": float(np.mean(np.array(values)))}, {i: per[i] for i in ids}


def spice_results(
    predictions: Mapping[Hashable, str],
    references: Mapping[Hashable, Sequence[str]],
    *,
    spice_dir: str | Path | None = None,
    cache_dir: str | Path | None = None,
    java: str = "java",
    memory: str = "8G",
    timeout: float | None = None,
) -> tuple[list[Hashable], list[int], dict[Hashable, dict]]:
    """The jar's output as it writes it: ``(ids, order, {id: scores})`` with ``ids`` those of ``predictions``,
    ``order`` the positions of ``ids`` in the order the jar scored them (sorted ids, as pycocoevalcap:
    :func:`jar_order`) and ``scores`` each image's ``{category: {"pr", "re", "f", ...}}`` (values as the jar wrote
    them). Raises :class:`MetricUnavailable` when Java or a jar is missing."""
    reason = spice_unavailable_reason(spice_dir, java)
    if reason is not None:
        raise MetricUnavailable(reason)
    root = find_spice_dir(spice_dir)
    assert root is not None
    ids, preds, refs = check_inputs(predictions, references)
    order = jar_order(ids)
    with tempfile.TemporaryDirectory(prefix="finecap-spice-") as tmp:
        in_file, out_file = Path(tmp) / "input.json", Path(tmp) / "output.json"
        data = [{"image_id": j, "test": preds[j], "refs": refs[j]} for j in order]
        in_file.write_text(json.dumps(data, indent=2))
        cache = Path(cache_dir) if cache_dir is not None else Path(tmp) / "cache"
        cache.mkdir(parents=True, exist_ok=True)
        cmd = [java, "-jar", f"-Xmx{memory}", SPICE_JAR, str(in_file), "-cache", str(cache)]
        cmd += ["-out", str(out_file), "-subset", "-silent"]
        done = subprocess.run(cmd, cwd=root, capture_output=True, timeout=timeout)
        if done.returncode != 0:
            err = done.stderr.decode(errors="replace").strip()[-2000:]
            raise RuntimeError(f"SPICE ({root / SPICE_JAR}) failed with exit code {done.returncode}: {err}")
        results = json.loads(out_file.read_text())
    return ids, order, {ids[item["image_id"]]: item["scores"] for item in results}


def spice(
    predictions: Mapping[Hashable, str], references: Mapping[Hashable, Sequence[str]], **kwargs
) -> dict[str, float]:
    """Corpus SPICE (key ``SPICE``); see :func:`spice_per_item` for the options and errors."""
    return spice_per_item(predictions, references, **kwargs)[0]
