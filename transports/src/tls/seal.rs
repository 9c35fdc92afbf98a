//! Record protection on the send side: records sealed where they will be
//! sent from.
//!
//! For the standard AES-GCM and ChaCha20-Poly1305 suites of TLS 1.3 and
//! 1.2 (every suite of rustls's `ring` provider, the one this crate builds
//! its configurations with), a record is written straight into the
//! connection's send buffer: header, plaintext, then ring's AEAD seals it
//! there and appends the tag. The provider's own encrypter would return
//! each record in a fresh allocation, to be copied once more into the send.
//! Records of any other suite, and those of a FIPS provider, go through
//! the provider's encrypter.
//!
//! The construction is RFC 8446 §5.2-5.3 for TLS 1.3 and RFC 5288 / RFC
//! 7905 for TLS 1.2's AES-GCM and ChaCha20-Poly1305; the in-memory tests
//! check every suite against rustls's own decrypters.

use bytes::{BufMut, BytesMut};
use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use rustls::crypto::cipher::{MessageEncrypter, OutboundChunks, OutboundPlainMessage};
use rustls::{ConnectionTrafficSecrets, ContentType, ProtocolVersion, SupportedCipherSuite};

use super::TlsFailure;

/// The record header's length.
const HEADER_LEN: usize = 5;
/// TLS 1.2 AES-GCM's explicit nonce, sent in each record.
const EXPLICIT_NONCE_LEN: usize = 8;
/// Every AEAD here has a 16-byte tag.
const TAG_LEN: usize = 16;
/// The version every record carries (TLS 1.3's legacy_record_version).
const RECORD_VERSION: [u8; 2] = [3, 3];

/// How records of a suite are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Form {
    /// The content type inside the ciphertext; the header as AAD.
    Tls13,
    /// TLS 1.2 AES-GCM: an explicit nonce before the ciphertext.
    Tls12Gcm,
    /// TLS 1.2 ChaCha20-Poly1305: the nonce implicit.
    Tls12Chacha,
}

/// Seals a connection's outgoing records under one key.
// It lives inside the boxed record layer: boxing the key schedule too
// would add a pointer chase per record for nothing.
#[allow(clippy::large_enum_variant)]
pub(super) enum Sealer {
    InPlace {
        key: LessSafeKey,
        iv: [u8; 12],
        form: Form,
    },
    Provider(Box<dyn MessageEncrypter>),
}

impl Sealer {
    pub(super) fn new(
        suite: SupportedCipherSuite,
        secrets: ConnectionTrafficSecrets,
        provider: impl FnOnce(ConnectionTrafficSecrets) -> Result<Box<dyn MessageEncrypter>, TlsFailure>,
    ) -> Result<Self, TlsFailure> {
        let Some((algorithm, form)) = ring_suite(suite) else {
            return provider(secrets).map(Sealer::Provider);
        };
        let (key, iv) = match &secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv }
            | ConnectionTrafficSecrets::Aes256Gcm { key, iv }
            | ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => (key, iv),
            _ => return provider(secrets).map(Sealer::Provider),
        };
        let (Ok(key), Ok(iv)) = (
            UnboundKey::new(algorithm, key.as_ref()),
            <[u8; 12]>::try_from(iv.as_ref()),
        ) else {
            return provider(secrets).map(Sealer::Provider);
        };
        Ok(Sealer::InPlace {
            key: LessSafeKey::new(key),
            iv,
            form,
        })
    }

    #[cfg(test)]
    pub(super) fn is_in_place(&self) -> bool {
        matches!(self, Sealer::InPlace { .. })
    }

    /// Bytes a record adds to its plaintext, at most.
    pub(super) const OVERHEAD: usize = HEADER_LEN + EXPLICIT_NONCE_LEN + 1 + TAG_LEN;

    /// Appends the record of `payload` (content type `typ`, sequence
    /// number `seq`) to `out`.
    pub(super) fn seal(
        &mut self,
        typ: ContentType,
        payload: &[u8],
        seq: u64,
        out: &mut BytesMut,
    ) -> Result<(), TlsFailure> {
        let (key, iv, form) = match self {
            Sealer::InPlace { key, iv, form } => (&*key, *iv, *form),
            Sealer::Provider(encrypter) => {
                let message = OutboundPlainMessage {
                    typ,
                    version: ProtocolVersion::TLSv1_2,
                    payload: OutboundChunks::Single(payload),
                };
                let record = encrypter
                    .encrypt(message, seq)
                    .map_err(|e| TlsFailure::Protocol(e.to_string()))?;
                out.extend_from_slice(&record.encode());
                return Ok(());
            }
        };
        let mut nonce = iv;
        for (n, s) in nonce[4..].iter_mut().zip(seq.to_be_bytes()) {
            *n ^= s;
        }
        let (outer_type, body_len) = match form {
            Form::Tls13 => (ContentType::ApplicationData, payload.len() + 1 + TAG_LEN),
            Form::Tls12Gcm => (typ, EXPLICIT_NONCE_LEN + payload.len() + TAG_LEN),
            Form::Tls12Chacha => (typ, payload.len() + TAG_LEN),
        };
        let header_len_field = u16::try_from(body_len)
            .map_err(|_| TlsFailure::Protocol("a record over 64 KiB".into()))?;
        let record_start = out.len();
        out.reserve(HEADER_LEN + body_len);
        out.put_u8(u8::from(outer_type));
        out.put_slice(&RECORD_VERSION);
        out.put_u16(header_len_field);
        let tls12_aad = |seq: u64| {
            let mut aad = [0u8; 13];
            aad[..8].copy_from_slice(&seq.to_be_bytes());
            aad[8] = u8::from(typ);
            aad[9..11].copy_from_slice(&RECORD_VERSION);
            // A record carries at most 16 KiB of plaintext.
            aad[11..].copy_from_slice(&(payload.len() as u16).to_be_bytes());
            aad
        };
        if form == Form::Tls12Gcm {
            out.put_slice(&nonce[4..]);
        }
        let start = out.len();
        out.put_slice(payload);
        if form == Form::Tls13 {
            out.put_u8(u8::from(typ));
        }
        let nonce = Nonce::assume_unique_for_key(nonce);
        let sealed = match form {
            Form::Tls13 => {
                let header: [u8; HEADER_LEN] = [
                    u8::from(outer_type),
                    RECORD_VERSION[0],
                    RECORD_VERSION[1],
                    (header_len_field >> 8) as u8,
                    header_len_field as u8,
                ];
                key.seal_in_place_separate_tag(nonce, Aad::from(header), &mut out[start..])
            }
            Form::Tls12Gcm | Form::Tls12Chacha => {
                key.seal_in_place_separate_tag(nonce, Aad::from(tls12_aad(seq)), &mut out[start..])
            }
        };
        let Ok(tag) = sealed else {
            // No half record stays behind.
            out.truncate(record_start);
            return Err(TlsFailure::Protocol("a record could not be sealed".into()));
        };
        out.put_slice(tag.as_ref());
        Ok(())
    }
}

/// ring's algorithm and the record form for a suite of the standard
/// ones sealed here; `None` for any other suite, and for a FIPS provider's
/// (whose records its own module must seal).
fn ring_suite(suite: SupportedCipherSuite) -> Option<(&'static aead::Algorithm, Form)> {
    use rustls::CipherSuite as Id;
    if suite.fips() {
        return None;
    }
    Some(match suite.suite() {
        Id::TLS13_AES_128_GCM_SHA256 => (&aead::AES_128_GCM, Form::Tls13),
        Id::TLS13_AES_256_GCM_SHA384 => (&aead::AES_256_GCM, Form::Tls13),
        Id::TLS13_CHACHA20_POLY1305_SHA256 => (&aead::CHACHA20_POLY1305, Form::Tls13),
        Id::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256 | Id::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 => {
            (&aead::AES_128_GCM, Form::Tls12Gcm)
        }
        Id::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384 | Id::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384 => {
            (&aead::AES_256_GCM, Form::Tls12Gcm)
        }
        Id::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
        | Id::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256 => {
            (&aead::CHACHA20_POLY1305, Form::Tls12Chacha)
        }
        _ => return None,
    })
}
