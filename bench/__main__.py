"""``python -m bench``: every benchmark, demo and diagnosis, room by room, with its command, its
rough run time and where its figures go (``bench/catalog.py``). ``--markdown``: the same as the
table at the top of ``docs/benchmarks.md``."""

from __future__ import annotations

import argparse

from bench.catalog import listing, markdown


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("--markdown", action="store_true", help="the table docs/benchmarks.md has")
    args = parser.parse_args()
    print(markdown() if args.markdown else listing())


if __name__ == "__main__":
    main()
