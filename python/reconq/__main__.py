"""Looking at a running reconq process from outside.

    reconq status URL [--json]
    reconq --version

``python -m reconq`` is the same command (``reconq`` is the console script
pip installs with the package).

``URL`` is the process's metrics server (``reconq.start_http_server()``,
Rust ``reconq::metrics::serve``), e.g. ``http://127.0.0.1:9100`` or
``127.0.0.1:9100``; the command prints its ``/status`` table (``--json``:
the entries as JSON, as ``reconq.status()`` gives them in the process).
It exits 1 with a message on stderr when the server cannot be reached or
answers with an error, and 2 with one when ``URL`` is not an http(s) URL
of a host (and a port, if any, a number). ``python -m reconq.demo`` runs
the demo controller, ``python -m reconq.status_demo`` prints the status
table of a demo in its own process.
"""

from __future__ import annotations

import argparse
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import List, Optional

from reconq import __version__

#: Seconds to wait for the server to answer.
TIMEOUT = 10.0


def status_url(url: str) -> str:
    """`url` with a scheme (http) and the path ``/status`` unless it names
    one; raises ``ValueError`` naming `url` when it is not an http(s) URL
    of a host."""
    given = url
    if "://" not in url:
        url = "http://" + url
    try:
        parts = urllib.parse.urlsplit(url)
        _ = parts.port  # raises ValueError for a port that is not a number
    except ValueError as e:
        raise ValueError(f"URL {given!r} is not a URL: {e}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in url):
        raise ValueError(f"URL {given!r} is not a URL like http://127.0.0.1:9100")
    if parts.path in ("", "/"):
        parts = parts._replace(path="/status")
    return urllib.parse.urlunsplit(parts)


def fetch(url: str, as_json: bool) -> str:
    """The body of ``GET url``; raises ``OSError`` (``URLError`` is one)
    when the server cannot be reached or answers with an error."""
    headers = {"Accept": "application/json"} if as_json else {}
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
        return str(response.read().decode("utf-8"))


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="reconq",
        description="Look at a running reconq process through its metrics server.",
    )
    parser.add_argument("--version", action="version", version=f"reconq {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="{status}")
    status = commands.add_parser("status", help="print a running process's status table")
    status.add_argument("url", metavar="URL", help="its metrics server, e.g. http://127.0.0.1:9100")
    status.add_argument("--json", action="store_true", help="print the entries as JSON")
    args = parser.parse_args(argv)

    try:
        url = status_url(args.url)
    except ValueError as e:
        print(f"reconq status: {e}", file=sys.stderr)
        return 2
    try:
        body = fetch(url, args.json)
    except urllib.error.HTTPError as e:
        print(f"reconq status: {url} answered {e.code} {e.reason}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        print(f"reconq status: cannot reach {url}: {reason}", file=sys.stderr)
        return 1
    print(body, end="" if body.endswith("\n") else "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
