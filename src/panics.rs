//! The text of a caught panic, for logs, stats and the status: the
//! controller, the manager and caches catch user code's panics and report
//! them the same way.

use std::any::Any;

/// The message of a panic payload (`panic!("...")` gives a `&str` or a
/// `String`; anything else gets a generic text).
pub(crate) fn message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-string payload".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use std::panic::catch_unwind;

    #[test]
    fn a_str_a_string_or_anything_else() {
        let message = |f: fn()| super::message(&*catch_unwind(f).unwrap_err());
        assert_eq!(message(|| panic!("boom")), "boom");
        assert_eq!(message(|| panic!("{} {}", "formatted", 1)), "formatted 1");
        assert_eq!(message(|| std::panic::panic_any(7u8)), "panic with a non-string payload");
    }
}
