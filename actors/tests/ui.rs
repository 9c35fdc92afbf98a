//! Compile-fail tests of the derive macros and the send API: each case in
//! `tests/ui/` must fail with the readable message in its `.stderr` file.

#[test]
fn misuse_fails_to_compile_with_readable_errors() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
