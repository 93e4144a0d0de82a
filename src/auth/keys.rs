//! The server's keys: a file of Ed25519 PKCS#8 PEM blocks, oldest first.
//!
//! The newest key signs tokens and seals secrets; older ones still verify what they signed and
//! open what they sealed until their block is deleted from the file. Every replica that shares
//! the file accepts the same tokens and opens the same secrets.
//!
//! Each key's sealing key is derived from its secret with HKDF-SHA256 under a label of its own,
//! rather than kept as a second key beside it: one secret per generation to back up and copy to
//! every replica, and a file written before sealing keys had a label of their own keeps working.

use std::path::Path;

use anyhow::{Context, bail};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ed25519_dalek::SigningKey;
use ed25519_dalek::pkcs8::{DecodePrivateKey, EncodePrivateKey, spki::der::pem::LineEnding};
use hkdf::Hkdf;
use jsonwebtoken::{DecodingKey, EncodingKey};
use sha2::{Digest, Sha256};

/// HKDF's `info` for the key that seals secrets.
const SEAL_LABEL: &[u8] = b"astraeus seal v1";
/// How values sealed before key ids were derived their key: kept to open them until resealed.
const LEGACY_SEAL_LABEL: &[u8] = b"astraeus secret sealing key v1";
/// The PEM label of an Ed25519 PKCS#8 private key.
const PEM_TAG: &str = "PRIVATE KEY";

/// One generation of the server's key.
pub struct Key {
    /// Named in tokens (`kid`) and beside sealed values: the first 8 bytes of the SHA-256 of
    /// the public key, in hex, so the id is the key's own and needs no bookkeeping.
    pub id: String,
    /// The Ed25519 public key: what agents are handed to check tokens with.
    pub(crate) public: [u8; 32],
    pub(crate) encoding: EncodingKey,
    pub(crate) decoding: DecodingKey,
    pub(crate) seal: [u8; 32],
    pub(crate) legacy_seal: [u8; 32],
}

impl Key {
    /// A key from its PKCS#8 DER.
    fn from_der(der: &[u8]) -> anyhow::Result<Key> {
        let signing = SigningKey::from_pkcs8_der(der).context("not an Ed25519 PKCS#8 private key")?;
        let public = signing.verifying_key();
        let id = key_id(public.as_bytes());
        let encoding = EncodingKey::from_ed_der(der);
        let decoding = DecodingKey::from_ed_components(&URL_SAFE_NO_PAD.encode(public.as_bytes()))
            .context("cannot derive the public key")?;
        let mut seal = [0u8; 32];
        Hkdf::<Sha256>::new(None, signing.as_bytes())
            .expand(SEAL_LABEL, &mut seal)
            .expect("32 bytes is a valid HKDF-SHA256 length");
        let legacy_seal =
            Sha256::new().chain_update(LEGACY_SEAL_LABEL).chain_update(signing.to_bytes()).finalize().into();
        Ok(Key { id, public: public.to_bytes(), encoding, decoding, seal, legacy_seal })
    }
}

/// The keys of the file, oldest first; never empty.
pub struct Keys {
    keys: Vec<Key>,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Keys({})", self.ids().collect::<Vec<_>>().join(", "))
    }
}

impl Keys {
    /// One or more PEM blocks, oldest first.
    pub fn from_pem(pem: &str) -> anyhow::Result<Keys> {
        let blocks = pem::parse_many(pem).context("not PEM")?;
        let mut keys: Vec<Key> = Vec::with_capacity(blocks.len());
        for (i, block) in blocks.iter().enumerate() {
            if block.tag() != PEM_TAG {
                bail!("block {} is a {:?}, not a {PEM_TAG:?}", i + 1, block.tag());
            }
            let key = Key::from_der(block.contents()).with_context(|| format!("block {}", i + 1))?;
            if keys.iter().any(|k| k.id == key.id) {
                bail!("key {} appears twice", key.id);
            }
            keys.push(key);
        }
        if keys.is_empty() {
            bail!("no Ed25519 PKCS#8 PEM private key");
        }
        Ok(Keys { keys })
    }

    pub fn load(path: &Path) -> anyhow::Result<Keys> {
        let pem = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the signing key {}", path.display()))?;
        Keys::from_pem(&pem).with_context(|| format!("bad signing key {}", path.display()))
    }

    /// The key that signs and seals.
    pub fn newest(&self) -> &Key {
        self.keys.last().expect("never empty")
    }

    /// The key that signed tokens without a `kid`: they were made before the file could hold
    /// more than one key, so by the one that comes first.
    pub fn oldest(&self) -> &Key {
        &self.keys[0]
    }

    pub fn get(&self, id: &str) -> Option<&Key> {
        self.keys.iter().find(|k| k.id == id)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Key> {
        self.keys.iter()
    }

    pub fn ids(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(|k| k.id.as_str())
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
        if path.exists() && !force {
            bail!("{} already exists (use --rotate to add a key, --force to replace it)", path.display());
        }
        write_private(path, &Keys::generate_pem()?)
    }

    /// Adds a new key after those of `path`, which then signs and seals; returns its id. The
    /// file is replaced whole, so a reader sees the old keys or all of the new ones.
    pub fn rotate_file(path: &Path) -> anyhow::Result<String> {
        let old = std::fs::read_to_string(path).with_context(|| {
            format!("cannot read {} (make the first key with keygen --out)", path.display())
        })?;
        Keys::from_pem(&old).with_context(|| format!("bad signing key {}", path.display()))?;
        let mut pem = old;
        if !pem.ends_with('\n') {
            pem.push('\n');
        }
        pem.push_str(&Keys::generate_pem()?);
        let id = Keys::from_pem(&pem)?.newest().id.clone();
        let tmp = path.with_extension("rotating");
        write_private(&tmp, &pem)?;
        std::fs::rename(&tmp, path).with_context(|| format!("cannot replace {}", path.display()))?;
        Ok(id)
    }
}

/// Writes `text` to a new file of mode 0600 at `path`, synced to disk.
fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
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
    file.write_all(text.as_bytes())?;
    file.sync_all()?;
    Ok(())
}

/// A key's id: the first 8 bytes of the SHA-256 of its public key, in hex.
pub(super) fn key_id(public: &[u8; 32]) -> String {
    hex(&Sha256::digest(public)[..8])
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_key_loads_with_the_same_id_and_sealing_key_each_time() {
        let pem = Keys::generate_pem().unwrap();
        let (a, b) = (Keys::from_pem(&pem).unwrap(), Keys::from_pem(&pem).unwrap());
        assert_eq!((&a.newest().id, a.newest().seal), (&b.newest().id, b.newest().seal));
        assert_eq!(a.newest().id.len(), 16);
        let other = Keys::from_pem(&Keys::generate_pem().unwrap()).unwrap();
        assert_ne!(a.newest().seal, other.newest().seal);
        assert_ne!(a.newest().id, other.newest().id);
        assert!(Keys::from_pem("not a key").is_err());
        assert!(Keys::from_pem("").is_err());
    }

    #[test]
    fn the_sealing_key_is_not_the_signing_secret_nor_the_legacy_derivation() {
        let pem = Keys::generate_pem().unwrap();
        let seed = SigningKey::from_pkcs8_pem(&pem).unwrap().to_bytes();
        let keys = Keys::from_pem(&pem).unwrap();
        assert_ne!(keys.newest().seal, seed);
        assert_ne!(keys.newest().seal, keys.newest().legacy_seal);
    }

    #[test]
    fn a_file_of_several_keys_signs_with_the_last_and_refuses_a_repeated_key() {
        let (first, second) = (Keys::generate_pem().unwrap(), Keys::generate_pem().unwrap());
        let one = Keys::from_pem(&first).unwrap();
        let both = Keys::from_pem(&format!("{first}{second}")).unwrap();
        assert_eq!(both.oldest().id, one.newest().id);
        assert_eq!(both.newest().id, Keys::from_pem(&second).unwrap().newest().id);
        assert_eq!(both.ids().count(), 2);
        assert!(both.get(&one.newest().id).is_some());
        assert!(both.get("0000000000000000").is_none());
        let twice = Keys::from_pem(&format!("{first}{first}")).unwrap_err();
        assert!(format!("{twice:#}").contains("appears twice"), "{twice:#}");
        let public = "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n";
        assert!(Keys::from_pem(&format!("{first}{public}")).is_err());
    }

    #[test]
    fn rotating_a_file_keeps_its_keys_and_adds_a_newest_one() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key.pem");
        assert!(Keys::rotate_file(&path).is_err(), "there is nothing to rotate");
        Keys::generate_file(&path, false).unwrap();
        let before = Keys::load(&path).unwrap();
        let id = Keys::rotate_file(&path).unwrap();
        let after = Keys::load(&path).unwrap();
        assert_eq!(after.ids().collect::<Vec<_>>(), [before.newest().id.as_str(), id.as_str()]);
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert!(Keys::generate_file(&path, false).is_err(), "a key file is not replaced by mistake");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "no file is left beside it");
    }
}
