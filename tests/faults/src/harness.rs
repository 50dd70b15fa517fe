//! Worker processes, the scenarios and the report table, under one name:
//! [`crate::workers`], [`crate::scenarios`] and [`crate::report`].

pub use crate::report::*;
pub use crate::scenarios::*;
pub use crate::workers::*;
