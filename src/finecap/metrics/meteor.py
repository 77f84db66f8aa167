"""METEOR 1.5 through the jar that pycocoevalcap ships (Java), one JVM per evaluation, optional.

Same protocol and options as pycocoevalcap's ``Meteor`` (``java -jar -Xmx2G meteor-1.5.jar - - -stdio -l en -norm``):
one ``SCORE`` line per image, then one ``EVAL`` line with all statistics; the corpus score comes from the pooled
statistics (it is *not* the mean of the per-image scores). Input captions should be tokenised like the other
metrics' (:func:`finecap.metrics.ptb_tokenize.ptb_tokenize`).

When Java or the jar is missing, :func:`meteor` raises :class:`MetricUnavailable` with the reason and what to do;
callers that evaluate several metrics catch it (or ask :func:`meteor_unavailable_reason` first) and carry on::

    try:
        scores.update(meteor(preds, refs))
    except MetricUnavailable as e:
        log.warning("skipping METEOR: %s", e)

The jar is looked up in ``$FINECAP_METEOR_JAR``, then in the installed ``pycocoevalcap`` package (found without
importing it); its ``data/paraphrase-en.gz`` must sit next to it.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import threading
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path

__all__ = ["MetricUnavailable", "find_meteor_jar", "meteor", "meteor_per_item", "meteor_unavailable_reason"]

METEOR_ENV = "FINECAP_METEOR_JAR"


class MetricUnavailable(RuntimeError):
    """An optional metric cannot run here (missing Java runtime or jar); the message says what is missing."""


def _pycocoevalcap_dir() -> Path | None:
    try:
        spec = importlib.util.find_spec("pycocoevalcap")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def find_meteor_jar(jar: str | Path | None = None) -> Path | None:
    """The METEOR jar to use: ``jar`` if given, else ``$FINECAP_METEOR_JAR``, else pycocoevalcap's copy."""
    if jar is not None:
        return Path(jar)
    if os.environ.get(METEOR_ENV):
        return Path(os.environ[METEOR_ENV])
    root = _pycocoevalcap_dir()
    return root / "meteor" / "meteor-1.5.jar" if root is not None else None


def meteor_unavailable_reason(jar: str | Path | None = None, java: str = "java") -> str | None:
    """Why METEOR cannot run (``None`` when it can)."""
    if shutil.which(java) is None:
        return (
            f"METEOR needs a Java runtime, but {java!r} is not on PATH (install a JRE, e.g. openjdk-17-jre-headless)"
        )
    path = find_meteor_jar(jar)
    if path is None:
        return f"meteor-1.5.jar not found: install pycocoevalcap (pip install pycocoevalcap) or set ${METEOR_ENV}"
    if not path.is_file():
        return f"meteor-1.5.jar not found at {path} (set ${METEOR_ENV} or pass jar=...)"
    if not (path.parent / "data" / "paraphrase-en.gz").is_file():
        return f"METEOR paraphrase table missing: expected {path.parent / 'data' / 'paraphrase-en.gz'}"
    return None


def _check_inputs(
    predictions: Mapping[Hashable, str], references: Mapping[Hashable, Sequence[str]]
) -> tuple[list[Hashable], list[str], list[list[str]]]:
    ids = list(predictions)
    if not ids:
        raise ValueError("predictions: empty, nothing to evaluate")
    refs = []
    for i in ids:
        if i not in references:
            raise ValueError(f"references: no entry for prediction id {i!r}")
        r = references[i]
        if isinstance(r, str) or len(r) == 0:
            raise ValueError(f"references[{i!r}]: expected a non-empty list of caption strings")
        refs.append(list(r))
    return ids, [predictions[i] for i in ids], refs


def meteor_per_item(
    predictions: Mapping[Hashable, str],
    references: Mapping[Hashable, Sequence[str]],
    *,
    jar: str | Path | None = None,
    java: str = "java",
    memory: str = "2G",
    timeout: float | None = 3600.0,
) -> tuple[dict[str, float], dict[Hashable, dict[str, float]]]:
    """Corpus METEOR (key ``METEOR``) and per-image METEOR, as pycocoevalcap's ``Meteor().compute_score``.

    Raises :class:`MetricUnavailable` when Java or the jar is missing, ``RuntimeError`` (with METEOR's stderr) when
    the JVM fails.
    """
    reason = meteor_unavailable_reason(jar, java)
    if reason is not None:
        raise MetricUnavailable(reason)
    path = find_meteor_jar(jar)
    assert path is not None
    ids, preds, refs = _check_inputs(predictions, references)
    cmd = [java, "-jar", f"-Xmx{memory}", path.name, "-", "-", "-stdio", "-l", "en", "-norm"]
    proc = subprocess.Popen(
        cmd, cwd=path.parent, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    stderr_chunks: list[bytes] = []
    drain = threading.Thread(target=lambda: stderr_chunks.append(proc.stderr.read()), daemon=True)
    drain.start()

    def fail(what: str) -> RuntimeError:
        if timed_out.is_set():
            what += f" (killed after the {timeout} s timeout)"
        proc.kill()
        proc.wait()
        drain.join(timeout=5)
        err = b"".join(stderr_chunks).decode(errors="replace").strip()[-2000:]
        return RuntimeError(f"METEOR ({path}) {what}; exit code {proc.returncode}; stderr: {err or '(empty)'}")

    # SCORE lines are written by a thread while this one reads the statistics back, so that neither pipe fills up
    lines = []
    for hyp, rs in zip(preds, refs):
        hyp = hyp.replace("|||", "").replace("  ", " ")  # pycocoevalcap's _stat
        lines.append(" ||| ".join(("SCORE", " ||| ".join(rs), hyp)) + "\n")
    writer_error: list[BaseException] = []

    def write() -> None:
        try:
            for line in lines:
                proc.stdin.write(line.encode())
            proc.stdin.flush()
        except BaseException as e:  # broken pipe: reported through the reader below
            writer_error.append(e)

    timed_out = threading.Event()

    def kill_on_timeout() -> None:
        timed_out.set()
        proc.kill()

    timer = threading.Timer(timeout, kill_on_timeout) if timeout is not None else None
    if timer is not None:
        timer.start()
    try:
        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        stats = []
        for _ in lines:
            out = proc.stdout.readline()
            if not out:
                raise fail("stopped before scoring every image")
            stats.append(out.decode().strip())
        writer.join()
        if writer_error:
            raise fail(f"did not accept the input ({writer_error[0]!r})")
        proc.stdin.write(("EVAL ||| " + " ||| ".join(stats) + "\n").encode())
        proc.stdin.flush()
        scores = []
        for _ in range(len(lines) + 1):
            out = proc.stdout.readline()
            if not out:
                raise fail("stopped before returning the scores")
            scores.append(float(out.decode().strip()))
        proc.stdin.close()
        proc.wait(timeout=60)
    finally:
        if timer is not None:
            timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    per = {i: {"METEOR": s} for i, s in zip(ids, scores[:-1])}
    return {"METEOR": scores[-1]}, per


def meteor(
    predictions: Mapping[Hashable, str], references: Mapping[Hashable, Sequence[str]], **kwargs
) -> dict[str, float]:
    """Corpus METEOR (key ``METEOR``); see :func:`meteor_per_item` for the options and errors."""
    return meteor_per_item(predictions, references, **kwargs)[0]
