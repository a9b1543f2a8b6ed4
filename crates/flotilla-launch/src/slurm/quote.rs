//! Quoting for the rendered sbatch script: every value that reaches a shell goes through
//! [`shell_quote`], every value in an `#SBATCH` line through [`sbatch_quote`] (sbatch's own
//! quoting; a newline is refused), and the task's argv becomes shell words with
//! [`quote_task`], so a config value such as `$(touch x)` is never executed.

use crate::JOB_DIR_PLACEHOLDER;

/// Characters that need no quoting, in a shell word or an sbatch value.
fn is_plain(c: char) -> bool {
    c.is_ascii_alphanumeric() || "/._-+=:,@%".contains(c)
}

/// A shell word that expands to exactly `s`: `s` itself when it only has plain characters,
/// otherwise single-quoted (`'` written as `'\''`). Nothing in it is ever expanded or executed.
/// Fails on a NUL byte, which no shell word can hold.
pub fn shell_quote(s: &str) -> Result<String, String> {
    if s.contains('\0') {
        return Err(format!("{s:?} contains a NUL byte"));
    }
    if !s.is_empty() && s.chars().all(is_plain) {
        return Ok(s.to_string());
    }
    Ok(format!("'{}'", s.replace('\'', r"'\''")))
}

/// An `#SBATCH` option value that sbatch reads back as exactly `s`: plain values as they are,
/// anything else in double quotes with `\` and `"` escaped (sbatch's script parser honours
/// both). A line break (or NUL) is refused: it would end the `#SBATCH` line and start a shell
/// command.
pub fn sbatch_quote(s: &str) -> Result<String, String> {
    if s.contains(['\n', '\r', '\0']) {
        return Err(format!(
            "{s:?} contains a line break or NUL, which cannot appear in an #SBATCH line"
        ));
    }
    if !s.is_empty() && s.chars().all(is_plain) {
        return Ok(s.to_string());
    }
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    Ok(out)
}

/// The task's argv as shell words, `{job_dir}` becoming `"$JOB_DIR"` (the batch script's
/// variable) and everything else quoted.
pub fn quote_task(argv: &[String]) -> Result<String, String> {
    if argv.is_empty() {
        return Err("the task command is empty".into());
    }
    let mut words = Vec::with_capacity(argv.len());
    for arg in argv {
        let mut word = String::new();
        for (i, part) in arg.split(JOB_DIR_PLACEHOLDER).enumerate() {
            if i > 0 {
                word.push_str("\"$JOB_DIR\"");
            }
            if !part.is_empty() {
                word.push_str(&shell_quote(part)?);
            }
        }
        if word.is_empty() {
            word.push_str("''");
        }
        words.push(word);
    }
    Ok(words.join(" "))
}
