"""Prompts of Visual Caption Boosting (NDLB Sec. 2, appendix A), in finecap's own words, with few-shot examples.

Three steps, each a chat request (a system message, optional few-shot user/assistant turns, the user message):

- ``blend`` (LLM): merge an image's human captions into one sentence without adding anything (BlendCap);
- ``visual`` (VLM): describe the attached image in detail (VisualCap);
- ``holistic`` (LLM): merge the visual description into the blended caption, keeping the human version wherever the
  two disagree (HolisticCap).

Template variables (Python ``str.format`` fields; ``{{``/``}}`` for literal braces):

=================  =============  ==========================================================================
variable           steps          value
=================  =============  ==========================================================================
``{captions}``     blend,         the image's human captions, one per line, each prefixed by ``- ``
                   holistic
``{n_captions}``   blend,         how many human captions there are
                   holistic
``{reference_      blend,         the human captions as NDLB's prompts number them: ``Reference caption 1: ...``,
captions}``        holistic       one per line
``{blend}``        holistic       the image's BlendCap (the ``blend`` step's answer)
``{visual}``       holistic       the image's VisualCap (the ``visual`` step's answer)
=================  =============  ==========================================================================

A prompt file (``boost.prompts``, YAML) overrides any part; ``boost.prompts=ndlb`` is the packaged file with the
paper's prompts, word for word (:data:`PACKAGED`; the default of the ``coco/boost_*`` recipes). Its layout is that
of :data:`DEFAULT_PROMPTS`::

    blend:
      system: "..."
      user: "Captions:\\n{captions}"
      examples:                       # few-shot turns: the variables of the step, then the answer
        - {captions: ["a dog", "a brown dog runs"], answer: "A brown dog runs."}
    holistic:
      user: "..."                    # keys left out keep their defaults

An example's ``captions`` is a list; it is formatted as ``{captions}`` is. An empty ``system`` sends no system
message. A file that is not UTF-8, unknown steps, keys or variables and unbalanced braces raise ``ValueError`` naming
the prompt file (and the step, key and line).
"""

from __future__ import annotations

import copy
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from finecap.utils.reading import METADATA, StrictYAMLLoader, read_bounded, read_yaml_mapping
from finecap.utils.text import short_repr

STEPS = ("blend", "visual", "holistic")
VARIABLES: dict[str, tuple[str, ...]] = {
    "blend": ("captions", "n_captions", "reference_captions"),
    "visual": (),
    "holistic": ("captions", "n_captions", "reference_captions", "blend", "visual"),
}
PACKAGED: dict[str, Path] = {"ndlb": Path(__file__).with_name("ndlb_prompts.yaml")}
"""Prompt files shipped with finecap, by the name ``boost.prompts`` takes: ``ndlb`` = NDLB appendix A.1."""

DEFAULT_PROMPTS: dict[str, dict[str, Any]] = {
    "blend": {
        "system": (
            "You combine several short descriptions of one picture into a single sentence. Use only what the "
            "descriptions say: never add an object, colour, number or place they do not mention, and when one "
            "description is more specific than another, keep the specific version. Answer with exactly one "
            "sentence and nothing else."
        ),
        "user": "Here are {n_captions} descriptions of the same picture:\n{captions}\nOne sentence combining them:",
        "examples": [
            {
                "captions": [
                    "A man rides a bike down the street.",
                    "A cyclist in a red jacket on a city road.",
                    "Someone riding a bicycle past parked cars.",
                ],
                "answer": "A man in a red jacket rides a bicycle down a city street past parked cars.",
            },
            {
                "captions": ["Two cats sleep on a sofa.", "A pair of grey cats curled up on a couch."],
                "answer": "Two grey cats sleep curled up on a sofa.",
            },
        ],
    },
    "visual": {
        "system": "You describe pictures accurately and in detail.",
        "user": (
            "Describe everything visible in this picture: each object with its colour, size and position, how the "
            "objects are arranged, and the setting. Write plain sentences."
        ),
        "examples": [],
    },
    "holistic": {
        "system": (
            "You improve an image caption with details from a second description of the same image. The caption "
            "was written by people and is reliable; the description was written by a model and may contain "
            "mistakes. Add details from the description that the caption does not mention; wherever the two "
            "disagree, keep the caption's version and drop the description's. Answer with one fluent caption and "
            "nothing else."
        ),
        "user": "Human caption: {blend}\nModel description: {visual}\nImproved caption:",
        "examples": [
            {
                "blend": "A man in a red jacket rides a bicycle down a city street.",
                "visual": "A person in a blue jacket cycles on a road. A yellow taxi is parked on the left. "
                "Tall buildings line the street.",
                "captions": [],
                "answer": "A man in a red jacket rides a bicycle down a city street lined with tall buildings, "
                "past a yellow taxi parked on the left.",
            }
        ],
    },
}


def format_captions(captions: list[str]) -> str:
    """The ``{captions}`` variable: one caption per line, each prefixed by ``- ``.

    Example::

        >>> print(format_captions(["a dog", "a brown dog"]))
        - a dog
        - a brown dog
    """
    return "\n".join(f"- {c}" for c in captions)


def format_reference_captions(captions: list[str]) -> str:
    """The ``{reference_captions}`` variable (NDLB's layout).

    Example::

        >>> print(format_reference_captions(["a dog", "a brown dog"]))
        Reference caption 1: a dog
        Reference caption 2: a brown dog
    """
    return "\n".join(f"Reference caption {k}: {c}" for k, c in enumerate(captions, 1))


def _fields(template: str, where: str) -> set[str]:
    try:
        return {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as e:  # "Single '}' encountered", "expected '}' before end of string"
        raise ValueError(f"{where}: {e} (write {{{{ and }}}} for a literal brace)") from None


def _key_lines(text: str) -> dict[str, int]:
    """``{"step.key": line}`` (1-based) of a prompt file's two top levels, for error messages."""
    try:
        root = yaml.compose(text, Loader=StrictYAMLLoader)  # read_yaml_mapping names what it refuses
    except yaml.YAMLError:
        return {}
    lines: dict[str, int] = {}
    if isinstance(root, yaml.MappingNode):
        for step, parts in root.value:
            if isinstance(parts, yaml.MappingNode):
                for key, value in parts.value:
                    lines[f"{step.value}.{key.value}"] = value.start_mark.line + 1
    return lines


def _read_text(path: Path) -> str:
    data = read_bounded(path, METADATA)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise ValueError(
            f"{path}: not UTF-8 text: byte 0x{data[e.start]:02x} at line {line} (offset {e.start}); save the prompt "
            "file as UTF-8"
        ) from None


@dataclass
class Prompts:
    """The three steps' templates (:data:`DEFAULT_PROMPTS` layout) and where they came from."""

    templates: dict[str, dict[str, Any]]
    source: str = "finecap defaults"
    lines: dict[str, int] | None = None
    """Line of each ``step.key`` in the prompt file, for error messages."""

    @classmethod
    def load(cls, path: str | Path | None = None) -> Prompts:
        """The defaults, overridden by the YAML prompt file ``path`` (if given; a name in :data:`PACKAGED` is that
        packaged file unless a file of that name exists); checks encoding, steps, keys, variables and braces."""
        templates = copy.deepcopy(DEFAULT_PROMPTS)
        source = "finecap defaults"
        lines: dict[str, int] = {}
        if path:
            if not Path(path).is_file() and str(path) in PACKAGED:  # an existing file wins, as for recipes
                path = PACKAGED[str(path)]
            path = Path(path)
            if not path.exists():
                raise FileNotFoundError(
                    f"boost.prompts: prompt file {path} not found (packaged prompts: {', '.join(PACKAGED)})"
                )
            if path.is_dir():
                raise ValueError(f"boost.prompts: {path} is a folder, not a prompt file")
            lines = _key_lines(_read_text(path))
            data = read_yaml_mapping(path, f"a prompt file maps steps ({', '.join(STEPS)}) to their templates")
            for step, parts in data.items():
                if step not in STEPS:
                    raise ValueError(f"{path}: unknown step {step!r}; valid steps: {', '.join(STEPS)}")
                if not isinstance(parts, dict) or set(parts) - {"system", "user", "examples"}:
                    raise ValueError(f"{path}: {step}: expected keys system, user, examples; got {parts!r:.80}")
                templates[step].update(parts)
            source = str(path)
        prompts = cls(templates, source, lines)
        prompts.check()
        return prompts

    def _where(self, step: str, key: str, item: str = "") -> str:
        line = (self.lines or {}).get(f"{step}.{key}")
        return f"{self.source}: {step}.{key}{item}" + (f" (line {line})" if line else "")

    def check(self) -> None:
        for step in STEPS:
            t = self.templates[step]
            for key in ("system", "user"):
                if not isinstance(t.get(key), str):
                    raise ValueError(f"{self._where(step, key)} must be a string")
                unknown = _fields(t[key], self._where(step, key)) - set(VARIABLES[step])
                if unknown:
                    raise ValueError(
                        f"{self._where(step, key)} uses unknown variable(s) {sorted(unknown)}; variables of "
                        f"{step}: {', '.join(VARIABLES[step]) or 'none'}"
                    )
            examples = t.get("examples") or []
            if not isinstance(examples, list):
                raise ValueError(f"{self._where(step, 'examples')} must be a list")
            used = _fields(t["user"], self._where(step, "user"))  # what an example fills in, as an image does
            needs = {"captions" if f in ("captions", "n_captions", "reference_captions") else f for f in used}
            for i, ex in enumerate(examples):
                where = self._where(step, "examples", f"[{i}]")
                if not isinstance(ex, dict) or not isinstance(ex.get("answer"), str):
                    raise ValueError(f"{where} needs an 'answer' string")
                missing = sorted(needs - set(ex))
                if missing:
                    raise ValueError(f"{where} needs {', '.join(map(repr, missing))}: {step}.user uses it")
                captions = ex.get("captions", [])
                if not isinstance(captions, list) or not all(isinstance(c, str) for c in captions):
                    raise ValueError(f"{where}: 'captions' must be a list of strings, got {short_repr(captions)}")
                wrong = sorted(k for k in needs - {"captions"} if not isinstance(ex[k], str))
                if wrong:
                    raise ValueError(f"{where}: {', '.join(map(repr, wrong))} must be a string")

    def _user(self, step: str, variables: dict[str, Any]) -> str:
        captions = list(variables.get("captions") or [])
        values = {**variables, "captions": format_captions(captions), "n_captions": len(captions),
                  "reference_captions": format_reference_captions(captions)}  # fmt: skip
        return self.templates[step]["user"].format_map(values)

    def messages(self, step: str, few_shot: bool = True, **variables: Any) -> list[dict[str, Any]]:
        """Chat messages ``[{"role", "content"}]`` of ``step`` for one image; the ``visual`` step's image is
        attached by the backend to the last user message.

        Example::

            >>> m = Prompts.load().messages("blend", few_shot=False, captions=["a dog", "a brown dog"])
            >>> [x["role"] for x in m], m[-1]["content"].splitlines()[0]
            (['system', 'user'], 'Here are 2 descriptions of the same picture:')
        """
        if step not in STEPS:
            raise ValueError(f"unknown boosting step {step!r}; valid steps: {', '.join(STEPS)}")
        t = self.templates[step]
        out: list[dict[str, Any]] = [{"role": "system", "content": t["system"]}] if t["system"] else []
        if few_shot:
            for ex in t.get("examples") or []:
                out.append({"role": "user", "content": self._user(step, ex)})
                out.append({"role": "assistant", "content": ex["answer"]})
        out.append({"role": "user", "content": self._user(step, variables)})
        return out
