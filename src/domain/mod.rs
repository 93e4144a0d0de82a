//! Validated types and pure rules: names, paths, drive and run specs. No I/O.

pub mod copy;
pub mod digest;
pub mod drive;
pub mod field;
pub mod grant;
pub mod image;
pub mod log_budget;
pub mod machine;
pub mod meta;
pub mod name;
pub mod path;
pub mod progress;
pub mod quantity;
pub mod restart;
pub mod role;
pub mod run;
pub mod task;

pub use field::{FieldError, Problems};
pub use name::Name;
