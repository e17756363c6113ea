//! [`PollingSource`]: a list function called every interval (docs/sources.md),
//! for systems with no change stream. Each poll is compared with the one
//! before and only the differences are events, so a poll is not a relist
//! and an unchanged item is no change.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::hash::Hash;
use std::time::{Duration, Instant};

use super::{BatchScope, Changes, Event, Item, Listing, Source, SourceError, Stop, in_scope};
use crate::error::InvalidArgument;

type ListFn<K, O, V> = Box<dyn FnMut() -> Result<Vec<Item<K, O, V>>, String> + Send>;

/// A source that calls `list_fn` every `interval` and turns the
/// differences from the poll before into puts and deletes. Its position
/// is the number of polls; a failed poll is a break (the cache backs off,
/// then this polls again at once).
pub struct PollingSource<K, O, V = ()> {
    list_fn: ListFn<K, O, V>,
    interval: Duration,
    /// What the last successful poll returned.
    last: HashMap<K, (O, Option<V>)>,
    polls: u64,
    /// When the next poll is due.
    next_poll: Instant,
    /// What a poll's comparisons with the last run inside.
    compare_scope: Option<BatchScope>,
}

impl<K, O> PollingSource<K, O, ()> {
    /// Polls `list_fn` (returning `(key, object)` pairs) every `interval`
    /// (positive).
    pub fn new<I, E>(
        interval: Duration,
        mut list_fn: impl FnMut() -> Result<I, E> + Send + 'static,
    ) -> Result<Self, InvalidArgument>
    where
        I: IntoIterator<Item = (K, O)>,
        E: fmt::Display,
    {
        Self::build(interval, move || Ok(list_fn().map_err(|e| e.to_string())?.into_iter().map(Item::from).collect()))
    }
}

impl<K, O, V> PollingSource<K, O, V> {
    /// Polls `list_fn`, whose items may carry versions, every `interval`
    /// (positive).
    pub fn with_items<I, E>(
        interval: Duration,
        mut list_fn: impl FnMut() -> Result<I, E> + Send + 'static,
    ) -> Result<Self, InvalidArgument>
    where
        I: IntoIterator<Item = Item<K, O, V>>,
        E: fmt::Display,
    {
        Self::build(interval, move || Ok(list_fn().map_err(|e| e.to_string())?.into_iter().collect()))
    }

    fn build(
        interval: Duration,
        list_fn: impl FnMut() -> Result<Vec<Item<K, O, V>>, String> + Send + 'static,
    ) -> Result<Self, InvalidArgument> {
        if interval.is_zero() {
            return Err(InvalidArgument::new("PollingSource: interval must be positive, got 0 s"));
        }
        Ok(Self {
            list_fn: Box::new(list_fn),
            interval,
            last: HashMap::new(),
            polls: 0,
            next_poll: Instant::now(),
            compare_scope: None,
        })
    }

    /// Compares each poll's objects with the last poll's inside `scope`,
    /// once a poll (the Python binding: one hold of the GIL, since
    /// comparing Python objects calls Python).
    #[cfg_attr(not(feature = "python"), allow(dead_code))]
    pub(crate) fn compare_in(mut self, scope: BatchScope) -> Self {
        self.compare_scope = Some(scope);
        self
    }
}

impl<K, O, V> fmt::Debug for PollingSource<K, O, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PollingSource").field("interval", &self.interval).field("polls", &self.polls).finish()
    }
}

impl<K, O, V> PollingSource<K, O, V>
where
    K: Clone + Eq + Hash,
    O: Clone + PartialEq,
    V: Clone + PartialEq,
{
    /// Calls the list function; on success, the items by key and the next
    /// poll is an interval away; on failure, the next poll is due at once
    /// (after the cache's back-off).
    fn poll(&mut self) -> Result<HashMap<K, (O, Option<V>)>, SourceError> {
        let result = (self.list_fn)();
        let now = Instant::now();
        match result {
            Ok(items) => {
                self.polls += 1;
                self.next_poll = now + self.interval;
                Ok(items.into_iter().map(|item| (item.key, (item.obj, item.version))).collect())
            }
            Err(e) => {
                self.next_poll = now;
                Err(SourceError::new(format!("list function failed: {e}")))
            }
        }
    }

    /// The events that turn the last poll into `now`, which becomes the
    /// last poll.
    fn differences(&mut self, now: HashMap<K, (O, Option<V>)>) -> VecDeque<Event<K, O, u64, V>> {
        let position = Some(self.polls);
        let last = &self.last;
        let mut events: VecDeque<_> = last
            .keys()
            .filter(|key| !now.contains_key(key))
            .map(|key| Event::Delete { key: key.clone(), position })
            .collect();
        in_scope(self.compare_scope.as_ref(), || {
            for (key, (obj, version)) in &now {
                if last.get(key).is_none_or(|(was, was_version)| was != obj || was_version != version) {
                    let (obj, version) = (obj.clone(), version.clone());
                    events.push_back(Event::Put { key: key.clone(), obj, position, version });
                }
            }
        });
        self.last = now;
        events
    }
}

impl<K, O, V> Source for PollingSource<K, O, V>
where
    K: Clone + Eq + Hash + fmt::Debug + Send + Sync + 'static,
    O: Clone + PartialEq + Send + Sync + 'static,
    V: Clone + PartialEq + fmt::Debug + Send + Sync + 'static,
{
    type Key = K;
    type Object = O;
    type Position = u64;
    type Version = V;

    fn list(&mut self, _stop: &Stop) -> Result<Listing<K, O, u64, V>, SourceError> {
        let now = self.poll()?;
        let items = now
            .iter()
            .map(|(key, (obj, version))| Item { key: key.clone(), obj: obj.clone(), version: version.clone() })
            .collect();
        self.last = now;
        Ok(Listing { items, position: Some(self.polls) })
    }

    fn changes(&mut self, _from: Option<&u64>, stop: &Stop) -> Result<Changes<'_, Self>, SourceError> {
        let stop = stop.clone();
        let mut pending = VecDeque::new();
        Ok(Box::new(std::iter::from_fn(move || {
            loop {
                if let Some(event) = pending.pop_front() {
                    return Some(Ok(event));
                }
                let wait = self.next_poll.saturating_duration_since(Instant::now());
                if stop.wait_timeout(wait) {
                    return None;
                }
                match self.poll() {
                    Ok(now) => pending = self.differences(now),
                    Err(e) => return Some(Err(e)),
                }
            }
        })))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[test]
    fn a_zero_interval_is_refused_naming_it() {
        let e = PollingSource::new(Duration::ZERO, || Ok::<_, String>(vec![(1, 1)])).unwrap_err();
        assert!(e.to_string().contains("interval"), "{e}");
    }

    #[test]
    fn polls_become_the_differences_and_failures_breaks() {
        type Answer = Result<Vec<(u32, &'static str)>, String>;
        let answers: VecDeque<Answer> =
            [Ok(vec![(1, "a"), (2, "b")]), Err("down".to_owned()), Ok(vec![(1, "a"), (2, "c"), (3, "d")])].into();
        let feed = Arc::new(Mutex::new(answers));
        let mut source =
            PollingSource::new(Duration::from_millis(1), move || feed.lock().unwrap().pop_front().unwrap()).unwrap();
        let stop = Stop::new();
        let listing = source.list(&stop).unwrap();
        assert_eq!((listing.items.len(), listing.position), (2, Some(1)));
        let mut changes = source.changes(Some(&1), &stop).unwrap();
        assert_eq!(changes.next().unwrap().unwrap_err().message(), "list function failed: down");
        let mut events: Vec<_> = (0..2).map(|_| changes.next().unwrap().unwrap()).collect();
        events.sort_by_key(|e| format!("{e:?}"));
        assert_eq!(
            events,
            [
                Event::Put { key: 2, obj: "c", position: Some(2), version: None },
                Event::Put { key: 3, obj: "d", position: Some(2), version: None },
            ]
        );
        stop.set();
        assert!(changes.next().is_none(), "a set stop ends the stream");
    }
}
