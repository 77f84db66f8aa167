"""Bag curation: decisions saved on every call and resumed, keyed by bag content, never lost to a concurrent writer or
a kill -9, and refused when the bags file changed under them."""

import json
import signal
import subprocess
import sys
import threading

import pytest

from finecap.data.bags_file import read_bags
from finecap.data.curation import BagCuration, content_key, decisions_path
from finecap.data.records import DataError


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
    assert saved == {"version": 2, "source": str(bags_file), "decisions": [
        {"images": [7, 8], "decision": "reject"}, {"images": [4, 5, 6], "decision": "accept"}]}  # fmt: skip
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


@pytest.mark.parametrize("key", ["3/00", "3/\u0661", "3/\u00b2", "03/1", "3/1/", " 3/1"])
def test_a_key_names_a_bag_only_as_keys_spells_it(bags_file, tmp_path, key):
    # an index that str.isdigit took was int()-ed: '3/00' and '3/<Arabic-Indic one>' were other names of bags 3/0
    # and 3/1 (a page of their own, and a decision there a KeyError of the bare key), '3/<superscript two>' a
    # ValueError from int() (the review page's 500)
    review = BagCuration(bags_file, tmp_path / "c.json")
    for call in (review.bag, review.similarity, lambda k: review.decide(k, "accept")):
        with pytest.raises(KeyError, match=r"no bag .* \(keys look like '3/0'\)"):
            call(key)
    assert review.decisions == {} and review.bag("3/1") == [4, 5, 6]


def test_decisions_follow_bag_content_not_position(bags_file, tmp_path):
    out = tmp_path / "curated.json"
    BagCuration(bags_file, out).decide("3/0", "accept")  # images [1, 2, 3]
    # The bags file rebuilt with the bags of size 3 in the other order (and one image order changed): the decision
    # stays with images {1, 2, 3}, now at position 3/1, and is not inherited by the bag now at 3/0.
    data = json.loads(bags_file.read_text())
    data["bags"]["3"] = [{"images": [4, 5, 6]}, {"images": [3, 1, 2]}]
    bags_file.write_text(json.dumps(data))
    again = BagCuration(bags_file, out)
    assert again.decisions == {"3/1": "accept"} and read_bags(out)[3] == [[3, 1, 2]]
    assert content_key([3, 1, 2]) == content_key([1, 2, 3]) != content_key([1, 2, "3"])


def test_a_decisions_file_for_a_changed_bags_file_is_refused(bags_file, tmp_path):
    out = tmp_path / "curated.json"
    BagCuration(bags_file, out).decide("3/0", "reject")
    before = decisions_path(out).read_text()
    data = json.loads(bags_file.read_text())
    data["bags"]["3"][0]["images"] = [1, 2, 9]  # the decided bag is no longer in the file
    bags_file.write_text(json.dumps(data))
    with pytest.raises(DataError, match=r"curated.decisions.json: made for a different version of .*bags.json: 1 "
                                        r"decided bag\(s\) are not in it \(e.g. images \[1, 2, 3\]\)"):  # fmt: skip
        BagCuration(bags_file, out)
    assert decisions_path(out).read_text() == before  # nothing dropped or rewritten
    # The older, position-keyed layout cannot be checked against the bags: refused too.
    decisions_path(out).write_text(json.dumps({"source": str(bags_file), "decisions": {"3/0": "accept"}}))
    with pytest.raises(DataError, match="keyed by bag position"):
        BagCuration(bags_file, out)
    decisions_path(out).write_text('{"version": 2, "decisions": [{"images": [1, 2, 3], "decision": "maybe"}]}')
    with pytest.raises(DataError, match=r"decisions\[0\] must be"):
        BagCuration(bags_file, out)


def test_an_output_that_is_not_a_curation_is_never_replaced(bags_file, tmp_path):
    mine = tmp_path / "notes.json"
    mine.write_text('{"my": "data"}')
    with pytest.raises(DataError, match="notes.json: exists and is not a curated bags file"):
        BagCuration(bags_file, mine)
    assert mine.read_text() == '{"my": "data"}' and not decisions_path(mine).exists()


def test_an_output_replaced_by_the_users_file_while_reviewing_is_not_overwritten(bags_file, tmp_path):
    """The output was checked to be a curation only when the review opened: a file of the user's put there while the
    server ran was overwritten by the next click. Each save checks again, and writes nothing when it is not ours."""
    out = tmp_path / "curated.json"
    review = BagCuration(bags_file, out)
    review.decide("3/1", "accept")
    decided = decisions_path(out).read_text()
    out.write_text('{"my": "data"}')
    with pytest.raises(DataError, match="curated.json: exists and is not a curated bags file"):
        review.decide("2/0", "reject")
    assert out.read_text() == '{"my": "data"}' and decisions_path(out).read_text() == decided


def test_a_curated_file_whose_decisions_file_is_missing_is_not_emptied(bags_file, tmp_path):
    # the curated file is rebuilt from the decisions file at start: with that file gone (only the curated file copied
    # or kept), a curated file of one accepted and one rejected bag was silently rewritten with none accepted
    out = tmp_path / "curated.json"
    review = BagCuration(bags_file, out)
    review.decide("3/0", "accept")
    review.decide("2/0", "reject")
    decisions_path(out).unlink()
    before = out.read_text()
    for rebuild in (True, False):
        with pytest.raises(DataError, match=r"curated.json: records 2 decision\(s\) but its decisions file .*"
                                            r"curated.decisions.json is missing"):  # fmt: skip
            BagCuration(bags_file, out, rebuild=rebuild)
    assert out.read_text() == before and not decisions_path(out).exists()
    with pytest.raises(DataError, match="is missing"):  # and a click of a server that started before it went
        review.decide("3/1", "accept")
    assert out.read_text() == before
    # a curated file of no decision yet (a review opened, nothing clicked) starts afresh as before
    BagCuration(bags_file, tmp_path / "fresh.json")
    decisions_path(tmp_path / "fresh.json").unlink()
    assert BagCuration(bags_file, tmp_path / "fresh.json").decisions == {}


def test_a_link_at_the_output_is_refused_before_anything_is_written(bags_file, tmp_path):
    # a link at the curated file was refused only when it was written, after its decisions file: a refused start
    # (nothing read, nothing decided) left link.decisions.json behind
    from finecap.outputs import OutputRefused

    BagCuration(bags_file, tmp_path / "real.json")
    decisions_path(tmp_path / "real.json").unlink()
    (tmp_path / "link.json").symlink_to(tmp_path / "real.json")
    for rebuild in (True, False):
        with pytest.raises(OutputRefused, match="link.json: is a symbolic link"):
            BagCuration(bags_file, tmp_path / "link.json", rebuild=rebuild)
    assert not decisions_path(tmp_path / "link.json").exists()
    (tmp_path / "theirs.json").write_text("{}")
    decisions_path(tmp_path / "new.json").symlink_to(tmp_path / "theirs.json")
    with pytest.raises(OutputRefused, match="new.decisions.json: is a symbolic link"):
        BagCuration(bags_file, tmp_path / "new.json")
    assert not (tmp_path / "new.json").exists() and (tmp_path / "theirs.json").read_text() == "{}"


def test_a_link_at_the_lock_file_is_refused_by_name_never_followed(bags_file, tmp_path):
    # filelock opens the lock without following a link: a link planted at .<out>.lock was a bare OSError ("Too many
    # levels of symbolic links"), which the review page answered with a 500
    from finecap.data.curation import lock_path
    from finecap.outputs import OutputRefused

    theirs = tmp_path / "theirs.txt"
    theirs.write_text("mine")
    review = BagCuration(bags_file, tmp_path / "out.json", rebuild=False)  # started before the link was planted
    lock_path(tmp_path / "out.json").symlink_to(theirs)
    with pytest.raises(OutputRefused, match=r"\.out\.json\.lock: is a symbolic link .*never writes through a link"):
        review.decide(review.keys()[0], "accept")
    with pytest.raises(OutputRefused, match=r"\.out\.json\.lock: is a symbolic link"):  # at the start too
        BagCuration(bags_file, tmp_path / "out.json")
    assert theirs.read_text() == "mine" and not (tmp_path / "out.json").exists()
    assert not decisions_path(tmp_path / "out.json").exists()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"bags": {"3": [{"images": [[1], [2]]}]}}', r"bags\['3'\]\[0\]: image id \[1\] must be an int or a string"),
        ('{"bags": {"2": [[true, 1]]}}', "image id True must be an int or a string, got bool"),
        ("[" * 100_000 + "]" * 100_000, "invalid JSON|nested too deeply"),
        ('{"bags": {"x": []}}', "'x' is not a bag size"),
    ],
)
def test_malformed_bags_files_are_named_errors(tmp_path, text, message):
    path = tmp_path / "bags.json"
    path.write_text(text)
    with pytest.raises(DataError, match=message):
        BagCuration(path, tmp_path / "out.json")


def test_a_folder_for_the_bags_file_is_a_named_error(tmp_path):
    with pytest.raises(DataError, match="a folder, not a bags file"):
        BagCuration(tmp_path, tmp_path / "out.json")


def _many_bags(path, n: int) -> list[str]:
    path.write_text(json.dumps({"bags": {"2": [{"images": [2 * i, 2 * i + 1]} for i in range(n)]}}))
    return [f"2/{i}" for i in range(n)]


def test_two_writers_of_one_output_read_after_the_lock(tmp_path):
    """Two curations of the same output (two servers, or a server and a script): each decision is applied to what is
    on disk when the lock is taken, so neither overwrites the other's."""
    bags = tmp_path / "bags.json"
    keys = _many_bags(bags, 200)
    out = tmp_path / "curated.json"
    first, second = BagCuration(bags, out), BagCuration(bags, out)
    first.decide(keys[0], "accept")
    second.decide(keys[1], "reject")  # second never saw first's decision in memory
    assert BagCuration(bags, out).decisions == {keys[0]: "accept", keys[1]: "reject"}
    # 100 pairs of simultaneous decisions, one of each pair through each object, from threads started together.
    for k in range(1, 100):
        barrier = threading.Barrier(2)

        def decide(curation, key, value, barrier=barrier):
            barrier.wait()
            curation.decide(key, value)

        pair = [threading.Thread(target=decide, args=(first, keys[2 * k], "accept")),
                threading.Thread(target=decide, args=(second, keys[2 * k + 1], "reject"))]  # fmt: skip
        for t in pair:
            t.start()
        for t in pair:
            t.join()
    final = BagCuration(bags, out).decisions
    assert final == {key: ("accept" if i % 2 == 0 else "reject") for i, key in enumerate(keys)}
    assert len(read_bags(out)[2]) == 100


CHILD = """
import sys
from finecap.data.curation import BagCuration
review = BagCuration(sys.argv[1], sys.argv[2])
for key in review.keys():
    review.decide(key, "accept")
    print(key, flush=True)  # acknowledged: decide() returned
"""


def test_a_kill_9_loses_no_acknowledged_decision(tmp_path):
    bags = tmp_path / "bags.json"
    keys = _many_bags(bags, 2000)
    out = tmp_path / "curated.json"
    BagCuration(bags, out)  # the files exist before the child starts
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(bags), str(out)], stdout=subprocess.PIPE, text=True)
    acknowledged = []
    for line in child.stdout:
        acknowledged.append(line.strip())
        if len(acknowledged) == 150:
            child.send_signal(signal.SIGKILL)  # in the middle of later decisions
            break
    child.wait()
    acknowledged += [line.strip() for line in child.stdout]  # printed before the kill landed
    assert child.returncode == -signal.SIGKILL and len(acknowledged) < len(keys)
    after = BagCuration(bags, out)  # both files parse (atomic writes) and the curated file is rebuilt
    assert set(acknowledged) <= set(after.decisions)
    assert set(after.decisions) == set(keys[: len(after.decisions)])
    assert len(after.decisions) - len(acknowledged) <= 1  # at most the one written but not yet acknowledged
    assert read_bags(out)[2] == [[2 * i, 2 * i + 1] for i in range(len(after.decisions))]
