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
enum SubstituteError {
    Missing(String),
    Malformed(String),
}

/// Replaces each `${NAME}` with the variable's value and each `$${` with a literal `${`.
/// One pass: a value that itself contains `${` is kept as it is, not expanded again.
fn substitute(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, SubstituteError> {
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

#[cfg(test)]
mod tests {
    use super::super::tests::{error, error_env, parse, parse_env};
    use super::super::Config;
    use super::*;

    #[test]
    fn missing_variable_names_file_key_and_variable() {
        assert_eq!(
            error("[storage]\nencryption_password = \"${BUCKETFS_PASSWORD}\"\n"),
            "bucketfs.toml: storage.encryption_password: environment variable \
             BUCKETFS_PASSWORD is not set"
        );
        assert_eq!(
            error("[servers.nbd]\nlisten = [\"127.0.0.1:1\", \"${ADDR}\"]\n"),
            "bucketfs.toml: servers.nbd.listen[1]: environment variable ADDR is not set"
        );
    }

    #[test]
    fn variables_are_substituted_inside_longer_strings() {
        let vars = [("BUCKET", "my-bucket"), ("ENV", "prod"), ("PORT", "4000")];
        let config = parse_env(
            "[storage]\nurl = \"s3://${BUCKET}/bucketfs-${ENV}/${ENV}\"\n\
             [servers.nbd]\nlisten = [\"127.0.0.1:${PORT}\"]\n\
             [cache]\ndisk_bytes_max = \"${PORT}M\"\n",
            &vars,
        )
        .unwrap();
        assert_eq!(config.storage.url, "s3://my-bucket/bucketfs-prod/prod");
        assert_eq!(
            config.servers.nbd.listen,
            vec!["127.0.0.1:4000".parse().unwrap()]
        );
        assert_eq!(config.cache.disk_bytes_max, 4000 << 20);
    }

    #[test]
    fn substituted_value_is_checked_like_a_literal() {
        assert_eq!(
            error_env("[storage]\ncompression = \"${C}\"\n", &[("C", "gzip")]),
            "bucketfs.toml: storage.compression: expected one of zstd, lz4, none, found \"gzip\""
        );
    }

    #[test]
    fn dollar_dollar_brace_is_a_literal_dollar_brace() {
        let config = parse("[storage]\nencryption_password = \"a$${HOME}b$$c$d$\"\n").unwrap();
        assert_eq!(
            config.storage.encryption_password.as_deref(),
            Some("a${HOME}b$$c$d$")
        );
    }

    #[test]
    fn substitution_is_a_single_pass() {
        let vars = [("A", "${B}"), ("B", "never")];
        let config = parse_env("[storage]\nencryption_password = \"${A}\"\n", &vars).unwrap();
        assert_eq!(config.storage.encryption_password.as_deref(), Some("${B}"));
    }

    #[test]
    fn variable_may_be_set_to_the_empty_string() {
        let config = parse_env("[aws]\nregion = \"x${EMPTY}y\"\n", &[("EMPTY", "")]).unwrap();
        assert_eq!(config.aws.region.as_deref(), Some("xy"));
    }

    #[test]
    fn malformed_references_are_errors() {
        assert_eq!(
            error("[aws]\nregion = \"${REGION\"\n"),
            "bucketfs.toml: aws.region: `${` without a closing `}` (write `$${` for a literal `${`)"
        );
        assert_eq!(
            error("[aws]\nregion = \"${}\"\n"),
            "bucketfs.toml: aws.region: `${}` is not a valid environment variable name \
             (letters, digits and _, not starting with a digit; write `$${` for a literal `${`)"
        );
        for bad in ["${1X}", "${A-B}", "${A B}", "${a.b}"] {
            let message = error(&format!("[aws]\nregion = \"{bad}\"\n"));
            assert!(
                message.contains("is not a valid environment variable name"),
                "{message}"
            );
        }
    }

    #[test]
    fn only_string_values_are_substituted() {
        // Keys are never substituted, so `${X}` as a key is just an unknown key.
        assert_eq!(
            error_env("[aws]\n\"${X}\" = \"y\"\n", &[("X", "region")]),
            "bucketfs.toml: unknown key `aws.\"${X}\"` (expected one of: access_key_id, \
             secret_access_key, session_token, region, endpoint, allow_http)"
        );
        assert_eq!(substitute("plain", &|_| None), Ok("plain".to_string()));
        assert_eq!(
            substitute("${X}", &|_| None),
            Err(SubstituteError::Missing("X".to_string()))
        );
    }

    #[test]
    fn substituted_text_cannot_inject_toml() {
        let vars = [("PW", "x\"\n[admin]\nlisten = \"0.0.0.0:1")];
        let config = parse_env("[storage]\nencryption_password = \"${PW}\"\n", &vars).unwrap();
        assert_eq!(
            config.storage.encryption_password.as_deref(),
            Some(vars[0].1)
        );
        assert_eq!(config.admin, Config::embedded_default().admin);
    }
}
