// SPDX-License-Identifier: MIT
//! Builds the C library from the repository's sources (src/*.c, the public
//! headers in include/) plus shim.c, which gives the header-only fast paths
//! (static inline in C) a symbol Rust can call, and links liburcu-bp,
//! which the library uses for its grace periods, as pkg-config finds it
//! (checked by linking a test program first).
//! The C sources sit two levels up: the crate is built from the repository
//! (PERCPUREF_SOURCE_DIR overrides where they are).
//!
//! shim.c is compiled together with a check of src/lib.rs's declarations
//! (prototypes.c in OUT_DIR), after every header: each function of its
//! `extern "C"` blocks and each `extern "C" fn` type alias, turned into C,
//! must have the type the headers give it (a static assertion naming it),
//! so a prototype that disagrees, or names no C function, fails the build
//! instead of the call; and each `pub const` must have the value the C
//! headers (or <errno.h>) give the same name.
use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The C type of a Rust parameter or return type used in src/lib.rs.
fn c_type(rust: &str) -> &'static str {
    match rust {
        "*mut percpu_ref" => "struct percpu_ref *",
        "*const percpu_ref" => "const struct percpu_ref *",
        "Option<percpu_ref_func_t>" | "percpu_ref_func_t" => "percpu_ref_func_t *",
        "c_int" => "int",
        "c_uint" => "unsigned int",
        "c_ulong" => "unsigned long",
        "bool" => "bool",
        "usize" => "size_t",
        "*mut usize" => "size_t *",
        "*mut c_void" => "void *",
        "*const c_char" => "const char *",
        other => panic!("percpuref-sys: build.rs knows no C type for `{}` (src/lib.rs)", other),
    }
}

/// `(arg: Type, ...) -> Type` as the C type of a pointer to such a
/// function: `ret (*)(params)`.
fn c_function_pointer(signature: &str) -> String {
    let (args, ret) = signature
        .strip_prefix('(')
        .and_then(|rest| rest.rsplit_once(')'))
        .unwrap_or_else(|| panic!("percpuref-sys: cannot read the signature `{}`", signature));
    let ret = ret.trim().strip_prefix("->").map_or("void", |t| c_type(t.trim()));
    let params: Vec<&str> = args
        .split(',')
        .map(str::trim)
        .filter(|arg| !arg.is_empty())
        .map(|arg| c_type(arg.split_once(':').map_or(arg, |(_, t)| t).trim()))
        .collect();
    let params = if params.is_empty() { "void".to_string() } else { params.join(", ") };
    format!("{} (*)({})", ret, params)
}

/// src/lib.rs without comments, on one line, each run of whitespace one space.
/// Block comments (`/* ... */`, not nested) are taken out too.
fn normalized(text: &str) -> String {
    let code: Vec<&str> = text.lines().map(|line| line.split("//").next().unwrap_or("")).collect();
    let mut code = code.join(" ");
    while let Some(start) = code.find("/*") {
        let end = code[start..].find("*/").map_or(code.len(), |end| start + end + 2);
        code.replace_range(start..end, " ");
    }
    code.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The C static assertion for one `pub const NAME: TYPE = VALUE;` of
/// src/lib.rs (@item: from NAME to the `;`).  Only what C can read the
/// same way is taken: a c_int or c_uint, a decimal or hexadecimal number
/// or a shift of one; anything else stops the build, naming it, rather than
/// feeding C something it would misread.
fn constant_check(item: &str) -> String {
    let refuse = |why: &str| -> ! {
        panic!("percpuref-sys: build.rs cannot check `pub const {}` against C: {}", item, why)
    };
    let (name, rest) = item.split_once(':').unwrap_or_else(|| refuse("no `: TYPE`"));
    let (ty, value) = rest.split_once('=').unwrap_or_else(|| refuse("no `= VALUE`"));
    let (name, ty, value) = (name.trim(), ty.trim(), value.trim());
    if ty != "c_int" && ty != "c_uint" {
        refuse("only c_int and c_uint constants have a C counterpart here");
    }
    let number = |n: &str| {
        let n = n.trim();
        n.strip_prefix("0x").map_or(!n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()), |hex| {
            !hex.is_empty() && hex.bytes().all(|b| b.is_ascii_hexdigit())
        })
    };
    let readable = match value.split_once("<<") {
        Some((base, shift)) => number(base) && number(shift),
        None => number(value),
    };
    if !readable {
        refuse("the value must be a number, or a number shifted left by one");
    }
    format!(
        "_Static_assert(({}) == ({}), \"src/lib.rs: const {} is not the C headers' value\");\n",
        name, value, name
    )
}

/// A declaration with its attributes (`#[...]`) taken off.  One that
/// renames the symbol would make the check compare the wrong function:
/// refused.
fn without_attributes(mut item: &str) -> &str {
    item = item.trim();
    while let Some(rest) = item.strip_prefix("#[") {
        let (attribute, after) = rest.split_once(']').expect("a `]` closing the attribute");
        assert!(
            !attribute.contains("link_name"),
            "percpuref-sys: #[link_name] in src/lib.rs; declare the C name instead"
        );
        item = after.trim();
    }
    item
}

/// shim.c, then every header, then a compile-time check of each function
/// declared in an `extern "C"` block of src/lib.rs and of each `extern "C"
/// fn` type alias against the C declarations (see the top).
fn checked_shim(manifest: &Path, include: &Path, out_dir: &Path) -> PathBuf {
    let lib_rs = manifest.join("src/lib.rs");
    let text = fs::read_to_string(&lib_rs)
        .unwrap_or_else(|e| panic!("percpuref-sys: cannot read {}: {}", lib_rs.display(), e));
    let code = normalized(&text);
    let mut c = format!(
        "/* Generated by build.rs from src/lib.rs. */\n#include \"{}\"\n",
        manifest.join("src/shim.c").display()
    );
    let headers_dir = include.join("percpuref");
    let mut headers: Vec<PathBuf> = fs::read_dir(&headers_dir)
        .unwrap_or_else(|e| panic!("percpuref-sys: cannot read {}: {}", headers_dir.display(), e))
        .map(|entry| entry.expect("readable directory entry").path())
        .filter(|path| path.extension().map_or(false, |ext| ext == "h"))
        .collect();
    headers.sort();
    for header in headers {
        c += &format!("#include \"{}\"\n", header.display());
    }
    // `type percpu_ref_func_t = unsafe extern "C" fn(...);`: C's function
    // type of that name.
    for piece in code.split("type ").skip(1) {
        if let Some((name, rest)) = piece.split_once(" = unsafe extern \"C\" fn") {
            let signature = rest.split_once(';').expect("a `;` after the type").0;
            c += &format!(
                "_Static_assert(__builtin_types_compatible_p({}, {} *), \"src/lib.rs: type {}\");\n",
                c_function_pointer(signature.trim()),
                name.trim(),
                name.trim()
            );
        }
    }
    // `pub const NAME: c_int = VALUE;`: the C headers' NAME (a flag, or an
    // errno value from <errno.h>, which some architectures number unlike
    // x86 and Arm) must have that value.  A `const fn` is no constant; one
    // under `#[cfg(...)]` would be checked on every target, whichever the
    // cfg keeps, so it is refused.
    let mut constants = 0;
    for (at, _) in code.match_indices("pub const ") {
        let item = &code[at + "pub const ".len()..];
        if item.starts_with("fn ") {
            continue;
        }
        let item = item.split_once(';').map_or(item, |(item, _)| item);
        let before = code[..at].trim_end();
        if before.ends_with(']') && before.rsplit_once("#[").map_or(false, |(_, a)| a.starts_with("cfg")) {
            panic!(
                "percpuref-sys: `pub const {}` has a #[cfg]: build.rs checks every constant \
                 on every target; give one value, or check it in the test",
                item
            );
        }
        c += &constant_check(item);
        constants += 1;
    }
    assert!(constants > 0, "percpuref-sys: no constant declared in src/lib.rs");
    let mut functions = 0;
    for block in code.split("extern \"C\" {").skip(1) {
        let block = block.split_once('}').expect("a `}` closing the extern block").0;
        for item in block.split(';').map(without_attributes).filter(|item| !item.is_empty()) {
            let decl = item
                .split_once("fn ")
                .unwrap_or_else(|| panic!("percpuref-sys: build.rs checks functions only: `{}`", item))
                .1;
            let (name, signature) = decl.split_once('(').expect("a `(` after the name");
            c += &format!(
                "_Static_assert(__builtin_types_compatible_p(__typeof__(&{}), {}), \"src/lib.rs: fn {} disagrees with its C prototype\");\n",
                name.trim(),
                c_function_pointer(&format!("({}", signature)),
                name.trim()
            );
            functions += 1;
        }
    }
    assert!(functions > 0, "percpuref-sys: no function declared in src/lib.rs");
    let path = out_dir.join("prototypes.c");
    fs::write(&path, c).unwrap_or_else(|e| panic!("percpuref-sys: cannot write {}: {}", path.display(), e));
    path
}

/// The repository the C sources come from: PERCPUREF_SOURCE_DIR, or two
/// levels above the crate.  A directory without them (a crate unpacked
/// from a registry, a wrong variable) is refused here, by name, rather
/// than by a compiler error or an undefined symbol at the final link.
fn source_root(manifest: &Path) -> PathBuf {
    let root = env::var_os("PERCPUREF_SOURCE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest.join("../../.."));
    for needed in ["src/percpu_ref.c", "include/percpuref/percpu_ref.h"] {
        if !root.join(needed).is_file() {
            panic!(
                "percpuref-sys: no percpuref sources in {} ({} is missing): build the crate \
                 from the percpuref repository (bindings/rust), or set PERCPUREF_SOURCE_DIR \
                 to the repository's top directory",
                root.display(),
                needed
            );
        }
    }
    root
}

/// The pkg-config that describes the target's libraries, by the pkg-config
/// crate's conventions: one named for the target (PKG_CONFIG_<target>,
/// TARGET_PKG_CONFIG), else PKG_CONFIG or pkg-config when building for the
/// host, or when cross-compiling with PKG_CONFIG_ALLOW_CROSS or
/// PKG_CONFIG_SYSROOT_DIR set.  None otherwise: the host's pkg-config
/// would give the host's directories to a cross build.
fn target_pkg_config() -> Option<String> {
    let target = env::var("TARGET").unwrap_or_default();
    let host = env::var("HOST").unwrap_or_default();
    for var in [
        format!("PKG_CONFIG_{}", target),
        format!("PKG_CONFIG_{}", target.replace('-', "_")),
        "TARGET_PKG_CONFIG".to_string(),
    ] {
        if let Ok(pkg_config) = env::var(&var) {
            return Some(pkg_config);
        }
    }
    if target == host
        || env::var_os("PKG_CONFIG_ALLOW_CROSS").is_some()
        || env::var_os("PKG_CONFIG_SYSROOT_DIR").is_some()
    {
        return Some(env::var("PKG_CONFIG").unwrap_or_else(|_| "pkg-config".to_string()));
    }
    None
}

/// liburcu-bp, which the library uses: its flags from
/// pkg-config (search paths included), then a test program compiled and
/// linked with them, so that a missing header or library fails here with
/// what to install, not at some later link.  A cross build with no
/// pkg-config for its target gets the plain library name, unprobed.  Adds
/// the include directories to @build; returns the directives for cargo, to
/// print after the library's own (a static library's dependencies follow
/// it on the link line).
fn probe_urcu(build: &mut cc::Build, out_dir: &Path) -> Vec<String> {
    const HINT: &str = "install liburcu's development files and pkg-config (Debian, Ubuntu: \
                        apt-get install liburcu-dev pkg-config)";
    let pkg_config = match target_pkg_config() {
        Some(pkg_config) => pkg_config,
        None => {
            return vec!["cargo:rustc-link-lib=urcu-bp".to_string()]
        }
    };
    let output = Command::new(&pkg_config)
        .args(["--cflags", "--libs", "liburcu-bp"])
        .output()
        .unwrap_or_else(|e| panic!("percpuref-sys: cannot run {}: {}; {}", pkg_config, e, HINT));
    if !output.status.success() {
        panic!(
            "percpuref-sys: {} knows no liburcu-bp ({}); {}",
            pkg_config,
            String::from_utf8_lossy(&output.stderr).trim(),
            HINT
        );
    }
    let flags = String::from_utf8_lossy(&output.stdout).into_owned();
    let mut probe = build.get_compiler().to_command();
    let source = out_dir.join("urcu_probe.c");
    fs::write(&source, "#include <urcu/urcu-bp.h>\nint main(void)\n{\n\turcu_bp_read_lock();\n\turcu_bp_read_unlock();\n\treturn 0;\n}\n")
        .unwrap_or_else(|e| panic!("percpuref-sys: cannot write {}: {}", source.display(), e));
    probe.arg(&source).arg("-o").arg(out_dir.join("urcu_probe"));
    let mut directives = Vec::new();
    for flag in flags.split_whitespace() {
        probe.arg(flag);
        if let Some(dir) = flag.strip_prefix("-I") {
            build.include(dir);
        } else if let Some(dir) = flag.strip_prefix("-L") {
            directives.push(format!("cargo:rustc-link-search=native={}", dir));
        } else if let Some(lib) = flag.strip_prefix("-l") {
            directives.push(format!("cargo:rustc-link-lib={}", lib));
        }
    }
    let probed = probe.output().unwrap_or_else(|e| panic!("percpuref-sys: cannot run the C compiler: {}", e));
    if !probed.status.success() {
        panic!(
            "percpuref-sys: a program using liburcu-bp does not compile and link with `{}`:\n{}\n{}",
            flags.trim(),
            String::from_utf8_lossy(&probed.stderr).trim(),
            HINT
        );
    }
    directives
}

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let root = source_root(&manifest);
    let src = root.join("src");
    let include = root.join("include");

    let mut sources: Vec<PathBuf> = fs::read_dir(&src)
        .unwrap_or_else(|e| panic!("percpuref-sys: cannot read {}: {}", src.display(), e))
        .map(|entry| entry.expect("readable directory entry").path())
        .filter(|path| path.extension().map_or(false, |ext| ext == "c"))
        .collect();
    sources.sort();
    let out_dir = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    sources.push(checked_shim(&manifest, &include, &out_dir));

    let mut build = cc::Build::new();
    build
        .files(&sources)
        .include(&include)
        .include(&src)
        .define("PERCPUREF_BUILDING", "1")
        .flag("-std=gnu11")
        .flag("-fvisibility=hidden")
        .warnings(false);
    let urcu = probe_urcu(&mut build, &out_dir);
    build.compile("percpuref");

    for directive in urcu {
        println!("{}", directive);
    }
    println!("cargo:rustc-link-lib=pthread");
    println!("cargo:rerun-if-changed={}", src.display());
    println!("cargo:rerun-if-changed={}", include.display());
    println!("cargo:rerun-if-changed=src/shim.c");
    println!("cargo:rerun-if-changed=src/lib.rs");
    println!("cargo:rerun-if-env-changed=PERCPUREF_SOURCE_DIR");
    for var in ["PKG_CONFIG", "PKG_CONFIG_PATH", "PKG_CONFIG_LIBDIR", "PKG_CONFIG_SYSROOT_DIR",
                "PKG_CONFIG_ALLOW_CROSS", "TARGET_PKG_CONFIG"] {
        println!("cargo:rerun-if-env-changed={}", var);
    }
}
