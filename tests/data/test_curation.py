"""Bag curation: decisions saved on every call, resumed on reopening, curated file readable as bags."""

import json

import pytest

from finecap.data.curation import BagCuration, decisions_path
from finecap.data.formats import read_bags


@pytest.fixture
def bags_file(tmp_path):
    path = tmp_path / "bags.json"
    data = {"split": "test", "bags": {"3": [{"images": [1, 2, 3], "similarity": 0.9}, {"images": [4, 5, 6],
            "similarity": 0.8}], "2": [[7, 8]]}, "family_purity": {"3": 1.0}}  # fmt: skip
    path.write_text(json.dumps(data))
    return path


def test_decisions_are_saved_at_once_and_resumed(bags_file, tmp_path):
    out = tmp_path / "curated.json"
    review = BagCuration(bags_file, out)
    assert review.keys() == ["2/0", "3/0", "3/1"]  # sizes in increasing order
    assert read_bags(out) == {3: [], 2: []}  # nothing accepted yet, but already a valid bags file
    review.decide("3/1", "accept")
    review.decide("2/0", "reject")
    # Saved without any further call (a crash now loses nothing).
    curated = json.loads(out.read_text())
    assert curated["bags"] == {"3": [{"images": [4, 5, 6], "similarity": 0.8}], "2": []}
    assert curated["curation"] == {"source": str(bags_file), "accepted": 1, "rejected": 1, "pending": 1}
    assert curated["split"] == "test" and "family_purity" not in curated  # purity described the candidates
    assert read_bags(out) == {3: [[4, 5, 6]], 2: []}
    saved = json.loads(decisions_path(out).read_text())
    assert saved["decisions"] == {"3/1": "accept", "2/0": "reject"}
    # Reopening resumes: decisions loaded, next undecided bag is 3/0.
    again = BagCuration(bags_file, out)
    assert again.decisions == {"3/1": "accept", "2/0": "reject"}
    assert again.next_pending() == "3/0"
    again.decide("3/0", "accept")
    assert again.next_pending() is None
    assert read_bags(out) == {3: [[1, 2, 3], [4, 5, 6]], 2: []}  # original order kept
    again.decide("3/1", None)  # withdraw
    assert read_bags(out) == {3: [[1, 2, 3]], 2: []} and again.counts()["pending"] == 1


def test_bad_keys_decisions_and_output(bags_file, tmp_path):
    review = BagCuration(bags_file, tmp_path / "c.json")
    with pytest.raises(KeyError, match="no bag '9/0'"):
        review.decide("9/0", "accept")
    with pytest.raises(KeyError, match="no bag '3/2'"):
        review.decide("3/2", "accept")
    with pytest.raises(ValueError, match="decision must be one of accept, reject"):
        review.decide("3/0", "maybe")
    with pytest.raises(ValueError, match="must differ"):
        BagCuration(bags_file, bags_file)
