//! The assistant turns of a conversation whose chat template is not prefix-stable, found by
//! markers. Some templates render earlier turns differently once later ones follow (Mistral v0.3
//! puts the system prompt into the last user turn; the DeepSeek-R1 templates open a `<think>`
//! block in the generation prompt that a rendered turn does not have), so the prefix rule
//! cannot find where a turn's tokens are. The conversation is rendered once more with each
//! assistant message's content replaced by a unique marker; the text between the markers is
//! the real render's, so walking both renders together finds each content in the real text
//! (verbatim, stripped as jinja2's `trim` strips it, or as the template rewrote it). A turn's
//! trained span is its content and what the template writes after it when the conversation
//! ends with that turn, as far as the conversation goes on the same way (its end-of-turn
//! token), never ending inside an added token: the prefix rule's end.
//!
//! The text and ids stay the real render's; only the mask comes from the markers.

use minijinja::Value as TemplateValue;
use serde_json::Value;

use super::chat::{common_prefix_len, outside_added_tokens, role_of};
use super::chat_template::{message_value, python_strip, ChatTemplate};

/// The marker standing for assistant message `i`'s content: private-use characters that no
/// template writes and no real text holds.
fn marker(i: usize) -> String {
    format!("\u{E000}flotilla-turn-{i}\u{E001}")
}

/// Byte spans of `full` (the real render of `messages`) trained for the assistant messages
/// `turns`, found by markers (module docs). An error says why a turn cannot be found.
pub(super) fn marker_spans(
    template: &ChatTemplate,
    added: &[String],
    messages: &[Value],
    full: &str,
    turns: &[usize],
) -> Result<Vec<(usize, usize)>, String> {
    let assistants: Vec<usize> = (0..messages.len())
        .filter(|&i| role_of(&messages[i]) == Some("assistant"))
        .collect();
    let mut contents = Vec::with_capacity(assistants.len());
    for &i in &assistants {
        match messages[i].get("content").and_then(Value::as_str) {
            Some(c) => contents.push((i, c)),
            None => {
                return Err(format!(
                    "the chat template renders earlier turns differently once later turns follow \
                     (it is not prefix-stable), and assistant message {} has no text content to \
                     find its turn by; use data.train_on=all",
                    i + 1
                ))
            }
        }
    }
    let mut marked: Vec<TemplateValue> = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        if assistants.contains(&i) {
            let mut m = m.clone();
            m["content"] = Value::String(marker(i));
            marked.push(message_value(&m));
        } else {
            marked.push(message_value(m));
        }
    }
    let rendered = template.render_messages(TemplateValue::from(marked.clone()), false)?;
    let found = content_spans(&rendered, full, &contents)?;
    let mut spans = Vec::with_capacity(turns.len());
    for &i in turns {
        // A content the template does not render has no tokens to train.
        let Some(&(_, start, end)) = found.iter().find(|(k, _, _)| *k == i) else {
            continue;
        };
        let upto = template.render_messages(TemplateValue::from(marked[..=i].to_vec()), false)?;
        let mark = marker(i);
        let Some(at) = upto.find(&mark) else {
            return Err(not_found(i, "the conversation ending with it"));
        };
        let after = &upto[at + mark.len()..];
        let turn_end = end + common_prefix_len(after, &full[end..]);
        let alone = format!("{}{after}", &full[..end]);
        let turn_end = outside_added_tokens(turn_end, &[full, &alone], added);
        if turn_end > start {
            spans.push((start, turn_end));
        }
    }
    Ok(spans)
}

fn not_found(i: usize, render: &str) -> String {
    format!(
        "the chat template renders earlier turns differently once later turns follow (it is not \
         prefix-stable), and assistant message {} cannot be found in {render} by a marker either; \
         use data.train_on=all",
        i + 1
    )
}

/// Where each rendered content sits in `full`: `(message, start, end)` for each marker of
/// `rendered` (the render with markers), walking both texts together.
fn content_spans(
    rendered: &str,
    full: &str,
    contents: &[(usize, &str)],
) -> Result<Vec<(usize, usize, usize)>, String> {
    // The markers in the order they appear, which must be the messages' order.
    let mut places: Vec<(usize, usize, &str)> = vec![];
    for &(i, content) in contents {
        let mark = marker(i);
        if let Some(at) = rendered.find(&mark) {
            if rendered[at + mark.len()..].contains(&mark) {
                return Err(not_found(i, "the render (its content is written twice)"));
            }
            places.push((at, i, content));
        }
    }
    if places.windows(2).any(|w| w[0].0 > w[1].0) {
        return Err(not_found(places[0].1, "the render (turns out of order)"));
    }
    let mismatch = |i: usize| not_found(i, "the render (the text around it differs)");
    let (mut in_full, mut in_marked) = (0usize, 0usize);
    let mut out = vec![];
    for (k, &(at, i, content)) in places.iter().enumerate() {
        let before = &rendered[in_marked..at];
        if !full[in_full..].starts_with(before) {
            return Err(mismatch(i));
        }
        in_full += before.len();
        in_marked = at + marker(i).len();
        // What follows the content up to the next marker (or the end).
        let next = places.get(k + 1).map_or(rendered.len(), |p| p.0);
        let following = &rendered[in_marked..next];
        let rest = &full[in_full..];
        let last = k + 1 == places.len();
        let fits = |len: usize| {
            let tail = &rest[len..];
            match last {
                true => tail == following,
                false => tail.starts_with(following),
            }
        };
        let stripped = python_strip(content);
        let len = if rest.starts_with(content) && fits(content.len()) {
            content.len()
        } else if rest.starts_with(stripped) && fits(stripped.len()) {
            stripped.len()
        } else if last {
            // Rewritten by the template: everything up to what the template writes after it.
            rest.len()
                .checked_sub(following.len())
                .filter(|&n| rest[n..] == *following && rest.is_char_boundary(n))
                .ok_or_else(|| mismatch(i))?
        } else if following.is_empty() {
            return Err(mismatch(i));
        } else {
            rest.find(following).ok_or_else(|| mismatch(i))?
        };
        out.push((i, in_full, in_full + len));
        in_full += len;
    }
    if full[in_full..] != rendered[in_marked..] {
        return Err(not_found(
            places.last().map_or(0, |p| p.1),
            "the render (the text after the last turn differs)",
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contents_are_found_verbatim_stripped_or_rewritten() {
        let (a, b) = (marker(1), marker(3));
        let rendered = format!("<s>[INST] hi[/INST] {a}</s>[INST] more[/INST] {b}</s>");
        let full = "<s>[INST] hi[/INST] Hello</s>[INST] more[/INST] Fine.</s>";
        let found = content_spans(&rendered, full, &[(1, "  Hello \n"), (3, "Fine.")]).unwrap();
        assert_eq!(&full[found[0].1..found[0].2], "Hello");
        assert_eq!(&full[found[1].1..found[1].2], "Fine.");
        // A content the template rewrites (reasoning dropped) is what lies between.
        let found = content_spans(
            &rendered,
            full,
            &[(1, "<think>x</think>Hello"), (3, "Fine.")],
        )
        .unwrap();
        assert_eq!(&full[found[0].1..found[0].2], "Hello");
        // Text around a turn that differs is refused.
        let other = "<s>[INST] hey[/INST] Hello</s>[INST] more[/INST] Fine.</s>";
        assert!(content_spans(&rendered, other, &[(1, "Hello"), (3, "Fine.")]).is_err());
    }
}
