"""METEOR through the jar pycocoevalcap ships (Java): the optional ``java`` backend, and the test suite's oracle.

Same protocol and options as pycocoevalcap's ``Meteor`` (``java -jar -Xmx2G meteor-1.5.jar - - -stdio -l en
-norm``, working directory the jar's folder): one ``SCORE`` line per image (its 23 statistics come back), then one
``EVAL`` line with all statistics (the segment scores and the corpus score come back). :class:`JarProcess` is one
running JVM; :func:`jar_per_item` is the backend.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path

from finecap.metrics.meteor.inputs import check_inputs, pycocoevalcap_line
from finecap.metrics.meteor.resources import MetricUnavailable, data_unavailable_reason, find_meteor_jar

__all__ = ["JarProcess", "jar_per_item", "java_unavailable_reason"]


def java_unavailable_reason(jar: str | Path | None = None, java: str = "java") -> str | None:
    """Why the jar cannot run here (``None`` when it can): no Java runtime, or no jar or paraphrase table."""
    if shutil.which(java) is None:
        return (
            f"the java METEOR backend needs a Java runtime, but {java!r} is not on PATH (install a JRE, e.g. "
            "openjdk-17-jre-headless, or use the python backend: eval.meteor_backend=python)"
        )
    return data_unavailable_reason(jar)


class JarProcess:
    """One METEOR JVM in ``-stdio`` mode, as pycocoevalcap starts it; a context manager.

    :meth:`statistics` sends ``SCORE`` lines and returns the statistics lines; :meth:`evaluate` sends one ``EVAL``
    line and returns the segment scores and the corpus score. Raises :class:`MetricUnavailable` when Java or the jar
    is missing, ``RuntimeError`` (with the JVM's stderr) when the JVM fails or outlives ``timeout`` seconds.
    """

    def __init__(self, jar: str | Path | None = None, java: str = "java", memory: str = "2G",
                 timeout: float | None = 3600.0):  # fmt: skip
        reason = java_unavailable_reason(jar, java)
        if reason is not None:
            raise MetricUnavailable(reason)
        path = find_meteor_jar(jar)
        assert path is not None
        self.path = path
        cmd = [java, "-jar", f"-Xmx{memory}", path.name, "-", "-", "-stdio", "-l", "en", "-norm"]
        self.proc = subprocess.Popen(
            cmd, cwd=path.parent, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        self._stderr: list[bytes] = []
        self._drain = threading.Thread(target=lambda: self._stderr.append(self.proc.stderr.read()), daemon=True)
        self._drain.start()
        self._timed_out = threading.Event()
        self._timer = threading.Timer(timeout, self._kill_on_timeout) if timeout is not None else None
        if self._timer is not None:
            self._timer.daemon = True
            self._timer.start()

    def _kill_on_timeout(self) -> None:
        self._timed_out.set()
        self.proc.kill()

    def _fail(self, what: str) -> RuntimeError:
        if self._timed_out.is_set():
            what += " (killed after its timeout)"
        self.proc.kill()
        self.proc.wait()
        self._drain.join(timeout=5)
        err = b"".join(self._stderr).decode(errors="replace").strip()[-2000:]
        return RuntimeError(
            f"METEOR ({self.path}) {what}; exit code {self.proc.returncode}; stderr: {err or '(empty)'}"
        )

    def _readline(self, what: str) -> str:
        out = self.proc.stdout.readline()
        if not out:
            raise self._fail(what)
        return out.decode().strip()

    def statistics(self, hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> list[str]:
        """The ``SCORE`` answers (23 space-separated statistics) for pycocoevalcap's lines of these captions."""
        lines = [pycocoevalcap_line(h, rs) + "\n" for h, rs in zip(hypotheses, references)]
        writer_error: list[BaseException] = []

        def write() -> None:  # a writer thread, so that neither pipe fills up
            try:
                for line in lines:
                    self.proc.stdin.write(line.encode())
                self.proc.stdin.flush()
            except BaseException as e:  # broken pipe: reported by the reader
                writer_error.append(e)

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        out = [self._readline("stopped before scoring every image") for _ in lines]
        writer.join()
        if writer_error:
            raise self._fail(f"did not accept the input ({writer_error[0]!r})")
        return out

    def evaluate(self, stats: Sequence[str]) -> tuple[list[float], float]:
        """``(segment scores, corpus score)`` of an ``EVAL`` line with these statistics."""
        self.proc.stdin.write(("EVAL ||| " + " ||| ".join(stats) + "\n").encode())
        self.proc.stdin.flush()
        scores = [float(self._readline("stopped before returning the scores")) for _ in range(len(stats) + 1)]
        return scores[:-1], scores[-1]

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> JarProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None and exc[0] is not None:
            self.proc.kill()
        self.close()


def jar_per_item(
    predictions: Mapping[Hashable, str],
    references: Mapping[Hashable, Sequence[str]],
    *,
    jar: str | Path | None = None,
    java: str = "java",
    memory: str = "2G",
    timeout: float | None = 3600.0,
) -> tuple[dict[str, float], dict[Hashable, dict[str, float]]]:
    """Corpus METEOR (key ``METEOR``) and per-image METEOR through the jar, as pycocoevalcap's
    ``Meteor().compute_score``: one JVM for this evaluation."""
    reason = java_unavailable_reason(jar, java)
    if reason is not None:
        raise MetricUnavailable(reason)
    ids, preds, refs = check_inputs(predictions, references)
    with JarProcess(jar, java, memory, timeout) as proc:
        scores, corpus = proc.evaluate(proc.statistics(preds, refs))
    return {"METEOR": corpus}, {i: {"METEOR": s} for i, s in zip(ids, scores)}
