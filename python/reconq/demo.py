"""A small reconcile loop you can run and read in a minute.

    python -m reconq.demo [--seconds 4] [--workers 2] [--seed 1] [--dir PATH] [--fresh] [--no-store]

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
  one and adds one with an invalid spec. With a store, the first run also
  has ``billing``, whose API is down for the whole run.

Everything lives in one directory, kept between runs: ``--dir``, else
``$RECONQ_DEMO_DIR``, else ``$XDG_STATE_HOME/reconq-demo`` (by default
``~/.local/state/reconq-demo``); ``--fresh`` empties it first. The
controller keeps its pending retries, failure counts and parked keys in
``<dir>/state.db`` (``store=``), so a second run picks up where the first
stopped: ``billing`` is still pending and its failure count continues
(its first try of the second run is not try 1), ``broken`` comes back
parked until the user of the second run fixes its spec. Later runs keep
the desired state as it was left. ``--no-store`` keeps no state.db.

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

    def __init__(self, actual: Path, seed: int, down: Set[str]) -> None:
        self.actual = actual
        self.seed = seed
        self.down = down  # objects whose backend is out for this whole run
        self.down_tries: Dict[str, int] = {}
        self.lock: threading.Lock = threading.Lock()
        self.calls: Dict[str, int] = {}
        self.failing_streak: Dict[str, int] = {}

    def _maybe_fail(self, name: str) -> None:
        if name in self.down:
            with self.lock:
                self.down_tries[name] = self.down_tries.get(name, 0) + 1
            time.sleep(0.01)
            raise TransientError(f"503 {name} backend down")
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
    def __init__(self, desired: Path, api: FlakyAPI, log: Callable[..., None], engine_counts: bool) -> None:
        self.desired = desired
        self.api = api
        self.log = log
        # On a Controller, ``reconq.context().attempt`` counts the tries
        # since the key last settled, restored from the store after a
        # restart; on a bare WorkQueue the demo counts them itself.
        self.engine_counts = engine_counts
        self.lock: threading.Lock = threading.Lock()
        self.attempts: Dict[str, int] = {}

    def __call__(self, name: str) -> None:
        with self.lock:
            attempt = self.attempts[name] = self.attempts.get(name, 0) + 1
        if self.engine_counts:
            attempt = reconq.context().attempt + 1
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
        self.queue: reconq.WorkQueue = reconq.WorkQueue(rate_limiter)
        self.threads: List[threading.Thread] = [
            threading.Thread(target=self._work, name=f"worker-{i}", daemon=True) for i in range(workers)
        ]
        self.counts: Dict[str, int] = {"reconciles": 0, "successes": 0, "failures": 0}
        self.busy: int = 0
        self.retrying: Set[str] = set()  # keys waiting out a backoff
        self.lock: threading.Lock = threading.Lock()

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


#: With a store, the first run also has this object, whose API is down for
#: the whole run: it ends pending, and the next run picks it up.
DOWN_FIRST_RUN = {"billing": {"image": "example/billing:1", "replicas": 2}}


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


def check_converged(desired: Path, actual: Path, down: Set[str]) -> List[str]:
    """What still differs between desired/ and actual/ (empty: converged),
    leaving out the objects whose API is down for this run."""
    problems = []
    for name in sorted((set(names_in(desired)) | set(names_in(actual))) - down):
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


def default_dir() -> Path:
    """Where the demo keeps its state without ``--dir``."""
    if os.environ.get("RECONQ_DEMO_DIR"):
        return Path(os.environ["RECONQ_DEMO_DIR"])
    state_home = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state_home) / "reconq-demo"


def next_run(root: Path) -> int:
    """Counts this run in ``<root>/runs``: 1 for a fresh directory."""
    counter = root / "runs"
    try:
        run = int(counter.read_text()) + 1
    except (FileNotFoundError, ValueError):
        run = 1
    counter.write_text(f"{run}\n")
    return run


def user_script(run: int, desired: Path) -> List[Tuple[float, str, Callable[[], None]]]:
    """A user changing desired/ while the controller runs: (when, as a
    fraction of the run, what, the change). The first run sets things up;
    later runs fix the invalid spec, if it is still there."""
    if run > 1:
        try:
            broken = read_json(desired / "broken.json")
        except json.JSONDecodeError:
            broken = None
        if broken is None or validate(broken) is None:
            return []
        return [
            (0.4, "fix broken.json (replicas: -1 -> 2)",
             lambda: write_json(desired / "broken.json", {"image": "x", "replicas": 2})),
        ]
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
    return script


def describe_restored(runner: Any, names: List[str]) -> str:
    """What a restart found in the store: pending keys with their failure
    counts, parked keys."""
    found = []
    for name in names:
        info = runner.inspect(name)
        if info["state"] == "parked":
            found.append(f"{name} parked")
        elif info["state"] != "unknown":
            found.append(f"{name} pending after {info['attempts']} failures")
    return ", ".join(found) or "nothing"


def wait_until(cond: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reconq.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="how long to run (default 4)")
    parser.add_argument("--workers", type=int, default=2, help="reconcile worker threads (default 2)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the flaky API (default 1)")
    parser.add_argument(
        "--dir", type=Path,
        help="keep the state in this directory (default: $RECONQ_DEMO_DIR, else ~/.local/state/reconq-demo)",
    )
    parser.add_argument("--fresh", action="store_true", help="empty the directory first: start over")
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

    root: Path = args.dir or default_dir()
    if args.fresh:
        shutil.rmtree(root, ignore_errors=True)
    desired, actual = root / "desired", root / "actual"
    first_time = not desired.exists()
    for d in (desired, actual):
        d.mkdir(parents=True, exist_ok=True)
    run = next_run(root)

    t0 = time.monotonic()
    print_lock = threading.Lock()

    def say(line: str) -> None:
        with print_lock:
            print(f"{time.monotonic() - t0:6.2f}s  {line}", flush=True)

    def log(name: str, attempt: int, outcome: str, detail: str) -> None:
        say(f"{name:<8} try {attempt}  {outcome:<5} {detail}")

    store = None if args.no_store else root / "state.db"
    on_controller = args.engine == "controller" or (args.engine == "auto" and hasattr(reconq, "Controller"))
    # Only a run whose pending keys are kept shows a backend down: the
    # next run picks the key up where this one left it.
    down = set(DOWN_FIRST_RUN) if first_time and store is not None and on_controller else set()
    if first_time:
        for name, spec in {**INITIAL, **{name: DOWN_FIRST_RUN[name] for name in down}}.items():
            write_json(desired / f"{name}.json", spec)
    api = FlakyAPI(actual, args.seed, down)
    reconcile = Reconciler(desired, api, log, engine_counts=on_controller)
    runner = make_runner(reconcile, args.workers, args.engine, store)
    engine = type(runner).__name__
    print(
        f"reconq demo, run {run}: syncing {desired} -> {actual}\n"
        f"  {len(names_in(desired))} objects, {args.workers} workers ({engine}), flaky API (seed {args.seed}), "
        f"{args.seconds:g} s\n"
        f"  state is kept in {root} between runs; `python -m reconq.demo --fresh` starts over\n"
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
    if store is not None and on_controller:
        restored = describe_restored(runner, sorted(set(names_in(desired)) | set(names_in(actual))))
        say(f"{'store':<8} {store.name}: restored {restored}")
    # do() runs at once, then every `interval` seconds; if it raised, it
    # would be retried after 1 x, 2 x, 3 x... error_retry_base seconds.
    manager.update("watch-desired", watch.poll, interval=0.1, error_retry_base=0.1)
    manager.update("resync", resync, interval=1.0)

    try:
        for at, what, change in user_script(run, desired):
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
        # Let pending retries land (not those of a backend that is down,
        # which are tried at least once).
        wait_until(
            lambda: not check_converged(desired, actual, down) and all(api.down_tries.get(n) for n in down),
            timeout=5,
        )
        runner.stop(drain=True, timeout=5)

    stats = runner.stats()
    problems = check_converged(desired, actual, down)
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
        print("converged: actual/ matches desired/ (an invalid spec is never applied)")
    for name in sorted(down):
        print(f"{name}: its API was down all run; still pending in {store}: run the demo again to see it picked up")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
