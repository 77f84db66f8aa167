"""lmms-eval's COCO caption aggregation (``lmms_eval/tasks/coco_cap/utils.py``: ``coco_aggregation_result``), the
code a user's evaluation harness runs on pycocoevalcap, kept here as text so that it runs unmodified: timed by
``eval_end_to_end.py`` (part 4) and run with and without ``finecap.compat.install()`` by
``tests/compat/test_pycocoevalcap.py``. Per metric it builds every scorer (``Meteor()`` starts a JVM), a COCO index by
hand, ``COCOEvalCap`` for its params, runs ``PTBTokenizer`` (a JVM) on gts and res, then one scorer."""

COCO_METRICS = ["Bleu_4", "Bleu_3", "Bleu_2", "Bleu_1", "METEOR", "ROUGE_L", "CIDEr"]
"""The metrics lmms-eval's coco_cap task aggregates, one call of ``coco_aggregation_result`` each."""

SOURCE = r"""
from pycocoevalcap.eval import COCOEvalCap, Bleu, Meteor, Rouge, Cider, Spice
from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer
from pycocotools.coco import COCO


def coco_aggregation_result(results, metric):
    scorers = [(Bleu(4), "Bleu_1"), (Bleu(4), "Bleu_2"), (Bleu(4), "Bleu_3"), (Bleu(4), "Bleu_4"),
               (Meteor(), "METEOR"), (Rouge(), "ROUGE_L"), (Cider(), "CIDEr")]
    scorers_dict = {s[1]: s for s in scorers}
    stored_results = []
    dataset = {"annotations": [], "images": []}
    idx = 0
    for result in results:
        stored_results.append({"image_id": int(result["image_id"]), "caption": result["pred"]})
        for a in result["answer"]:
            dataset["annotations"].append({"image_id": int(result["image_id"]), "caption": a, "id": idx})
            idx += 1
        dataset["images"].append({"id": result["image_id"]})
    coco = COCO()
    coco.dataset = dataset
    coco.createIndex()
    coco_result = coco.loadRes(stored_results)
    coco_eval = COCOEvalCap(coco, coco_result)
    imgIds = coco_eval.params["image_id"]
    gts = {}
    res = {}
    for imgId in imgIds:
        gts[imgId] = coco_eval.coco.imgToAnns[imgId]
        res[imgId] = coco_eval.cocoRes.imgToAnns[imgId]
    tokenizer = PTBTokenizer()
    gts = tokenizer.tokenize(gts)
    res = tokenizer.tokenize(res)
    score, scores = scorers_dict[metric][0].compute_score(gts, res)
    if type(score) == list:
        n = int(metric.split("_")[-1])
        score = score[n - 1]
    return score
"""
"""The module text of lmms-eval's aggregation: its imports and ``coco_aggregation_result(results, metric)`` over
``results = [{"image_id", "pred", "answer": [references]}]``."""
