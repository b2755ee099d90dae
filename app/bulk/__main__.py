"""``python -m app.bulk``: the bulk job (:mod:`app.bulk.cli`)."""

import sys

from app.bulk.cli import main

if __name__ == "__main__":
    sys.exit(main())
