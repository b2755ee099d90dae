"""``zhembed``: one command for the project's stages, each also its own ``python -m``.

    zhembed serve [flags]    the service              (python -m app)
    zhembed bulk [flags]     embed a corpus           (python -m app.bulk; the bulk extra)
    zhembed export [flags]   checkpoint -> ONNX       (python -m export; the export extra)

Each stage is imported only when asked for: ``zhembed serve`` never imports pyarrow or torch, and only
``zhembed export`` imports the export stage (and so torch).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

USAGE = __doc__.split("\n\n")[1] if __doc__ else ""


def _serve() -> Callable[[list[str]], int]:
    from app.serving.main import main

    return main


def _bulk() -> Callable[[list[str]], int]:
    from app.bulk.cli import main

    return main


def _export() -> Callable[[list[str]], int]:
    from export.__main__ import main  # here, never at the top: the service does not import torch

    return main


COMMANDS: dict[str, Callable[[], Callable[[list[str]], int]]] = {
    "serve": _serve,
    "bulk": _bulk,
    "export": _export,
}
# The extra each stage needs beyond the service's own dependencies.
EXTRAS = {"bulk": "bulk", "export": "export"}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(
            f"usage: zhembed {{serve,bulk,export}} [flags]; zhembed COMMAND --help for its flags\n\n{USAGE}"
        )
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"zhembed: no command {name!r}: use one of {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    try:
        command = COMMANDS[name]()
    except ImportError as exc:
        extra = EXTRAS.get(name, name)
        print(
            f"zhembed {name} needs the {extra} extra (pip install 'zhembed[{extra}]'): {exc}", file=sys.stderr
        )
        return 2
    return command(rest)


if __name__ == "__main__":
    sys.exit(main())
