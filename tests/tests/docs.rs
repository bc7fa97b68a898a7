//! The documentation's shape: a short front page, a README for every crate that is also its
//! rustdoc, and no relative link of any Markdown file that leads nowhere.
//!
//! Links are read with pulldown-cmark, the parser rustdoc itself uses, so what counts as a link
//! here is what renders as one. A link to a file must name a file or directory of the
//! repository; a `#fragment` must name a heading of the Markdown file it points into, spelled
//! as GitHub spells heading anchors. Links with a scheme (`https:`, `mailto:`) are not followed:
//! tests reach no network.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

use pulldown_cmark::{CodeBlockKind, Event, HeadingLevel, Parser, Tag, TagEnd};

/// The front page stays a front page: what it is, the two commands, the map, one Proxy, links.
const README_MAX_LINES: usize = 200;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .unwrap()
}

/// Every Markdown file of the repository, build outputs and installed packages left out.
fn markdown_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for path in entries {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                if !(name.starts_with('.') || name == "target" || name == "node_modules") {
                    walk(&path, out);
                }
            } else if name.ends_with(".md") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(&root(), &mut out);
    out
}

/// GitHub's anchor for a heading: lower case, letters, digits, `-` and `_` kept, spaces made
/// `-`, everything else dropped; a repeated anchor gets `-1`, `-2`, ...
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut heading: Option<String> = None;
    for event in Parser::new(markdown) {
        match event {
            Event::Start(Tag::Heading { .. }) => heading = Some(String::new()),
            Event::Text(t) | Event::Code(t) => {
                if let Some(h) = heading.as_mut() {
                    h.push_str(&t);
                }
            }
            Event::End(TagEnd::Heading(_)) => {
                let text = heading.take().unwrap_or_default();
                let slug: String = text
                    .to_lowercase()
                    .chars()
                    .filter_map(|c| match c {
                        ' ' => Some('-'),
                        c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                        _ => None,
                    })
                    .collect();
                let mut candidate = slug.clone();
                let mut n = 0;
                while !seen.insert(candidate.clone()) {
                    n += 1;
                    candidate = format!("{slug}-{n}");
                }
            }
            _ => {}
        }
    }
    seen
}

/// The links and images of a Markdown text, as written.
fn links(markdown: &str) -> Vec<String> {
    Parser::new(markdown)
        .filter_map(|event| match event {
            Event::Start(Tag::Link { dest_url, .. })
            | Event::Start(Tag::Image { dest_url, .. }) => Some(dest_url.into_string()),
            _ => None,
        })
        .collect()
}

/// `a/./b/../c` as `a/c`, without touching the file system (the target may not exist).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// What is wrong with one link of `file`, if anything.
fn broken(file: &Path, text: &str, link: &str) -> Option<String> {
    if link.contains("://") || link.starts_with("mailto:") {
        return None;
    }
    let (path, fragment) = match link.split_once('#') {
        Some((p, f)) => (p, Some(f)),
        None => (link, None),
    };
    let target = if path.is_empty() {
        file.to_path_buf()
    } else if let Some(from_root) = path.strip_prefix('/') {
        root().join(from_root)
    } else {
        normalize(&file.parent().unwrap().join(path))
    };
    if !target.starts_with(root()) {
        return Some(format!("{link}: leaves the repository"));
    }
    if !target.exists() {
        return Some(format!("{link}: no such file"));
    }
    match fragment {
        Some(fragment) if target.extension().is_some_and(|e| e == "md") => {
            let markdown = if target == file {
                text.to_owned()
            } else {
                std::fs::read_to_string(&target).unwrap()
            };
            (!anchors(&markdown).contains(fragment))
                .then(|| format!("{link}: no heading #{fragment} in {}", target.display()))
        }
        _ => None,
    }
}

#[test]
fn every_relative_link_of_every_markdown_file_resolves() {
    let files = markdown_files();
    assert!(
        files.len() > 10,
        "found only {} Markdown files",
        files.len()
    );
    let mut problems = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for link in links(&text) {
            if let Some(problem) = broken(file, &text, &link) {
                problems.push(format!(
                    "{}: {problem}",
                    file.strip_prefix(root()).unwrap().display()
                ));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "broken links:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_readme_is_a_front_page() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines < README_MAX_LINES,
        "README.md has {lines} lines; the manual lives beside the code it describes"
    );
}

/// The workspace's members, as `Cargo.toml` lists them.
fn members() -> Vec<String> {
    let manifest: toml::Table = std::fs::read_to_string(root().join("Cargo.toml"))
        .unwrap()
        .parse()
        .unwrap();
    manifest["workspace"]["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn every_crate_has_a_readme_that_is_its_rustdoc() {
    let mut problems = Vec::new();
    for member in members() {
        let dir = root().join(&member);
        let readme = dir.join("README.md");
        let Ok(text) = std::fs::read_to_string(&readme) else {
            problems.push(format!("{member}: no README.md"));
            continue;
        };
        let top = ["src/lib.rs", "src/main.rs"]
            .iter()
            .map(|f| dir.join(f))
            .find(|p| p.exists());
        let includes = top
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .is_some_and(|src| src.contains(r#"#![doc = include_str!("../README.md")]"#));
        if !includes {
            problems.push(format!(
                r#"{member}: its crate root does not start its docs with #![doc = include_str!("../README.md")]"#
            ));
        }
        // As rustdoc, an untagged or indented block would be compiled as a Rust doctest.
        for event in Parser::new(&text) {
            match event {
                Event::Start(Tag::CodeBlock(CodeBlockKind::Indented)) => {
                    problems.push(format!(
                        "{member}/README.md: an indented code block (fence it with a language)"
                    ));
                }
                Event::Start(Tag::CodeBlock(CodeBlockKind::Fenced(lang)))
                    if lang.trim().is_empty() =>
                {
                    problems.push(format!("{member}/README.md: a code block with no language"));
                }
                _ => {}
            }
        }
        if !Parser::new(&text).any(|e| {
            matches!(
                e,
                Event::Start(Tag::Heading {
                    level: HeadingLevel::H1,
                    ..
                })
            )
        }) {
            problems.push(format!("{member}/README.md: no title"));
        }
    }
    assert!(
        problems.is_empty(),
        "crate READMEs:\n{}",
        problems.join("\n")
    );
}

#[test]
fn anchors_are_spelled_as_github_spells_them() {
    let a = anchors(
        "# The CLI\n## TLS and tokens\n## Leases: a proxy for a crawler's session\n## `--world`\n## TLS and tokens\n",
    );
    for want in [
        "the-cli",
        "tls-and-tokens",
        "leases-a-proxy-for-a-crawlers-session",
        "--world",
        "tls-and-tokens-1",
    ] {
        assert!(a.contains(want), "{want} not in {a:?}");
    }
}

#[test]
fn a_link_to_a_missing_file_or_heading_is_named() {
    let dir = tempfile::tempdir_in(root().join("target")).unwrap();
    let file = dir.path().join("a.md");
    let text =
        "# Here\n[ok](#here) [gone](#there) [nofile](nothing.md) [web](https://example.com/x)\n";
    std::fs::write(&file, text).unwrap();
    let found: Vec<_> = links(text)
        .iter()
        .filter_map(|l| broken(&file, text, l))
        .collect();
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found[0].contains("no heading #there"), "{found:?}");
    assert!(found[1].contains("nothing.md: no such file"), "{found:?}");
}
