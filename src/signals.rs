//! SIGINT and SIGTERM as messages on a channel, without an async runtime:
//! `sigaction` handlers that write the signal's number to a pipe (the
//! self-pipe trick: `write` is async-signal-safe), and one thread blocked
//! reading it that forwards each signal to every subscriber.
//!
//! Taken over only while someone subscribes (the first subscriber installs
//! the handlers, the last one puts the previous dispositions back), and
//! only for signals whose disposition is the default: a handler the host
//! program set, or an ignored signal (`nohup`), is left alone, as Python's
//! `Controller.run()` leaves a program's own SIGTERM handler.

use std::io;
use std::sync::atomic::{AtomicI32, Ordering};

use crossbeam_channel::{Receiver, Sender, unbounded};
use parking_lot::Mutex;

use std::thread::JoinHandle;

/// The signals taken over: Ctrl-C, and the stop signal of systemd, Docker
/// and Kubernetes.
const SIGNALS: [libc::c_int; 2] = [libc::SIGINT, libc::SIGTERM];

/// Written to the pipe by the last unsubscribe: the reader thread exits.
const QUIT: u8 = 0;

/// The pipe's write end, for the handler (-1: none).
static WRITE_FD: AtomicI32 = AtomicI32::new(-1);

/// The process's one listener while anyone subscribes.
static LISTENER: Mutex<Option<Listener>> = Mutex::new(None);

struct Listener {
    subscribers: Vec<(u64, Sender<libc::c_int>)>,
    next_id: u64,
    /// The signals whose handler we installed, with what was there before.
    previous: Vec<(libc::c_int, libc::sigaction)>,
    read_fd: libc::c_int,
    write_fd: libc::c_int,
    reader: Option<JoinHandle<()>>,
}

/// Receives SIGINT and SIGTERM while it lives (those whose disposition was
/// the default when the first subscription began).
pub(crate) struct Subscription {
    id: u64,
    pub(crate) signals: Receiver<libc::c_int>,
}

extern "C" fn on_signal(signal: libc::c_int) {
    let fd = WRITE_FD.load(Ordering::Relaxed);
    if fd >= 0 {
        let errno = errno::get();
        let byte = signal as u8;
        // SAFETY: write(2) is async-signal-safe; a full pipe (non-blocking)
        // loses this signal, and the reader has many to read already.
        unsafe { libc::write(fd, (&raw const byte).cast(), 1) };
        errno::set(errno);
    }
}

/// Starts receiving SIGINT and SIGTERM.
pub(crate) fn subscribe() -> io::Result<Subscription> {
    let mut listener = LISTENER.lock();
    if listener.is_none() {
        *listener = Some(Listener::start()?);
    }
    let listener = listener.as_mut().expect("just made");
    let (tx, rx) = unbounded();
    let id = listener.next_id;
    listener.next_id += 1;
    listener.subscribers.push((id, tx));
    Ok(Subscription { id, signals: rx })
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut guard = LISTENER.lock();
        let Some(listener) = guard.as_mut() else { return };
        listener.subscribers.retain(|(id, _)| *id != self.id);
        if listener.subscribers.is_empty() {
            let listener = guard.take().expect("checked");
            drop(guard);
            listener.stop();
        }
    }
}

impl Listener {
    fn start() -> io::Result<Self> {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors. (Not `pipe2`:
        // macOS has none.)
        if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let [read_fd, write_fd] = fds;
        // Not inherited by programs this process runs; and the handler
        // must never block on a full pipe.
        // SAFETY: plain fcntl on descriptors we own.
        unsafe {
            libc::fcntl(read_fd, libc::F_SETFD, libc::FD_CLOEXEC);
            libc::fcntl(write_fd, libc::F_SETFD, libc::FD_CLOEXEC);
            libc::fcntl(write_fd, libc::F_SETFL, libc::O_NONBLOCK);
        }
        // A plain thread, not `thread::spawn_named`: it only forwards bytes,
        // nothing for the shuttle models to explore.
        let reader = std::thread::Builder::new().name("reconq-signals".into()).spawn(move || read_signals(read_fd));
        let reader = match reader {
            Ok(reader) => reader,
            Err(e) => {
                close_pipe(read_fd, write_fd);
                return Err(e);
            }
        };
        WRITE_FD.store(write_fd, Ordering::SeqCst);
        let mut listener = Listener {
            subscribers: Vec::new(),
            next_id: 0,
            previous: Vec::new(),
            read_fd,
            write_fd,
            reader: Some(reader),
        };
        for signal in SIGNALS {
            match take_over_if_default(signal) {
                Ok(Some(previous)) => listener.previous.push((signal, previous)),
                Ok(None) => {}
                Err(e) => {
                    listener.stop();
                    return Err(e);
                }
            }
        }
        Ok(listener)
    }

    /// Puts the previous dispositions back, ends the reader thread and
    /// closes the pipe.
    fn stop(mut self) {
        for (signal, previous) in self.previous.drain(..) {
            // SAFETY: restores a disposition sigaction gave us.
            unsafe { libc::sigaction(signal, &previous, std::ptr::null_mut()) };
        }
        WRITE_FD.store(-1, Ordering::SeqCst);
        let quit = QUIT;
        // SAFETY: writes one byte to our own pipe.
        unsafe { libc::write(self.write_fd, (&raw const quit).cast(), 1) };
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        close_pipe(self.read_fd, self.write_fd);
    }
}

fn close_pipe(read_fd: libc::c_int, write_fd: libc::c_int) {
    // SAFETY: closes descriptors we own, once.
    unsafe {
        libc::close(read_fd);
        libc::close(write_fd);
    }
}

/// Installs [`on_signal`] for `signal` if its disposition is the default;
/// returns the previous disposition if it did.
fn take_over_if_default(signal: libc::c_int) -> io::Result<Option<libc::sigaction>> {
    // SAFETY: sigaction with a null new action only reads the current one;
    // the struct is plain data, zero is a valid start.
    unsafe {
        let mut current: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(signal, std::ptr::null(), &mut current) != 0 {
            return Err(io::Error::last_os_error());
        }
        if current.sa_sigaction != libc::SIG_DFL {
            return Ok(None);
        }
        let mut ours: libc::sigaction = std::mem::zeroed();
        ours.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        ours.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut ours.sa_mask);
        let mut previous: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(signal, &ours, &mut previous) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Some(previous))
    }
}

/// The reader thread: forwards each signal read from the pipe to every
/// subscriber, until [`QUIT`].
fn read_signals(read_fd: libc::c_int) {
    loop {
        let mut byte = 0u8;
        // SAFETY: reads one byte into `byte`.
        let n = unsafe { libc::read(read_fd, (&raw mut byte).cast(), 1) };
        if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        if n != 1 || byte == QUIT {
            return;
        }
        // The last subscriber takes the listener out before it joins this
        // thread, so this lock is never held while waiting for us.
        let subscribers: Vec<Sender<libc::c_int>> =
            LISTENER.lock().iter().flat_map(|l| l.subscribers.iter().map(|(_, tx)| tx.clone())).collect();
        for tx in subscribers {
            let _ = tx.send(libc::c_int::from(byte));
        }
    }
}

/// The calling thread's `errno`, kept across the handler so the code it
/// interrupted sees its own.
mod errno {
    #[cfg(target_os = "linux")]
    fn location() -> *mut libc::c_int {
        // SAFETY: glibc and musl return this thread's errno.
        unsafe { libc::__errno_location() }
    }

    #[cfg(not(target_os = "linux"))]
    fn location() -> *mut libc::c_int {
        // SAFETY: the BSDs' and macOS's per-thread errno.
        unsafe { libc::__error() }
    }

    pub(super) fn get() -> libc::c_int {
        // SAFETY: a valid pointer to this thread's errno.
        unsafe { *location() }
    }

    pub(super) fn set(value: libc::c_int) {
        // SAFETY: as above.
        unsafe { *location() = value }
    }
}
