//! Stage 3 of loading: `${VAR}` in string values, replaced from the environment.

use std::path::Path;

use toml::Value;

use super::{join_key, ConfigError};

/// Stage 3: replaces `${VAR}` in every string in `value`, which sits at `key`.
pub(super) fn substitute_value(
    value: &mut Value,
    key: &str,
    env: &dyn Fn(&str) -> Option<String>,
    origin: &Path,
) -> Result<(), ConfigError> {
    match value {
        Value::String(text) => {
            *text = substitute(text, env).map_err(|error| match error {
                SubstituteError::Missing(variable) => ConfigError::MissingEnvVar {
                    path: origin.to_path_buf(),
                    key: key.to_string(),
                    variable,
                },
                SubstituteError::Malformed(message) => ConfigError::InvalidValue {
                    path: origin.to_path_buf(),
                    key: key.to_string(),
                    message,
                },
            })?;
        }
        Value::Array(items) => {
            for (index, item) in items.iter_mut().enumerate() {
                substitute_value(item, &format!("{key}[{index}]"), env, origin)?;
            }
        }
        Value::Table(table) => {
            for (name, item) in table.iter_mut() {
                substitute_value(item, &join_key(key, name), env, origin)?;
            }
        }
        Value::Integer(_) | Value::Float(_) | Value::Boolean(_) | Value::Datetime(_) => {}
    }
    Ok(())
}

#[derive(Debug, PartialEq, Eq)]
pub(super) enum SubstituteError {
    Missing(String),
    Malformed(String),
}

/// Replaces each `${NAME}` with the variable's value and each `$${` with a literal `${`.
/// One pass: a value that itself contains `${` is kept as it is, not expanded again.
pub(super) fn substitute(
    text: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, SubstituteError> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(dollar) = rest.find('$') {
        out.push_str(&rest[..dollar]);
        let after = &rest[dollar + 1..];
        if let Some(tail) = after.strip_prefix("${") {
            out.push_str("${");
            rest = tail;
        } else if let Some(tail) = after.strip_prefix('{') {
            let Some(end) = tail.find('}') else {
                return Err(SubstituteError::Malformed(
                    "`${` without a closing `}` (write `$${` for a literal `${`)".to_string(),
                ));
            };
            let name = &tail[..end];
            if !is_variable_name(name) {
                return Err(SubstituteError::Malformed(format!(
                    "`${{{name}}}` is not a valid environment variable name (letters, digits \
                     and _, not starting with a digit; write `$${{` for a literal `${{`)"
                )));
            }
            let value = env(name).ok_or_else(|| SubstituteError::Missing(name.to_string()))?;
            out.push_str(&value);
            rest = &tail[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

fn is_variable_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|first| first.is_ascii_alphabetic() || first == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}
