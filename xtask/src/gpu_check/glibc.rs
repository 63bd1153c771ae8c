//! The newest glibc version the artefact's binaries were linked against: a GPU machine with an
//! older glibc cannot run them, and the runner says so before it starts.

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context, bail};

/// The greatest `GLIBC_x.y[.z]` version any of `binaries` needs (its ELF version needs,
/// `.gnu.version_r`, which the dynamic loader checks), as `x.y[.z]`; `2.2.5` (x86-64's first)
/// when none needs one. Read with binutils' `readelf`, which the build's `strip` comes with.
pub(crate) fn needed(binaries: &[impl AsRef<Path>]) -> anyhow::Result<String> {
    let mut newest = vec![2, 2, 5];
    for binary in binaries {
        let binary = binary.as_ref();
        let output = Command::new("readelf")
            .args(["--version-info", "--wide"])
            .arg(binary)
            .stdin(Stdio::null())
            .output()
            .context("running readelf (binutils), which reads the glibc versions a binary needs")?;
        if !output.status.success() {
            bail!(
                "readelf could not read {}: {}",
                binary.display(),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        for version in version_needs(&String::from_utf8_lossy(&output.stdout)) {
            if version > newest {
                newest = version;
            }
        }
    }
    Ok(dotted(&newest))
}

/// The glibc versions a `readelf --version-info` listing says the file needs: the `GLIBC_…`
/// names of its version needs section, as their numbers.
fn version_needs(listing: &str) -> Vec<Vec<u32>> {
    listing
        .lines()
        .skip_while(|line| !line.starts_with("Version needs section"))
        .take_while(|line| line.starts_with(' ') || line.starts_with("Version needs section"))
        .filter_map(|line| line.split("Name: GLIBC_").nth(1))
        .filter_map(|rest| rest.split_whitespace().next())
        .filter_map(|version| version.split('.').map(|n| n.parse().ok()).collect())
        .collect()
}

/// `[2, 34]` as `2.34`.
fn dotted(version: &[u32]) -> String {
    version
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(".")
}

#[cfg(test)]
mod tests {
    use super::*;

    const LISTING: &str = "\
Version symbols section '.gnu.version' contains 3 entries:
  000:   0 (*local*)       2 (GLIBC_2.99)
Version needs section '.gnu.version_r' contains 2 entries:
 Addr: 0x00000000000010f8  Offset: 0x000010f8  Link: 8 (.dynstr)
  000000: Version: 1  File: libgcc_s.so.1  Cnt: 1
  0x0030:   Name: GCC_3.0  Flags: none  Version: 4
  0x0010: Version: 1  File: libc.so.6  Cnt: 3
  0x0060:   Name: GLIBC_2.2.5  Flags: none  Version: 3
  0x0070:   Name: GLIBC_2.34  Flags: none  Version: 15
  0x0080:   Name: GLIBC_PRIVATE  Flags: none  Version: 20

Version definition section '.gnu.version_d' contains 1 entry:
  000000: Rev: 1  Flags: BASE  Index: 1  Cnt: 1  Name: GLIBC_2.40
";

    #[test]
    fn only_the_version_needs_section_counts_and_private_names_are_no_versions() {
        assert_eq!(version_needs(LISTING), [vec![2, 2, 5], vec![2, 34]]);
        assert_eq!(dotted(&[2, 34]), "2.34");
    }

    #[test]
    fn this_test_binary_needs_a_glibc_no_newer_than_the_one_it_runs_on() {
        let me = std::env::current_exe().unwrap();
        let needed: Vec<u32> = needed(&[me])
            .unwrap()
            .split('.')
            .map(|n| n.parse().unwrap())
            .collect();
        let here = Command::new("getconf")
            .arg("GNU_LIBC_VERSION")
            .output()
            .unwrap();
        let here: Vec<u32> = String::from_utf8_lossy(&here.stdout)
            .split_whitespace()
            .nth(1)
            .unwrap()
            .split('.')
            .map(|n| n.parse().unwrap())
            .collect();
        // It runs here, so the loader found every version it needs; a Rust binary needs more
        // than x86-64's first.
        assert!(needed <= here, "{needed:?} > {here:?}");
        assert!(needed > vec![2, 2, 5], "{needed:?}");
    }
}
