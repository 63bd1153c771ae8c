//! The READMEs list the example binaries that exist: the root README's example table and
//! `examples/README.md` name exactly the `[[bin]]` targets of `examples/Cargo.toml`.

#![allow(
    clippy::unwrap_used,
    reason = "a test helper that meets an error must fail the test loudly"
)]

use std::collections::BTreeSet;

use lockstep_e2e::workspace_root;

fn read(path: &str) -> String {
    std::fs::read_to_string(workspace_root().join(path)).unwrap()
}

/// The `name = "…"` of every `[[bin]]` in the examples' manifest.
fn example_binaries() -> BTreeSet<String> {
    let manifest = read("examples/Cargo.toml");
    let mut names = BTreeSet::new();
    let mut in_bin = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_bin = line == "[[bin]]";
        } else if in_bin && let Some(name) = line.strip_prefix("name = ") {
            names.insert(name.trim_matches('"').to_owned());
        }
    }
    names
}

/// The first cell of every row of the first table after `marker` (or of the first table in the
/// file when `marker` is empty), without its backticks.
fn first_column(text: &str, marker: &str) -> BTreeSet<String> {
    let start = text.find(marker).unwrap_or(0);
    text[start..]
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2) // header and separator
        .filter_map(|row| row.split('|').nth(1))
        .map(|cell| cell.trim().trim_matches('`').to_owned())
        .collect()
}

#[test]
fn the_readmes_list_exactly_the_example_binaries() {
    let binaries = example_binaries();
    assert!(binaries.contains("mnist_custom_loop"), "{binaries:?}");
    assert_eq!(
        first_column(&read("README.md"), "<!-- example-list"),
        binaries,
        "README.md's example table"
    );
    assert_eq!(
        first_column(&read("examples/README.md"), ""),
        binaries,
        "examples/README.md's table"
    );
}
