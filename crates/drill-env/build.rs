//! With the `atari` feature, ALE's static C++ library (from `ale-sys`) needs the C++ runtime
//! and zlib at link time, which `ale-sys` does not declare.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_ATARI").is_some() {
        println!("cargo:rustc-link-lib=dylib=stdc++");
        println!("cargo:rustc-link-lib=dylib=z");
    }
}
