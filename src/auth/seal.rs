//! Sealing secret values at rest with ChaCha20-Poly1305, so a database dump holds none of them.

use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng};
use chacha20poly1305::{ChaCha20Poly1305, Nonce};

use super::Keys;

const NONCE_LEN: usize = 12;

/// `nonce || ciphertext` of `plain`.
pub fn seal(keys: &Keys, plain: &[u8]) -> Vec<u8> {
    let cipher = ChaCha20Poly1305::new((&keys.seal).into());
    let nonce = ChaCha20Poly1305::generate_nonce(&mut OsRng);
    let mut out = nonce.to_vec();
    out.extend(cipher.encrypt(&nonce, plain).expect("encrypting into memory cannot fail"));
    out
}

/// Opens what [`seal`] wrote; `None` when it was sealed with another key or altered.
pub fn open(keys: &Keys, sealed: &[u8]) -> Option<Vec<u8>> {
    if sealed.len() < NONCE_LEN {
        return None;
    }
    let (nonce, body) = sealed.split_at(NONCE_LEN);
    ChaCha20Poly1305::new((&keys.seal).into()).decrypt(Nonce::from_slice(nonce), body).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_values_open_only_with_their_key() {
        let keys = Keys::from_pem(&Keys::generate_pem().unwrap()).unwrap();
        let sealed = seal(&keys, b"hf_secret_value");
        assert!(!sealed.windows(6).any(|w| w == b"secret"));
        assert_eq!(open(&keys, &sealed).unwrap(), b"hf_secret_value");
        let other = Keys::from_pem(&Keys::generate_pem().unwrap()).unwrap();
        assert!(open(&other, &sealed).is_none());
        let mut tampered = sealed.clone();
        *tampered.last_mut().unwrap() ^= 1;
        assert!(open(&keys, &tampered).is_none());
    }
}
