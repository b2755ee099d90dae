"""``python -m app``: the service (:mod:`app.serving.main`)."""

import sys

from app.serving.main import main

if __name__ == "__main__":
    sys.exit(main())
