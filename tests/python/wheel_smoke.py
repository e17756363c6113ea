"""A smoke program for an installed wheel: a controller fed by a cache,
both on a store, with a dependency between keys. `.ci/run` runs it with
every CPython >= 3.9 it finds, each in a fresh virtualenv holding only the
wheel, so it imports nothing but the standard library and reconq.

    python tests/python/wheel_smoke.py

Prints one line naming the interpreter and the extension it loaded; exits
non-zero (an AssertionError) when anything is off.
"""

from __future__ import annotations

import os
import pathlib
import sys
import tempfile
import threading
from typing import List

import reconq

#: Generous: the machine may be loaded by a parallel build.
TIMEOUT = 60.0


def main() -> None:
    native = pathlib.Path(reconq._native.__file__)
    # The installed wheel's extension, not a checkout's in-place build.
    assert "site-packages" in native.parts, native
    desired = {"web": 3, "db": 1}
    ran: List[str] = []
    lock = threading.Lock()

    with tempfile.TemporaryDirectory() as tmp:
        state = os.path.join(tmp, "state.db")
        cache = reconq.Cache(reconq.PollingSource(lambda: dict(desired), 0.05), name="replicas", store=state)

        def reconcile(key: str) -> None:
            if key in desired:
                assert cache.get(key) == desired[key], (key, cache.get(key))
            with lock:
                ran.append(key)

        c = reconq.Controller(reconcile, workers=2, name="smoke", store=state)
        c.watch_cache(cache)
        c.set_dependencies("report", ["web"])  # "report" follows each run of "web"
        c.start()
        try:
            assert c.wait_synced(TIMEOUT)
            assert c.wait_idle(TIMEOUT)
            cache.flush()
        finally:
            c.stop()
            cache.stop(TIMEOUT)
        assert sorted(ran) == ["db", "report", "web"], ran
        assert ran.index("report") > ran.index("web"), ran
        assert os.path.getsize(state) > 0

    version = ".".join(map(str, sys.version_info[:3]))
    print(f"wheel smoke ok: CPython {version}, reconq {reconq.__version__}, {native}")


if __name__ == "__main__":
    main()
