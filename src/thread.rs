//! Spawning the engine's own threads.
//!
//! Like [`crate::sync`], this is a seam: with the internal `shuttle` feature,
//! [`spawn_named`], [`JoinHandle`] and [`current`] are shuttle's, so a
//! controller's workers and a manager's controller threads run as shuttle
//! threads in the model-checking tests.

use std::io;
use std::sync::Arc;

pub(crate) use imp::{JoinHandle, current};

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
    imp::spawn(name, move || {
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

#[cfg(not(feature = "shuttle"))]
mod imp {
    use std::io;
    use std::thread;

    pub(crate) use std::thread::{JoinHandle, current};

    pub(super) fn spawn(name: String, body: impl FnOnce() + Send + 'static) -> io::Result<JoinHandle<()>> {
        thread::Builder::new().name(name).spawn(body)
    }
}

#[cfg(feature = "shuttle")]
mod imp {
    use std::io;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    pub(crate) use shuttle::thread::current;

    /// shuttle's join handle, plus the `is_finished` std's has.
    #[derive(Debug)]
    pub(crate) struct JoinHandle<T> {
        inner: shuttle::thread::JoinHandle<T>,
        finished: Arc<AtomicBool>,
    }

    impl<T> JoinHandle<T> {
        pub(crate) fn join(self) -> std::thread::Result<T> {
            self.inner.join()
        }

        pub(crate) fn thread(&self) -> &shuttle::thread::Thread {
            self.inner.thread()
        }

        /// Only used to prune handles of exited threads, so a plain flag
        /// (not a scheduling point) is enough.
        pub(crate) fn is_finished(&self) -> bool {
            self.finished.load(Ordering::SeqCst)
        }
    }

    pub(super) fn spawn(name: String, body: impl FnOnce() + Send + 'static) -> io::Result<JoinHandle<()>> {
        let finished = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&finished);
        let inner = shuttle::thread::Builder::new().name(name).spawn(move || {
            // Set on unwinding too, as std's `is_finished` would be.
            struct SetOnDrop(Arc<AtomicBool>);
            impl Drop for SetOnDrop {
                fn drop(&mut self) {
                    self.0.store(true, Ordering::SeqCst);
                }
            }
            let _finished = SetOnDrop(flag);
            body();
        })?;
        Ok(JoinHandle { inner, finished })
    }
}
