//! Spawning the engine's own threads.

use std::io;
use std::sync::Arc;
use std::thread::{self, JoinHandle};

/// Runs the body of every thread the engine spawns (workers, timers,
/// triggers). The body is passed as `&mut dyn FnMut()` and must be called
/// exactly once.
///
/// The Python bindings use this to attach each thread to the interpreter once
/// for its whole life, instead of once per callback (which is ~20x slower
/// and resets `threading.local`).
pub type ThreadWrapper = Arc<dyn Fn(&mut dyn FnMut()) + Send + Sync>;

/// Spawns a named thread running `body`, inside `wrapper` if one is given.
pub(crate) fn spawn_named(
    name: String,
    wrapper: Option<&ThreadWrapper>,
    body: impl FnOnce() + Send + 'static,
) -> io::Result<JoinHandle<()>> {
    let wrapper = wrapper.cloned();
    thread::Builder::new().name(name).spawn(move || {
        let mut body = Some(body);
        let mut run_once = || {
            if let Some(body) = body.take() {
                body();
            }
        };
        match wrapper {
            Some(wrap) => wrap(&mut run_once),
            None => run_once(),
        }
    })
}
