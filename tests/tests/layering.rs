//! No circle of imports between the files of a crate.
//!
//! How it works: each file is parsed with `syn`, starting at `src/lib.rs` (or `src/main.rs`)
//! and following its `mod` declarations (`x.rs`, `x/mod.rs`, inline `mod x { .. }`),
//! which gives the crate's module tree. A file *names* another when one of its paths reaches
//! into the other: a `use` tree (groups, `self`, globs, `as`) or a path of two or more segments
//! in an expression, a type, a pattern or a trait bound (`crate::a::b(..)`, `super::X`,
//! `child::f()`, or through a module that a `use` brought in under a name). A path is followed
//! over the module tree as far as it goes through modules: `crate::model::pool::DeleteReason`
//! names the file of `model::pool`, `crate::Proxy` names `lib.rs`. A `mod` declaration is not a
//! use (every child would otherwise be in a circle with its parent), and nothing under
//! `#[cfg(test)]` is read: tests sit above what they test.
//!
//! The files and what they name make a graph; a circle is a strongly connected set of more than
//! one file (each reaches each other), reported with the steps between its files and the first
//! path that makes each step.
//! Every workspace member must have none, but the crates in [`STILL_WITH_CIRCLES`], whose
//! circles are printed without failing, as the work still to do: a crate leaves that list once
//! it has none, and a new crate is held from the start.
//!
//! What it does not see: paths inside macro invocations, paths through a glob-imported module
//! name, and `#[path]` on a `mod` (no crate uses one). It errs by missing an edge, never by inventing one.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// Crates (directories under the workspace root) whose files still import in circles; every
/// other crate's files must import in none.
const STILL_WITH_CIRCLES: &[&str] = &[];

/// A module's path from the crate root (`["model", "pool"]`).
type ModPath = Vec<String>;

/// A path written in a file: the module it is written in, its segments, and for a `use` the
/// name it brings into scope.
struct Written {
    at: ModPath,
    path: Vec<String>,
    alias: Option<String>,
}

/// A crate's module tree (the file of each module and its children) and the paths each file
/// writes. Files are named relative to the crate's `src/`.
#[derive(Default)]
struct Crate {
    modules: BTreeMap<ModPath, (PathBuf, BTreeSet<String>)>,
    written: BTreeMap<PathBuf, Vec<Written>>,
}

/// Whether an item is under `#[cfg(test)]`.
fn is_test(attrs: &[syn::Attribute]) -> bool {
    let test = |a: &syn::Attribute| a.parse_args::<syn::Ident>().is_ok_and(|i| i == "test");
    attrs.iter().any(|a| a.path().is_ident("cfg") && test(a))
}

fn attrs_of(item: &syn::Item) -> &[syn::Attribute] {
    macro_rules! attrs {
        ($($kind:ident)*) => { match item { $(syn::Item::$kind(i) => &i.attrs,)* _ => &[] } };
    }
    attrs!(Const Enum Fn Impl Macro Mod Static Struct Trait Type Use)
}

/// The `use` paths of a tree, each with the name it brings into scope (none for a glob).
fn flatten(
    tree: &syn::UseTree,
    prefix: &mut Vec<String>,
    out: &mut Vec<(Vec<String>, Option<String>)>,
) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            flatten(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) if n.ident == "self" => {
            out.push((prefix.clone(), prefix.last().cloned()));
        }
        syn::UseTree::Name(n) => {
            let path = [prefix.as_slice(), &[n.ident.to_string()]].concat();
            out.push((path, Some(n.ident.to_string())));
        }
        syn::UseTree::Rename(r) => {
            let name = if r.ident == "self" {
                vec![]
            } else {
                vec![r.ident.to_string()]
            };
            out.push((
                [prefix.as_slice(), &name].concat(),
                Some(r.rename.to_string()),
            ));
        }
        syn::UseTree::Glob(_) => out.push((prefix.clone(), None)),
        syn::UseTree::Group(g) => g.items.iter().for_each(|t| flatten(t, prefix, out)),
    }
}

/// Walks one file: records the modules it declares, the files to read next and the paths
/// it writes.
struct Walk<'a> {
    krate: &'a mut Crate,
    file: PathBuf,
    /// The directory a `mod x;` of the current module is looked for in.
    dir: PathBuf,
    at: ModPath,
    to_read: Vec<(PathBuf, ModPath, PathBuf)>,
}

impl Walk<'_> {
    fn write(&mut self, path: Vec<String>, alias: Option<String>) {
        let at = self.at.clone();
        let written = self.krate.written.entry(self.file.clone()).or_default();
        written.push(Written { at, path, alias });
    }
}

impl<'ast> Visit<'ast> for Walk<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        match item {
            _ if is_test(attrs_of(item)) => {}
            syn::Item::Mod(m) => {
                let name = m.ident.to_string();
                let siblings = &mut self.krate.modules.get_mut(&self.at).unwrap().1;
                siblings.insert(name.clone());
                let child = [self.at.clone(), vec![name.clone()]].concat();
                let dir = self.dir.join(&name);
                if let Some((_, items)) = &m.content {
                    let here = (self.file.clone(), BTreeSet::new());
                    self.krate.modules.insert(child.clone(), here);
                    let at = std::mem::replace(&mut self.at, child);
                    let outer = (at, std::mem::replace(&mut self.dir, dir));
                    items.iter().for_each(|i| self.visit_item(i));
                    (self.at, self.dir) = outer;
                } else {
                    let flat = self.dir.join(format!("{name}.rs"));
                    let file = if flat.exists() {
                        flat
                    } else {
                        dir.join("mod.rs")
                    };
                    self.to_read.push((file, child, dir));
                }
            }
            syn::Item::Use(u) if u.leading_colon.is_none() => {
                let mut paths = Vec::new();
                flatten(&u.tree, &mut Vec::new(), &mut paths);
                paths
                    .into_iter()
                    .for_each(|(path, alias)| self.write(path, alias));
            }
            _ => syn::visit::visit_item(self, item),
        }
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if !is_test(&f.attrs) {
            syn::visit::visit_impl_item_fn(self, f);
        }
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        if p.leading_colon.is_none() && p.segments.len() > 1 {
            self.write(
                p.segments.iter().map(|s| s.ident.to_string()).collect(),
                None,
            );
        }
        syn::visit::visit_path(self, p);
    }
}

impl Crate {
    /// Reads the crate whose root file is `root_file`, following its `mod` declarations.
    fn read(root_file: &Path) -> Crate {
        let src = root_file.parent().unwrap();
        let mut krate = Crate::default();
        let mut queue = vec![(root_file.to_path_buf(), Vec::new(), src.to_path_buf())];
        while let Some((path, at, dir)) = queue.pop() {
            let file = path.strip_prefix(src).unwrap().to_path_buf();
            krate
                .modules
                .insert(at.clone(), (file.clone(), BTreeSet::new()));
            let Ok(text) = std::fs::read_to_string(&path) else {
                // A module of another platform or feature whose file is elsewhere.
                println!("not read: {}", path.display());
                continue;
            };
            let parsed = syn::parse_file(&text).unwrap_or_else(|e| panic!("{file:?}: {e}"));
            krate.written.entry(file.clone()).or_default();
            let to_read = Vec::new();
            let mut walk = Walk {
                krate: &mut krate,
                file,
                dir,
                at,
                to_read,
            };
            parsed.items.iter().for_each(|i| walk.visit_item(i));
            queue.extend(walk.to_read);
        }
        krate
    }

    /// The module `path`, written in module `at`, reaches as far as it goes through modules,
    /// and whether all of it was modules. None for a path that leaves the crate.
    fn resolve(
        &self,
        at: &ModPath,
        aliases: &BTreeMap<(ModPath, String), ModPath>,
        path: &[String],
    ) -> Option<(ModPath, bool)> {
        let (mut module, mut rest) = match path.first()?.as_str() {
            "crate" => (Vec::new(), &path[1..]),
            "self" => (at.clone(), &path[1..]),
            "super" => {
                let ups = path.iter().take_while(|s| *s == "super").count();
                (at[..at.len().saturating_sub(ups)].to_vec(), &path[ups..])
            }
            name if self.modules.get(at)?.1.contains(name) => (at.clone(), path),
            name => (
                aliases.get(&(at.clone(), name.to_string()))?.clone(),
                &path[1..],
            ),
        };
        while let Some(seg) = rest.first() {
            if !self.modules.get(&module).is_some_and(|m| m.1.contains(seg)) {
                return Some((module, false));
            }
            module.push(seg.clone());
            rest = &rest[1..];
        }
        Some((module, true))
    }

    /// The files each file names, with the first path that names each.
    fn graph(&self) -> BTreeMap<PathBuf, BTreeMap<PathBuf, String>> {
        let mut graph = BTreeMap::new();
        for (file, written) in &self.written {
            let mut aliases = BTreeMap::new();
            for w in written.iter().filter(|w| w.alias.is_some()) {
                if let Some((m, true)) = self.resolve(&w.at, &aliases, &w.path) {
                    aliases.insert((w.at.clone(), w.alias.clone().unwrap()), m);
                }
            }
            let edges: &mut BTreeMap<PathBuf, String> = graph.entry(file.clone()).or_default();
            for w in written {
                let Some((m, _)) = self.resolve(&w.at, &aliases, &w.path) else {
                    continue;
                };
                let target = &self.modules[&m].0;
                if target != file {
                    edges
                        .entry(target.clone())
                        .or_insert_with(|| format!("`{}`", w.path.join("::")));
                }
            }
        }
        graph
    }

    /// Each strongly connected set of more than one file, with the steps inside it.
    fn circles(&self) -> Vec<String> {
        let graph = self.graph();
        let reach = |from: &PathBuf| -> BTreeSet<PathBuf> {
            let (mut seen, mut stack) = (BTreeSet::new(), vec![from.clone()]);
            while let Some(v) = stack.pop() {
                for w in graph.get(&v).into_iter().flat_map(|e| e.keys()) {
                    if seen.insert(w.clone()) {
                        stack.push(w.clone());
                    }
                }
            }
            seen
        };
        let reaches: BTreeMap<_, _> = graph.keys().map(|f| (f.clone(), reach(f))).collect();
        let mut done = BTreeSet::new();
        let mut out = Vec::new();
        for (start, from_start) in &reaches {
            let set: BTreeSet<PathBuf> = from_start
                .iter()
                .filter(|f| reaches[*f].contains(start))
                .cloned()
                .collect();
            if set.len() < 2 || !done.insert(set.clone()) {
                continue;
            }
            let names: Vec<String> = set.iter().map(|f| f.display().to_string()).collect();
            let mut text = format!("{} files in a circle: {}, by:", set.len(), names.join(", "));
            for a in &set {
                for (b, why) in graph[a].iter().filter(|(b, _)| set.contains(*b)) {
                    let (a, b) = (a.display(), b.display());
                    text.push_str(&format!("\n    {a} -> {b} by {why}"));
                }
            }
            out.push(text);
        }
        out
    }
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The workspace's members, from the root Cargo.toml's `members` list.
fn workspace_members() -> Vec<String> {
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let list = &manifest[manifest.find("members = [").expect("a members list")..];
    let list = &list[..list.find(']').unwrap()];
    list.split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// Reads every workspace member (its library and binary) and checks those not in
/// [`STILL_WITH_CIRCLES`]; those crates' circles are printed for the steps still to come (run
/// with `--nocapture`).
#[test]
fn the_crates_held_to_no_circle_have_none() {
    let (mut held, mut others) = (Vec::new(), Vec::new());
    let members = workspace_members();
    assert!(members.len() > 10, "the workspace's members were not read");
    for member in STILL_WITH_CIRCLES {
        assert!(
            members.iter().any(|m| m == member),
            "{member} is not a workspace member"
        );
    }
    for member in &members {
        for root_file in ["src/lib.rs", "src/main.rs"].map(|f| root().join(member).join(f)) {
            let circles = if root_file.exists() {
                Crate::read(&root_file).circles()
            } else {
                vec![]
            };
            let to = if STILL_WITH_CIRCLES.contains(&member.as_str()) {
                &mut others
            } else {
                &mut held
            };
            to.extend(circles.into_iter().map(|c| format!("{member}: {c}")));
        }
    }
    println!(
        "{}\n\n{} circle(s) in crates not yet held to none",
        others.join("\n\n"),
        others.len()
    );
    assert!(held.is_empty(), "import circles:\n{}", held.join("\n"));
}

// The checker's own tests, on small crates written to a temporary directory.

/// A crate from one text: each file follows a `--- path` line.
fn crate_of(files: &str) -> (tempfile::TempDir, Crate) {
    let dir = tempfile::tempdir().unwrap();
    for file in files.split("--- ").skip(1) {
        let (path, text) = file.split_once('\n').unwrap();
        let p = dir.path().join("src").join(path.trim());
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    let krate = Crate::read(&dir.path().join("src/lib.rs"));
    (dir, krate)
}

fn edges(krate: &Crate) -> BTreeSet<String> {
    let graph = krate.graph();
    let named =
        |(from, to): (&PathBuf, &PathBuf)| format!("{} -> {}", from.display(), to.display());
    graph
        .iter()
        .flat_map(|(from, to)| to.keys().map(move |t| named((from, t))))
        .collect()
}

fn set(edges: &[&str]) -> BTreeSet<String> {
    edges.iter().map(|e| e.to_string()).collect()
}

#[test]
fn a_circle_through_use_groups_and_paths_is_found_and_named() {
    let (_dir, krate) = crate_of(
        r#"
--- lib.rs
pub mod model; pub mod decide;
--- model/mod.rs
pub mod pool; pub mod labels;
--- model/pool.rs
use crate::{model::labels::{self, POOL}, decide::pool as d};
pub struct P;
--- model/labels.rs
pub const POOL: &str = "crate::decide::x"; // crate::decide
--- decide/mod.rs
pub mod pool;
--- decide/pool.rs
pub fn f() -> crate::model::pool::P { super::super::model::pool::P }
"#,
    );
    let want = [
        "model/pool.rs -> model/labels.rs",
        "model/pool.rs -> decide/pool.rs",
    ];
    assert_eq!(
        edges(&krate),
        set(&[&want[..], &["decide/pool.rs -> model/pool.rs"]].concat())
    );
    let circles = krate.circles();
    assert_eq!(circles.len(), 1, "{circles:?}");
    let named = "2 files in a circle: decide/pool.rs, model/pool.rs, by:\n    \
        decide/pool.rs -> model/pool.rs by `crate::model::pool::P`\n    \
        model/pool.rs -> decide/pool.rs by `crate::decide::pool`";
    assert_eq!(circles[0], named);
}

#[test]
fn paths_in_types_patterns_and_bounds_are_edges() {
    let (_dir, krate) = crate_of(
        r#"
--- lib.rs
mod a; mod b; mod c; mod d;
--- a.rs
pub struct S(Vec<crate::b::T>);
--- b.rs
pub struct T;
fn f(x: u8) { match x { crate::c::K => {} _ => {} } }
--- c.rs
pub const K: u8 = 1;
fn g<X: crate::d::Tr>() {}
--- d.rs
pub trait Tr {}
impl Tr for crate::a::S {}
"#,
    );
    let want = [
        "a.rs -> b.rs",
        "b.rs -> c.rs",
        "c.rs -> d.rs",
        "d.rs -> a.rs",
    ];
    assert_eq!(edges(&krate), set(&want));
    let circles = krate.circles();
    assert!(
        circles.len() == 1 && circles[0].starts_with("4 files in a circle"),
        "{circles:?}"
    );
}

#[test]
fn tests_children_and_inline_modules_make_no_circle() {
    let (_dir, krate) = crate_of(
        r#"
--- lib.rs
pub mod pool;
pub mod facade { pub use crate::pool::*; }
pub use pool::Decision;
--- pool/mod.rs
mod health;
pub struct Decision;
pub fn decide() { health::step(); }
#[cfg(test)]
mod tests;
--- pool/health.rs
pub fn step() {}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::facade::Decision;
    fn t() { super::super::decide(); }
}
#[cfg(test)]
fn helper() { crate::pool::decide(); }
pub struct H;
impl H {
    #[cfg(test)]
    fn probe() -> crate::pool::Decision { crate::pool::Decision }
}
--- pool/tests.rs
use super::*;
use crate::facade::*;
"#,
    );
    assert_eq!(
        edges(&krate),
        set(&["lib.rs -> pool/mod.rs", "pool/mod.rs -> pool/health.rs"])
    );
    assert!(
        !krate.written.keys().any(|f| f.ends_with("pool/tests.rs")),
        "a test file is read"
    );
    assert!(krate.circles().is_empty(), "{:?}", krate.circles());
}

#[test]
fn a_path_through_a_module_brought_in_under_a_name_is_followed() {
    let (_dir, krate) = crate_of(
        r#"
--- lib.rs
mod model;
--- model/mod.rs
mod pool;
use crate::model as m;
pub struct Member;
fn f() -> m::pool::P { todo!() }
--- model/pool.rs
pub struct P(super::Member);
"#,
    );
    let circles = krate.circles();
    let step = "model/mod.rs -> model/pool.rs by `m::pool::P`";
    assert!(
        circles.len() == 1 && circles[0].contains(step),
        "{circles:?}"
    );
}
