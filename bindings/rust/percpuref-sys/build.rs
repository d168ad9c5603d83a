// SPDX-License-Identifier: MIT
//! Builds the C library from the repository's sources (src/*.c, the public
//! headers in include/) plus shim.c, which gives the header-only fast paths
//! (static inline in C) a symbol Rust can call, and links liburcu-bp and
//! liburcu-cds, which the library uses for its grace periods and lists.
//! The C sources sit two levels up: the crate is built from the repository
//! (PERCPUREF_SOURCE_DIR overrides where they are).
use std::env;
use std::fs;
use std::path::PathBuf;

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let root = env::var_os("PERCPUREF_SOURCE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest.join("../../.."));
    let src = root.join("src");
    let include = root.join("include");

    let mut sources: Vec<PathBuf> = fs::read_dir(&src)
        .unwrap_or_else(|e| panic!("percpuref-sys: cannot read {}: {}", src.display(), e))
        .map(|entry| entry.expect("readable directory entry").path())
        .filter(|path| path.extension().map_or(false, |ext| ext == "c"))
        .collect();
    sources.sort();
    sources.push(manifest.join("src/shim.c"));

    let mut build = cc::Build::new();
    build
        .files(&sources)
        .include(&include)
        .include(&src)
        .define("PERCPUREF_BUILDING", "1")
        .flag("-std=gnu11")
        .flag("-fvisibility=hidden")
        .warnings(false);
    build.compile("percpuref");

    println!("cargo:rustc-link-lib=urcu-bp");
    println!("cargo:rustc-link-lib=urcu-cds");
    println!("cargo:rustc-link-lib=pthread");
    println!("cargo:rerun-if-changed={}", src.display());
    println!("cargo:rerun-if-changed={}", include.display());
    println!("cargo:rerun-if-changed=src/shim.c");
    println!("cargo:rerun-if-env-changed=PERCPUREF_SOURCE_DIR");
}
