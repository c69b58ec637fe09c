//! The documentation, checked against the binary and against itself:
//! - the README's command synopsis against each command's real `mprof <command> -h` (every
//!   option and argument, their values, which are required), so the two cannot drift;
//! - the CLI reference, `docs/cli.md`, generated here from `mprof --help` and every
//!   `mprof <command> --help` (`MPROF_BLESS=1` rewrites it; otherwise a drift fails);
//! - the README's length (at most 300 lines) and its fast-tier command;
//! - every relative link of the Markdown files (README, ARCHITECTURE, docs/, benches/, fuzz/)
//!   to a file that exists and, with `#anchor`, to a heading that exists.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `mprof ARGS`' standard output; the command must succeed.
fn mprof_out(args: &[&str]) -> String {
    let out = common::mprof().args(args).output().expect("run mprof");
    assert!(
        out.status.success(),
        "mprof {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("help is UTF-8")
}

/// One option as `-h` lists it.
#[derive(Debug)]
struct HelpOption {
    short: Option<String>,
    long: String,
    /// The value's name (`<RATE>`), if it takes one.
    value: Option<String>,
    /// `[possible values: a, b]`.
    possible: Vec<String>,
}

/// What `mprof [COMMAND] -h` says: the usage line's words after the command, the options, and
/// (top level) the commands.
#[derive(Debug)]
struct Help {
    usage: Vec<String>,
    options: Vec<HelpOption>,
    commands: Vec<String>,
}

fn parse_help(text: &str, command: Option<&str>) -> Help {
    let usage_prefix = match command {
        Some(c) => format!("Usage: mprof {c}"),
        None => "Usage: mprof".to_string(),
    };
    let usage_line = text
        .lines()
        .find(|l| l.starts_with(&usage_prefix))
        .unwrap_or_else(|| panic!("no `{usage_prefix}` line in:\n{text}"));
    let usage = usage_line[usage_prefix.len()..]
        .split_whitespace()
        .map(String::from)
        .collect();
    let mut section = "";
    let (mut options, mut commands) = (Vec::new(), Vec::new());
    for line in text.lines() {
        if !line.starts_with(' ') && line.ends_with(':') {
            section = line;
            continue;
        }
        let trimmed = line.trim_start();
        if trimmed.is_empty() {
            continue;
        }
        match section {
            "Commands:" => {
                let name = trimmed.split_whitespace().next().unwrap().to_string();
                commands.push(name);
            }
            "Options:" if trimmed.starts_with('-') => options.push(parse_option(trimmed)),
            _ => {}
        }
    }
    Help {
        usage,
        options,
        commands,
    }
}

/// `-o, --output <OUTPUT>   Capture file to write [default: …] [possible values: a, b]`.
fn parse_option(line: &str) -> HelpOption {
    let (flags, description) = line.split_once("  ").unwrap_or((line, ""));
    let mut short = None;
    let mut long = None;
    let mut value = None;
    for word in flags.split_whitespace() {
        let word = word.trim_end_matches(',');
        if let Some(v) = word.strip_prefix('<') {
            value = Some(v.trim_end_matches("...").trim_end_matches('>').to_string());
        } else if word.starts_with("--") {
            long = Some(word.to_string());
        } else if word.starts_with('-') {
            short = Some(word.to_string());
        }
    }
    let possible = description
        .split_once("[possible values: ")
        .map(|(_, rest)| {
            rest.split(']')
                .next()
                .unwrap()
                .split(", ")
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();
    HelpOption {
        short,
        long: long.unwrap_or_else(|| panic!("an option without a long name: {line}")),
        value,
        possible,
    }
}

/// One word of a synopsis entry, with whether it was inside `[...]`.
#[derive(Clone, Debug)]
struct Word {
    text: String,
    optional: bool,
}

/// The README's synopsis block: one entry per command (`None` for `mprof [OPTIONS] COMMAND`),
/// continuation lines joined.
fn readme_synopsis(readme: &str) -> BTreeMap<Option<String>, Vec<Word>> {
    let marker = "<!-- synopsis:";
    let start = readme
        .find(marker)
        .expect("the README has a `<!-- synopsis:` marker");
    let block = &readme[start..];
    let open = block
        .find("```")
        .expect("a code block after the synopsis marker");
    let body_start = open + block[open..].find('\n').unwrap() + 1;
    let body_len = block[body_start..]
        .find("```")
        .expect("the synopsis block ends");
    let body = &block[body_start..body_start + body_len];
    let mut entries: Vec<String> = Vec::new();
    for line in body.lines() {
        if line.starts_with("mprof ") {
            entries.push(line.to_string());
        } else if line.starts_with(' ') && !entries.is_empty() {
            let last = entries.last_mut().unwrap();
            last.push(' ');
            last.push_str(line.trim());
        } else if !line.trim().is_empty() {
            panic!("synopsis line neither starts an entry (`mprof …`) nor continues one: {line:?}");
        }
    }
    let mut out = BTreeMap::new();
    for entry in entries {
        let words = synopsis_words(&entry["mprof ".len()..]);
        let command = words
            .first()
            .filter(|w| !w.optional && w.text.chars().all(|c| c.is_ascii_lowercase()))
            .map(|w| w.text.clone());
        let rest = if command.is_some() {
            words[1..].to_vec()
        } else {
            words
        };
        assert!(
            out.insert(command.clone(), rest).is_none(),
            "two synopsis entries for {command:?}"
        );
    }
    out
}

/// Splits a synopsis entry into words, marking those inside brackets; `...` after a bracket is
/// dropped (repetition is not checked: `-h` does not say it).
fn synopsis_words(entry: &str) -> Vec<Word> {
    let mut words = Vec::new();
    let mut depth = 0usize;
    let mut current = String::new();
    let flush = |current: &mut String, words: &mut Vec<Word>, depth: usize| {
        let text = current.trim_end_matches("...").to_string();
        if !text.is_empty() {
            words.push(Word {
                text,
                optional: depth > 0,
            });
        }
        current.clear();
    };
    for c in entry.chars() {
        match c {
            '[' => {
                flush(&mut current, &mut words, depth);
                depth += 1;
            }
            ']' => {
                flush(&mut current, &mut words, depth);
                depth = depth.checked_sub(1).expect("unbalanced ] in the synopsis");
            }
            c if c.is_whitespace() => flush(&mut current, &mut words, depth),
            c => current.push(c),
        }
    }
    flush(&mut current, &mut words, depth);
    assert_eq!(depth, 0, "unbalanced [ in the synopsis: {entry}");
    words
}

/// Checks one synopsis entry against its `-h`; returns what differs, one line each.
fn compare(name: &str, words: &[Word], help: &Help, globals: &BTreeSet<String>) -> Vec<String> {
    let mut problems = Vec::new();
    let options: Vec<&HelpOption> = help
        .options
        .iter()
        .filter(|o| o.long != "--help" && o.long != "--version" && !globals.contains(&o.long))
        .collect();
    let find = |w: &str| {
        options
            .iter()
            .find(|o| o.long == w || o.short.as_deref() == Some(w))
            .copied()
    };
    // Options required by the usage line (`--pid <PID>` outside `[OPTIONS]`).
    let required: BTreeSet<&str> = help
        .usage
        .iter()
        .filter(|w| w.starts_with("--"))
        .map(|w| w.as_str())
        .collect();
    let mut seen = BTreeSet::new();
    let mut positionals = Vec::new();
    let mut i = 0;
    while i < words.len() {
        let w = &words[i];
        i += 1;
        if w.text == "--" {
            continue;
        }
        if !w.text.starts_with('-') {
            positionals.push(w.text.clone());
            continue;
        }
        let Some(opt) = find(&w.text) else {
            problems.push(format!("{name}: `{}` is not an option of `-h`", w.text));
            continue;
        };
        if !seen.insert(opt.long.clone()) {
            problems.push(format!("{name}: {} appears twice", opt.long));
        }
        if required.contains(opt.long.as_str()) == w.optional {
            problems.push(format!(
                "{name}: {} is {} by `-h` but {} in the synopsis",
                opt.long,
                if w.optional { "required" } else { "optional" },
                if w.optional {
                    "bracketed"
                } else {
                    "not bracketed"
                }
            ));
        }
        let value = words
            .get(i)
            .filter(|v| v.optional == w.optional && !v.text.starts_with('-'));
        match (&opt.value, value) {
            (Some(_), Some(v)) => {
                i += 1;
                let placeholder = v
                    .text
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || "_.".contains(c));
                let listed = v.text.split('|').map(String::from).collect::<Vec<_>>();
                if !placeholder && !opt.possible.is_empty() && listed != opt.possible {
                    problems.push(format!(
                        "{name}: {} {} but `-h` lists {}",
                        opt.long,
                        v.text,
                        opt.possible.join("|")
                    ));
                }
            }
            (Some(v), None) => problems.push(format!(
                "{name}: {} takes a value (<{v}>) the synopsis does not show",
                opt.long
            )),
            (None, _) => {}
        }
    }
    for opt in &options {
        if !seen.contains(&opt.long) {
            problems.push(format!(
                "{name}: {} is in `-h` but not in the synopsis",
                opt.long
            ));
        }
    }
    let usage_positionals: Vec<String> = help
        .usage
        .iter()
        .filter(|w| w.starts_with('<'))
        .filter(|w| {
            // A value of a required option (`--pid <PID>`) is not a positional.
            let at = help.usage.iter().position(|u| u == *w).unwrap();
            at == 0 || !help.usage[at - 1].starts_with("--")
        })
        .map(|w| {
            w.trim_end_matches("...")
                .trim_matches(['<', '>'])
                .to_string()
        })
        .collect();
    if positionals != usage_positionals {
        problems.push(format!(
            "{name}: arguments {positionals:?} in the synopsis, {usage_positionals:?} in `-h`"
        ));
    }
    problems
}

/// The README's synopsis names every command, and each entry's options, values and arguments
/// are those of the command's real `-h`.
#[test]
fn the_readme_synopsis_matches_every_commands_help() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let synopsis = readme_synopsis(&readme);
    let top = parse_help(&mprof_out(&["-h"]), None);
    let globals: BTreeSet<String> = top
        .options
        .iter()
        .filter(|o| o.long != "--help" && o.long != "--version")
        .map(|o| o.long.clone())
        .collect();
    let commands: BTreeSet<String> = top
        .commands
        .iter()
        .filter(|c| *c != "help")
        .cloned()
        .collect();
    let listed: BTreeSet<String> = synopsis.keys().flatten().cloned().collect();
    assert_eq!(
        listed, commands,
        "the README's synopsis lists other commands than `mprof -h`"
    );
    let mut problems = Vec::new();
    let words = synopsis
        .get(&None)
        .expect("a synopsis entry `mprof [OPTIONS] COMMAND` for the global options");
    problems.extend(compare("mprof", words, &top, &BTreeSet::new()));
    for command in &commands {
        let help = parse_help(&mprof_out(&[command, "-h"]), Some(command));
        let words = &synopsis[&Some(command.clone())];
        problems.extend(compare(command, words, &help, &globals));
    }
    assert!(
        problems.is_empty(),
        "the README's synopsis has drifted from `--help`:\n{}",
        problems.join("\n")
    );
}

/// docs/cli.md, as the binary's `--help` texts make it.
fn cli_reference() -> String {
    let top = parse_help(&mprof_out(&["-h"]), None);
    let mut out = String::from(
        "# mprof command-line reference\n\n\
         Generated from `mprof --help` and `mprof COMMAND --help` by `tests/docs.rs`, which \
         fails when\nthis file drifts from the binary; `MPROF_BLESS=1 cargo test --release \
         --test docs` rewrites it.\nThe README has the synopsis, the [user guide](README.md) \
         what the options are for.\n",
    );
    let mut section = |title: &str, args: &[&str]| {
        out.push_str(&format!("\n## {title}\n\n```text\n"));
        out.push_str(mprof_out(args).trim_end());
        out.push_str("\n```\n");
    };
    section("mprof", &["--help"]);
    for command in top.commands.iter().filter(|c| *c != "help") {
        section(&format!("mprof {command}"), &[command, "--help"]);
    }
    out
}

/// docs/cli.md is the binary's help, command by command (`MPROF_BLESS=1` rewrites it).
#[test]
fn the_cli_reference_is_the_binarys_help() {
    let path = root().join("docs/cli.md");
    let generated = cli_reference();
    if std::env::var_os("MPROF_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &generated).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "docs/cli.md has drifted from the binary's --help: \
         MPROF_BLESS=1 cargo test --release --test docs rewrites it"
    );
}

/// The README stays a first read: at most 300 lines, with the fast tier's command and time.
#[test]
fn the_readme_is_short_and_names_the_fast_tier() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(lines <= 300, "README.md has {lines} lines; at most 300");
    assert!(
        readme.contains("MPROF_TESTS=fast cargo test --release --workspace"),
        "the README names the fast tier's command"
    );
    assert!(
        readme.contains("**fast tier**") && readme.contains(" runs in **"),
        "the README says how long the fast tier runs"
    );
}

/// The Markdown files a reader follows links through.
fn markdown_files() -> Vec<PathBuf> {
    let mut files = vec![
        root().join("README.md"),
        root().join("ARCHITECTURE.md"),
        root().join("benches/README.md"),
        root().join("fuzz/README.md"),
        root().join("tests/fuzz/README.md"),
    ];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files.retain(|f| f.is_file());
    files
}

/// A Markdown file's text outside fenced code blocks and inline code.
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut code = false;
        for part in line.split('`') {
            if !code {
                out.push_str(part);
            }
            code = !code;
        }
        out.push('\n');
    }
    out
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens; a
/// repeated anchor gets `-1`, `-2`…
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let title = line.trim_start_matches('#').trim();
        let slug: String = title
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let n = seen.entry(slug.clone()).or_insert(0);
        out.insert(if *n == 0 {
            slug.clone()
        } else {
            format!("{slug}-{n}")
        });
        *n += 1;
    }
    out
}

/// The targets of `[text](target)` and `![alt](target)` links in `text`'s prose.
fn link_targets(text: &str) -> Vec<String> {
    let prose = prose(text);
    let mut out = Vec::new();
    let mut rest = prose.as_str();
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        if let Some(end) = rest.find(')') {
            out.push(rest[..end].trim().to_string());
        }
    }
    out
}

/// Every relative link in the docs leads to a file that exists, and its `#anchor` to a
/// heading of that file.
#[test]
fn relative_links_in_the_docs_resolve() {
    let mut problems = Vec::new();
    for file in markdown_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        let dir = file.parent().unwrap();
        for target in link_targets(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let resolved = if path.is_empty() {
                file.clone()
            } else {
                dir.join(path)
            };
            let shown = file.strip_prefix(root()).unwrap_or(&file).display();
            if !resolved.exists() {
                problems.push(format!("{shown}: ({target}): no such file"));
                continue;
            }
            if !anchor.is_empty() && resolved.extension().is_some_and(|e| e == "md") {
                let heads = anchors(&std::fs::read_to_string(&resolved).unwrap());
                if !heads.contains(anchor) {
                    problems.push(format!("{shown}: ({target}): no such heading"));
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "broken links:\n{}",
        problems.join("\n")
    );
}

/// The anchors of headings, as GitHub makes them (the link check depends on it).
#[test]
fn anchors_follow_githubs_rule() {
    let heads = anchors("# A\n## Native stacks (`--native`)\n## Report JSON: `mprof report --json`\n## A\n```\n# not\n```\n");
    let expected: BTreeSet<String> = [
        "a",
        "native-stacks---native",
        "report-json-mprof-report---json",
        "a-1",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(heads, expected);
    assert_eq!(
        link_targets("see [x](a.md#b) and `[y](not.md)`\n```\n[z](no.md)\n```\n"),
        vec!["a.md#b".to_string()]
    );
}
