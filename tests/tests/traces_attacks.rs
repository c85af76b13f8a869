//! Attacks on the tracing path (placeholder while building).
#[test]
fn placeholder() {}
