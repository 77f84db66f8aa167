"""The bags file of ``finecap bags build`` read back (finecap.data.bags_file.read_bags)."""

from __future__ import annotations

import json

import pytest

from finecap.data.bags_file import read_bags
from finecap.data.records import DataError


def test_a_bag_listed_under_another_size_is_refused_naming_the_file_and_the_bag(tmp_path):
    # The metric reports a bag under its own length: a bag of 3 listed under "5" was scored as bag3 and, read after
    # the real bags of 3, its bag3/R@1 replaced theirs (bag5 missing, bag3/n counting 3 captions instead of 6).
    path = tmp_path / "bags.json"
    path.write_text(json.dumps({"bags": {"3": [["a", "b", "c"]], "5": [["d", "e", "f"]]}}))
    with pytest.raises(DataError, match=r"bags\.json: bags\['5'\]\[0\] holds 3 images but is listed under bag size 5"):
        read_bags(path)
    path.write_text(json.dumps({"bags": {"3": [{"images": ["a", "b", "c"]}], "5": [{"images": list("defgh")}]}}))
    assert read_bags(path) == {3: [["a", "b", "c"]], 5: [list("defgh")]}
