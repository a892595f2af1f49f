//! Passwords: bcrypt hashes (as Cassandra stores them) and the SASL PLAIN token every
//! driver's plain-text auth provider sends.
//!
//! Hashing and checking are deliberately slow (bcrypt, 2^10 rounds as Cassandra's
//! default): callers on an async runtime run them on a blocking thread. A login for a
//! role that does not exist is checked against a dummy hash, so it takes as long as a
//! wrong password and does not reveal which roles exist. bcrypt compares hashes in
//! constant time.

use shoal_cql::{CqlError, ErrorCode};
use std::sync::OnceLock;

/// bcrypt's cost: 2^10 rounds, Cassandra's `auth_bcrypt_gensalt_log2_rounds` default.
pub const BCRYPT_COST: u32 = 10;

/// A salted hash of `password`.
pub fn hash(password: &str) -> Result<String, CqlError> {
    bcrypt::hash(password, BCRYPT_COST)
        .map_err(|e| CqlError::server(format!("could not hash the password: {e}")))
}

/// Whether `password` matches `salted_hash`; `None` (no such role, or a role without a
/// password) is checked against a dummy hash and never matches.
pub fn matches(password: &str, salted_hash: Option<&str>) -> bool {
    static DUMMY: OnceLock<String> = OnceLock::new();
    match salted_hash {
        Some(salted_hash) => bcrypt::verify(password, salted_hash).unwrap_or(false),
        None => {
            let dummy = DUMMY.get_or_init(|| hash("no such role").unwrap_or_default());
            let _ = bcrypt::verify(password, dummy);
            false
        }
    }
}

/// The credentials of a SASL PLAIN response: `[authzid] NUL authcid NUL password`.
#[derive(Debug, PartialEq, Eq)]
pub struct PlainCredentials {
    pub username: String,
    pub password: String,
}

impl PlainCredentials {
    /// Decodes a PLAIN token as Cassandra's `PlainTextSaslAuthenticator` does: the
    /// password follows the last NUL, the user name the one before; an authorization id
    /// before that is ignored.
    pub fn decode(token: &[u8]) -> Result<PlainCredentials, CqlError> {
        let bad = |message: &str| CqlError::new(ErrorCode::BadCredentials, message);
        let mut parts = token.rsplitn(3, |&b| b == 0);
        let password = parts.next().unwrap_or_default();
        let Some(username) = parts.next() else {
            return Err(bad("Password must not be null"));
        };
        if username.is_empty() {
            return Err(bad("Authentication ID must not be null"));
        }
        if password.is_empty() {
            return Err(bad("Password must not be null"));
        }
        let text = |bytes: &[u8]| {
            String::from_utf8(bytes.to_vec()).map_err(|_| bad("Credentials must be valid UTF-8"))
        };
        Ok(PlainCredentials {
            username: text(username)?,
            password: text(password)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_tokens_decode_with_or_without_an_authorization_id() {
        let expected = PlainCredentials {
            username: "alice".into(),
            password: "s3cret".into(),
        };
        assert_eq!(
            PlainCredentials::decode(b"\0alice\0s3cret").unwrap(),
            expected
        );
        assert_eq!(
            PlainCredentials::decode(b"admin\0alice\0s3cret").unwrap(),
            expected
        );
    }

    #[test]
    fn malformed_plain_tokens_are_bad_credentials() {
        for token in [&b""[..], b"alice", b"\0\0pw", b"\0alice\0", b"\0\xff\0pw"] {
            let error = PlainCredentials::decode(token).unwrap_err();
            assert_eq!(error.code, ErrorCode::BadCredentials, "{token:?}");
        }
    }

    #[test]
    fn a_hash_matches_only_its_password() {
        let salted = hash("right").unwrap();
        assert!(salted.starts_with("$2"));
        assert!(matches("right", Some(&salted)));
        assert!(!matches("wrong", Some(&salted)));
        assert!(!matches("right", None));
    }
}
