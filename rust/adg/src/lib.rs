//! Safe Rust layer over libadg (in progress).
