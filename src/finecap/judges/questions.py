"""Multiple-choice questions about images: generated from a world scene graph, read from a data file (CapRL's
layout), written back, and presented with shuffled options.

On the world (:func:`scene_questions`) every object gets a question about its colour, its size and its grid cell,
a patterned object one about its pattern, and the scene one about its background and one about its object count;
the wrong options are drawn, seeded by the question, from the world's other values (up to 3 of them). Each
question's ``fact`` is the ``(kind, shape)`` it asks, which the ``world`` judge answers from.

A questions file (:func:`read_questions`, :func:`write_questions`) is JSON Lines, one image a line, CapRL's layout::

    {"image_id": 7, "questions": [{"question": "What colour is the circle?", "options": ["red", "blue"],
                                   "answer": "red"}]}

``answer`` is the right option's text or its letter (``"A"`` = the first option); ``id`` and ``fact`` are optional.
Without ``options`` the question text may carry them as CapRL's QA data does, one a line after the question
(``"What colour is the circle?\\n   - A) red\\n   - B) blue"``, :func:`split_embedded`).
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

from finecap.data.records import check_id, refuse_repeated_ids
from finecap.judges.base import CANNOT_ANSWER, Question
from finecap.utils.reading import text_lines
from finecap.world.scene import BACKGROUNDS, CELLS, COLORS, MAX_OBJECTS, PATTERNS, SHAPES, SIZES, Scene

N_OPTIONS = 4
"""Options of a world question (fewer when the world has fewer values: size and pattern have 2)."""


def _options(truth: str, values: Sequence[str], rng: random.Random) -> tuple[str, ...]:
    others = rng.sample([v for v in values if v != truth], min(N_OPTIONS - 1, len(values) - 1))
    return tuple(sorted([truth, *others], key=list(values).index))


def scene_questions(image_id: Hashable, scene: Scene) -> list[Question]:
    """The questions of a world scene (module docstring), in a fixed order; options in the world's order of values
    (they are shuffled when presented, :func:`presentations`)."""
    out = []

    def add(kind: str, shape: str | None, text: str, truth: str, values: Sequence[str]) -> None:
        qid = f"{image_id}/{kind}/{shape or '-'}"
        rng = random.Random(qid)
        out.append(Question(qid, text, _options(truth, values, rng), truth, (kind, shape)))

    values = QUESTION_VALUES
    for o in scene.objects:
        add("color", o.shape, f"What colour is the {o.shape}?", o.color, values["color"])
        add("size", o.shape, f"What size is the {o.shape}?", o.size, values["size"])
        add("position", o.shape, f"Where is the {o.shape}?", CELLS[o.cell], values["position"])
        if o.pattern:
            add("pattern", o.shape, f"What pattern does the {o.shape} have?", o.pattern, values["pattern"])
    add("background", None, "What is the background?", scene.background, values["background"])
    add("count", None, "How many shapes are there?", str(len(scene.objects)), values["count"])
    return out


def presentations(question: Question, k: int, seed: int = 0) -> list[tuple[str, ...]]:
    """``k`` orders of the question's ``n`` options, :data:`CANNOT_ANSWER` last, distinct while the options allow:
    seeded rotations of shuffles. Order ``j`` is the ``j % n``-th rotation of shuffle ``j // n``; the shuffles are
    drawn in turn (seeded by ``seed`` and the question's id), each kept only when no earlier one is a rotation of it.
    So within ``n`` orders every option, the answer included, stands at a different position in each, which spreads
    a judge's preference for a position over the options, and all ``n!`` orders are distinct
    (docs/methods/judges.md#the-rewards-as-implemented). With ``k > n!`` (3 orders of a 2-option question) the
    orders repeat from the first: order ``j`` is order ``j % n!``, asked again. Order ``j`` is the same for any ``k``.

    Example::

        >>> q = Question("7/size/circle", "What size is the circle?", ("small", "large"), "small")
        >>> [o[:2] for o in presentations(q, 3)]
        [('large', 'small'), ('small', 'large'), ('large', 'small')]
    """
    n, rng = len(question.options), random.Random(f"{seed}/{question.id}")
    distinct = min(k, math.factorial(n))
    cycles: set[tuple[str, ...]] = set()
    orders: list[tuple[str, ...]] = []
    while len(orders) < distinct:
        options = list(question.options)
        rng.shuffle(options)
        start = options.index(question.options[0])
        cycle = tuple(options[start:] + options[:start])  # one name for the shuffle and its rotations
        if cycle not in cycles:
            cycles.add(cycle)
            orders += [(*options[r:], *options[:r], CANNOT_ANSWER) for r in range(n)]
    return [orders[j % distinct] for j in range(k)]


def letter(i: int) -> str:
    """The letter of option ``i`` (0 -> ``A``)."""
    return chr(ord("A") + i)


_EMBEDDED = re.compile(r"^\s*-?\s*([A-I])\)\s*(.+?)\s*$")


def split_embedded(text: str) -> tuple[str, list[str]]:
    """CapRL's question text with its options on the following lines (``"   - A) red"``) -> the question and the
    options, its "Can not answer" option left out (finecap adds its own).

    Example::

        >>> split_embedded("Colour?\\n  - A) red\\n  - B) blue\\n  - C) Can not answer based on the caption")
        ('Colour?', ['red', 'blue'])
    """
    lines = text.splitlines()
    options = [m.group(2) for line in lines[1:] if (m := _EMBEDDED.match(line))]
    return lines[0].strip(), [o for o in options if not o.lower().startswith("can not answer")]


def question_of(raw: object, image_id: Hashable, n: int, where: str) -> Question:
    """Question ``n`` of image ``image_id`` read from its JSON form ``raw`` (CapRL's layout: ``options`` listed or
    embedded in the question text, ``answer`` an option or its letter; with a ``fact``, options among the world's
    values of its kind, :data:`QUESTION_VALUES`); a ``ValueError`` naming ``where``."""
    if isinstance(raw, dict) and isinstance(raw.get("question"), str) and "options" not in raw:
        text, embedded = split_embedded(raw["question"])
        raw = {**raw, "question": text, "options": embedded}
    if not (isinstance(raw, dict) and isinstance(raw.get("question"), str) and isinstance(raw.get("options"), list)):
        raise ValueError(f"{where}: question {n} of image {image_id!r} needs 'question' (text) and 'options' (a list)")
    options = tuple(str(o) for o in raw["options"])
    answer = str(raw.get("answer", ""))
    if answer not in options and len(answer) == 1 and 0 <= ord(answer.upper()) - ord("A") < len(options):
        answer = options[ord(answer.upper()) - ord("A")]
    fact = raw.get("fact")
    if fact and not is_question_fact(fact):
        raise ValueError(
            f"{where}: question {n} of image {image_id!r}: 'fact' {fact!r} is no fact the world judge answers: "
            f"[kind, shape] with kind one of {', '.join(QUESTION_KINDS)} and shape one of {', '.join(SHAPES)} "
            "(null for background and count)"
        )
    if fact and (foreign := [o for o in options if o not in QUESTION_VALUES[fact[0]]]):
        raise ValueError(
            f"{where}: question {n} of image {image_id!r}: option(s) {', '.join(map(repr, foreign))} of a "
            f"'{fact[0]}' question are no value the world states, so the world judge, which matches options "
            "against the caption's facts, would never choose them (a caption stating the fact would be answered "
            f"'cannot answer'); the options of a '{fact[0]}' question are among {', '.join(QUESTION_VALUES[fact[0]])}"
        )
    try:
        return Question(str(raw.get("id") or f"{image_id}/{n}"), raw["question"], options, answer,
                        tuple(fact) if fact else None)  # fmt: skip
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


QUESTION_VALUES: dict[str, tuple[str, ...]] = {
    "color": tuple(COLORS),
    "size": tuple(SIZES),
    "position": tuple(CELLS),
    "pattern": tuple(PATTERNS),
    "background": tuple(BACKGROUNDS),
    "count": tuple(str(n) for n in range(1, MAX_OBJECTS + 1)),
}
"""The values of each kind of fact a question may ask, as the world's facts write them (``str`` of
:class:`finecap.world.facts.Fact`'s value): a question's options (:func:`scene_questions`), and what the world judge
matches a questions file's options against."""
QUESTION_KINDS = tuple(QUESTION_VALUES)
"""The kinds of fact a question may ask (:func:`scene_questions`): an object's (with its shape) or the scene's."""


def is_question_fact(fact: object) -> bool:
    """Whether ``fact`` is a question's ``[kind, shape]`` that the world judge can answer: a misspelt kind
    (``colour``) or shape would be answered "cannot answer" whatever the caption says.

    Example::

        >>> [is_question_fact(f) for f in (["color", "circle"], ["count", None], ["colour", "circle"])]
        [True, True, False]
    """
    if not (isinstance(fact, list | tuple) and len(fact) == 2):
        return False
    kind, shape = fact
    scene_wide = kind in ("background", "count")
    return kind in QUESTION_KINDS and (shape is None if scene_wide else shape in SHAPES)


def read_questions(path: str | Path) -> dict[Hashable, list[Question]]:
    """``{image_id: [Question]}`` of a questions file (module docstring); errors name the file and line. Lines of
    one image go on numbering its questions, an int id and its string being one image (``7`` and ``"7"``, as the
    data readers read ids: :func:`finecap.data.records.id_key`), keyed by its id as first written."""
    out: dict[Hashable, list[Question]] = {}
    written: dict[str, Hashable] = {}  # an id as text -> as first written
    path = Path(path)
    try:
        lines = text_lines(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ValueError(f"questions file {path}: cannot read it ({e.strerror})") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not JSON ({e.msg})") from None
        if not isinstance(row, dict) or "image_id" not in row or not isinstance(row.get("questions"), list):
            raise ValueError(f"{where}: a line needs 'image_id' and 'questions' (a list)")
        given = check_id(row["image_id"], where, "'image_id'")  # an int or a string: 7.0 or true is no image's id
        image_id = written.setdefault(str(given), given)
        questions = out.setdefault(image_id, [])
        start = len(questions)  # an image's later lines go on numbering its questions
        questions.extend([question_of(q, image_id, start + n, where) for n, q in enumerate(row["questions"])])
        check_unique_ids(questions, image_id, where)
    return out


def questions_of(records: Sequence[Any]) -> dict[Hashable, list[Question]] | None:
    """The questions a data set gives its images (``Record.questions``: a JSONL line's or chat record's
    ``questions``, an ``hf`` column), parsed (:func:`question_of`); ``None`` when no record gives any."""
    if not any(getattr(r, "questions", None) for r in records):
        return None
    out = {}
    for r in records:
        if r.questions:
            where = f"data: image {r.image_id!r}"
            out[r.image_id] = [question_of(q, r.image_id, n, where) for n, q in enumerate(r.questions)]
            check_unique_ids(out[r.image_id], r.image_id, "data")
    return out


def pick_questions(
    given: Mapping[Hashable, Sequence[Question]] | None,
    questions_file: str | Path,
    scenes: Mapping[Hashable, Scene] | None,
    who: str,
) -> Mapping[Hashable, Sequence[Question]] | None:
    """The questions QA utility asks, in the one order the ``qa_utility`` reward and the ``qa`` metric share: the
    data set's own (``given``: :func:`questions_of` of its records, or a caller's ``questions=``), else the
    questions file ``questions_file`` (``judge.questions``), else made from the world's ``scenes``; ``None`` when
    there are none of the three. Both ``given`` and a file is a ``ValueError`` naming ``who``: which of two sets of
    questions scores the captions would otherwise be a silent choice. So is an image of ``given`` with two questions
    of one id (:func:`check_unique_ids`, as a data set's or a file's): the blind filter, the shuffles and the cache
    would take them for one question; and an image keyed twice in ``given`` or ``scenes`` (``7`` and ``"7"``:
    :func:`~finecap.data.records.refuse_repeated_ids`, naming ``who``), whose questions :func:`read_questions`
    would read as one image's: which of the two sets an image's captions are asked would hang on how the batch
    keys it.

    Example::

        >>> q = Question("7/0", "Colour?", ("red", "blue"), "red")
        >>> pick_questions({7: [q]}, "", None, "metric 'qa'") == {7: [q]}
        True
        >>> pick_questions(None, "", None, "metric 'qa'") is None
        True
    """
    if questions_file:
        if given is not None:
            raise ValueError(f"{who}: the images have questions of their own (the data set's 'questions', or "
                             f"questions= given) and judge.questions names a questions file ({questions_file}); "
                             "give one of the two")  # fmt: skip
        return read_questions(questions_file)
    if given is not None:
        refuse_repeated_ids(given, f"{who} questions")  # 7 and "7": one image (read_questions merges them)
        for image_id, questions in given.items():  # a caller's questions= too, not only a data set's (questions_of)
            check_unique_ids(questions, image_id, who)
        return given
    if scenes is not None:
        refuse_repeated_ids(scenes, f"{who} scenes")  # 7 and "7": two sets of questions for one image
        return {i: scene_questions(i, s) for i, s in scenes.items()}
    return None


def check_unique_ids(questions: Sequence[Question], image_id: Hashable, where: str) -> None:
    """A ``ValueError`` naming ``where`` when two of an image's questions share an id: the blind filter, the option
    shuffles and the answer cache tell questions apart by it."""
    seen: set[str] = set()
    for q in questions:
        if q.id in seen:
            raise ValueError(f"{where}: image {image_id!r} has two questions with id {q.id!r} (ids must differ)")
        seen.add(q.id)


def write_questions(questions: Mapping[Hashable, Sequence[Question]], path: str | Path) -> None:
    """Write ``{image_id: [Question]}`` as a questions file (atomically), remembered as finecap's output, so that
    ``finecap questions make --out`` may replace it later without ``--force``."""
    from finecap.outputs import write_output

    lines = [json.dumps({"image_id": i, "questions": [q.to_dict() for q in qs]}) for i, qs in questions.items()]
    write_output(path, "".join(line + "\n" for line in lines), "questions")
