"""What finecap reads once per file version in a process (a file's hash, whether an image decodes) is read again when
the file is replaced by another of the same size and modification time: a notebook's second run fingerprinted the
data it had hashed in its first, said a repaired image was still damaged, and read a JSON file as format detection
had parsed it (:func:`finecap.data.hashing.file_version`: the inode and the change time tell such a replacement, as
they told it for the data set's records)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from finecap.data.hashing import sha256_file
from finecap.data.images import image_problem
from finecap.data.json_files import forget_json, load_json, peek_json
from finecap.data.records import Record
from helpers.image_files import corrupt_png, png


def replaced_keeping_size_and_time(path: Path, new: Path) -> None:
    """``new`` put in place of ``path`` (renamed over it, as an editor or ``rsync`` writes), its modification time
    set to ``path``'s (``cp -p``, ``rsync -t``, or one tick of a coarse clock): only the content differs."""
    st = path.stat()
    assert new.stat().st_size == st.st_size
    os.utime(new, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(new, path)
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (st.st_size, st.st_mtime_ns)


def test_a_file_replaced_with_the_same_size_and_time_is_hashed_again(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text('{"image": "a.png", "captions": ["a red circle"]}\n')
    assert sha256_file(data) == hashlib.sha256(data.read_bytes()).hexdigest()
    (tmp_path / "new").write_text('{"image": "a.png", "captions": ["a tan circle"]}\n')
    replaced_keeping_size_and_time(data, tmp_path / "new")
    assert sha256_file(data) == hashlib.sha256(b'{"image": "a.png", "captions": ["a tan circle"]}\n').hexdigest()


def test_a_damaged_image_replaced_by_a_good_one_of_the_same_size_and_time_decodes(tmp_path):
    image = corrupt_png(tmp_path / "a.png")
    record = Record("a", image, "train")
    assert "damaged" in image_problem(record)
    replaced_keeping_size_and_time(image, png(tmp_path / "good.png", size=(64, 64)))  # corrupt_png's, unzeroed
    assert image_problem(record) is None


def test_a_json_file_peeked_then_replaced_with_the_same_size_and_time_is_parsed_again(tmp_path):
    # format detection's parse is kept for the reader (peek_json -> load_json) and for the next peek: it was kept by
    # path and modification time alone, so the reader and a notebook's next run got the replaced file's contents
    refs = tmp_path / "refs.json"
    refs.write_text('{"annotations": [{"image_id": 1, "caption": "a red circle"}]}')
    assert peek_json(refs)["annotations"][0]["caption"] == "a red circle"
    (tmp_path / "new").write_text('{"annotations": [{"image_id": 1, "caption": "a tan circle"}]}')
    replaced_keeping_size_and_time(refs, tmp_path / "new")
    assert peek_json(refs)["annotations"][0]["caption"] == "a tan circle"
    (tmp_path / "newer").write_text('{"annotations": [{"image_id": 1, "caption": "a big circle"}]}')
    replaced_keeping_size_and_time(refs, tmp_path / "newer")
    assert load_json(refs)["annotations"][0]["caption"] == "a big circle"
    forget_json()
