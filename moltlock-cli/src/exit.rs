//! How `moltlock` exits: the status codes and the failure it reports.

/// The command ran and exited with this status.
pub const EXIT_OK: u8 = 0;
/// The command line cannot work (unknown option, bad duration, a `--grace`
/// that does not fit the TTL, an in-memory store for `run`, `--fair` on a
/// store without a fair queue): `EX_USAGE` of sysexits.h.
pub const EXIT_USAGE: u8 = 64;
/// A store error (connection refused, bad URL, bad key) or an internal one.
pub const EXIT_ERROR: u8 = 70;
/// `--no-wait` and the lock was held elsewhere.
pub const EXIT_BUSY: u8 = 75;
/// Waiting for the lock took longer than `--timeout`.
pub const EXIT_TIMEOUT: u8 = 124;
/// The lock was lost while the command ran; the command was stopped.
pub const EXIT_LOST: u8 = 125;

/// A failure to report: a message for stderr and the status to exit with.
#[derive(Debug)]
pub struct Failure {
    pub(crate) code: u8,
    pub(crate) message: String,
}

impl Failure {
    /// A usage error (status 64).
    pub fn usage(message: impl Into<String>) -> Self {
        Self {
            code: EXIT_USAGE,
            message: message.into(),
        }
    }

    /// A store or internal error (status 70).
    pub fn error(message: impl Into<String>) -> Self {
        Self {
            code: EXIT_ERROR,
            message: message.into(),
        }
    }
}

impl From<moltlock::Error> for Failure {
    fn from(e: moltlock::Error) -> Self {
        Self::error(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_are_distinct() {
        let codes = [
            EXIT_OK,
            EXIT_USAGE,
            EXIT_ERROR,
            EXIT_BUSY,
            EXIT_TIMEOUT,
            EXIT_LOST,
        ];
        let set: std::collections::HashSet<u8> = codes.into_iter().collect();
        assert_eq!(set.len(), codes.len());
    }
}
