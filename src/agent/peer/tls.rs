//! TLS on the data port: the holder's certificate and key (`--data-tls-cert`, `--data-tls-key`),
//! and whom a pull from an `https://` holder trusts (the CAs of `--data-tls-ca`, else the
//! system's roots). Certificates are always verified, the holder's address included.
//!
//! The files are read once, at start, so that one that cannot be used stops the agent with its
//! flag named rather than fail every transfer later. Parsing and checking are apart from the
//! reading: they take the files' bytes.

use std::io::Read;
use std::net::IpAddr;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use rustls::client::{ClientConfig, verify_server_name};
use rustls::crypto::{CryptoProvider, ring};
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::{ParsedCertificate, ServerConfig};
use rustls::{InconsistentKeys, RootCertStore};

pub const CERT_FLAG: &str = "--data-tls-cert";
pub const KEY_FLAG: &str = "--data-tls-key";
pub const CA_FLAG: &str = "--data-tls-ca";

/// Bytes read of a PEM file at most: a system's whole CA bundle is a fraction of it, and a
/// huge file given by mistake is refused rather than read on.
const MAX_PEM_BYTES: u64 = 4 << 20;
/// The only protocol the data port speaks: its receivers stream files over HTTP/1.1.
const ALPN: &[u8] = b"http/1.1";

/// A file's bytes, with the flag and path that named it for errors.
pub struct PemFile<'a> {
    pub flag: &'static str,
    pub path: &'a Path,
    pub bytes: Vec<u8>,
}

impl<'a> PemFile<'a> {
    /// Reads `path`, given with `flag`.
    pub fn read(flag: &'static str, path: &'a Path) -> Result<PemFile<'a>, String> {
        let cannot = |e: std::io::Error| format!("{flag} {}: cannot read it: {e}", path.display());
        // A device or a fifo given by mistake would be read on, or wait for a writer.
        if !std::fs::metadata(path).map_err(cannot)?.is_file() {
            return Err(format!("{flag} {}: not a file", path.display()));
        }
        let file = std::fs::File::open(path).map_err(cannot)?;
        let mut bytes = Vec::new();
        file.take(MAX_PEM_BYTES + 1).read_to_end(&mut bytes).map_err(cannot)?;
        if bytes.len() as u64 > MAX_PEM_BYTES {
            return Err(format!(
                "{flag} {}: larger than {MAX_PEM_BYTES} bytes: not a PEM file",
                path.display()
            ));
        }
        Ok(PemFile { flag, path, bytes })
    }

    fn error(&self, why: impl std::fmt::Display) -> String {
        format!("{} {}: {why}", self.flag, self.path.display())
    }

    /// Every certificate in the file, in order; at least one.
    fn certificates(&self) -> Result<Vec<CertificateDer<'static>>, String> {
        let found: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(&self.bytes).collect();
        let found = found.map_err(|e| self.error(not_pem(e)))?;
        if found.is_empty() {
            return Err(self.error("holds no PEM certificate (-----BEGIN CERTIFICATE-----)"));
        }
        Ok(found)
    }

    /// The file's private key: its first, PKCS#8, PKCS#1 or SEC1, unencrypted.
    fn private_key(&self) -> Result<PrivateKeyDer<'static>, String> {
        PrivateKeyDer::from_pem_slice(&self.bytes).map_err(|e| match e {
            pem::Error::NoItemsFound => {
                self.error("holds no unencrypted PEM private key (PKCS#8, PKCS#1 or SEC1)")
            }
            e => self.error(not_pem(e)),
        })
    }
}

fn not_pem(e: pem::Error) -> String {
    match e {
        pem::Error::MissingSectionEnd { .. } => "not valid PEM: a section has no END line".into(),
        pem::Error::IllegalSectionStart { .. } => "not valid PEM: a BEGIN line is malformed".into(),
        pem::Error::Base64Decode(_) => "not valid PEM: a section is not base64".into(),
        e => format!("not valid PEM: {e}"),
    }
}

/// ring: rustls deprecates it for having no post-quantum key exchange, but aws-lc-rs, which has
/// one, needs cmake to build. Named explicitly, as no process-wide default is installed.
#[allow(deprecated)]
fn provider() -> Arc<CryptoProvider> {
    Arc::new(ring::default_provider())
}

/// The data port's TLS from `--data-tls-cert` and `--data-tls-key`: both or neither. `listen`
/// is the address peers reach the port at (`--data-listen`): a certificate that does not name
/// it would be refused by every peer, so it is refused here first.
pub fn server_from_args(
    cert: Option<&Path>,
    key: Option<&Path>,
    listen: Option<IpAddr>,
) -> Result<Option<Arc<ServerConfig>>, String> {
    let (cert, key) = match (cert, key) {
        (None, None) => return Ok(None),
        (Some(cert), Some(key)) => (cert, key),
        (Some(_), None) => return Err(format!("{CERT_FLAG} needs {KEY_FLAG}: give both, or neither")),
        (None, Some(_)) => return Err(format!("{KEY_FLAG} needs {CERT_FLAG}: give both, or neither")),
    };
    let (cert, key) = (PemFile::read(CERT_FLAG, cert)?, PemFile::read(KEY_FLAG, key)?);
    server(&cert, &key, listen).map(|config| Some(Arc::new(config)))
}

/// A server config that presents `cert`'s chain (the data port's own certificate first) with
/// `key`, its private key; valid for `listen` when that is a single address.
pub fn server(cert: &PemFile, key: &PemFile, listen: Option<IpAddr>) -> Result<ServerConfig, String> {
    let chain = cert.certificates()?;
    let private = key.private_key()?;
    let parsed = ParsedCertificate::try_from(&chain[0])
        .map_err(|e| cert.error(format!("its first certificate cannot be read: {e}")))?;
    if let Some(ip) = listen.filter(|ip| !ip.is_unspecified()) {
        verify_server_name(&parsed, &ServerName::IpAddress(ip.into())).map_err(|_| {
            cert.error(format!(
                "not valid for {ip}, where peers reach the data port (--data-listen): it needs {ip} among its subject alternative names"
            ))
        })?;
    }
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_no_client_auth();
    let mut config = builder.with_single_cert(chain, private).map_err(|e| match e {
        rustls::Error::InconsistentKeys(InconsistentKeys::KeyMismatch) => format!(
            "{KEY_FLAG} {} is not the key of the certificate in {CERT_FLAG} {}",
            key.path.display(),
            cert.path.display()
        ),
        e => key.error(format!("cannot be used with {CERT_FLAG} {}: {e}", cert.path.display())),
    })?;
    config.alpn_protocols = vec![ALPN.to_vec()];
    Ok(config)
}

/// Whom a pull from an `https://` holder trusts. Either way the holder's certificate is
/// verified, and must name the address the pull connects to.
#[derive(Debug, Clone, Default)]
pub enum Trust {
    /// The system's roots, read when a pull first needs them.
    #[default]
    System,
    /// The CAs of `--data-tls-ca` alone.
    Cas(Arc<ClientConfig>),
}

impl Trust {
    /// The CAs of `--data-tls-ca`, else the system's roots.
    pub fn from_args(ca: Option<&Path>) -> Result<Trust, String> {
        match ca {
            None => Ok(Trust::System),
            Some(path) => Trust::cas(&PemFile::read(CA_FLAG, path)?),
        }
    }

    /// The CAs of a PEM bundle.
    pub fn cas(bundle: &PemFile) -> Result<Trust, String> {
        let mut roots = RootCertStore::empty();
        for (n, cert) in bundle.certificates()?.into_iter().enumerate() {
            roots
                .add(cert)
                .map_err(|e| bundle.error(format!("certificate {} cannot be a CA: {e}", n + 1)))?;
        }
        Ok(Trust::Cas(client(roots)))
    }

    /// The client config a pull over TLS uses.
    pub(super) fn client_config(&self) -> Arc<ClientConfig> {
        match self {
            Trust::Cas(config) => config.clone(),
            Trust::System => system().clone(),
        }
    }
}

/// The system's roots, read once. None found leaves none: every holder is refused, with the
/// verifier's reason, rather than any trusted.
fn system() -> &'static Arc<ClientConfig> {
    static SYSTEM: OnceLock<Arc<ClientConfig>> = OnceLock::new();
    SYSTEM.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        let mut roots = RootCertStore::empty();
        let (added, _) = roots.add_parsable_certificates(found.certs);
        if added == 0 {
            let errors: Vec<String> = found.errors.iter().map(|e| e.to_string()).collect();
            tracing::warn!(?errors, "no system root certificates: pulls from https:// data ports are refused unless {CA_FLAG} names their CA");
        }
        client(roots)
    })
}

fn client(roots: RootCertStore) -> Arc<ClientConfig> {
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![ALPN.to_vec()];
    Arc::new(config)
}

/// The reason a connection's TLS failed (a certificate refused, a handshake the holder broke
/// off), when that is what `e`'s causes say; `None` for any other failure. Such a failure is
/// the holder's or this machine's setup: trying again would fail the same way.
pub(super) fn failure(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut cause = Some(e);
    while let Some(e) = cause {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return Some(tls.to_string());
        }
        cause = match e.downcast_ref::<std::io::Error>() {
            // An io::Error's `source` skips the error it wraps (itself often an io::Error).
            Some(io) => io.get_ref().map(|inner| inner as &(dyn std::error::Error + 'static)),
            None => e.source(),
        };
    }
    None
}

#[cfg(test)]
pub(super) mod testing {
    //! A CA made at test time, and certificates it signs.

    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

    pub struct Ca {
        /// The CA's own certificate, PEM.
        pub pem: String,
        issuer: Issuer<'static, KeyPair>,
    }

    impl Ca {
        pub fn new(name: &str) -> Ca {
            let key = KeyPair::generate().unwrap();
            let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.distinguished_name.push(DnType::CommonName, name);
            let pem = params.self_signed(&key).unwrap().pem();
            Ca { pem, issuer: Issuer::new(params, key) }
        }

        /// A certificate for `names` (IP addresses or DNS names) and its key, PEM.
        pub fn issue(&self, names: &[&str]) -> (String, String) {
            let key = KeyPair::generate().unwrap();
            let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
            let cert = CertificateParams::new(names).unwrap().signed_by(&key, &self.issuer).unwrap();
            (cert.pem(), key.serialize_pem())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::Ca;
    use super::*;

    fn file<'a>(flag: &'static str, path: &'a Path, bytes: &str) -> PemFile<'a> {
        PemFile { flag, path, bytes: bytes.as_bytes().to_vec() }
    }

    #[test]
    fn the_cert_and_key_flags_go_together_or_not_at_all() {
        let (cert, key) = (Path::new("/etc/astraeus/data.crt"), Path::new("/etc/astraeus/data.key"));
        assert!(server_from_args(None, None, None).unwrap().is_none());
        let err = server_from_args(Some(cert), None, None).unwrap_err();
        assert_eq!(err, "--data-tls-cert needs --data-tls-key: give both, or neither");
        let err = server_from_args(None, Some(key), None).unwrap_err();
        assert_eq!(err, "--data-tls-key needs --data-tls-cert: give both, or neither");
    }

    #[test]
    fn the_data_port_serves_tls_with_a_certificate_and_key_read_from_their_files() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = Ca::new("cluster data ports").issue(&["127.0.0.1"]);
        let (c, k) = (dir.path().join("data.crt"), dir.path().join("data.key"));
        std::fs::write(&c, cert).unwrap();
        std::fs::write(&k, key).unwrap();
        let listen = Some(IpAddr::from([127, 0, 0, 1]));
        let config = server_from_args(Some(&c), Some(&k), listen).unwrap().unwrap();
        assert_eq!(config.alpn_protocols, [b"http/1.1".to_vec()]);
        let missing = dir.path().join("missing.key");
        let err = server_from_args(Some(&c), Some(&missing), listen).unwrap_err();
        assert!(err.starts_with(&format!("--data-tls-key {}: cannot read it", missing.display())), "{err}");
    }

    #[test]
    fn a_tls_failure_is_told_apart_from_other_failed_connections() {
        use std::io::{Error, ErrorKind};
        let refused = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let why = "invalid peer certificate: UnknownIssuer";
        let wrapped = Error::other(Error::new(ErrorKind::InvalidData, refused.clone()));
        assert_eq!(failure(&refused).as_deref(), Some(why));
        assert_eq!(failure(&wrapped).as_deref(), Some(why));
        assert_eq!(failure(&Error::from(ErrorKind::ConnectionRefused)), None);
        assert_eq!(failure(&Error::other(Error::from(ErrorKind::ConnectionReset))), None);
    }

    #[test]
    fn a_file_that_is_missing_not_a_file_or_huge_is_refused_naming_its_flag() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let huge = dir.path().join("huge.pem");
        std::fs::File::create(&huge).unwrap().set_len(MAX_PEM_BYTES + 1).unwrap();
        let cases = [
            (missing.as_path(), "--data-tls-cert", "cannot read it: No such file or directory"),
            (dir.path(), "--data-tls-cert", "not a file"),
            (Path::new("/dev/zero"), "--data-tls-cert", "not a file"),
            (huge.as_path(), "--data-tls-cert", "larger than 4194304 bytes: not a PEM file"),
        ];
        for (path, flag, why) in cases {
            let err = PemFile::read(CERT_FLAG, path).err().unwrap();
            assert!(err.starts_with(&format!("{flag} {}: {why}", path.display())), "{err}");
        }
        let err = server_from_args(Some(&missing), Some(&missing), None).unwrap_err();
        assert!(err.starts_with("--data-tls-cert "), "{err}");
        let err = Trust::from_args(Some(&missing)).unwrap_err();
        assert!(err.starts_with(&format!("--data-tls-ca {}: cannot read it", missing.display())), "{err}");
    }

    #[test]
    fn certificates_and_keys_that_are_empty_not_pem_or_mismatched_are_refused_naming_the_flag() {
        let ca = Ca::new("cluster data ports");
        let (cert, key) = ca.issue(&["127.0.0.1"]);
        let (_, other_key) = ca.issue(&["127.0.0.1"]);
        let (c, k) = (Path::new("c.pem"), Path::new("k.pem"));
        let no_cert = "--data-tls-cert c.pem: holds no PEM certificate (-----BEGIN CERTIFICATE-----)";
        let no_key = "--data-tls-key k.pem: holds no unencrypted PEM private key (PKCS#8, PKCS#1 or SEC1)";
        let cut = &cert[..cert.len() - 30];
        let garbage = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        let encrypted = "-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n";
        let cases: [(&str, &str, &str); 10] = [
            ("", &key, no_cert),
            ("not a certificate\n", &key, no_cert),
            // The key given for both.
            (&key, &key, no_cert),
            (cut, &key, "--data-tls-cert c.pem: not valid PEM: a section has no END line"),
            (garbage, &key, "--data-tls-cert c.pem: its first certificate cannot be read"),
            (&cert, "", no_key),
            (&cert, "\u{0}\u{1}binary", no_key),
            (&cert, &cert, no_key),
            (&cert, encrypted, no_key),
            (
                &cert,
                &other_key,
                "--data-tls-key k.pem is not the key of the certificate in --data-tls-cert c.pem",
            ),
        ];
        for (cert_pem, key_pem, why) in cases {
            let err = server(&file(CERT_FLAG, c, cert_pem), &file(KEY_FLAG, k, key_pem), None).unwrap_err();
            assert!(err.starts_with(why), "{cert_pem:?} / {key_pem:?}: {err}");
        }
        assert!(server(&file(CERT_FLAG, c, &cert), &file(KEY_FLAG, k, &key), None).is_ok());
        // A file holding the chain and the key serves for both flags.
        let both = format!("{cert}{key}");
        assert!(server(&file(CERT_FLAG, c, &both), &file(KEY_FLAG, k, &both), None).is_ok());
    }

    #[test]
    fn a_certificate_must_name_the_address_the_data_port_listens_on() {
        let ca = Ca::new("cluster data ports");
        let (cert, key) = ca.issue(&["10.0.0.5", "gpu-01.example"]);
        let (c, k) = (file(CERT_FLAG, Path::new("c.pem"), &cert), file(KEY_FLAG, Path::new("k.pem"), &key));
        let ip = |s: &str| Some(s.parse::<IpAddr>().unwrap());
        assert!(server(&c, &k, ip("10.0.0.5")).is_ok());
        // Listening on every address, the address peers use is not known here.
        assert!(server(&c, &k, ip("0.0.0.0")).is_ok());
        let err = server(&c, &k, ip("10.0.0.6")).unwrap_err();
        assert_eq!(
            err,
            "--data-tls-cert c.pem: not valid for 10.0.0.6, where peers reach the data port (--data-listen): it needs 10.0.0.6 among its subject alternative names"
        );
    }

    #[test]
    fn a_ca_bundle_must_hold_certificates_that_can_be_cas() {
        let (one, two) = (Ca::new("one"), Ca::new("two"));
        let path = Path::new("ca.pem");
        let bundle = format!("{}{}", one.pem, two.pem);
        assert!(matches!(Trust::cas(&file(CA_FLAG, path, &bundle)), Ok(Trust::Cas(_))));
        let cases = [
            ("", "--data-tls-ca ca.pem: holds no PEM certificate"),
            (
                "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
                "--data-tls-ca ca.pem: holds no PEM certificate",
            ),
            (
                "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
                "--data-tls-ca ca.pem: certificate 1 cannot be a CA",
            ),
        ];
        for (pem, why) in cases {
            let err = Trust::cas(&file(CA_FLAG, path, pem)).unwrap_err();
            assert!(err.starts_with(why), "{pem:?}: {err}");
        }
    }
}
