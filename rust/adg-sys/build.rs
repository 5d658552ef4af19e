//! Finds the installed libadg through pkg-config and links it.
//!
//! Why pkg-config rather than building libadg from the tree here: libadg's
//! build needs meson, liburcu and Concurrency Kit, and has options the user
//! chooses (sanitizers, the build type). Linking the build the user
//! installed keeps those choices theirs; a build script that ran meson
//! would hide them and repeat meson.build. In the tree, install a build
//! into a prefix and point PKG_CONFIG_PATH at it (rust/README.md).

fn main() {
    let lib = match pkg_config::Config::new()
        .atleast_version("0.2.0")
        .probe("adg")
    {
        Ok(lib) => lib,
        Err(e) => panic!(
            "adg-sys: libadg >= 0.2.0 not found by pkg-config ({e}); install \
             libadg and set PKG_CONFIG_PATH to its lib/pkgconfig"
        ),
    };
    // An rpath to the libdir pkg-config found, so that the tests and
    // examples of an uninstalled prefix run without LD_LIBRARY_PATH. A
    // link-arg reaches this package's own targets only: the libdir goes
    // to dependents too (DEP_ADG_LIBDIR), whose build script adds it.
    let libdir = std::env::join_paths(&lib.link_paths).expect("link paths");
    for dir in &lib.link_paths {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
    }
    println!("cargo:libdir={}", libdir.to_string_lossy());
    // The headers bound, for dependents (DEP_ADG_INCLUDE) and for
    // tests/headers.rs, which compiles a C program against them.
    let include = std::env::join_paths(&lib.include_paths).expect("include paths");
    println!("cargo:include={}", include.to_string_lossy());
    println!(
        "cargo:rustc-env=ADG_SYS_INCLUDE_PATH={}",
        include.to_string_lossy()
    );
}
