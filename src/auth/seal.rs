//! Sealing secret values at rest with ChaCha20-Poly1305, so a database dump holds none of them.
//!
//! A value is sealed with the newest key's sealing key, and bound to its row (workspace id and
//! secret name, as associated data): copied into another row, it does not open. The row keeps the
//! id of the key beside the value. A value without a key id was sealed before ids existed, with
//! no associated data and the older derivation; it opens until the resealer rewrites it.

use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Nonce};
use uuid::Uuid;

use super::Keys;

const NONCE_LEN: usize = 12;
/// Starts the associated data, so that it can change meaning in a later version.
const AAD_LABEL: &[u8] = b"astraeus secret v1\0";

/// The row a value belongs to.
#[derive(Debug, Clone, Copy)]
pub struct Row<'a> {
    pub workspace: Uuid,
    pub name: &'a str,
}

impl Row<'_> {
    /// The label, the 16 bytes of the workspace id, then the name: the id's length is fixed,
    /// so no two rows give the same bytes.
    fn associated_data(&self) -> Vec<u8> {
        let mut aad = AAD_LABEL.to_vec();
        aad.extend_from_slice(self.workspace.as_bytes());
        aad.extend_from_slice(self.name.as_bytes());
        aad
    }
}

/// A sealed value and the id of the key that sealed it.
#[derive(Debug, Clone, PartialEq)]
pub struct Sealed {
    pub key_id: String,
    /// `nonce || ciphertext`.
    pub bytes: Vec<u8>,
}

/// Why a value did not open. Neither names anything of the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    #[error("it is sealed with key {0}, which this server does not hold")]
    UnknownKey(String),
    #[error("it was altered or belongs to another secret")]
    Refused,
}

/// Seals `plain` for `row` with the newest key.
pub fn seal(keys: &Keys, row: Row<'_>, plain: &[u8]) -> Sealed {
    let key = keys.newest();
    let cipher = ChaCha20Poly1305::new((&key.seal).into());
    let nonce = ChaCha20Poly1305::generate_nonce(&mut OsRng);
    let aad = row.associated_data();
    let mut bytes = nonce.to_vec();
    bytes.extend(
        cipher
            .encrypt(&nonce, Payload { msg: plain, aad: &aad })
            .expect("encrypting into memory cannot fail"),
    );
    Sealed { key_id: key.id.clone(), bytes }
}

/// Opens what was sealed for `row` with key `key_id`, or, without one, a value sealed before
/// key ids with any key of the file.
pub fn open(keys: &Keys, row: Row<'_>, key_id: Option<&str>, sealed: &[u8]) -> Result<Vec<u8>, OpenError> {
    if sealed.len() < NONCE_LEN {
        return Err(OpenError::Refused);
    }
    let (nonce, body) = sealed.split_at(NONCE_LEN);
    let nonce = Nonce::from_slice(nonce);
    match key_id {
        Some(id) => {
            let key = keys.get(id).ok_or_else(|| OpenError::UnknownKey(id.to_owned()))?;
            let aad = row.associated_data();
            ChaCha20Poly1305::new((&key.seal).into())
                .decrypt(nonce, Payload { msg: body, aad: &aad })
                .map_err(|_| OpenError::Refused)
        }
        None => keys
            .iter()
            .find_map(|key| ChaCha20Poly1305::new((&key.legacy_seal).into()).decrypt(nonce, body).ok())
            .ok_or(OpenError::Refused),
    }
}

/// `sealed` sealed again for `row` with the newest key; `None` when it already is.
pub fn reseal(
    keys: &Keys,
    row: Row<'_>,
    key_id: Option<&str>,
    sealed: &[u8],
) -> Result<Option<Sealed>, OpenError> {
    if key_id == Some(keys.newest().id.as_str()) {
        return Ok(None);
    }
    open(keys, row, key_id, sealed).map(|plain| Some(seal(keys, row, &plain)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> Keys {
        Keys::from_pem(&Keys::generate_pem().unwrap()).unwrap()
    }

    /// What the server wrote before key ids: no associated data, the older derivation.
    fn legacy_seal(keys: &Keys, plain: &[u8]) -> Vec<u8> {
        let cipher = ChaCha20Poly1305::new((&keys.newest().legacy_seal).into());
        let nonce = ChaCha20Poly1305::generate_nonce(&mut OsRng);
        let mut out = nonce.to_vec();
        out.extend(cipher.encrypt(&nonce, plain).unwrap());
        out
    }

    #[test]
    fn sealed_values_open_only_with_their_key_and_row() {
        let keys = keys();
        let row = Row { workspace: Uuid::now_v7(), name: "hf" };
        let sealed = seal(&keys, row, b"hf_secret_value");
        assert_eq!(sealed.key_id, keys.newest().id);
        assert!(!sealed.bytes.windows(6).any(|w| w == b"secret"));
        let id = Some(sealed.key_id.as_str());
        assert_eq!(open(&keys, row, id, &sealed.bytes).unwrap(), b"hf_secret_value");

        let other_workspace = Row { workspace: Uuid::now_v7(), ..row };
        let other_name = Row { name: "hf2", ..row };
        for moved in [other_workspace, other_name] {
            assert_eq!(open(&keys, moved, id, &sealed.bytes), Err(OpenError::Refused), "{moved:?}");
        }
        let mut tampered = sealed.bytes.clone();
        *tampered.last_mut().unwrap() ^= 1;
        assert_eq!(open(&keys, row, id, &tampered), Err(OpenError::Refused));
        assert_eq!(open(&keys, row, id, &sealed.bytes[..5]), Err(OpenError::Refused));
        let other = self::keys();
        let unknown = Err(OpenError::UnknownKey(sealed.key_id.clone()));
        assert_eq!(open(&other, row, id, &sealed.bytes), unknown);
        assert_eq!(open(&keys, row, None, &sealed.bytes), Err(OpenError::Refused), "not a legacy value");
    }

    #[test]
    fn a_value_sealed_before_key_ids_opens_once_and_is_resealed_for_its_row() {
        let (old_pem, new_pem) = (Keys::generate_pem().unwrap(), Keys::generate_pem().unwrap());
        let old = Keys::from_pem(&old_pem).unwrap();
        let rotated = Keys::from_pem(&format!("{old_pem}{new_pem}")).unwrap();
        let row = Row { workspace: Uuid::now_v7(), name: "hf" };
        let legacy = legacy_seal(&old, b"v");
        assert_eq!(open(&rotated, row, None, &legacy).unwrap(), b"v");
        let resealed = reseal(&rotated, row, None, &legacy).unwrap().unwrap();
        assert_eq!(resealed.key_id, rotated.newest().id);
        assert_eq!(open(&rotated, row, Some(&resealed.key_id), &resealed.bytes).unwrap(), b"v");
        assert_eq!(reseal(&rotated, row, Some(&resealed.key_id), &resealed.bytes), Ok(None));

        // Sealed before the rotation, with the old key's id.
        let before = seal(&old, row, b"w");
        let again = reseal(&rotated, row, Some(&before.key_id), &before.bytes).unwrap().unwrap();
        assert_eq!(open(&rotated, row, Some(&again.key_id), &again.bytes).unwrap(), b"w");
        let mut tampered = before.bytes.clone();
        tampered[NONCE_LEN] ^= 1;
        assert_eq!(reseal(&rotated, row, Some(&before.key_id), &tampered), Err(OpenError::Refused));
    }
}
