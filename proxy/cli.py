"""``hangup-proxy``: not implemented yet (see the proxy issue)."""

import sys


def main() -> None:
    sys.exit("hangup-proxy: not implemented yet")
