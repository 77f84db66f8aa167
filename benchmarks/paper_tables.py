"""The four papers' tables on the embedded world: runs :func:`paper_tables.main` (the package
``benchmarks/paper_tables/``, whose docstring says what it does and how).

    nice -n 10 python benchmarks/paper_tables.py --paper sle                  # every runnable table, seeds 0,1
    python benchmarks/paper_tables.py --paper ndlb --page-only                # rewrite the page from the results
    python benchmarks/paper_tables.py --paper smile --list                    # the tables, rows and runs

Run as a script, this file's folder is first on ``sys.path``, where the package ``paper_tables/`` is found before
this file of the same name (a package wins over a module in one folder).
"""

import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # already so for a script; explicit for runpy
    from paper_tables import main

    sys.exit(main())
