//! Credentials: the server's signing key, bearer tokens (JWT, EdDSA) and sealed secrets.

pub mod issue;
pub mod keys;
pub mod machine;
pub mod recent;
pub mod seal;
pub mod token;
pub mod verified;

pub use keys::Keys;
pub use token::{Claims, TokenError};
