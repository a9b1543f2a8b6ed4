//! Chat data against the real transformers: tests/oracle/make_chat_tokenizers.py builds tiny
//! tokenizer directories carrying the real chat templates of Llama 3.1, Mistral v0.3,
//! Qwen2.5, Gemma 2, Phi-3 and Llama 2 (stored as a string, a named list, or a
//! `chat_template.jinja`), and tests/oracle/chat_oracle.py prints, for every conversation,
//! `apply_chat_template(messages, tokenize=False)`, the ids of `tokenizer(text,
//! add_special_tokens=False)` and the trained mask of the prefix rule. flotilla must give the
//! same text, the same ids and the same mask for every conversation and every `train_on`, and
//! fail exactly where the template raises. Then the pipeline as a user meets it: `flotilla-train
//! data show`, the cache, bad records, packing (packed conversations score as if alone), and a
//! short training run.

#[path = "../../../tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use flotilla_config::schema::{
    ChatData, ChatFormat, DataConfig, Overflow, PackedAttention, TrainOn,
};
use flotilla_train::data::chat::{self, encode_record};
use flotilla_train::data::{self, ChatTokenizer, DataOptions, Dataset};
use serde_json::Value;

const FAMILIES: &[&str] = &["llama3", "mistral", "qwen2.5", "gemma", "phi3", "llama2"];

fn fixtures() -> PathBuf {
    common::repo_root().join("tests/oracle/fixtures/chat")
}

/// The tiny tokenizer directories, made once per test binary.
fn tokenizers() -> Option<&'static Path> {
    static DIR: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        common::oracle_python()?;
        let dir = common::scratch_dir("chat_tokenizers");
        common::python(common::oracle_file("make_chat_tokenizers.py"))
            .arg(&dir)
            .run();
        Some(dir)
    })
    .as_deref()
}

fn require_tokenizers(test: &str) -> Option<&'static Path> {
    let dir = tokenizers();
    if dir.is_none() {
        common::skip_or_fail(&format!(
            "{test}: `import transformers` fails in {}; run scripts/setup.sh",
            common::venv_python().display()
        ));
    }
    dir
}

fn chat_config(tokenizer: &Path, path: &Path, yaml: &str) -> ChatData {
    let text = format!(
        "kind: chat\npath: {}\neval_path: null\ntokenizer: {}\nchat_template: null\n\
         format: messages\nmessages_key: messages\nsystem: null\ntrain_on: assistant\n\
         overflow: truncate\npacking: false\npacked_attention: conversation\nskip_bad_records: false\nseq_len: 4096\n\
         shuffle: false\nnum_workers: 0\n{yaml}",
        path.display(),
        tokenizer.display()
    );
    let mut value: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    // Later keys win (the test's own settings).
    if let serde_yaml::Value::Mapping(m) = &mut value {
        for (k, v) in
            serde_yaml::from_str::<serde_yaml::Mapping>(if yaml.is_empty() { "{}" } else { yaml })
                .unwrap()
        {
            m.insert(k, v);
        }
    }
    match serde_yaml::from_value::<DataConfig>(value).unwrap() {
        DataConfig::Chat(c) => c,
        other => panic!("{other:?}"),
    }
}

fn oracle(tokenizer: &Path, data: &Path, args: &[&str]) -> Vec<Value> {
    oracle_lines(&[tokenizer], data, args)
}

/// The oracle's lines for `data` with each of `tokenizers` (one Python start-up for all): with
/// several, each line names its tokenizer directory.
fn oracle_lines(tokenizers: &[&Path], data: &Path, args: &[&str]) -> Vec<Value> {
    let mut call = common::python(common::oracle_file("chat_oracle.py"));
    for tokenizer in tokenizers {
        call = call.arg("--tokenizer").arg(tokenizer);
    }
    call.arg("--data")
        .arg(data)
        .args(args)
        .run()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// flotilla's encoding of every record of `data` against the oracle's; returns how many
/// conversations were compared token for token and how many errors agreed.
fn compare(
    family: &str,
    tokenizer: &Path,
    data: &Path,
    cfg: &ChatData,
    args: &[&str],
) -> (usize, usize) {
    let expected = oracle(tokenizer, data, args);
    compare_with(family, data, cfg, args, &expected)
}

/// [`compare`] against oracle lines already computed (`args` only names the comparison).
fn compare_with(
    family: &str,
    data: &Path,
    cfg: &ChatData,
    args: &[&str],
    expected: &[Value],
) -> (usize, usize) {
    let chat = ChatTokenizer::open(cfg, None).unwrap();
    let text = std::fs::read_to_string(data).unwrap();
    let records: Vec<(usize, Value)> = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| (i + 1, serde_json::from_str(l).unwrap()))
        .collect();
    assert_eq!(
        records.len(),
        expected.len(),
        "{family}: one oracle line per record"
    );
    let (mut same, mut errors) = (0, 0);
    for ((line, record), want) in records.iter().zip(expected) {
        assert_eq!(want["line"].as_u64(), Some(*line as u64));
        let got = encode_record(&chat, record, cfg);
        let what = format!("{family} {} line {line} ({args:?})", data.display());
        match (want.get("error").and_then(Value::as_str), got) {
            (Some(msg), Err(ours)) => {
                // What the template raised comes through in its own words, and flotilla's
                // refusals by the masking rule say the same thing in a sentence; an error of
                // Jinja or Python itself (`kind: render`: an undefined attribute, str + list)
                // has the engine's own words, so there it must be a render that failed too.
                let agrees = match want.get("kind").and_then(Value::as_str) {
                    Some("render") => {
                        !ours.contains("not prefix-stable") && !ours.contains("no assistant turn")
                    }
                    _ => {
                        ours.contains(msg)
                            || (msg == "no assistant turn" && ours.contains("no assistant turn"))
                            || (msg == "not prefix-stable" && ours.contains("not prefix-stable"))
                    }
                };
                assert!(agrees, "{what}: oracle error {msg:?}, flotilla {ours:?}");
                errors += 1;
            }
            (Some(msg), Ok(e)) => panic!(
                "{what}: transformers fails ({msg}), flotilla does not and renders {:?}",
                e.text
            ),
            (None, Err(ours)) => panic!(
                "{what}: flotilla fails ({ours}), transformers does not and renders {:?}",
                want["text"].as_str().unwrap_or_default()
            ),
            (None, Ok(e)) => {
                assert_eq!(e.text, want["text"].as_str().unwrap(), "{what}: text");
                let ids: Vec<u32> = serde_json::from_value(want["input_ids"].clone()).unwrap();
                assert_eq!(e.ids, ids, "{what}: ids of {:?}", e.text);
                let trained: Vec<u8> = serde_json::from_value(want["trained"].clone()).unwrap();
                let ours: Vec<u8> = e.trained.iter().map(|&t| t as u8).collect();
                assert_eq!(ours, trained, "{what}: trained mask of {:?}", e.text);
                if let Some(how) = want.get("mask") {
                    assert_eq!(
                        &serde_json::to_value(e.mask).unwrap(),
                        how,
                        "{what}: how the mask was found"
                    );
                }
                same += 1;
            }
        }
    }
    (same, errors)
}

#[test]
fn every_family_renders_tokenizes_and_masks_like_transformers() {
    let Some(dir) =
        require_tokenizers("every_family_renders_tokenizes_and_masks_like_transformers")
    else {
        return;
    };
    let data = fixtures().join("conversations.jsonl");
    for family in FAMILIES {
        // The families whose pipelines have a faster exact encoder use it, so these
        // comparisons check it against transformers.
        let chat = ChatTokenizer::open(&chat_config(&dir.join(family), &data, ""), None).unwrap();
        let want = match *family {
            "llama3" | "qwen2.5" => Some("byte-level"),
            "mistral" | "llama2" | "phi3" => Some("metaspace"),
            _ => None,
        };
        assert_eq!(chat.tokenizer.fast_encoder(), want, "{family}");
    }
    let mut total = 0;
    for (train_on, arg) in [
        (TrainOn::Assistant, "assistant"),
        (TrainOn::All, "all"),
        (TrainOn::LastAssistant, "last_assistant"),
    ] {
        let args = ["--train-on", arg];
        let (dirs, expected) = oracle_by_family(dir, FAMILIES, &data, &args);
        for ((family, tok), expected) in FAMILIES.iter().zip(&dirs).zip(&expected) {
            let mut cfg = chat_config(tok, &data, "");
            cfg.train_on = train_on;
            let (same, errors) = compare_with(family, &data, &cfg, &args, expected);
            eprintln!("{family} {arg}: {same} conversations identical, {errors} errors agreed");
            assert!(
                same >= 5,
                "{family} {arg}: only {same} conversations compared"
            );
            total += same;
        }
    }
    assert!(total > 200, "{total}");
}

/// The oracle's lines for `data` with each family's tokenizer under `dir` (one oracle run for
/// all): the tokenizer directories, and each one's lines.
fn oracle_by_family(
    dir: &Path,
    families: &[&str],
    data: &Path,
    args: &[&str],
) -> (Vec<PathBuf>, Vec<Vec<Value>>) {
    let dirs: Vec<PathBuf> = families.iter().map(|f| dir.join(f)).collect();
    let paths: Vec<&Path> = dirs.iter().map(PathBuf::as_path).collect();
    let lines = oracle_lines(&paths, data, args);
    let expected = dirs
        .iter()
        .map(|tok| {
            lines
                .iter()
                .filter(|l| l["tokenizer"].as_str() == tok.to_str())
                .cloned()
                .collect()
        })
        .collect();
    (dirs, expected)
}

/// The tiny tokenizers that carry more real templates, one each (make_chat_tokenizers.py's
/// TEMPLATE_FAMILIES; tests/oracle/fixtures/chat_templates/SOURCES.md says where each template
/// comes from).
const TEMPLATE_FAMILIES: &[&str] = &[
    "deepseek-r1-distill",
    "deepseek-r1",
    "llama3.2",
    "gemma3",
    "phi4",
    "phi4-mini",
    "phi3.5",
    "mistral-nemo",
    "qwen3",
    "command-r7b",
    "granite3.2",
    "falcon3",
    "falcon-7b",
    "functionary-v3.1",
    "olmo",
    "glm4",
];

/// Every template, the six families' and the others', on the fixture conversations and on
/// template_cases.jsonl (reasoning under `reasoning_content`, `reasoning` and `thinking`, and
/// inline in `<think>` tags; keys set to null; content as a list of parts; tool calls with
/// their arguments as an object and as a string; whitespace that Python's `str.strip` removes
/// and Rust's `trim` keeps; several system messages): flotilla renders, tokenizes and masks
/// each conversation as transformers does, and fails where it fails. `train_on: all` compares
/// the whole renders (the DeepSeek templates' generation prompt opens a `<think>` block the
/// rendered turn does not have, so they are never prefix-stable), `assistant` also every
/// prefix rendered with the generation prompt. One oracle run per mode for all templates.
#[test]
fn more_templates_render_tokenize_and_mask_like_transformers() {
    let Some(dir) = require_tokenizers("more_templates_render_tokenize_and_mask_like_transformers")
    else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("chats.jsonl");
    let mut text = String::new();
    for name in ["conversations.jsonl", "template_cases.jsonl"] {
        text.push_str(&std::fs::read_to_string(fixtures().join(name)).unwrap());
        if !text.ends_with('\n') {
            text.push('\n');
        }
    }
    std::fs::write(&data, text).unwrap();
    let families: Vec<&str> = FAMILIES.iter().chain(TEMPLATE_FAMILIES).copied().collect();
    for (train_on, arg) in [(TrainOn::All, "all"), (TrainOn::Assistant, "assistant")] {
        let args = ["--train-on", arg];
        let (dirs, expected) = oracle_by_family(dir, &families, &data, &args);
        let mut total = 0;
        for ((family, tok), expected) in families.iter().zip(&dirs).zip(&expected) {
            let mut cfg = chat_config(tok, &data, "");
            cfg.train_on = train_on;
            let (same, errors) = compare_with(family, &data, &cfg, &args, expected);
            eprintln!("{family} {arg}: {same} conversations identical, {errors} errors agreed");
            if train_on == TrainOn::All {
                assert!(
                    same >= 15,
                    "{family} {arg}: only {same} conversations compared"
                );
            }
            total += same;
        }
        let least = if train_on == TrainOn::All { 450 } else { 350 };
        assert!(total > least, "{arg}: only {total} conversations compared");
    }
}

/// Mistral v0.3 renders a system prompt into the last user turn only, so a conversation with
/// one is not prefix-stable: flotilla trains it, its turns found by markers, with
/// transformers' text and ids, the mask the oracle computes by the same rule, and the mask
/// transformers itself gives from the template with `{% generation %}` around each reply. Each
/// trained run is one assistant content (stripped, as the template strips it) and its `</s>`.
#[test]
fn a_template_that_is_not_prefix_stable_is_masked_by_markers() {
    let Some(dir) = require_tokenizers("a_template_that_is_not_prefix_stable_is_masked_by_markers")
    else {
        return;
    };
    let data = fixtures().join("system_multiturn.jsonl");
    let tagged = common::repo_root()
        .join("tests/oracle/fixtures/chat_templates/mistral-7b-instruct-v0.3.generation.jinja");
    let tok = dir.join("mistral");
    for (train_on, arg) in [
        (TrainOn::Assistant, "assistant"),
        (TrainOn::LastAssistant, "last_assistant"),
    ] {
        let args = [
            "--train-on",
            arg,
            "--generation-template",
            tagged.to_str().unwrap(),
        ];
        let expected = oracle(&tok, &data, &args);
        let mut cfg = chat_config(&tok, &data, "");
        cfg.train_on = train_on;
        let (same, errors) = compare_with("mistral", &data, &cfg, &args, &expected);
        assert_eq!((same, errors), (5, 0), "{arg}");
        let by_markers: Vec<&str> = expected
            .iter()
            .map(|l| l["mask"].as_str().unwrap())
            .collect();
        assert_eq!(
            by_markers,
            ["markers", "markers", "markers", "prefixes", "markers"],
            "{arg}"
        );
        if train_on != TrainOn::Assistant {
            continue;
        }
        let chat = ChatTokenizer::open(&cfg, None).unwrap();
        let text = std::fs::read_to_string(&data).unwrap();
        for (line, want) in text.lines().zip(&expected) {
            // transformers' own assistant mask agrees with the oracle's and flotilla's.
            assert_eq!(want["generation_mask"], want["trained"], "{line}");
            let record: Value = serde_json::from_str(line).unwrap();
            let e = encode_record(&chat, &record, &cfg).unwrap();
            // The text each run of trained tokens covers, from the tokens' offsets.
            let (_, starts) = chat.tokenizer.encode_with_offsets(&e.text).unwrap();
            let mut runs: Vec<String> = vec![];
            let mut k = 0;
            while k < e.trained.len() {
                if !e.trained[k] {
                    k += 1;
                    continue;
                }
                let first = k;
                while k < e.trained.len() && e.trained[k] {
                    k += 1;
                }
                let end = starts.get(k).copied().unwrap_or(e.text.len());
                runs.push(e.text[starts[first]..end].to_string());
            }
            let replies: Vec<String> = record["messages"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|m| m["role"] == "assistant")
                .map(|m| format!("{}</s>", m["content"].as_str().unwrap().trim()))
                .collect();
            let runs: Vec<String> = runs.iter().map(|r| r.trim_start().to_string()).collect();
            assert_eq!(runs, replies, "{line}");
        }
    }
    // data show says how the masks were found.
    let cfg = chat_config(&tok, &data, "");
    let chat = ChatTokenizer::open(&cfg, None).unwrap();
    let (_, stats) = chat::build("data.path", &data, &cfg, &chat, false).unwrap();
    assert_eq!(stats.masked_by_markers, 4);
    assert!(
        chat::summary_line(&stats)
            .contains("4 masked by markers (the chat template is not prefix-stable"),
        "{}",
        chat::summary_line(&stats)
    );
}

#[test]
fn sharegpt_records_map_to_the_same_conversations() {
    let Some(dir) = require_tokenizers("sharegpt_records_map_to_the_same_conversations") else {
        return;
    };
    let data = fixtures().join("sharegpt.jsonl");
    for family in ["qwen2.5", "llama3"] {
        let tok = dir.join(family);
        let mut cfg = chat_config(&tok, &data, "");
        cfg.format = ChatFormat::Sharegpt;
        let (same, _) = compare(family, &tok, &data, &cfg, &["--sharegpt"]);
        assert!(same >= 2, "{family}: {same}");
    }
}

#[test]
fn a_template_that_raises_stops_with_the_file_the_line_and_its_message() {
    let Some(dir) = require_tokenizers("a_template_that_raises_stops_with_the_file_the_line")
    else {
        return;
    };
    let data = fixtures().join("bad_role_order.jsonl");
    let tok = dir.join("gemma");
    let cfg = chat_config(&tok, &data, "");
    let chat = ChatTokenizer::open(&cfg, None).unwrap();
    let err = chat::build("data.path", &data, &cfg, &chat, false)
        .unwrap_err()
        .to_string();
    assert!(err.starts_with(&format!("{}:", data.display())), "{err}");
    assert!(
        err.contains("the template raised: Conversation roles must alternate"),
        "{err}"
    );
    let expected = oracle(&tok, &data, &[]);
    let first_bad = expected
        .iter()
        .find(|v| v.get("error").is_some())
        .and_then(|v| v["line"].as_u64())
        .unwrap();
    assert!(
        err.contains(&format!(":{first_bad}: ")),
        "{err} (oracle: line {first_bad})"
    );

    // Asked to skip, the same file trains on what is left and counts what it skipped.
    let mut skipping = cfg.clone();
    skipping.skip_bad_records = true;
    let good = expected.iter().filter(|v| v.get("error").is_none()).count();
    match chat::build("data.path", &data, &skipping, &chat, false) {
        Ok((set, stats)) => {
            assert_eq!(stats.skipped, expected.len() - good);
            assert_eq!(set.len(), good);
        }
        Err(e) => assert_eq!(good, 0, "{e}"),
    }
}

#[test]
fn missing_templates_and_bad_records_are_clear_errors() {
    let Some(dir) = require_tokenizers("missing_templates_and_bad_records_are_clear_errors") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("chats.jsonl");
    std::fs::write(
        &data,
        "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]}\n\n{\"text\": \"no turns\"}\n",
    )
    .unwrap();
    let cfg = chat_config(&dir.join("no_template"), &data, "");
    let err = ChatTokenizer::open(&cfg, None).unwrap_err().to_string();
    assert!(err.contains("has no chat template"), "{err}");
    assert!(err.contains("data.chat_template="), "{err}");

    let cfg = chat_config(&dir.join("qwen2.5"), &data, "");
    let chat = ChatTokenizer::open(&cfg, None).unwrap();
    let err = chat::build("data.path", &data, &cfg, &chat, false)
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        format!(
            "{}:3: record has no 'messages' list (data.messages_key); its fields are [text]",
            data.display()
        )
    );

    let broken = tmp.path().join("broken.jinja");
    std::fs::write(&broken, "{% for m in messages %}{{ m.content }").unwrap();
    let mut cfg = chat_config(&dir.join("qwen2.5"), &data, "");
    cfg.chat_template = Some(broken.display().to_string());
    let err = ChatTokenizer::open(&cfg, None).unwrap_err().to_string();
    assert!(
        err.contains("broken.jinja") && err.contains("does not parse"),
        "{err}"
    );
}

#[test]
fn packing_keeps_masks_and_never_trains_across_conversations() {
    let Some(dir) = require_tokenizers("packing_keeps_masks") else {
        return;
    };
    let data = fixtures().join("conversations.jsonl");
    let tok = dir.join("qwen2.5");
    let mut cfg = chat_config(&tok, &data, "");
    cfg.seq_len = 256;
    cfg.skip_bad_records = true;
    let chat = ChatTokenizer::open(&cfg, None).unwrap();
    let (plain, plain_stats) = chat::build("data.path", &data, &cfg, &chat, false).unwrap();
    cfg.packing = true;
    let (packed, packed_stats) = chat::build("data.path", &data, &cfg, &chat, false).unwrap();
    assert!(
        packed.len() < plain.len(),
        "{} windows for {} conversations",
        packed.len(),
        plain.len()
    );
    assert_eq!(plain_stats.conversations, packed_stats.conversations);
    // The same tokens, the same trained tokens: packing only places them side by side.
    let all = |d: &data::MaskedSequences| -> (Vec<u32>, usize) {
        let mut ids = vec![];
        let mut trained = 0;
        for k in 0..d.len() {
            let (s, t) = d.sequence(k).unwrap();
            ids.extend_from_slice(&s);
            trained += t.iter().skip(1).filter(|&&x| x).count();
        }
        (ids, trained)
    };
    assert_eq!(all(&plain).0, all(&packed).0);
    assert_eq!(plain_stats.trained_tokens, packed_stats.trained_tokens);
    assert_eq!(all(&plain).1, all(&packed).1);
    // Each window's conversations start where the unpacked ones do, and (packed_attention:
    // conversation, the default) its sample's positions restart there.
    let mut plain_lengths = (0..plain.len()).map(|k| plain.sequence(k).unwrap().0.len());
    let mut windows_with_several = 0;
    for k in 0..packed.len() {
        let (s, _) = packed.sequence(k).unwrap();
        assert!(s.len() <= cfg.seq_len + 1);
        let sample = packed.get(k).unwrap();
        assert_eq!(sample.num_loss_tokens(), packed.num_loss_tokens(k).unwrap());
        let starts = packed.conversation_starts(k);
        let mut end = 0;
        for (i, &start) in starts.iter().enumerate() {
            assert_eq!(start, end, "window {k}, conversation {i}");
            end += plain_lengths.next().unwrap();
        }
        assert_eq!(end, s.len(), "window {k}");
        match &sample.positions {
            None => assert_eq!(starts.len(), 1, "window {k}"),
            Some(positions) => {
                windows_with_several += 1;
                for (i, &p) in positions.iter().enumerate() {
                    let begin = starts.iter().rev().find(|&&b| b <= i).unwrap();
                    assert_eq!(p, (i - begin) as i64, "window {k}, input {i}");
                }
            }
        }
    }
    assert!(windows_with_several > 0);
    // packed_attention: window: the same windows, attention over each whole.
    cfg.packed_attention = PackedAttention::Window;
    let (across, _) = chat::build("data.path", &data, &cfg, &chat, false).unwrap();
    assert_eq!(all(&across), all(&packed));
    assert!((0..across.len()).all(|k| across.get(k).unwrap().positions.is_none()));
    cfg.packed_attention = PackedAttention::Conversation;
    // Overflow: drop leaves long conversations out, truncate cuts them.
    cfg.packing = false;
    cfg.seq_len = 100;
    let (cut, cut_stats) = chat::build("data.path", &data, &cfg, &chat, false).unwrap();
    cfg.overflow = Overflow::Drop;
    let (kept, drop_stats) = chat::build("data.path", &data, &cfg, &chat, false).unwrap();
    assert!(cut_stats.truncated > 0 && drop_stats.dropped >= cut_stats.truncated);
    assert!(kept.len() < cut.len());
    for k in 0..cut.len() {
        assert!(cut.sequence(k).unwrap().0.len() <= 101);
    }
}

/// The fixture conversations copied into a fresh folder (where their cache will go), and the
/// llama3 tokenizer's chat config for them, skipping bad records.
fn fixture_chats_in_tempdir(dir: &Path) -> (tempfile::TempDir, PathBuf, ChatData, ChatTokenizer) {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("chats.jsonl");
    std::fs::copy(fixtures().join("conversations.jsonl"), &data).unwrap();
    let mut cfg = chat_config(&dir.join("llama3"), &data, "");
    cfg.skip_bad_records = true;
    let chat = ChatTokenizer::open(&cfg, None).unwrap();
    (tmp, data, cfg, chat)
}

/// The files with extension `ext` in the cache folder beside `data`.
fn cache_files(data: &Path, ext: &str) -> Vec<PathBuf> {
    let cache_dir = data.with_file_name(".flotilla-cache");
    match std::fs::read_dir(&cache_dir) {
        Ok(entries) => entries
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == ext))
            .collect(),
        Err(_) => vec![],
    }
}

#[test]
fn the_cache_is_used_and_never_stale() {
    let Some(dir) = require_tokenizers("the_cache_is_used_and_never_stale") else {
        return;
    };
    let (_tmp, data, mut cfg, chat) = fixture_chats_in_tempdir(dir);
    let (first, stats) = chat::build("data.path", &data, &cfg, &chat, true).unwrap();
    let entries = || cache_files(&data, "bin").len();
    assert_eq!(entries(), 1);
    let (again, again_stats) = chat::build("data.path", &data, &cfg, &chat, true).unwrap();
    assert_eq!((&first, &stats), (&again, &again_stats));
    // A changed record is a new key: the cache never answers for the old file.
    let text = std::fs::read_to_string(&data)
        .unwrap()
        .replacen("Paris", "Lyon", 1);
    std::fs::write(&data, text).unwrap();
    let (changed, _) = chat::build("data.path", &data, &cfg, &chat, true).unwrap();
    assert_ne!(changed, first);
    assert_eq!(entries(), 2);
    // So is a changed setting.
    cfg.train_on = TrainOn::All;
    let (all, _) = chat::build("data.path", &data, &cfg, &chat, true).unwrap();
    assert_ne!(all.sequence(0).unwrap().1, changed.sequence(0).unwrap().1);
    assert_eq!(entries(), 3);
    // Packed windows come back with where their conversations start.
    cfg.packing = true;
    let (packed, _) = chat::build("data.path", &data, &cfg, &chat, true).unwrap();
    assert_eq!(entries(), 4);
    let (cached, _) = chat::build("data.path", &data, &cfg, &chat, true).unwrap();
    assert_eq!(cached, packed);
    assert!((0..cached.len()).any(|k| cached.conversation_starts(k).len() > 1));
    // packed_attention changes how samples are read, not what is stored.
    cfg.packed_attention = PackedAttention::Window;
    let (window, _) = chat::build("data.path", &data, &cfg, &chat, true).unwrap();
    assert_eq!(entries(), 4);
    assert!((0..window.len()).all(|k| window.get(k).unwrap().positions.is_none()));
    assert!((0..cached.len()).any(|k| cached.get(k).unwrap().positions.is_some()));
}

/// A process that finds another preparing the same entry (holding its lock) waits, then reads
/// what the other stored instead of preparing it again.
#[test]
fn ranks_prepare_an_entry_once() {
    use std::os::unix::fs::MetadataExt;
    let Some(dir) = require_tokenizers("ranks_prepare_an_entry_once") else {
        return;
    };
    let (tmp, data, cfg, chat) = fixture_chats_in_tempdir(dir);
    let (first, _) = chat::build("data.path", &data, &cfg, &chat, true).unwrap();
    let named = |ext: &str| {
        let files = cache_files(&data, ext);
        assert_eq!(files.len(), 1, "one .{ext} file in the cache: {files:?}");
        files[0].clone()
    };
    let (bin, lock) = (named("bin"), named("lock"));
    let saved = tmp.path().join("saved.bin");
    std::fs::rename(&bin, &saved).unwrap();
    // Another rank is preparing: it holds the lock and there is no entry yet.
    let other = std::fs::OpenOptions::new().write(true).open(&lock).unwrap();
    other.lock().unwrap();
    let waiting = std::thread::spawn({
        let (data, cfg) = (data.clone(), cfg.clone());
        move || {
            let chat = ChatTokenizer::open(&cfg, None).unwrap();
            chat::build("data.path", &data, &cfg, &chat, true)
                .unwrap()
                .0
        }
    });
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert!(
        !waiting.is_finished(),
        "prepared while another process held the entry's lock"
    );
    // The other rank stores its entry and lets go.
    std::fs::copy(&saved, &bin).unwrap();
    let stored = std::fs::metadata(&bin).unwrap().ino();
    other.unlock().unwrap();
    let got = waiting.join().unwrap();
    assert_eq!(got, first);
    assert_eq!(
        std::fs::metadata(&bin).unwrap().ino(),
        stored,
        "the waiting process prepared and stored the entry again instead of reading it"
    );
}

/// A warm cache is read, not prepared again: its file is the same file (inode and time) after
/// a second build, and the samples read from it are those prepared.
#[test]
fn a_warm_cache_is_read_without_preparing_again() {
    use std::os::unix::fs::MetadataExt;
    let Some(dir) = require_tokenizers("a_warm_cache_is_read_without_preparing_again") else {
        return;
    };
    let (_tmp, data, mut cfg, chat) = fixture_chats_in_tempdir(dir);
    cfg.packing = true;
    cfg.seq_len = 300;
    let (first, stats) = chat::build("data.path", &data, &cfg, &chat, true).unwrap();
    let bin = cache_files(&data, "bin").pop().unwrap();
    let stamp = |p: &Path| {
        let m = std::fs::metadata(p).unwrap();
        (m.ino(), m.mtime(), m.mtime_nsec(), m.len())
    };
    let before = stamp(&bin);
    std::thread::sleep(std::time::Duration::from_millis(20));
    let (again, again_stats) = chat::build("data.path", &data, &cfg, &chat, true).unwrap();
    assert_eq!(stamp(&bin), before, "the cache entry was written again");
    assert_eq!((&again, &again_stats), (&first, &stats));
    let (uncached, uncached_stats) = chat::build("data.path", &data, &cfg, &chat, false).unwrap();
    assert_eq!((&uncached, &uncached_stats), (&first, &stats));
    for k in 0..first.len() {
        assert_eq!(first.get(k).unwrap(), uncached.get(k).unwrap());
        assert_eq!(again.example(k).unwrap(), uncached.example(k).unwrap());
    }
    // A damaged entry (cut short) is not served: it is prepared again, the same.
    let size = std::fs::metadata(&bin).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&bin)
        .unwrap()
        .set_len(size - 3)
        .unwrap();
    let (rebuilt, _) = chat::build("data.path", &data, &cfg, &chat, true).unwrap();
    assert_eq!(rebuilt, first);
    assert_eq!(std::fs::metadata(&bin).unwrap().len(), size);
}

/// A disk that fills while the samples are written is an error naming the cache file, and
/// leaves neither the entry nor its temporary file behind; the next build prepares it.
#[test]
fn a_full_disk_leaves_no_cache_entry_behind() {
    let Some(dir) = require_tokenizers("a_full_disk_leaves_no_cache_entry_behind") else {
        return;
    };
    if !Path::new("/dev/full").exists() {
        return;
    }
    let (_tmp, data, cfg, chat) = fixture_chats_in_tempdir(dir);
    let (first, _) = chat::build("data.path", &data, &cfg, &chat, true).unwrap();
    let bin = cache_files(&data, "bin").pop().unwrap();
    std::fs::remove_file(&bin).unwrap();
    // This process's temporary name for the entry, pointed at a device that is always full.
    let tmp = bin.with_extension(format!("tmp-{}", std::process::id()));
    std::os::unix::fs::symlink("/dev/full", &tmp).unwrap();
    let err = chat::build("data.path", &data, &cfg, &chat, true).unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains(&bin.display().to_string()) && message.contains("free space"),
        "{message}"
    );
    assert!(
        !err.is_input(),
        "a full disk is the machine's fault, not the data's"
    );
    assert!(cache_files(&data, "bin").is_empty());
    assert!(
        std::fs::symlink_metadata(&tmp).is_err(),
        "the temporary file is left behind"
    );
    let (again, _) = chat::build("data.path", &data, &cfg, &chat, true).unwrap();
    assert_eq!(again, first);
    assert_eq!(cache_files(&data, "bin"), vec![bin]);
}

/// A cache folder that cannot be made costs only the cache: the samples are written to a
/// temporary file and read from there.
#[test]
fn an_unwritable_cache_folder_costs_only_the_cache() {
    let Some(dir) = require_tokenizers("an_unwritable_cache_folder_costs_only_the_cache") else {
        return;
    };
    let (_tmp, data, cfg, chat) = fixture_chats_in_tempdir(dir);
    let (uncached, stats) = chat::build("data.path", &data, &cfg, &chat, false).unwrap();
    // A file where the folder would be.
    std::fs::write(data.with_file_name(".flotilla-cache"), "not a folder").unwrap();
    let (got, got_stats) = chat::build("data.path", &data, &cfg, &chat, true).unwrap();
    assert_eq!((&got, &got_stats), (&uncached, &stats));
    assert!((0..got.len()).all(|k| got.get(k).unwrap() == uncached.get(k).unwrap()));
}

/// `flotilla-train data show --format json` prints the oracle's ids, and labels that are the
/// ids where trained and -100 elsewhere.
#[test]
fn data_show_prints_what_the_model_sees() {
    let Some(dir) = require_tokenizers("data_show_prints_what_the_model_sees") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("chats.jsonl");
    std::fs::copy(fixtures().join("conversations.jsonl"), &data).unwrap();
    let tok = dir.join("phi3");
    let run_with = |format: &str, extra: &[&str]| {
        let out = Command::new(common::target_profile_dir().join("flotilla-train"))
            .current_dir(common::repo_root())
            .args([
                "data", "show", "--num", "4", "--color", "never", "--format", format,
            ])
            .arg("data=chat")
            .arg(format!("data.path={}", data.display()))
            .arg(format!("data.tokenizer={}", tok.display()))
            .args(["data.skip_bad_records=true", "data.seq_len=4096"])
            .args([
                "model.vocab_size=1024",
                "model.max_position_embeddings=4096",
            ])
            .args(extra)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let run = |format: &str| run_with(format, &[]);
    let shown: Value = serde_json::from_str(&run("json")).unwrap();
    let expected: Vec<Value> = oracle(&tok, &data, &[])
        .into_iter()
        .filter(|v| v.get("error").is_none())
        .collect();
    let examples = shown["examples"].as_array().unwrap();
    assert_eq!(examples.len(), 4);
    for (ex, want) in examples.iter().zip(&expected) {
        assert_eq!(ex["input_ids"], want["input_ids"]);
        let ids: Vec<i64> = serde_json::from_value(want["input_ids"].clone()).unwrap();
        let trained: Vec<u8> = serde_json::from_value(want["trained"].clone()).unwrap();
        let labels: Vec<i64> = ids
            .iter()
            .zip(&trained)
            .enumerate()
            .map(|(i, (&id, &t))| if t == 1 && i > 0 { id } else { -100 })
            .collect();
        assert_eq!(ex["labels"], serde_json::json!(labels));
        assert_eq!(ex["text"], want["text"]);
    }
    let summary = &shown["summary"];
    let trained: usize = expected
        .iter()
        .map(|v| {
            v["trained"]
                .as_array()
                .unwrap()
                .iter()
                .skip(1)
                .filter(|t| t.as_u64() == Some(1))
                .count()
        })
        .sum();
    assert_eq!(summary["examples"].as_u64(), Some(expected.len() as u64));
    assert_eq!(summary["trained_tokens"].as_u64(), Some(trained as u64));
    assert!(examples.iter().all(|e| e.get("position_ids").is_none()));

    // Packed: the first window holds the first conversations one after another, with the
    // position ids the model trains them at (restarting at each).
    let packed = ["data.packing=true"];
    let shown: Value = serde_json::from_str(&run_with("json", &packed)).unwrap();
    let window = &shown["examples"][0];
    let ids: Vec<i64> = serde_json::from_value(window["input_ids"].clone()).unwrap();
    let positions: Vec<i64> = serde_json::from_value(window["position_ids"].clone()).unwrap();
    let (mut want_ids, mut want_positions, mut held) = (vec![], vec![], 0);
    for conversation in &expected {
        let c: Vec<i64> = serde_json::from_value(conversation["input_ids"].clone()).unwrap();
        if want_ids.len() + c.len() > ids.len() {
            break;
        }
        want_positions.extend(0..c.len() as i64);
        want_ids.extend(c);
        held += 1;
    }
    assert!(held > 1, "the first window packs {held} conversation");
    assert_eq!(ids, want_ids);
    assert_eq!(positions, want_positions);
    let text = run_with("text", &packed);
    assert!(
        text.contains(&format!(
            "{held} conversations, each attending only to itself ──"
        )),
        "{text}"
    );

    // The text form, as a person reads it: trained spans bracketed, and the summary line.
    let text = run("text");
    assert!(text.contains("── example 1 of"), "{text}");
    assert!(text.contains("⟦"), "{text}");
    let last = text.lines().last().unwrap();
    assert!(
        last.contains(&format!(
            "{} conversations in {} examples",
            expected.len(),
            expected.len()
        )),
        "{last}"
    );
}

/// Every other data kind shows too: the default arithmetic job's first example.
#[test]
fn data_show_works_for_the_default_job() {
    let out = Command::new(common::target_profile_dir().join("flotilla-train"))
        .current_dir(common::repo_root())
        .args(["data", "show", "--num", "1", "--format", "json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    let ex = &shown["examples"][0];
    let text = ex["text"].as_str().unwrap();
    assert!(
        text.contains('=') && text.contains('+') || text.contains('-'),
        "{text}"
    );
    let labels = ex["labels"].as_array().unwrap();
    let ids = ex["input_ids"].as_array().unwrap();
    assert_eq!(labels.len(), ids.len());
    // The prompt is masked, the answer is not.
    assert_eq!(labels[0], -100);
    assert!(labels.iter().any(|l| l != -100));
    assert!(shown["summary"]["examples"].as_u64().unwrap() > 100);
}

#[test]
fn chat_data_needs_a_tokenizer_directory() {
    let cfg = chat_config(
        Path::new("/nonexistent-tokenizer"),
        Path::new("x.jsonl"),
        "",
    );
    let err = data::build(
        &DataConfig::Chat(cfg),
        &DataOptions {
            model_vocab_size: 1000,
            run_dir: None,
            init_from: None,
        },
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("has no tokenizer.json"), "{err}");
}

/// Trains on the chat example in `example` ([`common::make_chat_example`]: its base and its
/// conversations) in `run_dir` with `args` laid over, through `flotilla-train train`; the
/// run's standard error and its metrics rows.
fn train_on_chat_example(
    example: &Path,
    run_dir: &Path,
    args: &[&str],
) -> (String, Vec<flotilla_train::MetricsRow>) {
    let out = Command::new(common::target_profile_dir().join("flotilla-train"))
        .current_dir(common::repo_root())
        .arg("train")
        .arg("--run-dir")
        .arg(run_dir)
        .arg(format!(
            "model.init_from={}",
            example.join("base").display()
        ))
        .arg("data=chat")
        .arg(format!(
            "data.path={}",
            example.join("chats.jsonl").display()
        ))
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    let path = run_dir.join("metrics.csv");
    let rows = csv::Reader::from_path(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .deserialize()
        .map(|r| r.unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .collect();
    (stderr, rows)
}

/// The README's example, short: a base made by examples/chat/make_example.py, trained on its
/// conversations through `flotilla-train train`; the loss falls and `final/` is a tokenizer
/// directory with the chat template, as transformers needs it.
#[test]
fn a_short_chat_fine_tune_learns_and_keeps_the_template() {
    if require_tokenizers("a_short_chat_fine_tune_learns_and_keeps_the_template").is_none() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    common::make_chat_example(tmp.path());
    let run_dir = tmp.path().join("run");
    let (stderr, rows) = train_on_chat_example(
        tmp.path(),
        &run_dir,
        &[
            "data.seq_len=128",
            "trainer.max_steps=40",
            "trainer.warmup_steps=5",
            "trainer.eval_every=0",
            "trainer.checkpoint_every=0",
            "trainer.log_every=1",
        ],
    );
    assert!(
        stderr.contains("chat data: 2000 records: 2000 conversations in 2000 examples"),
        "{stderr}"
    );
    let losses: Vec<f64> = rows.iter().map(|r| r.loss).collect();
    assert!(losses.len() >= 40, "{losses:?}");
    let (first, last) = (losses[0], losses[losses.len() - 1]);
    assert!(last < first * 0.5, "loss {first} -> {last}");
    let final_dir = run_dir.join("final");
    let template = flotilla_train::data::ChatTemplate::from_tokenizer_dir(&final_dir).unwrap();
    let base =
        flotilla_train::data::ChatTemplate::from_tokenizer_dir(&tmp.path().join("base")).unwrap();
    assert_eq!(template.source(), base.source());
    assert!(template.source().contains("<|im_start|>"));
    assert!(final_dir.join("tokenizer.json").is_file());
}

/// Packed conversations that see only themselves score exactly as unpacked ones: with the
/// weights left alone (one step at lr 1e-30), the evaluation loss over the same 40 held-out
/// conversations is the same whether they are packed or not, and different when packed
/// windows attend across their conversations.
#[test]
fn packed_conversations_score_as_if_alone() {
    if require_tokenizers("packed_conversations_score_as_if_alone").is_none() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    common::make_chat_example(tmp.path());
    let eval = tmp.path().join("eval.jsonl");
    let eval_path = format!("data.eval_path={}", eval.display());
    let eval_loss = |name: &str, packing: &[&str]| -> f64 {
        let mut args = vec![
            "data.seq_len=256",
            eval_path.as_str(),
            "trainer.max_steps=1",
            "trainer.lr=1e-30",
            "trainer.warmup_steps=0",
            "trainer.eval_every=1",
            "trainer.eval_batches=40",
            "trainer.micro_batch_size=8",
            "trainer.global_batch_size=8",
            "trainer.checkpoint_every=0",
            "compute.tasks_per_node=1",
        ];
        args.extend(packing);
        let (_, rows) = train_on_chat_example(tmp.path(), &tmp.path().join(name), &args);
        rows.last()
            .and_then(|r| r.eval_loss)
            .expect("an evaluation")
    };
    // The held-out conversations really are packed, several to a window.
    let mut cfg = chat_config(&tmp.path().join("base"), &eval, "");
    cfg.seq_len = 256;
    cfg.packing = true;
    let chat = ChatTokenizer::open(&cfg, None).unwrap();
    let (windows, _) = chat::build("data.eval_path", &eval, &cfg, &chat, false).unwrap();
    assert!(windows.len() <= 20, "{} windows", windows.len());
    let alone = eval_loss("alone", &[]);
    let packed = eval_loss("packed", &["data.packing=true"]);
    let across = eval_loss(
        "across",
        &["data.packing=true", "data.packed_attention=window"],
    );
    let rel = |a: f64| (a - alone).abs() / alone;
    eprintln!(
        "eval loss: alone {alone}, packed {packed} (rel {:.1e}), packed attending across {across} \
         (rel {:.1e})",
        rel(packed),
        rel(across)
    );
    assert!(rel(packed) < 1e-6);
    assert!(rel(across) > 1e-4);
}
