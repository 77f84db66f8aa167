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


def test_an_image_in_two_bags_of_one_size_is_refused_naming_both_bags(tmp_path):
    # A hand-edited file: image "c" in bags 0 and 1 of size 3. The metric ranks a caption in one bag, so "c"'s caption
    # was ranked in bags["3"][0] only and bags["3"][1] was scored on 2 of its 3 captions (bag3/n 5, not 6). Bags of
    # one size are disjoint (NDLB Algorithm 2); an image may be in bags of different sizes.
    path = tmp_path / "bags.json"
    path.write_text(json.dumps({"bags": {"3": [["a", "b", "c"], {"images": ["d", "c", "e"]}]}}))
    with pytest.raises(DataError, match=r"bags\['3'\]\[1\] holds image 'c', already in bags\['3'\]\[0\]"):
        read_bags(path)
    # the review page reads any bags (disjoint=False); the metrics never take these
    assert read_bags(path, disjoint=False) == {3: [["a", "b", "c"], ["d", "c", "e"]]}
    path.write_text(json.dumps({"bags": {"3": [["a", "b", "c"], ["d", "e", "f"]], "2": [["c", "d"]]}}))
    assert read_bags(path) == {3: [["a", "b", "c"], ["d", "e", "f"]], 2: [["c", "d"]]}


def test_two_keys_naming_one_size_are_refused(tmp_path):
    # "3" and "03" both parse to size 3: the bags of "3" were silently replaced by those of "03" ({3: [[d, e, f]]}).
    path = tmp_path / "bags.json"
    path.write_text(json.dumps({"bags": {"3": [["a", "b", "c"]], "03": [["d", "e", "f"]]}}))
    with pytest.raises(DataError, match=r"bags keys '3' and '03' both name bag size 3"):
        read_bags(path)
