//! SLURM hostlist expressions such as `node[01-03,7],login1`.

/// At most this many host names come out of one expression: a typo like `n[1-999999999]`
/// becomes an error instead of exhausting memory.
pub const MAX_HOSTS: usize = 1 << 16;

/// Why a hostlist expression cannot be expanded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HostlistError {
    /// A `[` without its `]`, or a `]` without its `[`.
    #[error("unbalanced brackets at byte {0}")]
    UnbalancedBracket(usize),
    /// Something inside brackets that is not `N` or `N-M`.
    #[error("{0:?} is not a number or a range N-M")]
    BadRange(String),
    /// A range that runs backwards.
    #[error("range {0:?} runs backwards")]
    Backwards(String),
    /// An empty name, such as from `a,,b`.
    #[error("empty host name at byte {0}")]
    EmptyName(usize),
    /// More than [`MAX_HOSTS`] names.
    #[error("expands to more than {MAX_HOSTS} hosts")]
    TooMany,
}

/// Expands a SLURM hostlist into host names, in order.
///
/// Commas outside brackets separate names; inside brackets they separate numbers and ranges.
/// A range keeps the zero padding of its lower bound, and several bracket groups in one name
/// expand as a cartesian product, first group outermost, as `scontrol show hostnames` does.
///
/// ```
/// use lockstep_cluster::expand_hostlist;
///
/// assert_eq!(expand_hostlist("node[01-03,7]").unwrap(), ["node01", "node02", "node03", "node7"]);
/// assert_eq!(expand_hostlist("r[1-2]n[1-2],login").unwrap(), ["r1n1", "r1n2", "r2n1", "r2n2", "login"]);
/// assert!(expand_hostlist("node[3-1]").is_err());
/// ```
///
/// # Errors
///
/// A [`HostlistError`] saying what is malformed and where.
pub fn expand_hostlist(expression: &str) -> Result<Vec<String>, HostlistError> {
    let mut hosts = Vec::new();
    for (start, item) in split_top_level(expression)? {
        if item.is_empty() {
            return Err(HostlistError::EmptyName(start));
        }
        let mut names = vec![String::new()];
        for piece in pieces(item, start)? {
            names = match piece {
                Piece::Text(text) => names.into_iter().map(|n| n + text).collect(),
                Piece::Numbers(numbers) => {
                    if names.len().saturating_mul(numbers.len()) > MAX_HOSTS {
                        return Err(HostlistError::TooMany);
                    }
                    names
                        .iter()
                        .flat_map(|n| numbers.iter().map(move |num| format!("{n}{num}")))
                        .collect()
                }
            };
        }
        if hosts.len() + names.len() > MAX_HOSTS {
            return Err(HostlistError::TooMany);
        }
        hosts.extend(names);
    }
    Ok(hosts)
}

/// Splits on commas that are not inside brackets, with each part's byte offset.
fn split_top_level(expression: &str) -> Result<Vec<(usize, &str)>, HostlistError> {
    let mut parts = Vec::new();
    let mut depth = 0_u32;
    let mut start = 0;
    for (i, b) in expression.bytes().enumerate() {
        match b {
            b'[' if depth == 0 => depth = 1,
            b']' if depth == 1 => depth = 0,
            b'[' | b']' => return Err(HostlistError::UnbalancedBracket(i)),
            b',' if depth == 0 => {
                parts.push((start, &expression[start..i]));
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(HostlistError::UnbalancedBracket(expression.len()));
    }
    parts.push((start, &expression[start..]));
    Ok(parts)
}

enum Piece<'a> {
    Text(&'a str),
    Numbers(Vec<String>),
}

/// Cuts one name into literal text and expanded bracket groups. Brackets are balanced here.
fn pieces(item: &str, offset: usize) -> Result<Vec<Piece<'_>>, HostlistError> {
    let mut out = Vec::new();
    let mut rest = item;
    let mut at = offset;
    while let Some(open) = rest.find('[') {
        let close = rest[open..]
            .find(']')
            .map(|c| open + c)
            .ok_or(HostlistError::UnbalancedBracket(at + open))?;
        if open > 0 {
            out.push(Piece::Text(&rest[..open]));
        }
        let mut numbers = Vec::new();
        for range in rest[open + 1..close].split(',') {
            expand_range(range, &mut numbers)?;
        }
        out.push(Piece::Numbers(numbers));
        at += close + 1;
        rest = &rest[close + 1..];
    }
    if !rest.is_empty() {
        out.push(Piece::Text(rest));
    }
    Ok(out)
}

fn expand_range(range: &str, out: &mut Vec<String>) -> Result<(), HostlistError> {
    let bad = || HostlistError::BadRange(range.to_owned());
    let number = |s: &str| {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        s.parse::<u64>().map_err(|_| bad())
    };
    let (lo_text, hi_text) = range.split_once('-').unwrap_or((range, range));
    let (lo, hi) = (number(lo_text)?, number(hi_text)?);
    if lo > hi {
        return Err(HostlistError::Backwards(range.to_owned()));
    }
    if hi - lo >= MAX_HOSTS as u64 || out.len() as u64 + (hi - lo) >= MAX_HOSTS as u64 {
        return Err(HostlistError::TooMany);
    }
    let width = lo_text.len();
    out.extend((lo..=hi).map(|n| format!("{n:0width$}")));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_pass_through() {
        assert_eq!(expand_hostlist("a").unwrap(), ["a"]);
        assert_eq!(expand_hostlist("a,b.example").unwrap(), ["a", "b.example"]);
    }

    #[test]
    fn ranges_keep_the_padding_of_the_lower_bound() {
        assert_eq!(expand_hostlist("n[08-10]").unwrap(), ["n08", "n09", "n10"]);
        assert_eq!(expand_hostlist("n[8-10]").unwrap(), ["n8", "n9", "n10"]);
        assert_eq!(expand_hostlist("n[5]").unwrap(), ["n5"]);
        assert_eq!(expand_hostlist("n[1-2]-ib").unwrap(), ["n1-ib", "n2-ib"]);
    }

    #[test]
    fn malformed_expressions_say_what_is_wrong() {
        assert_eq!(
            expand_hostlist("n[1-2"),
            Err(HostlistError::UnbalancedBracket(5))
        );
        assert_eq!(
            expand_hostlist("n1-2]"),
            Err(HostlistError::UnbalancedBracket(4))
        );
        assert_eq!(
            expand_hostlist("n[[1]]"),
            Err(HostlistError::UnbalancedBracket(2))
        );
        assert_eq!(
            expand_hostlist("n[a-b]"),
            Err(HostlistError::BadRange("a-b".into()))
        );
        assert_eq!(
            expand_hostlist("n[]"),
            Err(HostlistError::BadRange(String::new()))
        );
        assert_eq!(
            expand_hostlist("n[1-]"),
            Err(HostlistError::BadRange("1-".into()))
        );
        assert_eq!(
            expand_hostlist("n[3-1]"),
            Err(HostlistError::Backwards("3-1".into()))
        );
        assert_eq!(expand_hostlist("a,,b"), Err(HostlistError::EmptyName(2)));
        assert_eq!(expand_hostlist(""), Err(HostlistError::EmptyName(0)));
        assert_eq!(
            expand_hostlist("n[99999999999999999999]"),
            Err(HostlistError::BadRange("99999999999999999999".into()))
        );
    }

    #[test]
    fn huge_expansions_are_refused_not_attempted() {
        assert_eq!(
            expand_hostlist("n[1-999999999999]"),
            Err(HostlistError::TooMany)
        );
        assert_eq!(
            expand_hostlist("a[1-300]b[1-300]"),
            Err(HostlistError::TooMany)
        );
        assert_eq!(expand_hostlist("a[1-65536]").map(|h| h.len()), Ok(65536));
    }
}
