//! Control loops besides the scheduler. Each is level-triggered and safe to run on every replica.

pub mod drain;
pub mod fill;
pub mod janitor;
pub mod liveness;
pub mod pressure;
pub mod reseal;
pub mod restart;
