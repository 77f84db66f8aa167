"""The test session's temporary folder (the root conftest's ``session_tmpdir``): what tests, docstring examples and
the processes they start leave in their temporary folders stays under pytest's own, which pytest prunes."""

import os
import subprocess
import sys
import tempfile
from pathlib import Path


def test_temporary_folders_are_under_pytests_own(tmp_path_factory):
    base = tmp_path_factory.getbasetemp()
    assert Path(tempfile.gettempdir()).is_relative_to(base) and os.environ["TMPDIR"] == tempfile.gettempdir()
    child = subprocess.run([sys.executable, "-c", "import tempfile; print(tempfile.mkdtemp())"], capture_output=True,
                           text=True, check=True)  # fmt: skip
    assert Path(child.stdout.strip()).is_relative_to(base)  # a process a test starts: TMPDIR
