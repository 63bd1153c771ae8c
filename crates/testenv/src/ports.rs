//! Free TCP ports for tests whose processes bind them by number.

use std::net::{Ipv4Addr, TcpListener};
use std::sync::atomic::{AtomicU32, Ordering};

/// The lowest port handed out: clear of the well-known and registered services most machines
/// run.
const LOWEST: u16 = 10_000;

/// The first of `len` neighbouring ports on which nothing listens now (on any address),
/// below the kernel's range of ephemeral ports, so that no `bind(0)` of a parallel test is
/// handed one of them before the test's processes bind them (or before it expects them
/// refused).
///
/// Each process starts at its own place, spread evenly over the range by a hash of its
/// process id, and walks on from there, wrapping around: no two calls in a process get the
/// same port, and two processes meet only when their walks overlap.
///
/// # Errors
///
/// When no `len` neighbouring ports are free below the ephemeral range.
pub fn unused_ports(len: u16) -> std::io::Result<u16> {
    static TAKEN: AtomicU32 = AtomicU32::new(0);
    let (low, high) = range(ephemeral_ports_start());
    let span = u32::from(high - low);
    let len32 = u32::from(len.max(1));
    let start = spread(std::process::id(), span);
    for _ in 0..span / len32 {
        let offset = (start + TAKEN.fetch_add(len32, Ordering::Relaxed)) % span;
        let Some(first) = u16::try_from(offset).ok().and_then(|o| low.checked_add(o)) else {
            continue;
        };
        let Some(end) = first.checked_add(len).filter(|&end| end <= high) else {
            continue;
        };
        if (first..end).all(|port| TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)).is_ok()) {
            return Ok(first);
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AddrNotAvailable,
        format!("no {len} neighbouring free ports from {low} below the ephemeral range ({high})"),
    ))
}

/// The ports handed out, `low..high`: from [`LOWEST`] (or half the ephemeral start, where the
/// kernel's range begins low) up to the ephemeral range.
fn range(ephemeral: u16) -> (u16, u16) {
    let low = LOWEST.min(ephemeral / 2);
    (low, ephemeral.max(low + 1))
}

/// A place in `0..span` for process `pid`: Fibonacci hashing spreads neighbouring ids far
/// apart, and the product's high half maps the hash onto the span evenly.
fn spread(pid: u32, span: u32) -> u32 {
    let hash = pid.wrapping_mul(0x9E37_79B9);
    ((u64::from(hash) * u64::from(span)) >> 32) as u32
}

/// The first port the kernel hands out for `bind(0)` (Linux's default where unreadable).
fn ephemeral_ports_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unused_ports_are_free_distinct_and_below_the_ephemeral_range() {
        let (pair, single) = (unused_ports(2).unwrap(), unused_ports(1).unwrap());
        assert!(single >= pair + 2 || single < pair, "{pair} {single}");
        for port in [pair, pair + 1, single] {
            assert!((LOWEST..ephemeral_ports_start()).contains(&port), "{port}");
            assert!(
                TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok(),
                "{port}"
            );
        }
    }

    #[test]
    fn process_ids_spread_evenly_over_the_whole_range() {
        let (low, high) = range(32_768);
        let span = u32::from(high - low);
        // Ten buckets over the range: every one of 10,000 neighbouring ids lands in one, and
        // none holds more than 12% or less than 8% of them.
        let mut buckets = [0_u32; 10];
        for pid in 1..=10_000 {
            let place = spread(pid, span);
            assert!(place < span);
            buckets[(place * 10 / span) as usize] += 1;
        }
        assert!(
            buckets.iter().all(|&n| (800..=1_200).contains(&n)),
            "{buckets:?}"
        );
    }

    #[test]
    fn a_low_ephemeral_range_still_leaves_ports_below_it() {
        assert_eq!(range(32_768), (10_000, 32_768));
        assert_eq!(range(8_000), (4_000, 8_000));
        assert_eq!(range(0), (0, 1));
    }
}
