//! Credentials: the server's signing key, bearer tokens (JWT, EdDSA) and sealed secrets.

pub mod issue;
pub mod keys;
pub mod machine;
pub mod public;
pub mod recent;
pub mod seal;
pub mod token;
pub mod transfer;
pub mod verified;

pub use keys::Keys;
pub use public::PublicKeys;
pub use token::{Claims, TokenError};
