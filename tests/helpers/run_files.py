"""Run test files each in a pytest process of its own, ``--jobs`` at a time (``make vllm-test``: a vLLM engine edits
``os.environ``, reseeds torch and opens a gloo group, so no two of its test files may share a process).

Usage: ``python tests/helpers/run_files.py --jobs 2 tests/engines/test_vllm_*.py``. Each file's output is printed
whole once it ends, in the order the files were given; the exit status is 1 when any file failed (each failed file
named last), else 0. The slow tests run too (``-m "slow or not slow"``), and no process writes pytest's cache (two
at once would write the same file).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor


def run_file(path: str) -> subprocess.CompletedProcess[str]:
    """pytest on the one file ``path`` in a process of its own, its output (stdout and stderr) captured."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "slow or not slow", path]
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2, help="files run at once (default 2)")
    parser.add_argument("files", nargs="+")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {args.jobs}")
    failed = []
    with ThreadPoolExecutor(args.jobs) as pool:
        for path, proc in zip(args.files, pool.map(run_file, args.files), strict=True):
            print(f"{path}:\n{proc.stdout}", end="" if proc.stdout.endswith("\n") else "\n", flush=True)
            if proc.returncode != 0:
                failed.append(f"{path} (exit {proc.returncode})")
    if failed:
        print("failed: " + ", ".join(failed), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
