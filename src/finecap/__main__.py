"""``python -m finecap ...`` runs the ``finecap`` command."""

import sys

from finecap.app.cli import main

sys.exit(main())
