"""A COCO instances file (``instances_val2014.json``'s layout) written by hand, for the CHAIR tests
(tests/metrics/test_hallucination.py, tests/rewards/test_chair_reward.py)."""

from __future__ import annotations

import json

# COCO's category ids
CATEGORIES = [{"id": 1, "name": "person"}, {"id": 2, "name": "bicycle"}, {"id": 6, "name": "bus"},
              {"id": 17, "name": "cat"}, {"id": 18, "name": "dog"}, {"id": 58, "name": "hot dog"},
              {"id": 67, "name": "dining table"}, {"id": 88, "name": "teddy bear"}]  # fmt: skip
ANNOTATED = {1: [1, 1, 18, 2], 2: [17, 88, 67], 3: [58, 67], 4: []}  # image 1: two people, a dog, a bicycle


def instances_file(tmp_path, annotated=ANNOTATED, categories=CATEGORIES, name="instances_val2014.json"):
    """An instances file at ``tmp_path / name``: each image id of ``annotated`` with one box per category id listed."""
    annotations = [{"id": 100 * i + k, "image_id": i, "category_id": c, "bbox": [0, 0, 1, 1]}
                   for i, cats in annotated.items() for k, c in enumerate(cats)]  # fmt: skip
    data = {"images": [{"id": i, "file_name": f"{i}.jpg"} for i in annotated], "annotations": annotations,
            "categories": categories}  # fmt: skip
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path
