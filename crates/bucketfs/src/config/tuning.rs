//! The keys of `[tuning]`: the fields of the engine's `Tuning`, which declares each with its
//! default and a doc comment. They are read out of that declaration rather than repeated.

use std::borrow::Cow;

use bucketfs_engine::Tuning;
use toml::{Table, Value};

use super::checks::check_count;
use super::keys::{Check, Key, Shown};

/// The source of `Tuning`: the template explains each key with the first sentence of the
/// field's doc comment, which the compiled struct does not keep.
const TUNING_SOURCE: &str = include_str!("../../../engine/src/tuning.rs");

/// One key per field of `Tuning`, in the order of its declaration, with the field's default.
pub(super) fn keys() -> Vec<Key> {
    let mut defaults = defaults();
    let mut keys = Vec::new();
    for (name, doc) in field_docs(TUNING_SOURCE) {
        if let Some(value) = defaults.remove(name) {
            keys.push(tuning_key(name, &value, first_sentence(&doc)));
        }
    }
    // A field the scan above missed is still a key; a test requires every key to have a doc.
    for (name, value) in defaults {
        keys.push(tuning_key(&name, &value, String::new()));
    }
    keys
}

/// Each field of `Tuning::default()`, by name.
fn defaults() -> Table {
    match Value::try_from(Tuning::default()) {
        Ok(Value::Table(table)) => table,
        other => panic!("Tuning serialises to a table of integers (tested), not {other:?}"),
    }
}

fn tuning_key(name: &str, default: &Value, doc: String) -> Key {
    Key {
        path: Cow::Owned(format!("tuning.{name}")),
        check: Check::One(check_count),
        shown: Shown::CommentedDefault(Cow::Owned(default.to_string())),
        doc: Cow::Owned(doc),
    }
}

/// The fields of `pub struct Tuning` in `source`, each with its doc comment as one line.
fn field_docs(source: &str) -> Vec<(&str, String)> {
    let mut fields = Vec::new();
    let mut doc = Vec::new();
    let body = source
        .lines()
        .map(str::trim)
        .skip_while(|line| !line.starts_with("pub struct Tuning {"))
        .skip(1)
        .take_while(|line| *line != "}");
    for line in body {
        if let Some(text) = line.strip_prefix("///") {
            doc.push(text.trim());
        } else if let Some((name, _)) = line
            .strip_prefix("pub ")
            .and_then(|field| field.split_once(':'))
        {
            fields.push((name.trim(), doc.join(" ")));
            doc.clear();
        }
    }
    fields
}

/// Up to and including the first full stop that ends a sentence.
fn first_sentence(text: &str) -> String {
    let end = text.find(". ").map_or(text.len(), |index| index + 1);
    text[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_of_tuning_is_a_key_with_its_default_and_a_sentence() {
        let defaults = defaults();
        let keys = keys();
        assert_eq!(keys.len(), defaults.len());
        let scanned: Vec<&str> = field_docs(TUNING_SOURCE)
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        for (name, default) in &defaults {
            assert!(
                scanned.contains(&name.as_str()),
                "no doc comment found for {name}"
            );
            let key = keys
                .iter()
                .find(|key| key.path == format!("tuning.{name}"))
                .unwrap_or_else(|| panic!("no key for {name}"));
            assert_eq!(key.shown.default(), Some(&*default.to_string()));
            assert!(key.doc.ends_with('.'), "{}: {:?}", key.path, key.doc);
        }
    }

    #[test]
    fn field_docs_and_first_sentences() {
        let source = "struct Other {\n    /// Not this.\n    pub x: u64,\n}\n\
                      pub struct Tuning {\n    /// One line\n    /// and two. Then more.\n\
                      pub a: u64,\n    /// See `a`.\n    pub b_us: u64,\n}\n";
        let fields = field_docs(source);
        assert_eq!(
            fields,
            [
                ("a", "One line and two. Then more.".to_string()),
                ("b_us", "See `a`.".to_string())
            ]
        );
        assert_eq!(first_sentence(&fields[0].1), "One line and two.");
        assert_eq!(first_sentence("No stop"), "No stop");
    }
}
