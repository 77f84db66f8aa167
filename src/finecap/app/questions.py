"""``finecap questions make``: the multiple-choice questions of a world's images, as a questions file the user can
inspect and edit, and ``qa_utility`` / the ``qa`` metric read (``judge.questions=FILE``).

``finecap questions make --out questions.jsonl [--split train] [--data WORLD]`` writes, for every image of the split,
the questions of its scene graph (:func:`finecap.judges.questions.scene_questions`), less those the configured judge
(``judge.*``) answers right without the caption in all ``judge.shuffles`` orders, and prints how many were dropped
(docs/methods/judges.md). On data without scene graphs (COCO, JSONL, ...) an LLM judge (``judge.name=openai`` or
``vllm``) writes up to ``--per-image`` questions per image from its references (the ``questions`` prompt, CapRL's
question generation), then the same blind filter runs.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

from finecap.config import Config
from finecap.data.references import load_references
from finecap.home import world_path
from finecap.judges import get_judge
from finecap.judges.base import Judge, Question, Subject, failed
from finecap.judges.qa import drop_blind
from finecap.judges.questions import scene_questions, write_questions
from finecap.metrics.faithfulness import scene_of
from finecap.outputs import check_output_file

log = logging.getLogger(__name__)


def written_questions(judge: Judge, records: Sequence[Any], per_image: int) -> dict[Hashable, list[Question]]:
    """Up to ``per_image`` questions per image written by ``judge`` from the image's references; an image whose
    questions the judge could not write (after its re-asks) gets none, and the count is said."""
    subjects = [Subject(r.image_id, tuple(r.captions)) for r in records if r.captions]
    made = judge.make_questions(subjects, per_image)
    lost = sum(failed(m) for m in made)
    if lost:
        log.warning(f"questions: the {judge.name} judge wrote no usable questions for {lost} of {len(subjects)} "
                    "images (left out)")  # fmt: skip
    return {s.image_id: list(m) for s, m in zip(subjects, made, strict=True) if not failed(m)}


def main(
    cfg: Config, *, out: str | Path, data: str | Path | None = None, split: str | None = "train", force: bool = False,
    recipe: str | Path | None = None, per_image: int = 8,
) -> dict[str, Any]:  # fmt: skip
    """Write the questions of ``split`` of the world ``data`` (default: the configured world) to ``out``; returns the
    blind filter's report (``questions``, ``dropped``, ``share``). ``out`` may not be an input, nor an existing file
    unless ``force``."""
    data_set = data or cfg.data.path or world_path(cfg.world)
    check_output_file(out, {"--data": data_set, "recipe": recipe}, force=force, kind="questions")
    refs = load_references(cfg, data, split=split)
    judge = get_judge(cfg.judge.name, cfg)
    try:
        if refs.scenes is not None:
            questions = {}
            for r in refs.records:
                scene = scene_of(r.image_id, refs.scenes)
                if scene is not None:
                    questions[r.image_id] = scene_questions(r.image_id, scene)
        else:
            questions = written_questions(judge, refs.records, per_image)
        if not questions:  # the judge wrote none (unreachable, refusing): no empty file that reads as a result
            raise ValueError(f"questions: no image of {data_set} (split {split}) got a question; nothing written to "
                             f"{out} (is the {judge.name} judge reachable? judge.urls, judge.model)")  # fmt: skip
        refuse = f"questions: nothing written to {out}"
        kept, report = drop_blind(judge, questions, cfg.judge.shuffles, cfg.judge.seed, refuse=refuse)
    finally:
        judge.close()
    write_questions(kept, out)
    log.info(f"wrote {out}: {report['questions'] - report['dropped']} questions of {len(kept)} images; "
             f"{report['dropped']} of {report['questions']} ({100 * report['share']:.1f} %) dropped: the {judge.name} "
             f"judge answers them without a caption")  # fmt: skip
    return report
