//! Noticing that etcd's history was reset (guarantees §10 L2, §11 H4,
//! §13 E1): its data directory wiped, or restored from an older snapshot.
//! Every reply carries a header with the cluster's and member's ids, the
//! store's revision and the raft term. A member's revision and term never
//! go backwards while its data lives, so a reply whose revision or term is
//! lower than one seen *from the same member before the request was sent*,
//! or from another cluster, comes from a new history. (Members are compared
//! one by one: a follower may trail the leader by a few revisions without
//! any reset. And only what was seen before the request counts: replies to
//! requests in flight at once, from several threads, may arrive in any
//! order, a slow read at revision 132 after a keep-alive at 133.)
//!
//! A reset stays pending until whoever uses the client [`accept`]s it
//! (having stopped acting on what the old history said): until then every
//! call fails with it, so an error dropped somewhere cannot hide it.
//!
//! [`accept`]: History::accept
//!
//! A wipe with the same configuration keeps the member and cluster ids
//! (etcd derives them from the peer URLs and the cluster token), so the
//! revision is what usually gives a reset away. When the new history has
//! already passed every revision seen (and a wiped single member starts
//! again at raft term 2), no header does: `fingerprint.rs` then compares
//! what a prefix held at a revision, and reports a difference here
//! ([`History::found`]).

use std::collections::HashMap;

use serde_json::Value;

use super::range_proto::ResponseHeader;

/// A reply from a history older than the one seen before: what was seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reset {
    /// The highest revision seen in the history that was reset: every
    /// create revision of that history (so every fencing token derived
    /// from one) is at most this.
    pub highest_revision: i64,
    /// The revision of the reply that gave the reset away.
    pub revision: i64,
}

/// One reply's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Header {
    cluster: u64,
    member: u64,
    revision: i64,
    term: u64,
}

impl Header {
    /// The header of a gateway reply (`header`, or `result.header` for
    /// streamed ones); `None` for a reply without one (errors).
    pub(super) fn of(reply: &Value) -> Option<Self> {
        let header = reply.get("header").or_else(|| reply.pointer("/result/header"))?;
        let number = |name: &str| -> Option<u64> {
            match header.get(name) {
                Some(Value::String(s)) => s.parse().ok(),
                Some(Value::Number(n)) => n.as_u64(),
                // Zero values are left out of the gateway's JSON.
                _ => Some(0),
            }
        };
        Some(Self {
            cluster: number("cluster_id")?,
            member: number("member_id")?,
            revision: i64::try_from(number("revision")?).ok()?,
            term: number("raft_term")?,
        })
    }
}

/// A gRPC reply's header (`grpc.rs`).
impl From<ResponseHeader> for Header {
    fn from(h: ResponseHeader) -> Self {
        Self { cluster: h.cluster_id, member: h.member_id, revision: h.revision, term: h.raft_term }
    }
}

/// What one client has seen of etcd's history.
#[derive(Debug, Default)]
pub(super) struct History {
    seen: Seen,
    /// The highest revision seen from any member of this history.
    highest: i64,
    /// A reset seen and not yet accepted.
    pending: Option<Reset>,
}

/// What had been seen of the history when a request was sent.
#[derive(Debug, Clone, Default)]
pub(super) struct Seen {
    /// Counts the resets seen: a reply to a request sent before the last
    /// one is not compared (the reset is known) nor taken in (it may come
    /// from the old history).
    generation: u64,
    cluster: Option<u64>,
    /// Per member: the highest revision and raft term seen from it.
    members: HashMap<u64, (i64, u64)>,
}

impl History {
    /// What has been seen so far, to [`observe`](Self::observe) the reply
    /// to a request sent now; an error if a reset is pending.
    pub(super) fn before_request(&self) -> Result<Seen, Reset> {
        self.check()?;
        Ok(self.seen.clone())
    }

    /// Takes in a reply's header (`before`: what had been seen when its
    /// request was sent; `None`: a reply without one, an error's): an
    /// error if it comes from a new history (which is the one seen from
    /// then on), or a reset is pending.
    pub(super) fn observe(&mut self, before: &Seen, header: Option<Header>) -> Result<(), Reset> {
        self.check()?;
        // etcd's revisions start at 1: a header with none (a watch
        // canceled because its start revision was compacted) says
        // nothing about the history.
        let Some(h) = header.filter(|h| h.revision > 0) else { return Ok(()) };
        if before.generation != self.seen.generation {
            return Ok(());
        }
        let other_cluster = before.cluster.is_some_and(|c| c != h.cluster);
        let went_back =
            before.members.get(&h.member).is_some_and(|&(revision, term)| h.revision < revision || h.term < term);
        if other_cluster || went_back {
            let reset = self.found(h.revision);
            self.take(h);
            return Err(reset);
        }
        self.take(h);
        Ok(())
    }

    /// A reset, given away by a reply at `revision`: pending from now on,
    /// and the new history is the one seen.
    pub(super) fn found(&mut self, revision: i64) -> Reset {
        let reset = Reset { highest_revision: self.highest, revision };
        let generation = self.seen.generation + 1;
        *self = Self { pending: Some(reset), seen: Seen { generation, ..Seen::default() }, highest: 0 };
        reset
    }

    /// The pending reset, if any.
    pub(super) fn check(&self) -> Result<(), Reset> {
        self.pending.map_or(Ok(()), Err)
    }

    /// The pending reset is dealt with: calls go on, in the new history.
    pub(super) fn accept(&mut self) {
        self.pending = None;
    }

    fn take(&mut self, h: Header) {
        self.seen.cluster = Some(h.cluster);
        let seen = self.seen.members.entry(h.member).or_default();
        *seen = (seen.0.max(h.revision), seen.1.max(h.term));
        self.highest = self.highest.max(h.revision);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn reply(member: u64, revision: i64, term: u64) -> Value {
        json!({ "header": { "cluster_id": "7", "member_id": member.to_string(),
                            "revision": revision.to_string(), "raft_term": term.to_string() } })
    }

    /// Observes `reply` to a request sent now.
    fn observe(h: &mut History, reply: &Value) -> Result<(), Reset> {
        let before = h.before_request()?;
        h.observe(&before, Header::of(reply))
    }

    #[test]
    fn a_revision_or_term_going_back_on_one_member_is_a_reset_pending_until_accepted() {
        let mut h = History::default();
        assert_eq!(observe(&mut h, &reply(1, 200, 3)), Ok(()));
        let reset = Reset { highest_revision: 200, revision: 2 };
        assert_eq!(observe(&mut h, &reply(1, 2, 3)), Err(reset));
        assert_eq!(observe(&mut h, &reply(1, 3, 3)), Err(reset), "pending");
        assert_eq!(h.check(), Err(reset));
        h.accept();
        assert_eq!(observe(&mut h, &reply(1, 3, 3)), Ok(()), "the new history is the one seen from then on");
        assert_eq!(observe(&mut h, &reply(1, 3, 2)), Err(Reset { highest_revision: 3, revision: 3 }), "term went back");
    }

    #[test]
    fn replies_to_requests_in_flight_at_once_may_come_in_any_order() {
        let mut h = History::default();
        assert_eq!(observe(&mut h, &reply(1, 100, 2)), Ok(()));
        let (slow, fast) = (h.before_request().unwrap(), h.before_request().unwrap());
        assert_eq!(h.observe(&fast, Header::of(&reply(1, 133, 2))), Ok(()));
        assert_eq!(h.observe(&slow, Header::of(&reply(1, 132, 2))), Ok(()), "sent before 133 was seen");
        // Sent before a reset was seen: neither compared nor taken in.
        let old = h.before_request().unwrap();
        assert!(observe(&mut h, &reply(1, 5, 2)).is_err());
        h.accept();
        assert_eq!(h.observe(&old, Header::of(&reply(1, 140, 2))), Ok(()));
        assert_eq!(observe(&mut h, &reply(1, 6, 2)), Ok(()), "the old history's 140 was not taken in");
    }

    #[test]
    fn a_trailing_follower_and_replies_without_a_header_are_no_reset() {
        let mut h = History::default();
        assert_eq!(observe(&mut h, &reply(1, 200, 3)), Ok(()));
        assert_eq!(observe(&mut h, &reply(2, 198, 3)), Ok(()));
        assert_eq!(observe(&mut h, &json!({ "error": "x" })), Ok(()));
        assert_eq!(observe(&mut h, &reply(1, 0, 3)), Ok(()), "a header without a revision (a compacted watch)");
        let streamed = json!({ "result": { "header": reply(1, 150, 3)["header"].clone() } });
        assert_eq!(observe(&mut h, &streamed), Err(Reset { highest_revision: 200, revision: 150 }));
    }

    #[test]
    fn another_cluster_is_a_reset() {
        let mut h = History::default();
        assert_eq!(observe(&mut h, &reply(1, 5, 2)), Ok(()));
        let other = json!({ "header": { "cluster_id": "8", "member_id": "1", "revision": "9", "raft_term": "2" } });
        assert_eq!(observe(&mut h, &other), Err(Reset { highest_revision: 5, revision: 9 }));
    }
}
