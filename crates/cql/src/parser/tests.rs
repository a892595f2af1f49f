//! Golden tests: every statement in `testdata/statements.cql` is parsed and its result
//! (the AST or the error) written to `testdata/statements.golden`. A behaviour change shows
//! up as a text diff; regenerate with `UPDATE_GOLDEN=1 cargo test -p shoal-cql`.

use super::parse_statement;
use std::fmt::Write as _;
use std::path::PathBuf;

#[test]
fn statements_parse_as_recorded() {
    // The directory at run time: one target directory serves several checkouts.
    let manifest = std::env::var("CARGO_MANIFEST_DIR")
        .unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string());
    let directory = PathBuf::from(manifest).join("src/parser/testdata");
    let input = std::fs::read_to_string(directory.join("statements.cql")).expect("read input");
    let mut output = String::new();
    for statement in input.split("\n\n").map(str::trim).filter(|s| !s.is_empty()) {
        let result = match parse_statement(statement) {
            Ok(parsed) => format!("{parsed:?}"),
            Err(error) => format!("ERROR {error}"),
        };
        let _ = writeln!(output, "{statement}\n=> {result}\n");
    }
    let golden_path = directory.join("statements.golden");
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&golden_path, &output).expect("write golden");
        return;
    }
    let expected =
        std::fs::read_to_string(&golden_path).expect("read golden (UPDATE_GOLDEN=1 creates it)");
    assert!(
        expected == output,
        "parser output changed; diff against {} (UPDATE_GOLDEN=1 to accept):\n{output}",
        golden_path.display()
    );
}
