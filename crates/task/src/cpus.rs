//! A list of cores, as `taskset -c` and `numactl --physcpubind` write it (without their
//! strides): `0-3,8,10-11`.

use std::fmt;
use std::str::FromStr;

/// The highest core number a list may name, plus one: the size of Linux's `cpu_set_t`.
pub const MAX_CPUS: usize = rustix::thread::CpuSet::MAX_CPU;

/// Cores in the order listed (`0-3,8` is 0, 1, 2, 3, 8), each once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuList(Vec<usize>);

impl CpuList {
    /// The cores, in the order listed.
    pub fn cpus(&self) -> &[usize] {
        &self.0
    }

    /// The cores of `set`, lowest first.
    pub(crate) fn of_set(set: &rustix::thread::CpuSet) -> Self {
        Self((0..MAX_CPUS).filter(|&cpu| set.is_set(cpu)).collect())
    }
}

/// Why a core list could not be read; the message names the part at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the core list {list:?}: {why}")]
pub struct CpuListError {
    list: String,
    why: String,
}

impl FromStr for CpuList {
    type Err = CpuListError;

    fn from_str(list: &str) -> Result<Self, Self::Err> {
        let fail = |why: String| CpuListError {
            list: list.to_owned(),
            why,
        };
        let core = |text: &str| -> Result<usize, CpuListError> {
            let text = text.trim();
            if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
                return Err(fail(format!("{text:?} is not a core number")));
            }
            match text.parse::<usize>() {
                Ok(n) if n < MAX_CPUS => Ok(n),
                _ => Err(fail(format!(
                    "core {text} is past the last, {}",
                    MAX_CPUS - 1
                ))),
            }
        };
        let mut cpus = Vec::new();
        let mut seen = [false; MAX_CPUS];
        for item in list.split(',') {
            let (first, last) = if let Some((first, last)) = item.split_once('-') {
                (core(first)?, core(last)?)
            } else {
                let n = core(item)?;
                (n, n)
            };
            if first > last {
                return Err(fail(format!("the range {first}-{last} runs backwards")));
            }
            for n in first..=last {
                let listed = seen
                    .get_mut(n)
                    .ok_or_else(|| fail(format!("core {n} is past the last, {}", MAX_CPUS - 1)))?;
                if *listed {
                    return Err(fail(format!("core {n} is listed twice")));
                }
                *listed = true;
                cpus.push(n);
            }
        }
        Ok(Self(cpus))
    }
}

impl fmt::Display for CpuList {
    /// Consecutive cores as ranges: `0-3,8`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rest = self.0.as_slice();
        let mut first_item = true;
        while let Some((&start, _)) = rest.split_first() {
            let run = rest
                .iter()
                .zip(start..)
                .take_while(|&(&n, expected)| n == expected)
                .count();
            if !first_item {
                f.write_str(",")?;
            }
            first_item = false;
            match run {
                1 => write!(f, "{start}")?,
                _ => write!(f, "{start}-{}", start + run - 1)?,
            }
            rest = rest.get(run..).unwrap_or_default();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn list(text: &str) -> Result<Vec<usize>, String> {
        text.parse::<CpuList>()
            .map(|l| l.cpus().to_vec())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn single_cores_and_ranges_read_in_the_order_listed() {
        assert_eq!(list("0"), Ok(vec![0]));
        assert_eq!(list("0-3,8"), Ok(vec![0, 1, 2, 3, 8]));
        assert_eq!(list("6, 2-3"), Ok(vec![6, 2, 3]));
        assert_eq!(list("1023"), Ok(vec![1023]));
    }

    #[test]
    fn a_malformed_list_is_refused_naming_its_fault() {
        for (text, fault) in [
            ("", "\"\" is not a core number"),
            ("0,", "\"\" is not a core number"),
            ("a", "\"a\" is not a core number"),
            ("-1", "\"\" is not a core number"),
            ("3-1", "the range 3-1 runs backwards"),
            ("0-2,1", "core 1 is listed twice"),
            ("1024", "core 1024 is past the last, 1023"),
            (
                "0-99999999999999999999",
                "core 99999999999999999999 is past the last",
            ),
            ("+3", "\"+3\" is not a core number"),
            ("0-10:2", "\"10:2\" is not a core number"),
        ] {
            let error = list(text).unwrap_err();
            assert!(error.contains(fault), "{text:?}: {error}");
        }
    }

    #[test]
    fn a_list_prints_its_consecutive_cores_as_ranges() {
        let printed = |text: &str| text.parse::<CpuList>().unwrap().to_string();
        assert_eq!(printed("0,1,2,3,8"), "0-3,8");
        assert_eq!(printed("5"), "5");
        assert_eq!(printed("4,2,3"), "4,2-3");
    }

    proptest! {
        #[test]
        fn any_text_parses_or_is_refused_without_a_panic(text in "\\PC{0,24}") {
            let _ = text.parse::<CpuList>();
        }

        #[test]
        fn a_printed_list_reads_back_as_itself(
            cpus in proptest::sample::subsequence((0..64_usize).collect::<Vec<_>>(), 1..20)
                .prop_shuffle()
        ) {
            let printed = CpuList(cpus.clone()).to_string();
            prop_assert_eq!(printed.parse::<CpuList>().map(|l| l.0), Ok(cpus));
        }
    }
}
