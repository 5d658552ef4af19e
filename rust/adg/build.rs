//! An rpath to the libdir adg-sys found libadg in (DEP_ADG_LIBDIR), so
//! that this crate's tests and examples run against an uninstalled prefix
//! without LD_LIBRARY_PATH: adg-sys's own link-arg reaches only its
//! targets.

fn main() {
    if let Some(dirs) = std::env::var_os("DEP_ADG_LIBDIR") {
        for dir in std::env::split_paths(&dirs) {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
        }
    }
}
