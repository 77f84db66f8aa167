"""The ``boost`` section: caption boosting (``finecap boost``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from finecap.config.fields import Section, check, doc
from finecap.utils.text import short_repr

BoostMode = Literal["blend", "visual", "holistic"]
BoostBackend = Literal["openai", "transformers", "vllm", "world"]

MODE_ROLES: dict[str, tuple[str, ...]] = {"blend": ("llm",), "visual": ("vlm",), "holistic": ("llm", "vlm")}
"""The backends (``boost.<role>_*``) each ``boost.mode`` asks: its steps' (:data:`finecap.boost.engine.MODE_STEPS`:
blend and holistic ask the LLM, visual the VLM)."""
BACKEND_READS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("base_url", "api_key_env", "api_key"), ("openai",)),
    "model": ("openai", "transformers", "vllm"),
}
"""The ``boost.<role>_*`` options only some backends read (:func:`finecap.boost.backends.make_backend`; the world VLM
reads ``vlm_model``, its visual-expert checkpoint, the world LLM nothing)."""
SHARED_READS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("concurrency", "timeout", "retry_max_wait"), ("openai",)),
    "batch_size": ("transformers", "vllm"),
    **dict.fromkeys(("max_new_tokens", "temperature"), ("openai", "transformers", "vllm")),
}
"""The options both roles share that only some backends read."""


def _http_url_problem(url: str) -> str | None:
    """Why ``url`` is not an http(s) URL with a host, or ``None`` when it is (an empty URL means "the default")."""
    from urllib.parse import urlsplit

    if not url:
        return None
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError as e:
        return f"malformed URL ({e})"
    if parts.scheme not in ("http", "https"):
        return f"not an http(s) URL (scheme {short_repr(parts.scheme or 'missing')}); e.g. http://localhost:8000/v1"
    if not parts.hostname:
        return "the URL names no host; e.g. http://localhost:8000/v1"
    return None


@dataclass
class BoostConfig(Section, name="boost"):
    mode: BoostMode = doc(
        "holistic", "Captions `finecap boost` writes: BlendCap, VisualCap or HolisticCap (NDLB Sec. 2)."
    )
    llm_backend: BoostBackend = doc(
        "world", "LLM backend (blend, holistic): openai-compatible server, transformers, vllm (in-process), world."
    )
    llm_model: str = doc("", "LLM model name (openai: served name; transformers, vllm: HF name or path).")
    llm_base_url: str = doc(
        "", "openai: server URL, e.g. http://localhost:8000/v1; empty = env OPENAI_BASE_URL.", url=True
    )
    llm_api_key_env: str = doc("OPENAI_API_KEY", "openai: environment variable holding the LLM server's API key.")
    llm_api_key: str = doc("", "Deprecated (use llm_api_key_env): API key given in the config; never written out.")
    vlm_backend: BoostBackend = doc(
        "world", "VLM backend (visual): openai-compatible server, transformers, vllm (in-process), world."
    )
    vlm_model: str = doc(
        "runs/visual_expert/checkpoints/best", "VLM name or path (world: the visual-expert ClipCap checkpoint)."
    )
    vlm_base_url: str = doc("", "openai: VLM server URL; empty = env OPENAI_BASE_URL.", url=True)
    vlm_api_key_env: str = doc("OPENAI_API_KEY", "openai: environment variable holding the VLM server's API key.")
    vlm_api_key: str = doc("", "Deprecated (use vlm_api_key_env): API key given in the config; never written out.")
    concurrency: int = doc(
        8, "openai: requests in flight at once.", ge=1, le=1024, why="requests in flight, one thread each"
    )
    timeout: float = doc(120.0, "openai: seconds before a request times out (then retried).", gt=0)
    retries: int = doc(
        3,
        "Retries of a failed request or malformed/empty answer before the image is logged as failed.",
        ge=0,
        le=100,
        why="each retry waits; a failing server would hold the run",
    )
    retry_max_wait: float = doc(
        60.0,
        "openai: longest wait before a retry, s; a server asking (Retry-After) for longer fails the request.",
        ge=0,
    )
    max_failure_rate: float = doc(
        0.01,
        "Failure budget: the run stops, exit 2, once more than this fraction of the images to boost failed; a run "
        "whose every image failed fails at 1 too.",
        ge=0,
        le=1,
    )
    max_consecutive_failures: int = doc(
        10,
        "The run stops, exit 2, after this many requests in a row failed to reach the server or got no answer from "
        "an in-process engine that raised instead (a failed batch counts once).",
        ge=1,
    )
    prompts: str = doc("", "Prompt file (YAML) overriding the default templates, or 'ndlb' (the paper's prompts).")
    few_shot: bool = doc(True, "Prepend the prompts' few-shot examples to each request.")
    batch_size: int = doc(
        8, "transformers, vllm: prompts generated per batch.", ge=1, le=4096, why="prompts generated at once"
    )
    max_new_tokens: int = doc(
        120,
        "openai/transformers/vllm: most tokens generated per answer; an answer cut off there fails its image.",
        ge=1,
        le=32_768,
        why="a caption rewrite takes ~200 tokens",
    )
    temperature: float = doc(0.0, "openai/transformers/vllm: sampling temperature (0 = greedy).", ge=0)
    limit: int = doc(0, "Boost only the first N images (0 = all); the rest keep their human captions.", ge=0)

    def __post_init__(self) -> None:
        super().__post_init__()
        for role in ("llm", "vlm"):
            problem = _http_url_problem(getattr(self, f"{role}_base_url"))
            check(problem is None, f"boost.{role}_base_url", str(problem))
            check(bool(getattr(self, f"{role}_api_key_env")), f"boost.{role}_api_key_env", "must name a variable")
        check(
            self.few_shot or self.prompts != "ndlb",
            "boost.few_shot",
            "false with boost.prompts=ndlb would send the paper's system prompts, which announce \"Three examples are "
            'shown below", without the examples; keep few_shot=true, or give a prompts file of your own',
        )

    def unread_options(self, cfg: Any) -> dict[str, tuple[str, str]]:
        """The options of a role ``boost.mode`` does not ask (:data:`MODE_ROLES`) and those no asked backend reads
        (:data:`BACKEND_READS`, :data:`SHARED_READS`)."""
        mode, roles = f"boost.mode={self.mode}", MODE_ROLES[self.mode]
        out = {}
        for role in ("llm", "vlm"):
            backend = getattr(self, f"{role}_backend")
            if role not in roles:
                needs = f"boost.mode={' or '.join(m for m, asked in MODE_ROLES.items() if role in asked)}"
                out |= {f"boost.{role}_{key}": (needs, mode) for key in ("backend", *BACKEND_READS)}
                continue
            out |= {f"boost.{role}_{key}": (f"boost.{role}_backend={' or '.join(names)}", f"boost.{role}_backend="
                                             f"{backend}")
                    for key, names in BACKEND_READS.items()
                    if backend not in names and not (role == "vlm" and key == "model")}  # fmt: skip
        backends = {getattr(self, f"{role}_backend") for role in roles}
        have = ", ".join(f"boost.{role}_backend={getattr(self, f'{role}_backend')}" for role in roles)
        out |= {f"boost.{key}": (f"a backend {' or '.join(names)}", have)
                for key, names in SHARED_READS.items() if not backends & set(names)}  # fmt: skip
        return out
