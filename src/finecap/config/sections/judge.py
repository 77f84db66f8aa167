"""The ``judge`` section: which judge answers the judge-backed rewards and metrics (:mod:`finecap.judges`) and how
it is reached. One module of the section package (:mod:`finecap.config.sections`), as every section."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from finecap.config.fields import Section, check, doc
from finecap.config.secrets import masked_url_secrets
from finecap.registry import JUDGES

SERVED = ("openai", "vllm")
JUDGE_READS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("urls", "api_key_env", "timeout", "retry_max_wait", "concurrency", "retries"), ("openai",)),
    **dict.fromkeys(("model", "max_tokens", "cache", "max_consecutive_failures"), SERVED),
    "noise": ("world",),
}  # fmt: skip
"""The ``judge`` options only some judges read (their factories, :mod:`finecap.judges`), with those judges; the
others (``name``, ``seed``, ``questions``, ``shuffles``) every judge's callers read. Given to another judge, one is
warned of in a configuration (:meth:`JudgeConfig.unread_options`) and refused from Python
(:func:`finecap.judges.base.refuse_unread`)."""


@dataclass
class JudgeConfig(Section, name="judge"):
    name: str = doc(
        "world",
        "Judge (finecap.registry.JUDGES: world, openai, vllm; or 'pkg.module:factory'), docs/methods/judges.md.",
    )
    urls: list[str] = doc([], "openai: server URLs (e.g. http://localhost:8000/v1), asked round-robin.", url=True)
    model: str = doc("", "openai: the served model name; vllm: a chat LLM's folder or Hub name.")
    api_key_env: str = doc("OPENAI_API_KEY", "openai: environment variable holding the judge server's API key.")
    noise: float = doc(0.0, "world: share of answers flipped to another option at random (seeded).", ge=0, le=1)
    seed: int = doc(0, "Seed of the option shuffles of QA questions (every judge) and of world's flipped answers.")
    retries: int = doc(
        3, "openai: retries of a failed request, and re-asks of an unparsable answer until one repeats, before the "
        "call counts as failed (vllm asks once: its greedy engine repeats its answers).", ge=0, le=100,
        why="each retry waits; a failing server would hold the run",
    )  # fmt: skip
    max_consecutive_failures: int = doc(
        10,
        "openai, vllm: the run stops (judge unavailable) after this many calls in a row got no answer (openai: no "
        "server answered: unreachable, or HTTP 429/5xx after the retries; vllm: the engine raised).",
        ge=1,
    )
    timeout: float = doc(60.0, "openai: seconds before a request times out (then retried).", gt=0)
    retry_max_wait: float = doc(
        60.0, "openai: longest wait before a retry, s; a server asking (Retry-After) for longer fails the call.", ge=0
    )
    concurrency: int = doc(
        8, "openai: requests in flight at once.", ge=1, le=1024, why="requests in flight, one thread each"
    )
    max_tokens: int = doc(
        512, "openai, vllm: most tokens of one answer.", ge=1, le=32_768, why="a claim list takes a few hundred tokens"
    )
    cache: bool = doc(True, "Keep every answer in <finecap home>/cache/judges, so a re-run asks nothing twice.")
    questions: str = doc(
        "", "qa_utility, qa: questions file (JSON Lines, CapRL's layout) where the data has none; empty: the scenes'."
    )
    shuffles: int = doc(
        2, "qa: times each question is asked with its options shuffled.", ge=1, le=64, why="each is a judge call"
    )

    def unread_options(self, cfg: Any) -> dict[str, tuple[str, str]]:
        """The options of the other registered judges (:data:`JUDGE_READS`; a judge of one's own, by dotted path,
        may read any): ``judge.noise`` without the world judge, the server's options without ``openai``."""
        if self.name not in JUDGES:
            return {}
        return {f"judge.{key}": (f"judge.name={' or '.join(names)}", f"judge.name={self.name}")
                for key, names in JUDGE_READS.items() if self.name not in names}  # fmt: skip

    def __post_init__(self) -> None:
        super().__post_init__()
        check(bool(self.name), "judge.name", "names no judge; e.g. world or openai")
        for url in self.urls:
            check(
                url.startswith(("http://", "https://")),
                "judge.urls",
                f"{masked_url_secrets(url)!r} is not an http(s) URL; e.g. http://localhost:8000/v1",
            )
        check(bool(self.api_key_env), "judge.api_key_env", "must name a variable")
