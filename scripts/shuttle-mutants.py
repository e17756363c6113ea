#!/usr/bin/env python3
"""Shows that each shuttle model can fail: puts a plausible concurrency bug
back into the engine, runs the model meant to catch it, and restores the file.

    python3 scripts/shuttle-mutants.py [--iterations N] [NAME ...]

For each mutant it prints whether the model failed (caught) and the first
line of the failure. Not part of CI (each mutant rebuilds the library and
runs one model: 15-30 s). A mutant whose code no longer matches the source is reported
as "stale" so the list can be brought up to date. Run from the repository
root with a clean work tree for the files it touches (they are restored with
the original text, not with git).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from dataclasses import dataclass


@dataclass
class Mutant:
    name: str
    what: str
    path: str
    old: str
    new: str
    test_file: str
    test: str


MUTANTS = [
    Mutant(
        "group-room-not-freed",
        "fair ready set: a finished key of a full group does not unblock the group's held keys",
        "src/queue/ready.rs",
        """        if !was_full {
            return;
        }""",
        """        if !was_full || true {
            return;
        }""",
        "shuttle_controller",
        "group_limit_racing_finish",
    ),
    Mutant(
        "group-limit-off-by-one",
        "fair ready set: a group counts as full only above its limit",
        "src/queue/ready.rs",
        "self.in_flight.get(&group).is_some_and(|&n| n >= self.limit)",
        "self.in_flight.get(&group).is_some_and(|&n| n > self.limit)",
        "shuttle_controller",
        "group_limit_racing_finish",
    ),
    Mutant(
        "settle-after-done",
        "worker loop: the retry is scheduled and counted after `done`, not before",
        "src/controller/worker.rs",
        """        settle(core, rt, &key, &ctx, outcome, timed_out);
        drop(entered);""",
        """        rt.queue.done(&key);
        settle(core, rt, &key, &ctx, outcome, timed_out);
        drop(entered);""",
        "shuttle_controller",
        "worker_loop_requeue_racing_readds",
    ),
    Mutant(
        "dirty-dropped",
        "queue: an add while the key is processing is dropped instead of marking it dirty",
        "src/queue/state.rs",
        """                    self.requeue_after_done += 1;
                    occupied.insert(Slot::Processing { then: Then::Requeue { added }, run, group, again });""",
        """                    let _ = (added, then);
                    occupied.insert(Slot::Processing { then: Then::Finish, run, group, again });""",
        "shuttle_controller",
        "worker_loop_requeue_racing_readds",
    ),
    Mutant(
        "route-check-outside-lock",
        "enqueue before start: `rt` checked only outside the pending lock",
        "src/controller/mod.rs",
        """        let mut pending = self.pending.lock();
        if let Some(rt) = self.rt.get() {
            drop(pending);
            return self.apply(rt, key, when, priority);
        }""",
        """        let mut pending = self.pending.lock();""",
        "shuttle_controller",
        "drain_racing_enqueues_and_start",
    ),
    Mutant(
        "exit-without-notify",
        "a worker's exit is counted without waking stop's waiters",
        "src/controller/worker.rs",
        """            life.live_aux -= 1;
        }
        self.core.life_cv.notify_all();""",
        """            life.live_aux -= 1;
        }""",
        "shuttle_controller",
        "drain_racing_enqueues_and_start",
    ),
    Mutant(
        "cancel-all-read-outside-slot-lock",
        "begin: the stop flag is read before the slot lock is taken",
        "src/controller/worker.rs",
        """        *running = Some(Running { key: key.clone(), since: rt.clock.now(), hang_logged: false, timed_out: false });
        // Under the slot lock, so a concurrent `cancel_all` either sees this
        // reconcile or we see its flag.
        slot.signal.reset_to(core.cancel_all.load(Ordering::SeqCst));""",
        """        let cancel_all = core.cancel_all.load(Ordering::SeqCst);
        drop(running);
        running = slot.running.lock();
        *running = Some(Running { key: key.clone(), since: rt.clock.now(), hang_logged: false, timed_out: false });
        slot.signal.reset_to(cancel_all);""",
        "shuttle_controller",
        "stop_cancels_every_reconcile",
    ),
    Mutant(
        "cancel-everything-without-slot-lock",
        "stop: slot signals are set without taking the slot locks",
        "src/controller/mod.rs",
        """                let _running = slot.running.lock();
                slot.signal.set();""",
        """                slot.signal.set();""",
        "shuttle_controller",
        "stop_cancels_every_reconcile",
    ),
    Mutant(
        "cancel-set-outside-slot-lock",
        "cancel(key): the slot is checked under its lock, the signal set after releasing it",
        "src/controller/handle.rs",
        """            let running = slot.running.lock();
            if running.as_ref().is_some_and(|r| &r.key == key) {
                slot.signal.set();""",
        """            let found = slot.running.lock().as_ref().is_some_and(|r| &r.key == key);
            if found {
                slot.signal.set();""",
        "shuttle_controller",
        "cancel_racing_completion_one_worker",
    ),
    Mutant(
        "reset-after-slot-lock",
        "begin: the signal is reset after the slot lock is released",
        "src/controller/worker.rs",
        """        slot.signal.reset_to(core.cancel_all.load(Ordering::SeqCst));
    }""",
        """    }
    slot.signal.reset_to(core.cancel_all.load(Ordering::SeqCst));""",
        "shuttle_controller",
        "cancel_racing_completion_two_workers",
    ),
    Mutant(
        "no-reset",
        "begin: the signal is never reset (a cancel leaks into the worker's next reconcile)",
        "src/controller/worker.rs",
        """        slot.signal.reset_to(core.cancel_all.load(Ordering::SeqCst));""",
        """        if core.cancel_all.load(Ordering::SeqCst) {
            slot.signal.set();
        }""",
        "shuttle_controller",
        "cancel_racing_completion_two_workers",
    ),
    Mutant(
        "update-after-remove-lost",
        "manager: update applies parameters to a controller already removed (the bug the model found)",
        "src/manager/worker.rs",
        """            if st.removed {
                return Err(params);
            }""",
        "",
        "shuttle_controller",
        "manager_update_racing_remove_and_trigger",
    ),
    Mutant(
        "remove-without-notify",
        "manager: remove marks the controller removed without waking its thread",
        "src/manager/worker.rs",
        """        st.removed = true;
        cancel_run(&st);
        self.wake.notify_all();""",
        """        st.removed = true;
        cancel_run(&st);""",
        "shuttle_controller",
        "manager_update_racing_remove_and_trigger",
    ),
    Mutant(
        "stop-before-first-run",
        "manager: a controller removed before its first run exits without running do",
        "src/manager/worker.rs",
        """                return !st.ran_once;""",
        """                return false;""",
        "shuttle_controller",
        "manager_update_racing_remove_and_trigger",
    ),
    Mutant(
        "update-without-pending",
        "manager: update replaces the parameters without requesting a run",
        "src/manager/worker.rs",
        """            let old = std::mem::replace(&mut st.params, params);
            st.pending = true;""",
        """            let old = std::mem::replace(&mut st.params, params);""",
        "shuttle_controller",
        "manager_update_racing_trigger_runs_latest_do",
    ),
    Mutant(
        "self-join",
        "manager: remove_and_wait joins the calling thread too",
        "src/manager/mod.rs",
        """        if handle.thread().id() != me {""",
        """        if true {""",
        "shuttle_controller",
        "manager_self_removal_racing_remove_all",
    ),
    Mutant(
        "leadership-checked-before-begin",
        "worker: the fencing token is read before the reconcile is marked running, so a loss in between cancels nothing",
        "src/controller/worker.rs",
        """        begin(core, rt, slot, &key);
        // Asked after `begin`: a leadership lost after this check cancels
        // this reconcile (the loss clears the token, then cancels what its
        // callback finds running, and `begin` made us findable).
        if let Some(election) = &rt.leader {
            match election.token() {""",
        """        let early = rt.leader.as_ref().and_then(LeaderElection::token);
        begin(core, rt, slot, &key);
        if let Some(election) = &rt.leader {
            match early {""",
        "shuttle_controller",
        "leadership_lost_during_reconciles",
    ),
    Mutant(
        "hand-over-before-reconciles-returned",
        "sharding: a partition given up is deleted while reconciles of its keys still run",
        "src/coordination/sharding.rs",
        """            .filter(|(_, o)| o.releasing.is_some() && o.in_flight == 0)""",
        """            .filter(|(_, o)| o.releasing.is_some())""",
        "shuttle_controller",
        "partition_handed_over_while_its_key_runs",
    ),
    Mutant(
        "admit-while-giving-up",
        "sharding: keys of a partition being given up are still handed out",
        "src/coordination/sharding.rs",
        """        let owned = st.owned.get_mut(&partition).filter(|o| o.releasing.is_none())?;""",
        """        let owned = st.owned.get_mut(&partition)?;""",
        "shuttle_controller",
        "partition_handed_over_while_its_key_runs",
    ),
    Mutant(
        "cancelled-run-releases-one-waiter",
        "dependencies: a cancelled run's return tells only the first key waiting for it (D3)",
        "src/graph/mod.rs",
        "        for waiter in waiters {",
        "        for waiter in waiters.into_iter().take(1) {",
        "shuttle_controller",
        "parent_ready_while_descendant_is_cancelled",
    ),
    Mutant(
        "batch-holds-nothing",
        "batches: a key that becomes ready inside a batch is handed out at once (U3)",
        "src/queue/state.rs",
        """        let Some(held) = &mut self.batch else { return false };
        held.push(key.clone());
        true""",
        """        let Some(held) = &mut self.batch else { return false };
        let _ = (held, key);
        false""",
        "shuttle_controller",
        "batch_closing_while_workers_finish",
    ),
    Mutant(
        "batch-close-wakes-nobody",
        "batches: the last close releases its keys without waking a waiting worker",
        "src/queue/mod.rs",
        """        if g.q.close_batch() {
            self.shared.publish_ready(&g);
            self.shared.wake_ready(&mut g);""",
        """        if g.q.close_batch() {
            self.shared.publish_ready(&g);""",
        "shuttle_controller",
        "batch_closing_while_workers_finish",
    ),
    Mutant(
        "batch-close-loses-a-key",
        "batches: the last close releases every held key but the first",
        "src/queue/state.rs",
        "            for key in &held {",
        "            for key in held.iter().skip(1) {",
        "shuttle_controller",
        "batch_closing_while_workers_finish",
    ),
]


def run(m: Mutant, iterations: int) -> tuple[str, str]:
    with open(m.path) as f:
        original = f.read()
    if original.count(m.old) != 1:
        return "stale", f"the code to mutate is not (exactly once) in {m.path}"
    try:
        with open(m.path, "w") as f:
            f.write(original.replace(m.old, m.new))
        env = dict(os.environ, RECONQ_SHUTTLE_ITERATIONS=str(iterations))
        cmd = ["cargo", "test", "--features", "shuttle", "--test", m.test_file, "--", "--exact", m.test]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    finally:
        with open(m.path, "w") as f:
            f.write(original)
    out = p.stdout + p.stderr
    if "error[" in out and "test result" not in out:
        return "build error", next(line for line in out.splitlines() if "error[" in line)
    if p.returncode == 0:
        return "MISSED", ""
    deadlock = re.search(r"deadlock! blocked tasks[^\n]*", out)
    steps = re.search(r"exceeded max_steps bound \d+", out)
    found = re.search(r"panicked at [^\n]*\n([^\n]*)(?:\n  left: ([^\n]*))?", out)
    if deadlock:
        detail = deadlock.group(0)
    elif steps:
        detail = steps.group(0) + " (a thread never finished)"
    elif found:
        detail = found.group(1) + (f" left: {found.group(2)}" if found.group(2) else "")
    else:
        detail = "failed"
    return "caught", detail[:220]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", type=int, default=1000, help="schedules per scheduler (random, PCT)")
    ap.add_argument("names", nargs="*")
    args = ap.parse_args()
    chosen = [m for m in MUTANTS if not args.names or m.name in args.names]
    missed = 0
    for m in chosen:
        status, detail = run(m, args.iterations)
        missed += status != "caught"
        print(f"{m.name:36} {status:8} {m.test}: {detail}", flush=True)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
