//! The newest glibc version the artefact's binaries were linked against: a GPU machine with an
//! older glibc cannot run them, and the runner says so before it starts.

use std::path::Path;

use anyhow::Context;

/// The greatest `GLIBC_x.y[.z]` version any of `binaries` names (their symbol versions,
/// which the dynamic loader checks), as `x.y[.z]`; `2.2.5` (x86-64's first) when none names
/// one.
pub(crate) fn needed(binaries: &[impl AsRef<Path>]) -> anyhow::Result<String> {
    let mut newest = vec![2, 2, 5];
    for binary in binaries {
        let binary = binary.as_ref();
        let bytes =
            std::fs::read(binary).with_context(|| format!("reading {}", binary.display()))?;
        for version in versions(&bytes) {
            if version > newest {
                newest = version;
            }
        }
    }
    Ok(newest
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join("."))
}

/// Every `GLIBC_` version string in `bytes`, as its numbers.
fn versions(bytes: &[u8]) -> Vec<Vec<u32>> {
    const PREFIX: &[u8] = b"GLIBC_";
    let mut found = Vec::new();
    let mut rest = bytes;
    while let Some(at) = rest.windows(PREFIX.len()).position(|w| w == PREFIX) {
        rest = &rest[at + PREFIX.len()..];
        let end = rest
            .iter()
            .position(|&b| !(b.is_ascii_digit() || b == b'.'))
            .unwrap_or(rest.len());
        let numbers: Option<Vec<u32>> = std::str::from_utf8(&rest[..end])
            .ok()
            .filter(|text| !text.is_empty() && !text.ends_with('.'))
            .and_then(|text| text.split('.').map(|n| n.parse().ok()).collect());
        if let Some(numbers) = numbers.filter(|n| n.len() >= 2) {
            found.push(numbers);
        }
        rest = &rest[end..];
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_version_named_wins_and_other_strings_are_ignored() {
        let bytes = b"\0GLIBC_2.2.5\0GLIBC_2.34\0GLIBC_PRIVATE\0GLIBC_2.17\0GLIBC_2.\0xGLIBC_2.9";
        assert_eq!(
            versions(bytes),
            [vec![2, 2, 5], vec![2, 34], vec![2, 17], vec![2, 9]]
        );
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::write(&a, bytes).unwrap();
        std::fs::write(&b, b"GLIBC_2.28").unwrap();
        assert_eq!(needed(&[&a, &b]).unwrap(), "2.34");
        let none: [&Path; 0] = [];
        assert_eq!(needed(&none).unwrap(), "2.2.5");
    }

    #[test]
    fn this_test_binary_names_the_glibc_it_was_linked_against() {
        let me = std::env::current_exe().unwrap();
        let version = needed(&[me]).unwrap();
        assert!(version.starts_with("2."), "{version}");
    }
}
