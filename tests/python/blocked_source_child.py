"""A process whose cache's source blocks and ignores its stop event, for
the exit and hand-over tests of test_stop_blocked_source.py.

    python blocked_source_child.py HOW BLOCKED [ENDPOINT]

BLOCKED is where the source blocks: ``list`` (a ``list()`` that is given
no stop event) or ``changes`` (an iterator that ignores ``stop``). HOW is
how the process ends: ``exit`` (the script just ends, the exit hook stops
everything) or ``run`` (``Controller.run()``, ended by a SIGTERM from the
test). With ENDPOINT the controller campaigns on etcd (election
``blocked``, ttl 30 s, identity ``child``). Prints ``ready`` once the
source is blocked (and, with an election, the child leads), ``ran`` when
``run()`` returned.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Iterator, Tuple

import reconq
from waiting import wait_for

how, blocked = sys.argv[1], sys.argv[2]
endpoint = sys.argv[3] if len(sys.argv) > 3 else None

entered = threading.Event()
never = threading.Event()


def list_items() -> Tuple[Any, int]:
    if blocked == "list":
        entered.set()
        never.wait()
    return {"a": 1}, 1


def changes(position: Any, stop: threading.Event) -> Iterator[reconq.Put]:
    entered.set()
    never.wait()  # ignores `stop`
    yield reconq.Put("a", 2, position=2)


election = reconq.LeaderElection(endpoint, "blocked", ttl=30, identity="child") if endpoint else None
cache = reconq.Cache(reconq.Source(list_items, changes), name="blocked")
controller = reconq.Controller(lambda key: None, name="blocked", leader_election=election)
controller.watch_cache(cache)


def ready() -> None:
    wait_for(entered.is_set, what="the source to block")
    if election is not None:
        wait_for(lambda: election.is_leader, what="leadership")
    print("ready", flush=True)


if how == "exit":
    controller.start()
    ready()
else:
    threading.Thread(target=ready, daemon=True).start()
    controller.run()
    print("ran", flush=True)
