//! The server's Ed25519 signing key, kept in a PKCS#8 PEM file.
//!
//! Tokens are signed with it and the key that seals secrets is derived from it, so every
//! replica that shares the file accepts the same tokens and opens the same secrets.

use std::path::Path;

use anyhow::{Context, bail};
use base64::Engine;
use ed25519_dalek::SigningKey;
use ed25519_dalek::pkcs8::{DecodePrivateKey, EncodePrivateKey, spki::der::pem::LineEnding};
use jsonwebtoken::{DecodingKey, EncodingKey};
use sha2::{Digest, Sha256};

#[derive(Clone)]
pub struct Keys {
    pub(crate) encoding: EncodingKey,
    pub(crate) decoding: DecodingKey,
    pub(crate) seal: [u8; 32],
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keys(..)")
    }
}

impl Keys {
    pub fn from_pem(pem: &str) -> anyhow::Result<Keys> {
        let signing = SigningKey::from_pkcs8_pem(pem).context("not an Ed25519 PKCS#8 PEM private key")?;
        let public =
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(signing.verifying_key().as_bytes());
        let encoding = EncodingKey::from_ed_pem(pem.as_bytes()).context("cannot use the signing key")?;
        let decoding = DecodingKey::from_ed_components(&public).context("cannot derive the public key")?;
        let seal = Sha256::new()
            .chain_update(b"astraeus secret sealing key v1")
            .chain_update(signing.to_bytes())
            .finalize()
            .into();
        Ok(Keys { encoding, decoding, seal })
    }

    pub fn load(path: &Path) -> anyhow::Result<Keys> {
        let pem = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the signing key {}", path.display()))?;
        Keys::from_pem(&pem).with_context(|| format!("bad signing key {}", path.display()))
    }

    /// A new random key, as PEM.
    pub fn generate_pem() -> anyhow::Result<String> {
        let mut seed = [0u8; 32];
        getrandom::getrandom(&mut seed).context("no randomness from the OS")?;
        let pem =
            SigningKey::from_bytes(&seed).to_pkcs8_pem(LineEnding::LF).context("cannot encode the key")?;
        Ok(pem.to_string())
    }

    /// Writes a new key to `path` (mode 0600), refusing to replace one unless `force`.
    pub fn generate_file(path: &Path, force: bool) -> anyhow::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        if path.exists() && !force {
            bail!("{} already exists (use --force to replace it)", path.display());
        }
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)
            .with_context(|| format!("cannot write {}", path.display()))?;
        file.write_all(Keys::generate_pem()?.as_bytes())?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_key_loads_and_seals_deterministically() {
        let pem = Keys::generate_pem().unwrap();
        let (a, b) = (Keys::from_pem(&pem).unwrap(), Keys::from_pem(&pem).unwrap());
        assert_eq!(a.seal, b.seal);
        let other = Keys::from_pem(&Keys::generate_pem().unwrap()).unwrap();
        assert_ne!(a.seal, other.seal);
        assert!(Keys::from_pem("not a key").is_err());
    }
}
