//! The workspace's layering, checked from the sources: inside every crate, the modules under
//! one parent import each other without cycles (layers call down only), and drill-exp (the
//! experiment folder) does not depend on the training crates or burn.
//!
//! An edge `a → b` between two sibling modules means some file inside `a` names `crate::…::b`
//! or `super::b` (with `use` or in a path), or names an item that a `pub use` elsewhere
//! re-exports from `b` (`use crate::{Name}` with `pub use b::Name` in `lib.rs`: followed
//! through chains of re-exports to the module that defines it). The unit tests at the bottom
//! of a file (from `#[cfg(test)]` on), which may drive a layer through the ones above it, do
//! not count.

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

/// A file's code without its unit tests and line comments.
fn code_of(text: &str) -> String {
    let text = text.split("#[cfg(test)]").next().unwrap_or("");
    text.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Split `s` at the commas outside braces.
fn split_top(s: &str) -> Vec<&str> {
    let (mut depth, mut start, mut out) = (0i32, 0, Vec::new());
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

/// The leaves of a `use` tree, as (path, the name it is known by): `a::{b, c::d as e}` gives
/// `(["a", "b"], "b")` and `(["a", "c", "d"], "e")`; `a::{self}` gives `(["a"], "a")`. Globs
/// are left out.
fn use_leaves(tree: &str, prefix: &[String], out: &mut Vec<(Vec<String>, String)>) {
    let tree = tree.trim();
    if tree.is_empty() || tree == "*" {
        return;
    }
    if let Some(inner) = tree.strip_prefix('{') {
        let inner = &inner[..inner.rfind('}').unwrap_or(inner.len())];
        for part in split_top(inner) {
            use_leaves(part, prefix, out);
        }
        return;
    }
    let brace = tree.find('{').unwrap_or(tree.len());
    if let Some(i) = tree[..brace].find("::") {
        let mut p = prefix.to_vec();
        p.push(tree[..i].trim().to_string());
        use_leaves(&tree[i + 2..], &p, out);
        return;
    }
    let (name, alias) = match tree.split_once(" as ") {
        Some((n, a)) => (n.trim(), Some(a.trim())),
        None => (tree, None),
    };
    if name == "self" {
        if let Some(last) = prefix.last() {
            out.push((prefix.to_vec(), alias.unwrap_or(last).to_string()));
        }
    } else {
        let mut p = prefix.to_vec();
        p.push(name.to_string());
        out.push((p, alias.unwrap_or(name).to_string()));
    }
}

/// Every `pub use` (any visibility) of the crate: (module it is in, name it exports) → the
/// absolute path of what it names. Paths into other crates are left out.
fn reexports(
    mods: &[(Vec<String>, String)],
    known: &BTreeSet<Vec<String>>,
) -> BTreeMap<(Vec<String>, String), Vec<String>> {
    let mut out = BTreeMap::new();
    for (me, text) in mods {
        let code = code_of(text);
        let mut from = 0;
        while let Some(i) = code[from..].find("pub") {
            let at = from + i;
            from = at + 3;
            let rest = code[from..].trim_start();
            let rest = match rest.strip_prefix('(') {
                Some(r) => r[r.find(')').map_or(r.len(), |e| e + 1)..].trim_start(),
                None => rest,
            };
            let Some(tree) = rest.strip_prefix("use ") else {
                continue;
            };
            let tree = &tree[..tree.find(';').unwrap_or(tree.len())];
            let mut leaves = Vec::new();
            use_leaves(tree, &[], &mut leaves);
            for (path, name) in leaves {
                let absolute = match path.first().map(String::as_str) {
                    Some("crate") => path[1..].to_vec(),
                    Some("self") => me
                        .iter()
                        .cloned()
                        .chain(path[1..].iter().cloned())
                        .collect(),
                    Some("super") => {
                        let ups = path.iter().take_while(|s| *s == "super").count();
                        let base = &me[..me.len().saturating_sub(ups)];
                        base.iter()
                            .cloned()
                            .chain(path[ups..].iter().cloned())
                            .collect()
                    }
                    Some(first) => {
                        let mut child = me.clone();
                        child.push(first.to_string());
                        if !known.contains(&child) {
                            continue; // another crate
                        }
                        me.iter().cloned().chain(path.iter().cloned()).collect()
                    }
                    None => continue,
                };
                out.insert((me.clone(), name), absolute);
            }
        }
    }
    out
}

/// `path` with re-exports followed: while the longest module it names re-exports its next
/// segment, that segment is replaced by what it re-exports.
fn resolve(
    mut path: Vec<String>,
    known: &BTreeSet<Vec<String>>,
    reexported: &BTreeMap<(Vec<String>, String), Vec<String>>,
) -> Vec<String> {
    for _ in 0..16 {
        let Some(m) = (0..=path.len())
            .rev()
            .find(|&n| known.contains(&path[..n].to_vec()))
        else {
            break;
        };
        let Some(next) = path.get(m) else { break };
        let Some(to) = reexported.get(&(path[..m].to_vec(), next.clone())) else {
            break;
        };
        let mut resolved = to.clone();
        resolved.extend(path[m + 1..].iter().cloned());
        if resolved == path {
            break;
        }
        path = resolved;
    }
    path
}

/// The module paths a file of module `me` names: `crate::a::b…` and `super::x…` (`super` is
/// `me`'s parent, whether the file is `x.rs` or `x/mod.rs`). Brace groups
/// (`crate::{a, b::c}`) give each member.
fn references(text: &str, me: &[String]) -> Vec<Vec<String>> {
    let code = code_of(text);
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
    let reexported = reexports(&mods, &known);
    // parent → (child → the siblings it names)
    let mut graphs: BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (me, text) in &mods {
        for target in references(text, me) {
            let target = resolve(target, &known, &reexported);
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

/// Copy the tree `from` into `to`.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let dest = to.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_tree(&path, &dest);
        } else {
            std::fs::copy(&path, &dest).unwrap();
        }
    }
}

/// A cycle that only a re-export shows: in a scratch copy of drill-env, `error.rs` (which
/// `vector.rs` imports `EnvError` from) names `crate::{DynVecEnv}`, an item `lib.rs`
/// re-exports from `vector`. The check must follow the re-export and fail.
#[test]
fn the_cycle_check_follows_reexports() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    copy_tree(&crates().join("drill-env/src"), &src);
    assert_eq!(sibling_cycles(&src), Vec::<String>::new());
    let error = src.join("error.rs");
    let text = std::fs::read_to_string(&error).unwrap();
    std::fs::write(&error, format!("use crate::{{DynVecEnv}};\n{text}")).unwrap();
    assert_eq!(sibling_cycles(&src), ["crate: error <-> vector"]);
    // A chain of re-exports: a module's own `pub use` of another module's item.
    std::fs::write(&error, format!("use crate::Renamed;\n{text}")).unwrap();
    let append = |file: &str, line: &str| {
        let path = src.join(file);
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, format!("{text}\n{line}\n")).unwrap();
    };
    append("lib.rs", "pub use time_limit::Again as Renamed;");
    append("time_limit.rs", "pub use crate::vector::VecEnv as Again;");
    assert_eq!(sibling_cycles(&src), ["crate: error <-> vector"]);
}
