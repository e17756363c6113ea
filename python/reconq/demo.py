"""A small reconcile loop you can run and read in a minute.

    python -m reconq.demo [--seconds 4] [--workers 2] [--seed 1] [--dir PATH] [--no-store]

It keeps a directory of *actual* state in sync with a directory of *desired*
state, the way a Kubernetes controller keeps a cluster in sync with its
objects:

* ``desired/<name>.json`` is what a user wants (``{"image": ..., "replicas": n}``).
* ``actual/<name>.json`` is what a simulated, flaky "API" has applied.
* ``reconcile(name)`` compares the two and calls the API to create, update or
  delete one object. It is idempotent and level-triggered: it looks at the
  current state, never at what changed.
* The API fails transiently now and then (seeded, so every run is the same):
  the exception makes the engine retry the key with exponential backoff.
  A spec that can never work raises ``reconq.PermanentError``: no retry.
* Two named periodic jobs on a ``reconq.Manager``: a *watch* that polls
  ``desired/`` for changed files and enqueues their names, and a *resync*
  that enqueues every name once a second (as informers do), which also
  cleans up anything a missed event left behind.
* While it runs, a scripted "user" edits one file, deletes one, adds a new
  one and adds one with an invalid spec.

The controller keeps its pending retries and parked keys in
``<dir>/state.db`` (``store=``): run it twice with the same ``--dir`` and the
second run starts where the first stopped (``--no-store`` to keep nothing).

Every reconcile prints one line (time, key, attempt, outcome); at the end it
prints the stats and checks that ``actual/`` converged to ``desired/``.
The exit code is 0 when it did.

The reconcile loop runs on ``reconq.Controller`` when the module has it,
otherwise on a ``reconq.WorkQueue`` with a few lines of worker threads that do
what the Controller does (see ``QueueRunner``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import reconq

# ---------------------------------------------------------------------------
# The world: desired state (files a user edits), actual state (what the API
# applied) and a flaky API in between.
# ---------------------------------------------------------------------------


class TransientError(Exception):
    """The API was busy; trying again later will work."""


def write_json(path: Path, data: Dict[str, Any]) -> None:
    """Writes atomically, so a reader never sees half a file."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, sort_keys=True) + "\n")
    os.replace(tmp, path)


def read_json(path: Path) -> Optional[Dict[str, Any]]:
    try:
        data: Dict[str, Any] = json.loads(path.read_text())
        return data
    except FileNotFoundError:
        return None


class FlakyAPI:
    """Applies specs to ``actual/``; fails like a real API sometimes does.

    Whether call n for an object fails depends only on (seed, name, n), so a
    run is reproducible whatever the thread timing. At most 3 calls in a row
    fail for one object, so every valid spec eventually lands.
    """

    FAILURE_RATE = 0.35

    def __init__(self, actual: Path, seed: int) -> None:
        self.actual = actual
        self.seed = seed
        self.lock = threading.Lock()
        self.calls: Dict[str, int] = {}
        self.failing_streak: Dict[str, int] = {}

    def _maybe_fail(self, name: str) -> None:
        with self.lock:
            n = self.calls[name] = self.calls.get(name, 0) + 1
            rng = random.Random(f"{self.seed}/{name}/{n}")
            streak = self.failing_streak.get(name, 0)
            fail = streak < 3 and rng.random() < self.FAILURE_RATE
            self.failing_streak[name] = streak + 1 if fail else 0
            latency = rng.uniform(0.005, 0.04)
        time.sleep(latency)  # the network round trip
        if fail:
            raise TransientError(rng.choice(["503 service unavailable", "429 too many requests", "timeout"]))

    def get(self, name: str) -> Optional[Dict[str, Any]]:
        return read_json(self.actual / f"{name}.json")

    def apply(self, name: str, spec: Dict[str, Any]) -> None:
        self._maybe_fail(name)
        write_json(self.actual / f"{name}.json", {"spec": spec})

    def delete(self, name: str) -> None:
        self._maybe_fail(name)
        (self.actual / f"{name}.json").unlink(missing_ok=True)


def validate(spec: Any) -> Optional[str]:
    """Why a spec can never be applied, or None if it is fine."""
    if not isinstance(spec, dict):
        return "spec must be a JSON object"
    if not isinstance(spec.get("image"), str) or not spec["image"]:
        return "image must be a non-empty string"
    replicas = spec.get("replicas")
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
        return "replicas must be an integer >= 0"
    return None


# ---------------------------------------------------------------------------
# The reconcile function: the only part a controller author really writes.
# ---------------------------------------------------------------------------


class Reconciler:
    def __init__(self, desired: Path, api: FlakyAPI, log: Callable[..., None]) -> None:
        self.desired = desired
        self.api = api
        self.log = log
        self.lock = threading.Lock()
        self.attempts: Dict[str, int] = {}  # tries since the key last settled

    def __call__(self, name: str) -> None:
        with self.lock:
            attempt = self.attempts[name] = self.attempts.get(name, 0) + 1
        try:
            outcome = self.reconcile(name)
        except reconq.PermanentError as e:
            self._settled(name)
            self.log(name, attempt, "FAIL", f"{e} (permanent: not retried)")
            raise
        except Exception as e:
            self.log(name, attempt, "retry", f"{type(e).__name__}: {e} (will back off)")
            raise  # the engine retries the key with backoff
        self._settled(name)
        if outcome != "in sync" or attempt > 1:
            self.log(name, attempt, "ok", outcome)

    def _settled(self, name: str) -> None:
        with self.lock:
            self.attempts.pop(name, None)

    def reconcile(self, name: str) -> str:
        """Makes actual/<name> match desired/<name>; returns what it did."""
        path = self.desired / f"{name}.json"
        try:
            spec = read_json(path)
        except json.JSONDecodeError as e:
            raise reconq.PermanentError(f"desired/{name}.json is not JSON: {e}") from None
        current = self.api.get(name)
        if spec is None:  # no longer desired
            if current is None:
                return "in sync"
            self.api.delete(name)
            return "deleted"
        problem = validate(spec)
        if problem:
            raise reconq.PermanentError(f"invalid spec: {problem}")
        if current is not None and current.get("spec") == spec:
            return "in sync"
        self.api.apply(name, spec)
        verb = "created" if current is None else "updated"
        return f"{verb} image={spec['image']} replicas={spec['replicas']}"


# ---------------------------------------------------------------------------
# Running it: reconq.Controller if present, else WorkQueue + worker threads.
# ---------------------------------------------------------------------------


class QueueRunner:
    """What ``reconq.Controller`` does, in a few lines on ``reconq.WorkQueue``.

    Success -> ``forget`` (reset the backoff); ``PermanentError`` -> forget,
    no retry; any other exception -> ``add_rate_limited`` (retry with backoff).
    """

    def __init__(self, reconcile: Callable[[str], None], workers: int, rate_limiter: reconq.RateLimiter) -> None:
        self.reconcile = reconcile
        self.queue = reconq.WorkQueue(rate_limiter)
        self.threads = [
            threading.Thread(target=self._work, name=f"worker-{i}", daemon=True) for i in range(workers)
        ]
        self.counts = {"reconciles": 0, "successes": 0, "failures": 0}
        self.busy = 0
        self.retrying: Set[str] = set()  # keys waiting out a backoff
        self.lock = threading.Lock()

    def enqueue(self, key: str) -> None:
        self.queue.add(key)

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def _work(self) -> None:
        while True:
            try:
                key = str(self.queue.get())  # this demo only adds str keys
            except reconq.ShutDown:
                return
            with self.lock:
                self.busy += 1
                self.retrying.discard(key)
            ok = False
            try:
                self.reconcile(key)
                ok = True
                self.queue.forget(key)
            except reconq.PermanentError:
                self.queue.forget(key)
            except Exception:
                with self.lock:
                    self.retrying.add(key)
                self.queue.add_rate_limited(key)
            finally:
                with self.lock:
                    self.busy -= 1
                    self.counts["reconciles"] += 1
                    self.counts["successes" if ok else "failures"] += 1
                self.queue.done(key)

    def wait_idle(self, timeout: float) -> bool:
        """Whether, within `timeout`, nothing was ready, running or retrying."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if not self.busy and not self.retrying and len(self.queue) == 0:
                    return True
            time.sleep(0.01)
        return False

    def stop(self, drain: bool = True, timeout: Optional[float] = None) -> bool:
        if drain:
            self.queue.shut_down_with_drain(timeout=timeout)
        else:
            self.queue.shut_down()
        for t in self.threads:
            t.join(timeout)
        return not any(t.is_alive() for t in self.threads)

    def stats(self) -> Dict[str, Any]:
        with self.lock:
            return dict(self.counts)


def make_runner(reconcile: Callable[[str], None], workers: int, engine: str, store: Optional[Path] = None) -> Any:
    # Retries after 50 ms, 100 ms, 200 ms... capped at 1 s.
    limiter = reconq.ExponentialBackoff(0.05, 1.0)
    Controller = getattr(reconq, "Controller", None)
    if engine == "controller" or (engine == "auto" and Controller is not None):
        if Controller is None:
            raise SystemExit("this reconq has no Controller; use --engine queue")
        # With a store, pending retries and parked keys survive a restart:
        # run the demo twice with the same --dir and the second run starts
        # where the first stopped.
        return Controller(
            reconcile, workers=workers, rate_limiter=limiter, name="file-sync",
            store=None if store is None else str(store),
        )
    return QueueRunner(reconcile, workers, limiter)


# ---------------------------------------------------------------------------
# The demo itself.
# ---------------------------------------------------------------------------

INITIAL = {
    "web": {"image": "nginx:1.27", "replicas": 3},
    "api": {"image": "example/api:2.4", "replicas": 2},
    "cache": {"image": "redis:7", "replicas": 1},
    "db": {"image": "postgres:16", "replicas": 1},
    "worker": {"image": "example/worker:2.4", "replicas": 4},
}


def names_in(directory: Path) -> List[str]:
    return sorted(p.stem for p in directory.glob("*.json"))


class Watch:
    """Polls desired/ and enqueues the names of files that changed."""

    def __init__(self, desired: Path, enqueue: Callable[[str], None]) -> None:
        self.desired = desired
        self.enqueue = enqueue
        self.seen: Dict[str, bytes] = {}

    def poll(self) -> None:
        now: Dict[str, bytes] = {}
        for p in self.desired.glob("*.json"):
            try:
                now[p.stem] = p.read_bytes()
            except FileNotFoundError:
                pass
        for name in sorted(set(now) | set(self.seen)):
            if now.get(name) != self.seen.get(name):
                self.enqueue(name)
        self.seen = now


def check_converged(desired: Path, actual: Path) -> List[str]:
    """What still differs between desired/ and actual/ (empty: converged)."""
    problems = []
    for name in sorted(set(names_in(desired)) | set(names_in(actual))):
        try:
            spec = read_json(desired / f"{name}.json")
        except json.JSONDecodeError:
            spec = None
        cur = read_json(actual / f"{name}.json")
        if spec is not None and validate(spec) is not None:
            if cur is not None:
                problems.append(f"{name}: invalid spec was applied")
        elif spec is None and cur is not None:
            problems.append(f"{name}: deleted from desired/ but still in actual/")
        elif spec is not None and (cur is None or cur.get("spec") != spec):
            problems.append(f"{name}: actual {cur and cur.get('spec')} != desired {spec}")
    return problems


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reconq.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="how long to run (default 4)")
    parser.add_argument("--workers", type=int, default=2, help="reconcile worker threads (default 2)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the flaky API (default 1)")
    parser.add_argument("--dir", type=Path, help="work in this directory (default: a temporary one, removed)")
    parser.add_argument(
        "--engine", choices=["auto", "controller", "queue"], default="auto", help=argparse.SUPPRESS
    )
    parser.add_argument(
        "--no-store", action="store_true", help="keep no state.db in the directory (default: keep one)"
    )
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.workers < 1:
        parser.error("--seconds must be > 0 and --workers >= 1")
    # The demo prints every outcome itself; without this, reconq's own
    # failure logs (with tracebacks) would reach stderr through Python's
    # last-resort handler, since nothing here configures logging.
    logging.getLogger("reconq").addHandler(logging.NullHandler())

    root = args.dir or Path(tempfile.mkdtemp(prefix="reconq-demo-"))
    desired, actual = root / "desired", root / "actual"
    for d in (desired, actual):
        d.mkdir(parents=True, exist_ok=True)
    for name, spec in INITIAL.items():
        write_json(desired / f"{name}.json", spec)

    t0 = time.monotonic()
    print_lock = threading.Lock()

    def say(line: str) -> None:
        with print_lock:
            print(f"{time.monotonic() - t0:6.2f}s  {line}", flush=True)

    def log(name: str, attempt: int, outcome: str, detail: str) -> None:
        say(f"{name:<8} try {attempt}  {outcome:<5} {detail}")

    api = FlakyAPI(actual, args.seed)
    reconcile = Reconciler(desired, api, log)
    store = None if args.no_store else root / "state.db"
    runner = make_runner(reconcile, args.workers, args.engine, store)
    engine = type(runner).__name__
    print(
        f"reconq demo: syncing {desired} -> {actual}\n"
        f"  {len(INITIAL)} objects, {args.workers} workers ({engine}), flaky API (seed {args.seed}), "
        f"{args.seconds:g} s\n"
        f"   time  key      try    outcome",
        flush=True,
    )

    watch = Watch(desired, runner.enqueue)

    def resync() -> None:
        names = sorted(set(names_in(desired)) | set(names_in(actual)))
        say(f"{'resync':<8} enqueue all {len(names)} names")
        for name in names:
            runner.enqueue(name)

    manager = reconq.Manager()
    runner.start()
    if store is not None and hasattr(runner, "parked"):
        st = runner.stats()
        parked = runner.parked()
        say(
            f"{'store':<8} {store.name}: restored {st['depth'] + st['waiting']} pending, "
            f"{len(parked)} parked ({', '.join(map(str, parked)) or '-'})"
        )
    # do() runs at once, then every `interval` seconds; if it raised, it
    # would be retried after 1 x, 2 x, 3 x... error_retry_base seconds.
    manager.update("watch-desired", watch.poll, interval=0.1, error_retry_base=0.1)
    manager.update("resync", resync, interval=1.0)

    # A user changing desired/ while the controller runs.
    script: List[Tuple[float, str, Callable[[], None]]] = [
        (0.25, "edit web.json: replicas 3 -> 5",
         lambda: write_json(desired / "web.json", {**INITIAL["web"], "replicas": 5})),
        (0.35, "delete cache.json",
         lambda: (desired / "cache.json").unlink()),
        (0.45, "add search.json",
         lambda: write_json(desired / "search.json", {"image": "opensearch:2", "replicas": 3})),
        (0.55, "add broken.json (replicas: -1)",
         lambda: write_json(desired / "broken.json", {"image": "x", "replicas": -1})),
    ]
    try:
        for at, what, change in script:
            delay = t0 + at * args.seconds - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            say(f"{'user':<8} {what}")
            change()
        delay = t0 + args.seconds - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    except KeyboardInterrupt:
        say("interrupted")
    finally:
        jobs = {s["name"]: s for s in manager.status()}
        manager.remove_all(wait=True)  # no more watch or resync
        say("time is up: stopping the watch and resync, finishing retries")
        runner.wait_idle(timeout=5)  # let pending retries finish
        runner.stop(drain=True, timeout=5)

    stats = runner.stats()
    problems = check_converged(desired, actual)
    print(
        f"\ndone in {time.monotonic() - t0:.2f} s: {stats['reconciles']} reconciles, "
        f"{stats['successes']} ok, {stats['failures']} failed "
        f"({sum(api.calls.values())} API calls)"
    )
    for name, job in jobs.items():
        print(f"manager job {name!r}: {job['successes']} runs, {job['failures']} failed")
    print(f"desired: {', '.join(names_in(desired))}")
    print(f"actual:  {', '.join(names_in(actual))}")
    if problems:
        print("NOT converged:\n  " + "\n  ".join(problems))
    else:
        print("converged: actual/ matches desired/ (broken.json is invalid and was never applied)")
    if args.dir is None:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
