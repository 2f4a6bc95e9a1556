//! The workspace's layering, checked from the sources against ARCHITECTURE.md's "Layers"
//! tables: each crate depends (`[dependencies]`) only on crates of lower layers; drill-algo's
//! top-level modules name only modules of their own layer or lower ones; inside every crate
//! the modules under one parent import each other without cycles; drill-exp and drill-kernels
//! build without burn, and drill-kernels without any other drill crate.
//!
//! An edge `a → b` between two sibling modules means some file inside `a` names `crate::…::b`
//! or `super::b` (with `use` or in a path), or names an item that a `pub use` elsewhere
//! re-exports from `b` (`use crate::{Name}` with `pub use b::Name` in `lib.rs`: followed
//! through chains of re-exports to the module that defines it). Files are read whole, without
//! comments and string literals; an item under `#[cfg(test)]` (a unit test module, inline or
//! `mod tests;`), which may drive a layer through the ones above it, does not count.

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

/// A file's code: comments and the contents of string and char literals blanked, and every
/// item under `#[cfg(test)]` taken out (to its `;` or its closing brace).
fn code_of(text: &str) -> String {
    without_test_items(&blank_comments_and_literals(text))
}

/// `text` with comments (line, block, nested) and the insides of string, raw string, byte
/// string and char literals replaced by spaces, so that no brace or path inside them counts.
/// Lengths and line breaks are kept.
fn blank_comments_and_literals(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = b.to_vec();
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for c in &mut out[from..to.min(b.len())] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    };
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            let end = b[i..]
                .iter()
                .position(|&c| c == b'\n')
                .map_or(b.len(), |e| i + e);
            blank(&mut out, i, end);
            i = end;
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let (mut depth, mut j) = (1, i + 2);
            while j < b.len() && depth > 0 {
                if b[j] == b'/' && b.get(j + 1) == Some(&b'*') {
                    depth += 1;
                    j += 2;
                } else if b[j] == b'*' && b.get(j + 1) == Some(&b'/') {
                    depth -= 1;
                    j += 2;
                } else {
                    j += 1;
                }
            }
            blank(&mut out, i, j);
            i = j;
        } else if (c == b'r' || (c == b'b' && b.get(i + 1) == Some(&b'r')))
            && (i == 0 || !ident(b[i - 1]))
            && {
                let s = if c == b'b' { i + 2 } else { i + 1 };
                let h = b[s..].iter().take_while(|&&c| c == b'#').count();
                b.get(s + h) == Some(&b'"')
            }
        {
            // A raw string: r"…", r#"…"#, br"…".
            let s = if c == b'b' { i + 2 } else { i + 1 };
            let hashes = b[s..].iter().take_while(|&&c| c == b'#').count();
            let body = s + hashes + 1;
            let close = format!("\"{}", "#".repeat(hashes));
            let end = text[body..].find(&close).map_or(b.len(), |e| body + e);
            blank(&mut out, body, end);
            i = end + close.len();
        } else if c == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            blank(&mut out, i + 1, j);
            i = j + 1;
        } else if c == b'\'' {
            // A char literal ('x', '\n', '\u{…}'), or a lifetime ('a), left alone.
            if b.get(i + 1) == Some(&b'\\') {
                let end = b[i + 2..]
                    .iter()
                    .position(|&c| c == b'\'')
                    .map_or(b.len(), |e| i + 2 + e);
                blank(&mut out, i + 1, end);
                i = end + 1;
            } else if b.get(i + 2) == Some(&b'\'') {
                blank(&mut out, i + 1, i + 2);
                i += 3;
            } else if let Some(len) = text[i + 1..].chars().next().map(char::len_utf8)
                && len > 1
                && b.get(i + 1 + len) == Some(&b'\'')
            {
                blank(&mut out, i + 1, i + 1 + len);
                i += 2 + len;
            } else {
                i += 1;
            }
        } else {
            i += 1;
        }
    }
    String::from_utf8(out).expect("blanking keeps UTF-8: whole characters become spaces")
}

/// `code` (comments and literals blanked) without the items `#[cfg(test)]` marks: each runs
/// from the attribute to its first `;` outside braces or to the brace that closes its body.
fn without_test_items(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let item = &rest[at + "#[cfg(test)]".len()..];
        let (mut depth, mut braces, mut end) = (0i32, 0i32, item.len());
        for (i, c) in item.char_indices() {
            match c {
                '(' | '[' => depth += 1,
                ')' | ']' => depth -= 1,
                '{' => braces += 1,
                '}' => {
                    braces -= 1;
                    if braces == 0 && depth == 0 {
                        end = i + 1;
                        break;
                    }
                }
                ';' if depth == 0 && braces == 0 => {
                    end = i + 1;
                    break;
                }
                _ => {}
            }
        }
        rest = &item[end..];
    }
    out.push_str(rest);
    out
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

/// Who names whom among siblings: parent module → (child → the siblings it names).
type Graphs = BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>>;

/// The sibling edges of a crate's modules (`modules` of its `src`).
fn sibling_graphs(mods: &[(Vec<String>, String)]) -> Graphs {
    let known: BTreeSet<Vec<String>> = mods.iter().map(|(m, _)| m.clone()).collect();
    let reexported = reexports(mods, &known);
    let mut graphs = Graphs::new();
    for (me, text) in mods {
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
    graphs
}

/// Cycles among siblings, as `parent: a <-> b` for each pair that reach each other.
fn sibling_cycles(src: &Path) -> Vec<String> {
    let mut cycles = Vec::new();
    for (parent, g) in &sibling_graphs(&modules(src)) {
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

/// A "Layers" table of ARCHITECTURE.md (`text`): the rows under the header line that starts
/// with `| {header}`, top layer first, each the names written in backticks in its second
/// column (`drill-algo`, `compute/`, `dqn.rs`: a module's `/` or `.rs` dropped).
fn layer_table(text: &str, header: &str) -> Vec<Vec<String>> {
    let start = format!("| {header}");
    let mut lines = text.lines().skip_while(|l| !l.starts_with(&start));
    assert!(
        lines.next().is_some(),
        "ARCHITECTURE.md has no table headed {start:?}"
    );
    lines
        .skip(1) // |---|---|
        .take_while(|l| l.starts_with('|'))
        .map(|row| {
            let names = row.split('|').nth(2).unwrap_or("");
            names
                .split('`')
                .skip(1)
                .step_by(2)
                .map(|n| n.trim_end_matches('/').trim_end_matches(".rs").to_string())
                .collect()
        })
        .collect()
}

/// The layer (0 = top) `name` is in.
fn layer_of(layers: &[Vec<String>], name: &str) -> Option<usize> {
    layers.iter().position(|l| l.iter().any(|n| n == name))
}

/// The workspace crates (folders under `crates_dir` with a Cargo.toml) whose
/// `[dependencies]` name a drill crate of the same or a higher layer, or that no layer holds.
fn crate_layer_breaches(crates_dir: &Path, layers: &[Vec<String>]) -> Vec<String> {
    let mut out = Vec::new();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(crates_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|d| d.join("Cargo.toml").is_file())
        .collect();
    dirs.sort();
    for dir in dirs {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let Some(me) = layer_of(layers, &name) else {
            out.push(format!("{name} is in no layer"));
            continue;
        };
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
        let deps = manifest
            .lines()
            .skip_while(|l| l.trim() != "[dependencies]")
            .skip(1)
            .take_while(|l| !l.trim_start().starts_with('['));
        for line in deps {
            let dep: String = line
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '-' || *c == '_')
                .collect();
            if !dep.starts_with("drill-") {
                continue;
            }
            match layer_of(layers, &dep) {
                Some(l) if l > me => {}
                Some(_) => out.push(format!(
                    "{name} depends on {dep}, of its own layer or a higher one"
                )),
                None => out.push(format!("{name} depends on {dep}, which is in no layer")),
            }
        }
    }
    out
}

/// drill-algo's top-level modules (its `src`) that name a module of a higher layer, or that
/// no layer holds.
fn module_layer_breaches(src: &Path, layers: &[Vec<String>]) -> Vec<String> {
    let mods = modules(src);
    let graphs = sibling_graphs(&mods);
    let mut out = Vec::new();
    let top: BTreeSet<String> = mods
        .iter()
        .filter_map(|(m, _)| m.first().cloned())
        .collect();
    for m in &top {
        if layer_of(layers, m).is_none() {
            out.push(format!("module {m} is in no layer"));
        }
    }
    for (from, to) in graphs.get(&Vec::new()).into_iter().flatten() {
        let Some(a) = layer_of(layers, from) else {
            continue;
        };
        for t in to {
            if layer_of(layers, t).is_some_and(|b| b < a) {
                out.push(format!("{from} names {t}, of a higher layer"));
            }
        }
    }
    out
}

/// Files of the crate at `src` (lib.rs aside) that name an item through the crate root
/// (`crate::Item`, an item lib.rs defines or re-exports) instead of its own module: lib.rs is
/// the façade for other crates, not a layer the crate's own modules import from.
fn imports_through_the_root(src: &Path) -> Vec<String> {
    let mods = modules(src);
    let top: BTreeSet<&str> = mods
        .iter()
        .filter_map(|(m, _)| m.first().map(String::as_str))
        .collect();
    let mut out = Vec::new();
    for (me, text) in &mods {
        if me.is_empty() {
            continue;
        }
        for target in references(text, me) {
            // A path whose first segment is no top-level module names an item of the root.
            if let Some(first) = target.first()
                && !top.contains(first.as_str())
            {
                out.push(format!("{}: crate::{first}", me.join("::")));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

fn architecture_md() -> String {
    std::fs::read_to_string(crates().join("../ARCHITECTURE.md")).unwrap()
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
fn every_crate_depends_only_on_lower_layers() {
    let layers = layer_table(&architecture_md(), "crate layer");
    let breaches = crate_layer_breaches(&crates(), &layers);
    assert!(
        breaches.is_empty(),
        "layer breaches:\n{}",
        breaches.join("\n")
    );
}

#[test]
fn drill_algo_modules_name_only_their_layer_or_lower_ones() {
    let layers = layer_table(&architecture_md(), "drill-algo layer");
    let breaches = module_layer_breaches(&crates().join("drill-algo/src"), &layers);
    assert!(
        breaches.is_empty(),
        "layer breaches:\n{}",
        breaches.join("\n")
    );
}

#[test]
fn drill_algo_modules_do_not_import_through_lib_rs() {
    let found = imports_through_the_root(&crates().join("drill-algo/src"));
    assert!(
        found.is_empty(),
        "imports through lib.rs:\n{}",
        found.join("\n")
    );
    // Planted: a module naming a re-exported item through the root must be seen.
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    copy_tree(&crates().join("drill-algo/src"), &src);
    let envs = src.join("envs.rs");
    let text = std::fs::read_to_string(&envs).unwrap();
    std::fs::write(&envs, format!("{text}\nuse crate::TrainResult;\n")).unwrap();
    assert_eq!(imports_through_the_root(&src), ["envs: crate::TrainResult"]);
}

/// Normal dependencies (`cargo tree -e normal`) of `package`, one crate name per line.
fn dependency_tree(package: &str) -> String {
    let out = std::process::Command::new(env!("CARGO"))
        .args(["tree", "-p", package, "-e", "normal", "--prefix", "none"])
        .current_dir(crates())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(tree.contains(package), "{tree}");
    tree
}

#[test]
fn the_experiment_folder_needs_no_tensor_library() {
    let tree = dependency_tree("drill-exp");
    for heavy in ["burn", "drill-algo"] {
        assert!(
            !tree.lines().any(|l| l.starts_with(heavy)),
            "drill-exp depends on {heavy}:\n{tree}"
        );
    }
}

#[test]
fn the_kernels_need_no_tensor_library_and_no_other_drill_crate() {
    let tree = dependency_tree("drill-kernels");
    let bad: Vec<&str> = tree
        .lines()
        .filter(|l| {
            l.starts_with("burn") || (l.starts_with("drill-") && !l.starts_with("drill-kernels"))
        })
        .collect();
    assert!(bad.is_empty(), "drill-kernels depends on {bad:?}");
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

/// The cycle check reads a file whole: in a scratch copy of drill-task, whose `lib.rs` has
/// `#[cfg(test)] mod fuzz;` above its `pub use` lines (through which `parallel` names `task`),
/// `task.rs` naming `parallel` closes a loop the check must see.
#[test]
fn the_cycle_check_reads_past_a_test_module() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    copy_tree(&crates().join("drill-task/src"), &src);
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let fuzz = lib
        .find("#[cfg(test)]")
        .expect("drill-task's lib.rs has a test module");
    assert!(
        lib[fuzz..].contains("pub use task::"),
        "the re-exports are no longer below the test module: move this test's plant"
    );
    assert_eq!(sibling_cycles(&src), Vec::<String>::new());
    let task = src.join("task.rs");
    let text = std::fs::read_to_string(&task).unwrap();
    std::fs::write(&task, format!("{text}\nuse crate::parallel::Parallel;\n")).unwrap();
    assert_eq!(sibling_cycles(&src), ["crate: parallel <-> task"]);
}

/// Test items are left out by their extent, not by where the first one starts: code after a
/// test module counts, code inside one (or in a string, or a comment) does not.
#[test]
fn test_items_comments_and_strings_do_not_count() {
    let code = code_of(
        "use crate::a;\n#[cfg(test)]\nmod tests {\n    use crate::b;\n    fn f() { let s = \"}\"; }\n}\n\
         #[cfg(test)]\nmod fuzz;\nuse crate::c; // crate::d\nconst S: &str = r#\"crate::e\"#;\n\
         /* crate::f /* nested */ crate::g */ fn h<'a>(x: &'a str) -> char { '{' }\nuse crate::i;\n",
    );
    let names: Vec<Vec<String>> = references(&code, &["m".to_string()]);
    let firsts: Vec<&str> = names.iter().map(|p| p[0].as_str()).collect();
    assert_eq!(firsts, ["a", "c", "i"], "{code}");
}

/// A layer breach that closes no loop: in a scratch copy of drill-algo, `compute/` (low)
/// naming `interrupt` (a run's parts, which names no drill-algo module) must fail the layer
/// check while the cycle check passes; and a
/// crate depending on a higher crate must fail the crate check.
#[test]
fn the_layer_checks_see_a_breach() {
    let md = architecture_md();
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    copy_tree(&crates().join("drill-algo/src"), &src);
    let layers = layer_table(&md, "drill-algo layer");
    assert_eq!(module_layer_breaches(&src, &layers), Vec::<String>::new());
    let compute = src.join("compute/mod.rs");
    let text = std::fs::read_to_string(&compute).unwrap();
    std::fs::write(
        &compute,
        format!("{text}\nuse crate::interrupt::requested;\n"),
    )
    .unwrap();
    assert_eq!(sibling_cycles(&src), Vec::<String>::new());
    assert_eq!(
        module_layer_breaches(&src, &layers),
        ["compute names interrupt, of a higher layer"]
    );

    let layers = layer_table(&md, "crate layer");
    let scratch = tmp.path().join("crates");
    for entry in std::fs::read_dir(crates()).unwrap() {
        let dir = entry.unwrap().path();
        if dir.join("Cargo.toml").is_file() {
            let to = scratch.join(dir.file_name().unwrap());
            std::fs::create_dir_all(&to).unwrap();
            std::fs::copy(dir.join("Cargo.toml"), to.join("Cargo.toml")).unwrap();
        }
    }
    assert_eq!(
        crate_layer_breaches(&scratch, &layers),
        Vec::<String>::new()
    );
    let comm = scratch.join("drill-comm/Cargo.toml");
    let text = std::fs::read_to_string(&comm).unwrap();
    let text = text.replacen(
        "[dependencies]\n",
        "[dependencies]\ndrill-exp.workspace = true\n",
        1,
    );
    std::fs::write(&comm, text).unwrap();
    assert_eq!(
        crate_layer_breaches(&scratch, &layers),
        ["drill-comm depends on drill-exp, of its own layer or a higher one"]
    );
}
