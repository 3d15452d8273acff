//! The commented configuration file that `bucketfs init` writes, generated from the key table
//! (keys.rs): every key, with the sentences that explain it and its default or an example.

use super::keys::{self, Shown, SECTIONS};

const HEADER: &str = "\
# bucketfs configuration, written by `bucketfs init`.
#
# Every setting is listed with its default value; settings that have no default are
# commented out, with an example, and so are the [tuning] values, so that their defaults
# apply. Unknown keys are errors, so a typo cannot go unnoticed.
# In any string, ${NAME} is replaced by the environment variable NAME when the file is
# loaded (write $${ for a literal ${), so secrets need not be stored in this file.
# Sizes are a number of bytes, or a number with a unit K, M, G or T (1K = 1024 bytes).
";

/// Comments are wrapped to fit this many columns, `# ` included.
const COMMENT_COLUMNS_MAX: usize = 92;

/// What `bucketfs init` writes. Parsed with `BUCKETFS_PASSWORD` set, it equals
/// [`super::Config::embedded_default`] plus that password (tested).
pub fn init_template() -> String {
    let mut out = String::from(HEADER);
    let mut current_table = None;
    for key in keys::keys() {
        let (table, name) = key.split();
        if current_table != Some(table) {
            out.push('\n');
            if let Some(section) = SECTIONS.iter().find(|section| section.path == table) {
                push_comment(&mut out, section.doc);
            }
            out.push_str(&format!("[{table}]\n"));
            current_table = Some(table);
        }
        push_comment(&mut out, &key.doc);
        let line = match &key.shown {
            Shown::Default(value) => format!("{name} = {value}"),
            Shown::Suggested(value) => format!("{name} = {value}"),
            Shown::CommentedDefault(value) => format!("# {name} = {value}"),
            Shown::Example(value) => format!("# {name} = {value}"),
        };
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// `text` as `# ` lines, broken between words.
fn push_comment(out: &mut String, text: &str) {
    let mut line = String::from("#");
    for word in text.split_whitespace() {
        if line.len() > 1 && line.len() + 1 + word.len() > COMMENT_COLUMNS_MAX {
            out.push_str(&line);
            out.push('\n');
            line.truncate(1);
        }
        line.push(' ');
        line.push_str(word);
    }
    out.push_str(&line);
    out.push('\n');
}
