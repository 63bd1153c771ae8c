//! `host:port` addresses as TensorFlow writes them in a cluster spec.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// A validated `host:port` address: an IPv4 address, a bracketed IPv6 address or a host name,
/// then a port from 1 to 65535.
///
/// ```
/// use lockstep_cluster::{Address, Host};
///
/// let a: Address = "[::1]:2222".parse().unwrap();
/// assert_eq!(a.port(), 2222);
/// assert!(matches!(a.host(), Host::Ipv6(_)));
/// assert!("worker-0.svc:2222".parse::<Address>().is_ok());
/// assert!("::1:2222".parse::<Address>().is_err()); // IPv6 needs brackets
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Address {
    host: Host,
    port: u16,
}

/// The host part of an [`Address`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    /// A dotted-quad IPv4 address.
    Ipv4(Ipv4Addr),
    /// An IPv6 address, written in brackets.
    Ipv6(Ipv6Addr),
    /// A DNS host name, stored in lower case (names compare without case).
    Name(String),
}

/// Why a string is not a `host:port` address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AddressError {
    /// Nothing at all.
    #[error("the address is empty")]
    Empty,
    /// A URL such as `grpc://host:port`.
    #[error("a scheme such as `grpc://` is not allowed; write host:port")]
    HasScheme,
    /// No `:port` suffix.
    #[error("no `:port` after the host")]
    MissingPort,
    /// The port is not a number from 1 to 65535.
    #[error("port {0:?} is not a number from 1 to 65535")]
    InvalidPort(String),
    /// An IPv6 address without brackets, which is ambiguous with the port.
    #[error("an IPv6 address must be in brackets, like [::1]:2222")]
    UnbracketedIpv6,
    /// Brackets around something that is not an IPv6 address, or unbalanced brackets.
    #[error("{0:?} is not a bracketed IPv6 address")]
    InvalidIpv6(String),
    /// A host that is neither an IPv4 address nor a valid DNS name.
    #[error(
        "host {0:?} is neither an IPv4 address nor a DNS name (letters, digits and '-' in dot-separated labels)"
    )]
    InvalidHost(String),
}

impl Address {
    /// The host part.
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// The port, never 0.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl FromStr for Address {
    type Err = AddressError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.is_empty() {
            return Err(AddressError::Empty);
        }
        if s.contains("://") {
            return Err(AddressError::HasScheme);
        }
        let (host, port) = if let Some(rest) = s.strip_prefix('[') {
            let (inside, after) = rest
                .split_once(']')
                .ok_or_else(|| AddressError::InvalidIpv6(s.to_owned()))?;
            let ip = Ipv6Addr::from_str(inside)
                .map_err(|_| AddressError::InvalidIpv6(format!("[{inside}]")))?;
            let port = after.strip_prefix(':').ok_or(AddressError::MissingPort)?;
            (Host::Ipv6(ip), port)
        } else {
            let (host, port) = s.rsplit_once(':').ok_or(AddressError::MissingPort)?;
            if host.contains(':') {
                return Err(AddressError::UnbracketedIpv6);
            }
            (parse_host(host)?, port)
        };
        Ok(Self {
            host,
            port: parse_port(port)?,
        })
    }
}

fn parse_port(text: &str) -> Result<u16, AddressError> {
    let invalid = || AddressError::InvalidPort(text.to_owned());
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid());
    }
    match text.parse::<u16>() {
        Ok(0) | Err(_) => Err(invalid()),
        Ok(port) => Ok(port),
    }
}

fn parse_host(text: &str) -> Result<Host, AddressError> {
    if let Ok(ip) = Ipv4Addr::from_str(text) {
        return Ok(Host::Ipv4(ip));
    }
    let invalid = || AddressError::InvalidHost(text.to_owned());
    // All-numeric labels that failed to parse as IPv4 ("256.1.1.1", "1.2.3") are typos, not names.
    if text.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err(invalid());
    }
    if text.is_empty() || text.len() > 253 {
        return Err(invalid());
    }
    let label_ok = |label: &str| {
        !label.is_empty()
            && label.len() <= 63
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
    };
    if text.split('.').all(label_ok) {
        Ok(Host::Name(text.to_ascii_lowercase()))
    } else {
        Err(invalid())
    }
}

impl fmt::Display for Address {
    /// The canonical form: equal addresses print the same (`[0::1]:80` prints `[::1]:80`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            Host::Ipv4(ip) => write!(f, "{ip}:{}", self.port),
            Host::Ipv6(ip) => write!(f, "[{ip}]:{}", self.port),
            Host::Name(name) => write!(f, "{name}:{}", self.port),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(s: &str) -> AddressError {
        s.parse::<Address>().unwrap_err()
    }

    #[test]
    fn ipv4_ipv6_and_host_names_are_accepted() {
        assert_eq!(
            "127.0.0.1:2222".parse::<Address>().unwrap().to_string(),
            "127.0.0.1:2222"
        );
        assert_eq!(
            "[::1]:80".parse::<Address>().unwrap().to_string(),
            "[::1]:80"
        );
        assert_eq!(
            "[0:0::1]:80".parse::<Address>().unwrap().to_string(),
            "[::1]:80"
        );
        assert_eq!(
            "Worker-0.Default.svc:65535"
                .parse::<Address>()
                .unwrap()
                .to_string(),
            "worker-0.default.svc:65535"
        );
        assert_eq!("localhost:1".parse::<Address>().unwrap().port(), 1);
    }

    #[test]
    fn a_missing_or_bad_port_is_refused() {
        assert_eq!(err("localhost"), AddressError::MissingPort);
        assert_eq!(err("localhost:"), AddressError::InvalidPort(String::new()));
        assert_eq!(err("localhost:0"), AddressError::InvalidPort("0".into()));
        assert_eq!(
            err("localhost:65536"),
            AddressError::InvalidPort("65536".into())
        );
        assert_eq!(
            err("localhost:+80"),
            AddressError::InvalidPort("+80".into())
        );
        assert_eq!(err("[::1]"), AddressError::MissingPort);
    }

    #[test]
    fn malformed_hosts_are_refused() {
        assert_eq!(err(""), AddressError::Empty);
        assert_eq!(err("grpc://h:1"), AddressError::HasScheme);
        assert_eq!(err("::1:80"), AddressError::UnbracketedIpv6);
        assert_eq!(err("[::1:80"), AddressError::InvalidIpv6("[::1:80".into()));
        assert_eq!(
            err("[1.2.3.4]:80"),
            AddressError::InvalidIpv6("[1.2.3.4]".into())
        );
        assert_eq!(
            err("256.0.0.1:80"),
            AddressError::InvalidHost("256.0.0.1".into())
        );
        assert_eq!(err(":80"), AddressError::InvalidHost(String::new()));
        assert_eq!(err("-bad:80"), AddressError::InvalidHost("-bad".into()));
        assert_eq!(err("a..b:80"), AddressError::InvalidHost("a..b".into()));
        assert_eq!(
            err("under_score:80"),
            AddressError::InvalidHost("under_score".into())
        );
        assert_eq!(
            err(&format!("{}:80", "a".repeat(64))),
            AddressError::InvalidHost("a".repeat(64))
        );
    }
}
