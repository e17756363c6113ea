//! Errors for arguments the engine refuses.

use std::fmt;

/// An argument out of its allowed range (a non-positive rate, a zero burst,
/// a zero worker count...). Nothing was changed by the refused call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidArgument {
    message: String,
}

impl InvalidArgument {
    pub(crate) fn new(message: impl Into<String>) -> Self {
        Self { message: message.into() }
    }
}

impl fmt::Display for InvalidArgument {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for InvalidArgument {}
