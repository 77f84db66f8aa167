"""``finecap eval``: score a COCO results file against a reference data set, print the scores, write JSON.

``finecap eval --predictions results.json --references DATA [--metrics ...] [--images DIR] [--bags bags.json]
[--instances instances.json] [--split S] [--format table|json|coco] [--out scores.json] [--per-image items.json]
[--predictions-format F]`` calls
:func:`main`, which reads the files and calls :func:`finecap.metrics.suite.evaluate_items` (the metric groups and
their keys are listed there).

- Metrics (:func:`default_metrics`): ``--metrics a,b`` or ``eval.metrics`` when given, else the groups the
  references and this machine allow: the caption metrics always (``bleu``, ``meteor`` when pycocoevalcap's data is
  installed (no Java needed), ``rouge``, ``cider``, ``spice`` when Java and its jars are: pycocoevalcap's five),
  ``length`` and ``vocab``, image metrics (``clipscore``, ``retrieval``; ``bags`` with ``--bags``) when every
  image file of the references exists and a retriever is known (``retriever.checkpoint``, or the world's trained
  encoder), the world's ``faithfulness`` on a world, ``hallucination`` (CHAIR) with ``--instances`` (or
  ``eval.instances``: a COCO ``instances_*.json``), ``perplexity`` when ``eval.lm`` is set. What is left out is
  said in one note each. A group asked for by name that cannot run here is an error naming ``--metrics`` (or
  ``eval.metrics``) and why.
- Output: only a Markdown table on stdout (``--format table``, default), or only the JSON ``{metric: value}``
  (``--format json``, for scripts), or that JSON with pycocoevalcap's names (``--format coco``:
  ``Bleu_1`` .. ``Bleu_4``, ``METEOR``, ``ROUGE_L``, ``CIDEr``, ``SPICE``, the keys of ``COCOEvalCap.eval``; by
  default only those five groups). ``--out`` also writes that JSON to a file. When a judge-backed group ran
  (``qa``, ``claims``, ``clair``) the JSON also holds ``judge``: what judged (its name, prompt version, model,
  ``max_tokens``, noise, seed, shuffles: :func:`finecap.metrics.judged.judge_record`) and what it did (``counts``:
  calls, cache hits, unparsable answers, failed calls, HTTP 429 replies; ``group_counts``: each group's). A judged
  group's means are over the images the judge did not fail on, ``<group>/judge_scored`` of them
  (``<group>/judge_failed`` failed, warned): the command exits 0 on such a partial score, and fails (exit 2, nothing
  written) when a group has no image scored.
  ``--per-image FILE`` writes the per-image scores of the caption metrics as a JSON list of ``{"image_id": id,
  metric: score, ...}``, one per image in the references' order: ``COCOEvalCap.evalImgs`` (the values of
  ``imgToEval``), with the names of ``--format``.
  What the command says about its work (the notes: metrics left out, images scored, ``wrote FILE``) are INFO records
  of the ``finecap`` logger, its warnings WARNING records: stderr, never inside the table or JSON
  (docs/cli.md#verbosity--v-and--q).
- References: the format is detected from the file (:func:`finecap.data.formats.detect_format`; a world also
  brings its scene graphs). An image id in several records of the references is an error naming the ids; COCO
  annotations of one ``image_id`` are that image's references (as pycocotools groups them).
- Predictions (:func:`finecap.data.predictions.read_predictions`): COCO results, or another toolkit's prediction file
  (lmms-eval sample logs, VLMEvalKit result files, LLaMA-Factory's ``generated_predictions.jsonl``, ms-swift's
  inference JSONL), detected or named with ``--predictions-format`` (:mod:`finecap.data.predictions`). Those carry
  their references: then ``--references`` may be left out (given, it is what is scored against). Warnings about the
  file (a reference that looks like a stringified list but is not one) go to stderr; a note says when the captions
  average over twice their references' length (n-gram metrics punish detailed captions).
- Predicted ids name reference images by id, by path relative to the data set's folder, or by file name when only one
  image has it (:func:`match_ids`: ``finecap caption --images photos/``'s ``img000.jpg`` is a chat JSONL's
  ``photos/img000.jpg``), or, an integer, by the number of a file's name (``--images``' ``1000092795`` is
  ``1000092795.jpg``); an id naming none is an error showing the first ids of both sides, an integer read as an id
  that is also another image's file number a warning (:func:`read_by_id_not_file`).
- An image of the predictions listed several times is an error naming the ids
  (pycocoevalcap's scorers assert one caption per image), unless the ``diversity`` group is asked for by name: an
  image's captions are then its samples, and its first caption is what the other groups score.
- Start-up: with text-only metrics nothing imports torch or transformers; image metrics load the retriever when
  they run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
from collections.abc import Callable, Hashable, Iterator, Sequence
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from finecap.config import Config
from finecap.data.bags_file import read_bags
from finecap.data.predictions import check_line_order, prediction_format, read_predictions
from finecap.data.records import MAX_LISTED, DataError, Record, stem_number
from finecap.data.references import (
    LoadedReferences,
    check_image_folder,
    load_references,
    missing_images,
    require_captions,
)
from finecap.data.results import empty_captions_note
from finecap.judges.questions import questions_of
from finecap.metrics.cocoeval import COCO_NAMES
from finecap.metrics.faithfulness import SILENT_NOTE, mostly_silent
from finecap.metrics.group import metric_group
from finecap.metrics.suite import CAPTION_METRICS, evaluate_items, parse_metrics, unavailable_reason
from finecap.models.world_encoder_cache import encoder_dir
from finecap.outputs import check_not_among, check_outputs, strict_json, write_output_json

Format = Literal["table", "json", "coco"]
FORMATS = ("table", "json", "coco")

log = logging.getLogger(__name__)

TEXT_METRICS = ("length", "vocab")
"""Descriptive statistics of the captions, in the default set of the table and JSON formats."""


def main(
    cfg: Config,
    *,
    predictions: str | Path,
    references: str | Path | None,
    images: str | Path | None = None,
    bags: str | Path | None = None,
    instances: str | Path | None = None,
    metrics: str | Sequence[str] | None = None,
    out: str | Path | None = None,
    split: str | None = None,
    fmt: Format = "table",
    per_image: str | Path | None = None,
    force: bool = False,
    recipe: str | Path | None = None,
    predictions_format: str = "auto",
) -> dict[str, float]:
    """Score ``predictions`` (COCO results) against ``references``; print the scores in ``fmt``, write them to
    ``out`` and the per-image scores to ``per_image`` when given (module docstring). Returns the printed
    ``{metric: value}`` (pycocoevalcap's names with ``fmt="coco"``).

    Without ``split`` the retrieval pool is the split of the predicted images (or every referenced image when they
    span several splits).

    ``instances``: a COCO ``instances_*.json`` for the ``hallucination`` group (default ``eval.instances``); a
    missing or malformed one is an error naming ``--instances``.

    ``predictions_format``: a name of :data:`finecap.registry.PREDICTION_FORMATS` or ``"auto"`` (detected).
    ``references`` may be ``None`` when the predictions file carries them.

    ``images``, the image folder of the references' relative paths, must be a folder, whether or not a metric reads
    the images (a mistyped one is refused, not passed over unsaid).

    ``out`` and ``per_image`` may not name an input (the predictions, the references, the bags, the instances and
    questions files, given as options or in the configuration, the ``recipe`` the configuration was read from, the
    retriever checkpoint ``retriever.checkpoint``), nor be or lie inside the image folder (``images``, else
    ``data.images``), nor be an image file the references name: refused even with ``force``; nor replace an existing
    file finecap did not make unless ``force`` (:mod:`finecap.outputs`).
    """
    if fmt not in FORMATS:
        raise ValueError(f"--format: expected one of {', '.join(FORMATS)}, got {fmt!r}")
    if images is not None:  # refused even when no metric reads it: a typo would hide
        check_image_folder(images)
    check_outputs(
        [("--out", out, "scores"), ("--per-image", per_image, "per-image")],
        {
            "--predictions": predictions,
            "--references": references,
            "--bags": bags,
            "--instances": instances,
            "--images": images,
            "data.images": None if images is not None else (cfg.data.images or None),  # the image folder read
            "eval.instances": cfg.eval.instances or None,  # the inputs the configuration names too
            "judge.questions": cfg.judge.questions or None,
            "retriever.checkpoint": cfg.retriever.checkpoint or None,  # read by the retrieval metrics
            "recipe": recipe,
        },
        force=force,
    )
    with _cyclic_gc_paused():
        return _main(cfg, predictions=predictions, references=references, images=images, bags=bags,
                     instances=instances, metrics=metrics, out=out, split=split, fmt=fmt, per_image=per_image,
                     predictions_format=predictions_format)  # fmt: skip


@contextlib.contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while the files are read and scored, and restore it after: reading
    a large reference file creates hundreds of thousands of objects (none in reference cycles), and the collector's
    repeated passes over them took 5-7 % of `finecap eval`'s time (245 collections on 8k COCO-like images)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _main(
    cfg: Config,
    *,
    predictions: str | Path,
    references: str | Path | None,
    images: str | Path | None,
    bags: str | Path | None,
    instances: str | Path | None,
    metrics: str | Sequence[str] | None,
    out: str | Path | None,
    split: str | None,
    fmt: Format,
    per_image: str | Path | None,
    predictions_format: str,
) -> dict[str, float]:
    source = "--metrics" if metrics is not None else "eval.metrics" if cfg.eval.metrics else None
    asked = parse_metrics(metrics, cfg.eval.metrics, option=source) if source else None
    pred_format, read = read_predictions(predictions, predictions_format)
    results = read.captions
    for warning in read.warnings:
        log.warning("%s", warning)
    if not results:
        raise DataError(f"--predictions: {predictions}: no captions in it (read as {pred_format} predictions); "
                        "nothing to evaluate")  # fmt: skip
    repeated = [i for i, caps in results.items() if len(caps) > 1]
    if repeated and "diversity" not in (asked or ()):
        raise DataError(
            f"{predictions}: {len(repeated)} image id(s) have several captions, e.g. {repeated[:MAX_LISTED]}; "
            "pycocoevalcap's scorers take one caption per image. Keep one per image, or ask for the diversity group "
            "(--metrics diversity,...) to use them as samples (the first caption of each image is then scored)"
        )
    if repeated:
        log.info(f"{len(repeated)} image(s) have several captions: the first is scored, all of them are diversity "
                 "samples")  # fmt: skip
    bag_data = read_bags(bags) if bags is not None else None
    objects = _read_instances(cfg, instances)
    if references is not None:
        refs = load_references(cfg, references, split=split, images=images)
        cfg = references_world(cfg, refs)
        if read.references is not None:
            log.info(f"{predictions}: the references it holds are not used: scoring against {references}")
    elif read.references is not None:
        unused = [option for option, value in (("--split", split), ("--images", images)) if value is not None]
        if unused:  # they choose among the images of a references file; these captions carry their own
            raise ValueError(
                f"{' and '.join(unused)}: {predictions} carries its own references, so there is nothing to choose "
                "from; give --references to score against a data set's split or images"
            )
        refs = _carried_references(Path(predictions), pred_format, read.references)
    else:
        raise ValueError(f"--references: required: {predictions} holds {pred_format} predictions, without references")
    for option, path in (("--out", out), ("--per-image", per_image)):  # an image beside the references: no folder
        if path is not None:  # of check_outputs holds it
            check_not_among(path, [r.path for r in refs.records if not r.embedded],
                            what=f"an image of the references {refs.path}", option=option)  # fmt: skip
    by_id = {r.image_id: r for r in refs.records}
    numbers = file_numbers(refs)
    matched = match_ids(list(results), refs, numbers)
    missing = [i for i in results if i not in matched]
    twice = match_ids(missing, refs, numbers) if missing else {}  # ids naming an image another id took already
    if twice:
        i, image = next(iter(twice.items()))
        other = next(j for j, target in matched.items() if target == image)
        raise DataError(
            f"{predictions}: {len(twice)} predicted image id(s) name an image that another predicted id names too, "
            f"e.g. {i!r} and {other!r} both name image {image!r} of {refs.path}; keep one caption entry per image"
        )
    if missing:
        where = f" (split {split!r})" if split else ""
        raise DataError(
            f"{predictions}: {len(missing)} predicted image id(s) are not in the references {refs.path}{where} "
            f"(neither as ids, paths relative to the data set nor unambiguous file names), e.g. "
            f"{missing[:MAX_LISTED]}; the references' ids are e.g. {list(by_id)[:MAX_LISTED]}"
            + _uncaptioned_note(refs, missing)
        )
    crossed = read_by_id_not_file(matched, numbers)
    if crossed:
        i, other = crossed[0]
        log.warning(f"{len(crossed)} predicted id(s) are ids of the references and numbers of other images' "
                    f"file names, e.g. {i!r}: image {i!r} by id, image {other!r} by its file name; scored by id "
                    "(as `finecap caption --data` writes them). Predictions of `finecap caption --images` name files: "
                    "caption the references' split with --data to score them by id")  # fmt: skip
    if references is not None and read.references is not None and prediction_format(pred_format).line_ids:
        check_line_order(Path(predictions), read.references, matched, {r.image_id: r.captions for r in refs.records})
    results = {matched[i]: caps for i, caps in results.items()}
    samples = results if repeated else None
    # pycocoevalcap's order (loadRes keeps the reference file's image order): its tokenizer reads captions as
    # consecutive lines, and a caption's last token can depend on the next line (finecap.metrics.ptb_tokenize)
    preds = {r.image_id: results[r.image_id][0] for r in refs.records if r.image_id in results}
    require_captions([by_id[i] for i in preds], refs.path, refs.format, "the predictions")  # a folder's may have none
    empty = empty_captions_note(preds, "the predicted captions")
    if empty:
        log.warning("%s: %s, scored as they are", predictions, empty)
    pool = refs.records
    if split is None:
        splits = {by_id[i].split for i in preds}
        if len(splits) == 1:
            pool = [r for r in refs.records if r.split in splits]
    unscored = [r.image_id for r in pool if r.image_id not in results]
    if unscored:  # scores over a subset are not the data set's: say so (a log record: stdout holds the scores alone)
        log.info(f"note: the predictions cover {len(preds)} of the {len(pool)} reference images"
                 f"{f' of split {split!r}' if split else ''}; {len(unscored)} are not scored, "
                 f"e.g. {unscored[:MAX_LISTED]}")  # fmt: skip
    why_not = _reasons(cfg, refs, pool, samples=samples, bags=bag_data, instances=objects)
    if asked is not None:
        names = asked
        for name in names:
            reason = why_not(name, True)
            if reason:
                raise ValueError(f"{source}: metric {name!r} cannot run here: {reason}")
    else:
        names, skipped = [], {}
        for name in default_metrics(coco=fmt == "coco", world=refs.scenes is not None, bags=bag_data is not None,
                                    lm=bool(cfg.eval.lm), instances=objects is not None):  # fmt: skip
            reason = why_not(name, False)
            if reason:
                skipped.setdefault(reason, []).append(name)
            else:
                names.append(name)
        for reason, left_out in skipped.items():
            log.info(f"skipping {', '.join(left_out)}: {reason}")
    about: dict[str, Any] = {}  # what judged the judge-backed scores, written beside them
    result, items = evaluate_items(
        preds,
        refs.captions(),
        metrics=names,
        images=pool,  # the retrieval pool (and the listener's)
        scenes=refs.scenes,
        bags=bag_data,
        samples=samples,
        instances=objects,
        # the data set's own questions, which qa reads first as the qa_utility reward does (parsed only for it)
        questions=questions_of(refs.records) if "qa" in names else None,
        cfg=cfg,
        per_image=per_image is not None,
        about=about,
    )
    scored = "/judge_scored"  # a judged group's means are over this many images (metrics/judged.py)
    dead = [k.removesuffix(scored) for k, v in result.items() if k.endswith(scored) and v == 0]
    if dead:  # a judge that answered for no image it scored: no score at all, not a result to write and exit 0 on
        raise ValueError(f"metric(s) {', '.join(dead)}: the {cfg.judge.name} judge failed on every image it was to "
                         "score (the warnings above say why; is it reachable? judge.urls, judge.model); nothing "
                         "written")  # fmt: skip
    rename = (lambda k: COCO_NAMES.get(k, k)) if fmt == "coco" else (lambda k: k)
    result = {rename(k): v for k, v in result.items()}
    log.info(f"{len(preds)} images of {refs.path}" + (f" (split {split})" if split else ""))
    _length_note(preds, refs.captions())  # after scoring: a command that fails prints its error alone
    silent = mostly_silent(result)
    if silent is not None:
        log.info(f"note: {silent:.0%} of the captions ({round(silent * len(preds))} of {len(preds)}) {SILENT_NOTE}")
    if fmt == "table":
        from finecap.report.columns import rules_for  # only for the table
        from finecap.report.table import markdown_table

        title = Path(predictions).name
        print(markdown_table({k: {title: v} for k, v in result.items()}, columns=[title], row_header="metric",
                             rules=rules_for(names)))  # fmt: skip
    written = {**result, **about}  # the JSON: the scores, and the judge's record ("judge") under them
    if fmt != "table":
        print(strict_json(written, indent=1))
    if out is not None:
        write_output_json(out, written, "scores")
        log.info(f"wrote {out}")
    if per_image is not None:
        rows = [{"image_id": i, **{rename(k): v for k, v in s.items()}} for i, s in items.items()]
        write_output_json(per_image, rows, "per-image")
        log.info(f"wrote {per_image} (per-image scores of {len(items)} images)")
    return result


def match_ids(
    predicted: Sequence[Hashable], refs: LoadedReferences, numbers: dict[int, Hashable] | None = None
) -> dict[Hashable, Hashable]:
    """The reference image id of each predicted id that names one: the id itself, else the image's path relative to
    the data set's folder (``photos/img000.jpg``), else its file name (``img000.jpg``) when only one reference image
    has it and the id's folders, if it names any, agree with that image's path as far as both go
    (``val2014/img000.jpg`` names ``/data/coco/val2014/img000.jpg``, ``dogs/001.jpg`` never names ``cats/001.jpg``),
    else (an integer) the image whose file name is that number (:func:`file_numbers`). So ``finecap caption
    --images photos/``'s ids (file names, or numbers of numbered files) score against a chat JSONL's (paths as the
    file writes them), a folder's or Flickr30k's Karpathy file's, and the other way round. Ids naming no image, or
    naming one another id already took, are left out (the caller reports them). ``numbers``: :func:`file_numbers`
    of ``refs`` when the caller has them already. When every predicted id is a reference id (``finecap caption
    --data``'s, a COCO results file's) no path is read: the path maps are built only for the ids left.

    Example::

        >>> from finecap.data.records import Record
        >>> refs = LoadedReferences([Record("photos/a.jpg", Path("/d/photos/a.jpg"), "test"),
        ...                          Record("x/b.jpg", Path("/d/x/b.jpg"), "test"),
        ...                          Record("y/b.jpg", Path("/d/y/b.jpg"), "test")], Path("/d/data.jsonl"), "jsonl")
        >>> match_ids(["a.jpg", "./x/b.jpg", "b.jpg", "c.jpg"], refs)
        {'a.jpg': 'photos/a.jpg', './x/b.jpg': 'x/b.jpg'}
        >>> match_ids(["cats/a.jpg", "/d/x/b.jpg"], refs)
        {'/d/x/b.jpg': 'x/b.jpg'}
    """
    ids = {r.image_id for r in refs.records}
    matched: dict[Hashable, Hashable] = {i: i for i in predicted if i in ids}  # the ids themselves first
    others = [i for i in predicted if i not in matched]
    if not others:  # the usual case; the maps below cost a few pathlib paths per image (0.14 s for 8,000)
        return matched
    folder = refs.path if refs.path.is_dir() else refs.path.parent
    by_path: dict[str, Hashable] = {}
    by_name: dict[str, list[Hashable]] = {}
    paths: dict[Hashable, set[tuple[str, ...]]] = {}  # the path forms of each image, as their parts
    by_number = file_numbers(refs) if numbers is None else numbers
    for r in refs.records:
        names = {PurePosixPath(str(r.image_id)).as_posix()}
        if not r.embedded and r.path.is_relative_to(folder):
            names.add(r.path.relative_to(folder).as_posix())
        for name in names:
            by_path.setdefault(name, r.image_id)
        for name in {PurePosixPath(n).name for n in names} | {r.path.name}:
            by_name.setdefault(name, []).append(r.image_id)
        forms = names | (set() if r.embedded else {r.path.as_posix()})
        paths.setdefault(r.image_id, set()).update(PurePosixPath(f).parts for f in forms)
    taken = set(matched)
    for i in others:
        text = PurePosixPath(str(i).replace("\\", "/"))
        same_name = {j for j in by_name.get(text.name, ()) if any(_agree(text.parts, f) for f in paths[j])}
        target = by_path.get(text.as_posix(), same_name.pop() if len(same_name) == 1 else None)
        if target is None and isinstance(i, int) and not isinstance(i, bool):  # --images' id of a numbered file
            target = by_number.get(i)
        if target is not None and target not in taken:
            matched[i] = target
            taken.add(target)
    return matched


def _agree(named: tuple[str, ...], path: tuple[str, ...]) -> bool:
    """Whether two paths' parts agree as far as both go from their file names up (``dogs/001.jpg`` and
    ``/d/cats/001.jpg`` do not; ``001.jpg``, ``cats/001.jpg`` and ``/d/cats/001.jpg`` all do)."""
    n = min(len(named), len(path))
    return named[len(named) - n :] == path[len(path) - n :]


def file_numbers(refs: LoadedReferences) -> dict[int, Hashable]:
    """``{number: image id}`` of the reference images whose file name is a number
    (:func:`~finecap.data.records.file_number`: ``1000092795.jpg``, ``COCO_val2014_000000000042.jpg``), the ids
    ``finecap caption --images`` gives them; a number two files share is left out."""
    out: dict[int, Hashable] = {}
    shared: set[int] = set()
    for r in refs.records:
        number = None if r.embedded else stem_number(r.path.stem)
        if number is None:
            continue
        if number in out and out[number] != r.image_id:
            shared.add(number)
        out.setdefault(number, r.image_id)
    return {n: i for n, i in out.items() if n not in shared}


def read_by_id_not_file(matched: dict[Hashable, Hashable], numbers: dict[int, Hashable]) -> list[tuple[int, Hashable]]:
    """The predicted integer ids that :func:`match_ids` read as another image's id while a reference file is named by
    that number (``numbers``: :func:`file_numbers`; Karpathy's Flickr30k numbers images from 0, its files are
    ``1000092795.jpg``): ``(id, the image its file number names)``. Ids read as ids are what ``finecap caption
    --data`` writes; ``--images`` writes file numbers, and a set of small numbered files may mean the other image."""
    return [(i, numbers[i]) for i, target in matched.items()
            if isinstance(i, int) and i == target and numbers.get(i, i) != i]  # fmt: skip


def _read_instances(cfg: Config, instances: str | Path | None) -> dict | None:
    """The ``{image id: annotated categories}`` of ``--instances`` (else ``eval.instances``), or None; errors name
    the option it came from."""
    if instances is None and not cfg.eval.instances:
        return None
    from finecap.metrics.hallucination import read_instances  # the CHAIR vocabulary: only when asked for

    if instances is not None:
        return read_instances(instances, "--instances")
    return read_instances(cfg.eval.instances, "eval.instances")


def _uncaptioned_note(refs: LoadedReferences, missing: list[Hashable]) -> str:
    """For COCO references: which of the ``missing`` ids the file lists under ``images`` without a caption (read
    as no image: nothing to score against), else nothing."""
    if refs.format != "coco":
        return ""
    from finecap.data.formats.coco import uncaptioned_images

    listed = {str(i) for i in uncaptioned_images(refs.path)}
    found = [i for i in missing if str(i) in listed]
    if not found:
        return ""
    return (f"; {len(found)} of them ({found[:MAX_LISTED]}) are in its 'images' list without a caption annotation "
            "(COCO images without captions are left out: nothing to score them against)")  # fmt: skip


def _carried_references(path: Path, pred_format: str, references: dict) -> LoadedReferences:
    """The references a predictions file carries, as reference records (no image files: image metrics say so)."""
    records = [Record(i, path.with_name(f"{path.name}#image-{i}"), "", refs) for i, refs in references.items()]
    return LoadedReferences(records, path, pred_format)


def _length_note(preds: dict, references: dict) -> None:
    """Say when the captions average over twice the words of their references (detailed captions under n-gram
    metrics, which reward matching the references' n-grams and length: BLEU's precisions, CIDEr-D's penalty)."""
    cand = sum(len(c.split()) for c in preds.values()) / len(preds)
    ref = sum(sum(len(r.split()) for r in references[i]) / len(references[i]) for i in preds) / len(preds)
    if cand > 2 * ref:
        log.info(f"note: the captions average {cand:.1f} words, over twice their references' {ref:.1f}: n-gram "
                 "metrics (BLEU, CIDEr-D, ROUGE-L, METEOR) score such detailed captions low whatever they say; "
                 "compare them with references of their own length, or with reference-free metrics "
                 "(clipscore)")  # fmt: skip


def default_metrics(*, coco: bool, world: bool, bags: bool, lm: bool, instances: bool = False) -> list[str]:
    """The metric groups ``finecap eval`` runs without ``--metrics`` / ``eval.metrics``, those that cannot run here
    left out (module docstring): pycocoevalcap's five with ``coco``; else also the text statistics, the world's
    faithfulness on a world, CHAIR with instance annotations, the image metrics (bags with a bags file) and
    perplexity when ``eval.lm`` is set."""
    if coco:
        return list(CAPTION_METRICS)
    names = [*CAPTION_METRICS, *TEXT_METRICS]
    names += ["faithfulness"] if world else []
    names += ["hallucination"] if instances else []
    names += ["clipscore", "retrieval"] + (["bags"] if bags else [])
    return names + (["perplexity"] if lm else [])


def references_world(cfg: Config, refs: LoadedReferences) -> Config:
    """``cfg`` with the world settings of the references when they are a finecap world (its recorded settings,
    :func:`finecap.world.make.recorded_settings`): the world encoder the image metrics use is that world's, whatever
    ``world.*`` the configuration holds (a default configuration names the 10,000-scene world)."""
    if refs.format != "world":
        return cfg
    from finecap.world.make import recorded_settings

    folder = Path(refs.path)
    world = recorded_settings(folder if folder.is_dir() else folder.parent)
    return cfg if world is None else dataclasses.replace(cfg, world=world)


def _reasons(
    cfg: Config,
    refs: LoadedReferences,
    pool: list,
    *,
    samples: dict | None,
    bags: dict | None,
    instances: dict | None = None,
) -> Callable[[str, bool], str | None]:
    """``why_not(group, asked)``: why a metric group cannot run on these inputs here, or ``None``. ``asked``: the
    group was asked for by name (its error then says all that is missing; the default set only needs a yes/no, and
    does not load a model to find out)."""

    def images(asked: bool) -> str | None:
        reason = missing_images(pool, refs.path, first=not asked, fmt=refs.format)
        if reason:
            return f"it needs the image files, but {reason}; pass the image folder with --images DIR"
        if cfg.retriever.checkpoint:
            return None  # loaded when the group runs (its errors name what is missing)
        if refs.format != "world" and not asked:  # the world's encoder on other images: only when asked for
            return "no retriever: set retriever.checkpoint (a CLIP model, e.g. openai/clip-vit-base-patch32)"
        if not (encoder_dir(cfg) / "encoder.json").exists():
            return (
                "no retriever: retriever.checkpoint is not set (a CLIP model, e.g. openai/clip-vit-base-patch32) and "
                "no world encoder of this world is trained with these retriever.* settings and "
                f"run.seed={cfg.run.seed} (give those it was trained with, e.g. the run's recipe, or train it: "
                "finecap retriever train)"
            )
        return None

    def why_not(name: str, asked: bool) -> str | None:
        reads = metric_group(name).reads  # what the group's record says it reads
        reason = unavailable_reason(name, cfg)
        if reason:
            return reason
        if "world" in reads and refs.scenes is None:
            return f"it needs scene graphs, which only a world has ({refs.path} is {refs.format})"
        if "samples" in reads and samples is None:
            return "it needs several captions per image in the predictions (samples)"
        if "lm" in reads and not cfg.eval.lm:
            return "it needs a language model: set eval.lm=<causal LM name or path>"
        if "bags" in reads and bags is None:
            return "it needs a bags file: pass --bags (from `finecap bags build`)"
        if "instances" in reads and instances is None:
            return "it needs COCO instance annotations: pass --instances instances_<split>.json (or eval.instances)"
        reason = images(asked) if "images" in reads else None
        n = cfg.eval.n_distractors
        if reason is None and name == "retrieval" and len(pool) < n + 1:  # RD-N: N distractors from the pool
            return f"RD{n} needs at least {n + 1} images, the pool has {len(pool)}: lower eval.n_distractors"
        return reason

    return why_not
