"""Command line: ``python -m kvoffload info | demo | simulate | bench``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _cmd_info(args: argparse.Namespace) -> int:
    from kvoffload.info import collect_info, format_info

    print(format_info(collect_info()))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvoffload", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_info = sub.add_parser("info", help="versions, device, usable kernel backends")
    p_info.set_defaults(func=_cmd_info)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
