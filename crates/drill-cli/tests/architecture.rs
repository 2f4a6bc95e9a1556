//! The workspace's layering, checked from the sources: inside every crate, the modules under
//! one parent import each other without cycles (layers call down only), and drill-exp (the
//! experiment folder) does not depend on the training crates or burn.
//!
//! An edge `a → b` between two sibling modules means some file inside `a` names `crate::…::b`
//! or `super::b` (with `use` or in a path). Items of the parent itself (its `mod.rs`) are not a
//! sibling, so `mod.rs` re-exports do not count; nor do the unit tests at the bottom of a file
//! (from `#[cfg(test)]` on), which may drive a layer through the ones above it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn crates() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every `.rs` file under `src`, as (module path, text): `src/a/b.rs` and `src/a/b/mod.rs` are
/// `["a", "b"]`; `lib.rs`, `main.rs` are `[]`.
fn modules(src: &Path) -> Vec<(Vec<String>, String)> {
    let mut out = Vec::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(src).unwrap();
            let mut parts: Vec<String> = rel
                .iter()
                .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
                .collect();
            if matches!(
                parts.last().map(String::as_str),
                Some("mod" | "lib" | "main")
            ) {
                parts.pop();
            }
            out.push((parts, std::fs::read_to_string(&path).unwrap()));
        }
    }
    out
}

/// The module paths a file of module `me` names: `crate::a::b…` and `super::x…` (`super` is
/// `me`'s parent, whether the file is `x.rs` or `x/mod.rs`). Brace groups
/// (`crate::{a, b::c}`) give each member.
fn references(text: &str, me: &[String]) -> Vec<Vec<String>> {
    let text = text.split("#[cfg(test)]").next().unwrap_or("");
    let code: String = text
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let path_after = |rest: &str| -> Vec<Vec<String>> {
        // `a::b::{c, d::e}` or `a::b` or `{a, b}`.
        let mut prefix = Vec::new();
        let mut rest = rest;
        loop {
            if let Some(group) = rest.strip_prefix('{') {
                let end = group.find('}').unwrap_or(group.len());
                return group[..end]
                    .split(',')
                    .map(|item| {
                        let mut p = prefix.clone();
                        p.extend(item.trim().split("::").map(ident).filter(|s| !s.is_empty()));
                        p
                    })
                    .collect();
            }
            let id = ident(rest);
            if id.is_empty() {
                return vec![prefix];
            }
            rest = &rest[id.len()..];
            prefix.push(id);
            match rest.strip_prefix("::") {
                Some(r) => rest = r,
                None => return vec![prefix],
            }
        }
    };
    let mut out = Vec::new();
    let parent = me[..me.len().saturating_sub(1)].to_vec();
    for (marker, base) in [("crate::", Vec::new()), ("super::", parent)] {
        let mut from = 0;
        while let Some(i) = code[from..].find(marker) {
            let at = from + i;
            from = at + marker.len();
            // Skip `foo_crate::`, `$crate::` and similar.
            if at > 0 && {
                let c = code.as_bytes()[at - 1];
                c.is_ascii_alphanumeric() || c == b'_' || c == b'$'
            } {
                continue;
            }
            for p in path_after(&code[from..]) {
                let mut full = base.clone();
                full.extend(p);
                out.push(full);
            }
        }
    }
    out
}

/// Cycles among siblings, as `parent: a <-> b` for each pair that reach each other.
fn sibling_cycles(src: &Path) -> Vec<String> {
    let mods = modules(src);
    let known: BTreeSet<Vec<String>> = mods.iter().map(|(m, _)| m.clone()).collect();
    // parent → (child → the siblings it names)
    let mut graphs: BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (me, text) in &mods {
        for target in references(text, me) {
            // The longest known module the path names.
            let Some(target) = (1..=target.len())
                .rev()
                .map(|n| target[..n].to_vec())
                .find(|t| known.contains(t))
            else {
                continue;
            };
            // Where `me` and `target` part: two siblings of one parent.
            let common = me.iter().zip(&target).take_while(|(a, b)| a == b).count();
            if common >= me.len() || common >= target.len() {
                continue; // an ancestor or a descendant
            }
            graphs
                .entry(me[..common].to_vec())
                .or_default()
                .entry(me[common].clone())
                .or_default()
                .insert(target[common].clone());
        }
    }
    let mut cycles = Vec::new();
    for (parent, g) in &graphs {
        let name = if parent.is_empty() {
            "crate".to_string()
        } else {
            parent.join("::")
        };
        for a in g.keys() {
            for b in g.keys().filter(|b| a < *b) {
                if reaches(g, a, b, &mut BTreeSet::new()) && reaches(g, b, a, &mut BTreeSet::new())
                {
                    cycles.push(format!("{name}: {a} <-> {b}"));
                }
            }
        }
    }
    cycles
}

/// `from` names `to`, directly or through other siblings.
fn reaches(
    g: &BTreeMap<String, BTreeSet<String>>,
    from: &str,
    to: &str,
    seen: &mut BTreeSet<String>,
) -> bool {
    if !seen.insert(from.to_string()) {
        return false;
    }
    g.get(from)
        .is_some_and(|deps| deps.iter().any(|d| d == to || reaches(g, d, to, seen)))
}

#[test]
fn no_crate_has_an_import_cycle_between_sibling_modules() {
    let mut all = Vec::new();
    for entry in std::fs::read_dir(crates()).unwrap() {
        let dir = entry.unwrap().path();
        let src = dir.join("src");
        if src.is_dir() {
            for c in sibling_cycles(&src) {
                all.push(format!(
                    "{}: {c}",
                    dir.file_name().unwrap().to_string_lossy()
                ));
            }
        }
    }
    assert!(all.is_empty(), "import cycles:\n{}", all.join("\n"));
}

#[test]
fn the_experiment_folder_needs_no_tensor_library() {
    let out = std::process::Command::new(env!("CARGO"))
        .args([
            "tree",
            "-p",
            "drill-exp",
            "-e",
            "normal",
            "--prefix",
            "none",
        ])
        .current_dir(crates())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = String::from_utf8_lossy(&out.stdout);
    assert!(tree.contains("drill-exp"), "{tree}");
    for heavy in ["burn", "drill-algo"] {
        assert!(
            !tree.lines().any(|l| l.starts_with(heavy)),
            "drill-exp depends on {heavy}:\n{tree}"
        );
    }
}

#[test]
fn the_cycle_check_sees_a_cycle() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path();
    std::fs::create_dir_all(src.join("cmd")).unwrap();
    std::fs::write(src.join("lib.rs"), "mod a;\nmod b;\nmod cmd;\n").unwrap();
    std::fs::write(src.join("a.rs"), "use crate::b::X;\n").unwrap();
    std::fs::write(src.join("b.rs"), "pub fn f() { crate::a::g() }\n").unwrap();
    std::fs::write(src.join("cmd/mod.rs"), "mod x;\nmod y;\npub use x::T;\n").unwrap();
    std::fs::write(src.join("cmd/x.rs"), "use super::{y::Y, T};\n").unwrap();
    std::fs::write(src.join("cmd/y.rs"), "// use super::x;\npub struct Y;\n").unwrap();
    assert_eq!(sibling_cycles(src), ["crate: a <-> b"]);
    std::fs::write(src.join("cmd/y.rs"), "use crate::cmd::x::Z;\n").unwrap();
    assert_eq!(sibling_cycles(src), ["crate: a <-> b", "cmd: x <-> y"]);
}
