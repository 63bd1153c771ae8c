//! The job's secret as a launcher hands it to every task: the variables that carry it, and
//! a fresh one per job. Checking a peer against it is the collective layer's work
//! (`lockstep_collective::ClusterSecret`); the names live here, beside `TF_CONFIG`, so that a
//! launcher can set them without building the collective layer.

/// The variable that holds the secret itself.
pub const SECRET_VARIABLE: &str = "LOCKSTEP_CLUSTER_SECRET";

/// The variable that names a file holding the secret (readable by its owner only).
pub const SECRET_FILE_VARIABLE: &str = "LOCKSTEP_CLUSTER_SECRET_FILE";

/// Hexadecimal digits, for a generated secret.
const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// A fresh random secret (32 bytes from the operating system's generator), written as 64
/// hexadecimal digits: what a launcher hands to each task of a new job.
///
/// # Errors
///
/// When the operating system's random generator fails.
pub fn generate_secret_hex() -> Result<String, std::io::Error> {
    let mut bytes = [0_u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| {
        std::io::Error::other(format!("no random bytes for a new cluster secret: {e}"))
    })?;
    Ok(to_hex(&bytes))
}

/// `bytes` as lower-case hexadecimal digits.
#[must_use]
pub fn to_hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .flat_map(|b| [DIGITS[usize::from(b >> 4)], DIGITS[usize::from(b & 15)]])
        .map(char::from)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_secrets_are_64_hex_digits_and_differ() {
        let (a, b) = (
            generate_secret_hex().unwrap(),
            generate_secret_hex().unwrap(),
        );
        assert_eq!(a.len(), 64);
        assert!(
            a.bytes()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
        assert_ne!(a, b);
    }

    #[test]
    fn bytes_are_written_high_digit_first() {
        assert_eq!(to_hex(&[0x00, 0x0f, 0xa5, 0xff]), "000fa5ff");
    }
}
