//! Mutual TLS between cluster members. A cluster CA issues every node's certificate
//! ([`ClusterCa`], `weir tune certs`); each side of a connection presents its own and accepts
//! only a peer whose certificate the cluster CA signed ([`TlsIdentity`]). There is no
//! unauthenticated mode: a peer without a certificate, or with one from another CA, is refused
//! during the handshake.
//!
//! The cryptography is *ring*'s (no C toolchain beyond what RocksDB needs, no cmake), with
//! TLS 1.3 only and AES-128-GCM preferred: records are encrypted on the shards, and it is the
//! cheapest suite with AES-NI (`docs/design/exchange.md`). rustls marks *ring*'s provider
//! deprecated only because it lacks post-quantum key exchange; a cluster that needs it
//! switches the provider here.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;

/// Why certificates cannot be made, read or used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file cannot be read.
    #[error(
        "cannot read the {what} {path}: {source}; create the cluster's certificates with \
         `weir tune certs`"
    )]
    Read {
        /// What the file should hold.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A PEM text that does not hold what it should.
    #[error("the {what} from {origin} is not usable: {detail}")]
    Pem {
        /// What it should hold.
        what: &'static str,
        /// Where it came from (a path, or "memory").
        origin: String,
        /// Why.
        detail: String,
    },
    /// rcgen cannot make a key or a certificate.
    #[error("cannot issue a certificate: {0}")]
    Issue(#[from] rcgen::Error),
    /// rustls refuses the identity (a key that is not the certificate's, say).
    #[error("the TLS identity from {origin} is refused: {detail}")]
    Config {
        /// Where it came from.
        origin: String,
        /// Why.
        detail: String,
    },
}

/// The crypto provider of every cluster connection: *ring*, AES-128-GCM first.
pub fn provider() -> Arc<CryptoProvider> {
    use rustls::crypto::ring::cipher_suite;
    #[allow(deprecated)] // deprecated for its lack of post-quantum key exchange; see above
    let mut provider = rustls::crypto::ring::default_provider();
    provider.cipher_suites = vec![
        cipher_suite::TLS13_AES_128_GCM_SHA256,
        cipher_suite::TLS13_AES_256_GCM_SHA384,
        cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
    ];
    Arc::new(provider)
}

/// A cluster's certificate authority: its certificate (every member trusts it) and its key
/// (kept by the operator, used only to issue nodes' certificates).
pub struct ClusterCa {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    cert_pem: String,
    key_pem: String,
}

impl ClusterCa {
    /// A new CA named `name` (its certificate's common name), valid for ten years.
    pub fn generate(name: &str) -> Result<ClusterCa, TlsError> {
        let key = rcgen::KeyPair::generate()?;
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(in_ten_years(), 1, 1);
        let cert_pem = params.self_signed(&key)?.pem();
        let key_pem = key.serialize_pem();
        Ok(ClusterCa {
            issuer: rcgen::Issuer::new(params, key),
            cert_pem,
            key_pem,
        })
    }

    /// The CA of a cluster made before, from its certificate and key.
    pub fn from_pem(cert_pem: &str, key_pem: &str, origin: &str) -> Result<ClusterCa, TlsError> {
        let pem = |what: &'static str, detail: String| TlsError::Pem {
            what,
            origin: origin.to_string(),
            detail,
        };
        let key = rcgen::KeyPair::from_pem(key_pem)
            .map_err(|e| pem("CA key", format!("{e} (expected a PKCS#8 PEM private key)")))?;
        let issuer = rcgen::Issuer::from_ca_cert_pem(cert_pem, key).map_err(|e| {
            pem(
                "CA certificate",
                format!("{e} (expected a PEM certificate)"),
            )
        })?;
        Ok(ClusterCa {
            issuer,
            cert_pem: cert_pem.to_string(),
            key_pem: key_pem.to_string(),
        })
    }

    /// The CA's certificate, PEM: every member's trust root.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA's private key, PEM: keep it off the cluster's hosts.
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// A certificate and key for the node `name`, valid under `name` and every one of
    /// `also` (host names or IP addresses its peers dial), for both sides of a connection.
    pub fn issue(&self, name: &str, also: &[String]) -> Result<NodeCertificate, TlsError> {
        let key = rcgen::KeyPair::generate()?;
        let mut names = vec![name.to_string()];
        names.extend(also.iter().filter(|n| *n != name).cloned());
        let mut params = rcgen::CertificateParams::new(names)?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(in_ten_years(), 1, 1);
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(NodeCertificate {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// Ten years from this year: when the certificates made now expire (on the 1st of January).
fn in_ten_years() -> i32 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    1970 + (now.as_secs() / 31_556_952) as i32 + 10
}

/// A node's certificate and private key, PEM.
pub struct NodeCertificate {
    /// The certificate, signed by the cluster CA.
    pub cert_pem: String,
    /// Its private key (PKCS#8).
    pub key_pem: String,
}

/// What a cluster member presents and trusts: its certificate chain and key, and the
/// cluster CA's certificate.
#[derive(Clone)]
pub struct TlsIdentity {
    ca: Vec<CertificateDer<'static>>,
    roots: Arc<RootCertStore>,
    chain: Vec<CertificateDer<'static>>,
    key: Arc<PrivateKeyDer<'static>>,
}

impl std::fmt::Debug for TlsIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsIdentity")
            .field("chain", &self.chain.len())
            .finish_non_exhaustive()
    }
}

impl TlsIdentity {
    /// An identity from PEM texts: the cluster CA's certificate, this node's certificate
    /// (chain) and its private key. `origin` names where they came from, for errors.
    pub fn from_pem(
        ca: &str,
        cert: &str,
        key: &str,
        origin: &str,
    ) -> Result<TlsIdentity, TlsError> {
        let pem = |what: &'static str, detail: String| TlsError::Pem {
            what,
            origin: origin.to_string(),
            detail,
        };
        let certs = |what: &'static str, text: &str| {
            let certs = CertificateDer::pem_slice_iter(text.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| pem(what, e.to_string()))?;
            if certs.is_empty() {
                return Err(pem(what, "no PEM certificate in it".into()));
            }
            Ok(certs)
        };
        let ca = certs("cluster CA certificate", ca)?;
        let mut roots = RootCertStore::empty();
        for root in &ca {
            roots
                .add(root.clone())
                .map_err(|e| pem("cluster CA certificate", e.to_string()))?;
        }
        let chain = certs("node certificate", cert)?;
        let key = PrivateKeyDer::from_pem_slice(key.as_bytes())
            .map_err(|e| pem("node key", format!("{e} (expected a PEM private key)")))?;
        let identity = TlsIdentity {
            ca,
            roots: Arc::new(roots),
            chain,
            key: Arc::new(key),
        };
        // Both configurations now, so that a key that does not match its certificate is
        // refused here, naming the files, not at the first connection.
        let refused = |e: rustls::Error| TlsError::Config {
            origin: origin.to_string(),
            detail: format!("{e} (is the key this certificate's?)"),
        };
        identity.server_config().map_err(refused)?;
        identity.client_config().map_err(refused)?;
        Ok(identity)
    }

    /// An identity from PEM files (`weir tune certs` writes them).
    pub fn from_files(ca: &Path, cert: &Path, key: &Path) -> Result<TlsIdentity, TlsError> {
        let read = |what: &'static str, path: &Path| {
            std::fs::read_to_string(path).map_err(|source| TlsError::Read {
                what,
                path: path.to_path_buf(),
                source,
            })
        };
        TlsIdentity::from_pem(
            &read("cluster CA certificate", ca)?,
            &read("node certificate", cert)?,
            &read("node key", key)?,
            &format!("{}, {} and {}", ca.display(), cert.display(), key.display()),
        )
    }

    /// The cluster CA's certificate(s): what this node trusts.
    pub fn ca(&self) -> &[CertificateDer<'static>] {
        &self.ca
    }

    /// This node's certificate chain.
    pub fn chain(&self) -> &[CertificateDer<'static>] {
        &self.chain
    }

    /// The server side: presents this node's certificate and requires the client's, signed
    /// by the cluster CA.
    pub fn server_config(&self) -> Result<rustls::ServerConfig, rustls::Error> {
        let provider = provider();
        let verifier =
            WebPkiClientVerifier::builder_with_provider(Arc::clone(&self.roots), provider.clone())
                .build()
                .map_err(|e| rustls::Error::General(e.to_string()))?;
        rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_client_cert_verifier(verifier)
            .with_single_cert(self.chain.clone(), self.key.clone_key())
    }

    /// The client side: trusts only the cluster CA and presents this node's certificate.
    pub fn client_config(&self) -> Result<rustls::ClientConfig, rustls::Error> {
        rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_root_certificates(Arc::clone(&self.roots))
            .with_client_auth_cert(self.chain.clone(), self.key.clone_key())
    }
}
