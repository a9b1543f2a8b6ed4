//! The data layer against its contracts: the exact sample order of token files, the per-rank
//! split, shuffling and resume, text packing, jsonl masking, tokenizers (with the Hugging Face
//! `tokenizers` Python library as the oracle), the arithmetic task and its exact-match
//! accuracy, and the error messages that name the culprit.

#[path = "../../../tests/common/mod.rs"]
mod common;

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use flotilla_config::schema::{DataConfig, TokenDtype};
use flotilla_train::data::{
    self, arithmetic, eval_batches, greedy_generate, ArithmeticTask, BatchLayout, DataError,
    DataLoader, DataOptions, Dataset, SamplerState, SequenceDataset, Tokenizer, TokensDataset,
    IGNORE_INDEX,
};
use flotilla_train::objective::next_token_loss_sum;
use tch::{Device, Kind, Tensor};

// ------------------------------------------------------------------------------------------
// helpers
// ------------------------------------------------------------------------------------------

fn write_tokens(path: &Path, ids: &[u64], dtype: TokenDtype) {
    let mut bytes = vec![];
    for &id in ids {
        match dtype {
            TokenDtype::Uint16 => bytes.extend((id as u16).to_le_bytes()),
            TokenDtype::Uint32 => bytes.extend((id as u32).to_le_bytes()),
        }
    }
    std::fs::write(path, bytes).unwrap();
}

fn rows(t: &Tensor) -> Vec<Vec<i64>> {
    let size = t.size();
    let flat: Vec<i64> = Vec::try_from(t.reshape([-1])).unwrap();
    flat.chunks(size[1] as usize).map(|c| c.to_vec()).collect()
}

fn layout(g: usize, m: usize, rank: usize, world: usize) -> BatchLayout {
    BatchLayout {
        global_batch_size: g,
        micro_batch_size: m,
        rank,
        world_size: world,
    }
}

fn data_config(yaml: &str) -> DataConfig {
    serde_yaml::from_str(yaml).unwrap_or_else(|e| panic!("{yaml}: {e}"))
}

fn opts(vocab: usize, run_dir: Option<&Path>) -> DataOptions<'_> {
    DataOptions {
        model_vocab_size: vocab,
        run_dir,
        init_from: None,
    }
}

fn err_text<T: std::fmt::Debug>(r: Result<T, DataError>) -> String {
    r.expect_err("expected an error").to_string()
}

/// Every sample index a loader hands out over `steps` steps, for each rank in order.
fn global_batches(
    dataset: Arc<dyn Dataset>,
    shuffle: bool,
    seed: u64,
    g: usize,
    m: usize,
    world: usize,
    steps: usize,
) -> Vec<Vec<usize>> {
    let mut loaders: Vec<DataLoader> = (0..world)
        .map(|r| {
            DataLoader::new(
                dataset.clone(),
                shuffle,
                seed,
                layout(g, m, r, world),
                Device::Cpu,
            )
            .unwrap()
        })
        .collect();
    (0..steps)
        .map(|_| {
            loaders
                .iter_mut()
                .flat_map(|l| l.next_step().unwrap().indices)
                .collect()
        })
        .collect()
}

// ------------------------------------------------------------------------------------------
// kind: tokens — the exact order contract
// ------------------------------------------------------------------------------------------

fn check_token_order(dtype: TokenDtype, base: u64, vocab: usize) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("train.bin");
    // N = 87 tokens, T = 8: (87-1)/8 = 10 samples; the last 6 tokens (81..87) only serve as...
    // nothing: 10*8+1 = 81 tokens are used, the tail of 6 is dropped.
    let n = 87u64;
    let t = 8usize;
    let ids: Vec<u64> = (0..n).map(|i| base + i * 7 % 1000).collect();
    write_tokens(&path, &ids, dtype);
    let ds = Arc::new(TokensDataset::open(&path, "data.path", dtype, t, vocab).unwrap());
    assert_eq!(ds.len(), 10);
    assert_eq!(ds.num_tokens(), n);

    // G = 4, M = 2, one rank: step s holds samples s*4 .. s*4+3, wrapping after sample 9.
    let (g, m) = (4, 2);
    let mut loader =
        DataLoader::new(ds.clone(), false, 0, layout(g, m, 0, 1), Device::Cpu).unwrap();
    for s in 0..5usize {
        let step = loader.next_step().unwrap();
        let expect_idx: Vec<usize> = (s * g..s * g + g).map(|k| k % 10).collect();
        assert_eq!(step.indices, expect_idx, "step {s}");
        assert_eq!(step.micro_batches.len(), 2);
        assert_eq!(step.global_loss_tokens, (g * t) as u64);
        for (mi, mb) in step.micro_batches.iter().enumerate() {
            assert_eq!(mb.input_ids.size(), vec![m as i64, t as i64]);
            assert_eq!(mb.input_ids.kind(), Kind::Int64);
            assert_eq!(mb.labels.kind(), Kind::Int64);
            assert_eq!(mb.num_loss_tokens, (m * t) as u64);
            let (inp, lab) = (rows(&mb.input_ids), rows(&mb.labels));
            for r in 0..m {
                let k = expect_idx[mi * m + r];
                let want_in: Vec<i64> = ids[k * t..k * t + t].iter().map(|&x| x as i64).collect();
                let want_lab: Vec<i64> = ids[k * t + 1..k * t + t + 1]
                    .iter()
                    .map(|&x| x as i64)
                    .collect();
                assert_eq!(inp[r], want_in, "step {s} sample {k} inputs");
                assert_eq!(lab[r], want_lab, "step {s} sample {k} labels");
            }
        }
    }
    // The last sample ends at token 80; tokens 81..86 are never read as inputs or labels.
    let last = ds.get(9).unwrap();
    assert_eq!(*last.labels.last().unwrap(), ids[80] as i64);
}

#[test]
fn tokens_order_contract_uint16() {
    check_token_order(TokenDtype::Uint16, 0, 1000);
}

#[test]
fn tokens_order_contract_uint32() {
    // Ids above 65535 prove the 4-byte little-endian decoding.
    check_token_order(TokenDtype::Uint32, 100_000, 101_000);
}

#[test]
fn tokens_via_build_and_errors_name_the_culprit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.bin");
    write_tokens(&path, &(0..50).collect::<Vec<_>>(), TokenDtype::Uint16);
    let cfg = data_config(&format!(
        "kind: tokens\npath: {}\neval_path: null\ntoken_dtype: uint16\nseq_len: 4\nshuffle: false\nnum_workers: 0\n",
        path.display()
    ));
    let d = data::build(&cfg, &opts(64, None)).unwrap();
    assert!(d.tokenizer.is_none() && d.eval.is_none());
    assert_eq!(d.train.len(), 12); // (50-1)/4

    // An id >= vocab: the file, the position and the vocabulary size.
    let d = data::build(&cfg, &opts(40, None)).unwrap();
    let e = err_text(d.train.get(9)); // sample 9 reads tokens 36..=40
    assert_eq!(
        e,
        format!(
            "{}: token id 40 at position 40 is out of range for model.vocab_size=40",
            path.display()
        )
    );

    // Missing file, with its path and key.
    let missing = dir.path().join("nope.bin");
    let e = err_text(TokensDataset::open(
        &missing,
        "data.path",
        TokenDtype::Uint16,
        4,
        64,
    ));
    assert_eq!(
        e,
        format!("data.path: file not found: {}", missing.display())
    );

    // Size not a multiple of the dtype width.
    let odd = dir.path().join("odd.bin");
    std::fs::write(&odd, [0u8; 11]).unwrap();
    let e = err_text(TokensDataset::open(
        &odd,
        "data.path",
        TokenDtype::Uint32,
        1,
        64,
    ));
    assert!(
        e.starts_with(&format!(
            "{}: size 11 bytes is not a multiple of 4 (data.token_dtype=uint32)",
            odd.display()
        )),
        "{e}"
    );

    // Too short for one sample.
    let e = err_text(TokensDataset::open(
        &path,
        "data.path",
        TokenDtype::Uint16,
        50,
        64,
    ));
    assert!(
        e.contains("50 tokens is too few for one sample of data.seq_len=50"),
        "{e}"
    );
}

// ------------------------------------------------------------------------------------------
// ranks, shuffle, resume
// ------------------------------------------------------------------------------------------

fn varied_dataset() -> Arc<dyn Dataset> {
    // 37 sequences of varied lengths and prompt lengths: the loss-token count differs per
    // sample, so normalising by the global count matters.
    let items = (0..37u32)
        .map(|i| {
            let len = 3 + (i * 5 % 9) as usize;
            let ids: Vec<u32> = (0..len as u32).map(|j| (i * 3 + j) % 23).collect();
            (ids, 1 + (i % 3) as usize)
        })
        .collect();
    Arc::new(SequenceDataset::new("varied", items, 12, 0).unwrap())
}

#[test]
fn rank_split_gives_the_same_global_batch_and_loss_for_any_world_size() {
    let ds = varied_dataset();
    let (g, m) = (8, 2);
    let one = global_batches(ds.clone(), true, 5, g, m, 1, 6);
    for w in [2, 4] {
        assert_eq!(
            global_batches(ds.clone(), true, 5, g, m, w, 6),
            one,
            "W={w}"
        );
    }
    // Rank r's rows are r*G/W .. (r+1)*G/W of the global batch.
    let mut l = DataLoader::new(ds.clone(), true, 5, layout(g, m, 1, 4), Device::Cpu).unwrap();
    assert_eq!(l.next_step().unwrap().indices, one[0][2..4].to_vec());

    // The per-step loss of a fixed fake model, normalised by the global count, is the same.
    tch::manual_seed(0);
    let table = Tensor::randn([23, 23], (Kind::Float, Device::Cpu));
    let step_losses = |world: usize, micro: usize| -> Vec<f64> {
        let mut loaders: Vec<DataLoader> = (0..world)
            .map(|r| {
                DataLoader::new(ds.clone(), true, 5, layout(g, micro, r, world), Device::Cpu)
                    .unwrap()
            })
            .collect();
        (0..6)
            .map(|_| {
                let mut total = 0.0;
                let mut counts = HashSet::new();
                for l in loaders.iter_mut() {
                    let step = l.next_step().unwrap();
                    counts.insert(step.global_loss_tokens);
                    for mb in &step.micro_batches {
                        let logits = table.index_select(0, &mb.input_ids.reshape([-1]));
                        let logits = logits.reshape([mb.rows(), 12, 23]);
                        total += next_token_loss_sum(&logits, mb).double_value(&[])
                            / step.global_loss_tokens as f64;
                    }
                }
                assert_eq!(counts.len(), 1, "every rank sees the same global count");
                total
            })
            .collect()
    };
    let base = step_losses(1, 8);
    for (w, m) in [(1, 2), (2, 2), (2, 4), (4, 1), (4, 2)] {
        for (a, b) in step_losses(w, m).iter().zip(&base) {
            assert!(
                (a - b).abs() < 1e-5 * b.abs().max(1.0),
                "W={w} M={m}: {a} vs {b}"
            );
        }
    }
}

#[test]
fn bad_layouts_are_rejected() {
    let ds = varied_dataset();
    let e = err_text(
        DataLoader::new(ds.clone(), false, 0, layout(6, 2, 0, 4), Device::Cpu).map(|_| ()),
    );
    assert!(
        e.contains("global batch size 6 is not divisible by world size 4"),
        "{e}"
    );
    let e = err_text(DataLoader::new(ds, false, 0, layout(8, 3, 0, 2), Device::Cpu).map(|_| ()));
    assert!(e.contains("do not split into micro-batches of 3"), "{e}");
}

#[test]
fn shuffle_is_seeded_per_epoch_and_reproducible() {
    let ds = varied_dataset(); // 37 samples
    let n = ds.len();
    let stream = |seed: u64| -> Vec<usize> {
        global_batches(ds.clone(), true, seed, 1, 1, 1, 3 * n).concat()
    };
    let a = stream(7);
    assert_eq!(a, stream(7), "same seed, same order");
    assert_ne!(a, stream(8), "another seed, another order");
    let epochs: Vec<&[usize]> = a.chunks(n).collect();
    for e in &epochs {
        let mut sorted = e.to_vec();
        sorted.sort();
        assert_eq!(
            sorted,
            (0..n).collect::<Vec<_>>(),
            "each epoch visits every sample once"
        );
        assert_ne!(*e, (0..n).collect::<Vec<_>>().as_slice(), "shuffled");
    }
    assert_ne!(epochs[0], epochs[1]);
    assert_ne!(epochs[1], epochs[2]);

    // shuffle=false is the identity, epoch after epoch.
    let seq = global_batches(ds.clone(), false, 7, 1, 1, 1, 2 * n).concat();
    let want: Vec<usize> = (0..2 * n).map(|p| p % n).collect();
    assert_eq!(seq, want);
}

#[test]
fn sampler_state_round_trips_mid_epoch() {
    let ds = varied_dataset(); // 37 samples, G = 8: step 4 crosses into epoch 1
    let mut a = DataLoader::new(ds.clone(), true, 11, layout(8, 4, 0, 1), Device::Cpu).unwrap();
    for _ in 0..3 {
        a.next_step().unwrap();
    }
    let json = serde_json::to_string(&a.state()).unwrap();
    let expected: Vec<Vec<usize>> = (0..5).map(|_| a.next_step().unwrap().indices).collect();

    let state: SamplerState = serde_json::from_str(&json).unwrap();
    assert_eq!(state.position, 24);
    assert_eq!(state.epoch, 0);
    let mut b = DataLoader::new(ds.clone(), true, 11, layout(8, 4, 0, 1), Device::Cpu).unwrap();
    b.restore(&state).unwrap();
    let got: Vec<Vec<usize>> = (0..5).map(|_| b.next_step().unwrap().indices).collect();
    assert_eq!(got, expected);
    assert_eq!(b.state(), a.state());
    assert_eq!(b.state().epoch, 1);

    // A state from other data (or another seed) is refused with the reason.
    let mut c = DataLoader::new(ds.clone(), true, 12, layout(8, 4, 0, 1), Device::Cpu).unwrap();
    let e = err_text(c.restore(&state));
    assert!(e.contains("saved with shuffle seed 11, now 12"), "{e}");
    let other = Arc::new(SequenceDataset::new("x", vec![(vec![1, 2], 1); 5], 4, 0).unwrap());
    let mut d = DataLoader::new(other, true, 11, layout(8, 4, 0, 1), Device::Cpu).unwrap();
    let e = err_text(d.restore(&state));
    assert!(
        e.contains("saved for 37 samples, the data now has 5"),
        "{e}"
    );
}

#[test]
fn eval_split_covers_the_first_samples_once() {
    let ds = varied_dataset();
    let all = eval_batches(ds.as_ref(), 10, 4, 0, 1, Device::Cpu).unwrap();
    assert_eq!(all.indices, (0..10).collect::<Vec<_>>());
    assert_eq!(all.micro_batches.len(), 3); // 4 + 4 + 2
    let mut union = vec![];
    let mut local = 0;
    for r in 0..3 {
        let part = eval_batches(ds.as_ref(), 10, 4, r, 3, Device::Cpu).unwrap();
        assert_eq!(part.global_loss_tokens, all.global_loss_tokens);
        local += part.local_loss_tokens();
        union.extend(part.indices);
    }
    assert_eq!(union, all.indices);
    assert_eq!(local, all.global_loss_tokens);
}

// ------------------------------------------------------------------------------------------
// kind: text
// ------------------------------------------------------------------------------------------

/// The documents of a packed text dataset, read back from its windows (`seq_len` 1: every
/// token of the stream but the last EOS is a window's input).
fn text_documents(ds: &dyn data::Dataset, eos: i64) -> Vec<String> {
    let stream: Vec<i64> = (0..ds.len())
        .map(|i| ds.get(i).unwrap().input_ids[0])
        .collect();
    stream
        .split(|&t| t == eos)
        .map(|d| String::from_utf8(d.iter().map(|&t| t as u8).collect()).unwrap())
        .filter(|d| !d.is_empty())
        .collect()
}

/// `data.eval_fraction` / `data.eval_records` hold documents of `kind: text` out, seeded by
/// `data.seed`: the held-out documents are never trained on, both sets keep reading order.
#[test]
fn text_holds_documents_out() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("docs.jsonl");
    let docs: Vec<String> = (0..20).map(|i| format!("doc{i:02}")).collect();
    let lines: Vec<String> = docs
        .iter()
        .map(|d| format!(r#"{{"text": "{d}"}}"#))
        .collect();
    std::fs::write(&file, lines.join("\n")).unwrap();
    let config = |held: &str, seed: u64| {
        data_config(&format!(
            "kind: text\npaths: ['{}']\neval_paths: null\n{held}\nseed: {seed}\ntokenizer: byte\n\
             vocab_size: 300\nseq_len: 1\nshuffle: false\nnum_workers: 0\n",
            file.display()
        ))
    };
    let eos = 258i64;
    let d = data::build(&config("eval_records: 4", 0), &opts(300, None)).unwrap();
    let train = text_documents(d.train.as_ref(), eos);
    let eval = text_documents(d.eval.as_ref().unwrap().as_ref(), eos);
    assert_eq!((train.len(), eval.len()), (16, 4), "{train:?} {eval:?}");
    let mut all: Vec<String> = train.iter().chain(&eval).cloned().collect();
    all.sort();
    assert_eq!(all, docs, "every document once, in one set");
    for set in [&train, &eval] {
        assert!(
            set.windows(2).all(|w| w[0] < w[1]),
            "reading order: {set:?}"
        );
    }
    let d = data::build(&config("eval_fraction: 0.25", 0), &opts(300, None)).unwrap();
    assert_eq!(
        text_documents(d.eval.as_ref().unwrap().as_ref(), eos).len(),
        5
    );
    let other = data::build(&config("eval_records: 4", 1), &opts(300, None)).unwrap();
    assert_ne!(
        text_documents(other.eval.as_ref().unwrap().as_ref(), eos),
        eval
    );
    // Holding every document out is refused, naming the key.
    let e = data::build(&config("eval_records: 20", 0), &opts(300, None))
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("data.eval_records") && e.contains("leave none of the 20 to train on"),
        "{e}"
    );
}

#[test]
fn text_is_packed_with_eos_between_documents() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("b.txt"), "héllo\n").unwrap();
    std::fs::write(dir.path().join("a.txt"), "one two").unwrap();
    std::fs::write(dir.path().join("c.md"), "not matched").unwrap();
    let pattern = format!("{}/*.txt", dir.path().display());
    let cfg = data_config(&format!(
        "kind: text\npaths: ['{pattern}']\neval_paths: null\ntokenizer: byte\nvocab_size: 300\nseq_len: 5\nshuffle: false\nnum_workers: 0\n"
    ));
    let d = data::build(&cfg, &opts(300, None)).unwrap();
    let eos = 258i64;
    // a.txt then b.txt (glob order), each followed by EOS.
    let mut stream: Vec<i64> = "one two".bytes().map(i64::from).collect();
    stream.push(eos);
    stream.extend("héllo\n".bytes().map(i64::from));
    stream.push(eos);
    assert_eq!(stream.len(), 16);
    assert_eq!(d.train.len(), 3); // (16-1)/5
    for k in 0..3 {
        let s = d.train.get(k).unwrap();
        assert_eq!(s.input_ids, stream[k * 5..k * 5 + 5]);
        assert_eq!(s.labels, stream[k * 5 + 1..k * 5 + 6]);
    }
    assert_eq!(d.train.get(1).unwrap().labels[1], eos); // the separator is a target

    // A glob that matches nothing, and a plain path that does not exist.
    let cfg = data_config(&format!(
        "kind: text\npaths: ['{pattern}', '{0}/*.rst']\neval_paths: null\ntokenizer: byte\nvocab_size: 300\nseq_len: 5\nshuffle: false\nnum_workers: 0\n",
        dir.path().display()
    ));
    let e = err_text(data::build(&cfg, &opts(300, None)));
    assert_eq!(
        e,
        format!(
            "data.paths: pattern '{}/*.rst' matches no file",
            dir.path().display()
        )
    );
    let cfg = data_config(&format!(
        "kind: text\npaths: ['{pattern}']\neval_paths: ['{0}/gone.txt']\ntokenizer: byte\nvocab_size: 300\nseq_len: 5\nshuffle: false\nnum_workers: 0\n",
        dir.path().display()
    ));
    let e = err_text(data::build(&cfg, &opts(300, None)));
    assert_eq!(
        e,
        format!(
            "data.eval_paths: file not found: {}/gone.txt",
            dir.path().display()
        )
    );
    // The byte tokenizer does not fit a 256-id model.
    let cfg = data_config(&format!(
        "kind: text\npaths: ['{pattern}']\neval_paths: null\ntokenizer: byte\nvocab_size: 300\nseq_len: 5\nshuffle: false\nnum_workers: 0\n"
    ));
    let e = err_text(data::build(&cfg, &opts(256, None)));
    assert!(
        e.starts_with("model.vocab_size: 256 is smaller than the Byte tokenizer's 259 ids"),
        "{e}"
    );
}

// ------------------------------------------------------------------------------------------
// kind: jsonl
// ------------------------------------------------------------------------------------------

const ALPACA: &str = "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n";

fn jsonl_config(path: &Path, mask: bool, tokenizer: &str) -> DataConfig {
    data_config(&format!(
        "kind: jsonl\npath: {}\neval_path: null\nprompt_template: {}\ncompletion_key: output\nmask_prompt: {mask}\ntokenizer: {tokenizer}\nvocab_size: 400\nseq_len: 96\nshuffle: true\nnum_workers: 0\n",
        path.display(),
        serde_json::to_string(ALPACA).unwrap()
    ))
}

/// The completions of a jsonl dataset's samples: the bytes between the prompt's `=` and EOS.
fn jsonl_completions(ds: &dyn data::Dataset) -> Vec<String> {
    (0..ds.len())
        .map(|i| {
            let ids = ds.example(i).unwrap().ids;
            let bytes: Vec<u8> = ids.iter().filter(|&&t| t < 256).map(|&t| t as u8).collect();
            String::from_utf8(bytes).unwrap()
        })
        .collect()
}

/// jsonl data mixes sources and carves held-out records as chat data does: each source's
/// share of what is left after its held-out records, a share above the source repeating it.
#[test]
fn jsonl_sources_take_their_shares_and_hold_records_out() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.jsonl");
    let lines: Vec<String> = (0..30)
        .map(|i| format!(r#"{{"prompt": "a{i}=", "completion": "x"}}"#))
        .collect();
    std::fs::write(&a, lines.join("\n")).unwrap();
    let b = dir.path().join("b.json");
    let items: Vec<String> = (0..10)
        .map(|i| format!(r#"{{"prompt": "b{i}=", "completion": "y"}}"#))
        .collect();
    std::fs::write(&b, format!("[{}]", items.join(","))).unwrap();
    let config = |seed: u64| {
        data_config(&format!(
            "kind: jsonl\npath: null\nsources: [{{path: {}, fraction: 0.5}}, {{path: {}, records: 15}}]\n\
             eval_path: null\neval_fraction: 0.2\nseed: {seed}\nprompt_template: '{{prompt}}'\n\
             completion_key: completion\nmask_prompt: true\ntokenizer: byte\nvocab_size: 400\n\
             seq_len: 16\nshuffle: false\nnum_workers: 0\n",
            a.display(),
            b.display()
        ))
    };
    let d = data::build(&config(1), &opts(300, None)).unwrap();
    let train = jsonl_completions(d.train.as_ref());
    let eval = jsonl_completions(d.eval.as_ref().unwrap().as_ref());
    // Held out: 20% of each source (6 of a, 2 of b); of the rest, half of a's 24 and 15 of
    // b's 8 (each once, the first 7 twice).
    let from = |set: &[String], p: char| set.iter().filter(|t| t.starts_with(p)).count();
    assert_eq!((from(&train, 'a'), from(&train, 'b')), (12, 15));
    assert_eq!((from(&eval, 'a'), from(&eval, 'b')), (6, 2));
    assert!(
        eval.iter().all(|e| !train.contains(e)),
        "a held-out record is trained on: {eval:?} {train:?}"
    );
    let distinct_b: HashSet<&String> = train.iter().filter(|t| t.starts_with('b')).collect();
    assert_eq!(distinct_b.len(), 8);
    // The seed picks them.
    let other = data::build(&config(2), &opts(300, None)).unwrap();
    assert_ne!(
        jsonl_completions(other.eval.as_ref().unwrap().as_ref()),
        eval
    );
}

#[test]
fn jsonl_alpaca_masks_the_prompt() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("train.jsonl");
    std::fs::write(
        &path,
        concat!(
            r#"{"instruction": "Add", "input": "2 and 3", "output": "5"}"#,
            "\n\n",
            r#"{"text": "plain"}"#,
            "\n",
            r#"{"instruction": "Say hi", "input": "", "output": "hi!"}"#,
            "\n"
        ),
    )
    .unwrap();
    let d = data::build(&jsonl_config(&path, true, "byte"), &opts(300, None)).unwrap();
    assert_eq!(d.train.len(), 3);
    let (bos, eos, pad) = (257i64, 258i64, 256i64);

    let prompt = ALPACA
        .replace("{instruction}", "Add")
        .replace("{input}", "2 and 3");
    let mut seq = vec![bos];
    seq.extend(prompt.bytes().map(i64::from));
    let p = seq.len(); // BOS + prompt
    seq.extend([b'5' as i64, eos]);
    let s = d.train.get(0).unwrap();
    assert_eq!(s.input_ids[..seq.len() - 1], seq[..seq.len() - 1]);
    assert!(s.input_ids[seq.len() - 1..].iter().all(|&x| x == pad));
    for (i, &l) in s.labels.iter().enumerate() {
        let want = if i + 1 >= p && i + 1 < seq.len() {
            seq[i + 1]
        } else {
            IGNORE_INDEX
        };
        assert_eq!(l, want, "label {i}");
    }
    assert_eq!(s.num_loss_tokens(), 2); // "5" and EOS
    assert_eq!(d.train.num_loss_tokens(0).unwrap(), 2);

    // A text record is labelled everywhere: "plain" + EOS.
    let s = d.train.get(1).unwrap();
    let want: Vec<i64> = "plain".bytes().map(i64::from).chain([eos]).collect();
    assert_eq!(s.labels[..6], want[..]);
    assert_eq!(s.num_loss_tokens(), 6);

    // mask_prompt: false labels the prompt too.
    let d = data::build(&jsonl_config(&path, false, "byte"), &opts(300, None)).unwrap();
    assert_eq!(d.train.get(0).unwrap().num_loss_tokens(), seq.len() - 1);
}

#[test]
fn jsonl_errors_name_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.jsonl");
    let good = r#"{"instruction": "a", "input": "b", "output": "c"}"#;
    let cases = [
        (format!("{good}\n{{\"instruction\": \"x\",\n"), 2, "invalid JSON: "),
        (format!("{good}\n\n[1, 2]\n"), 3, "a record must be a JSON object"),
        (
            format!("{good}\n{{\"instruction\": \"x\", \"output\": \"y\"}}\n"),
            2,
            "record has no field 'input', which data.prompt_template uses",
        ),
        (
            "{\"question\": \"x\"}\n".to_string(),
            1,
            "record has neither 'output' (data.completion_key) nor 'text'; its fields are [question]",
        ),
    ];
    for (text, line, msg) in cases {
        std::fs::write(&path, text).unwrap();
        let e = err_text(data::build(
            &jsonl_config(&path, true, "byte"),
            &opts(300, None),
        ));
        let head = format!("{}:{line}: {msg}", path.display());
        assert!(e.starts_with(&head), "{e}\nexpected: {head}");
    }
    let missing = dir.path().join("missing.jsonl");
    let e = err_text(data::build(
        &jsonl_config(&missing, true, "byte"),
        &opts(300, None),
    ));
    assert_eq!(
        e,
        format!("data.path: file not found: {}", missing.display())
    );
}

// ------------------------------------------------------------------------------------------
// tokenizers
// ------------------------------------------------------------------------------------------

const CORPUS: &[&str] = &[
    "the cat sat on the mat. the cat ate the rat.\n",
    "a man, a plan, a canal: panama! the plan was the canal.\n",
    "héllo wörld — 東京 🦀 tokenizers are fun; tokenizers are fast.\n",
];

const STRINGS: &[&str] = &[
    "the cat sat on the mat",
    "Hello, World! naïve café",
    "  leading spaces and\ttabs\nnewlines  ",
    "東京 🦀 emoji and ümlauts",
    "<eos> special tokens inside <pad> text",
    "",
];

#[test]
fn byte_tokenizer_round_trips() {
    let t = Tokenizer::byte();
    for s in STRINGS.iter().filter(|s| !s.contains('<')) {
        let ids = t.encode(s).unwrap();
        assert_eq!(ids, s.bytes().map(u32::from).collect::<Vec<_>>(), "{s:?}");
        assert_eq!(t.decode(&ids, false).unwrap(), *s);
    }
}

#[test]
fn bpe_trained_into_run_dir_reloads_to_the_same_ids() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    std::fs::create_dir(&run).unwrap();
    for (i, c) in CORPUS.iter().enumerate() {
        std::fs::write(dir.path().join(format!("{i}.txt")), c.repeat(4)).unwrap();
    }
    let cfg = data_config(&format!(
        "kind: text\npaths: ['{}/*.txt']\neval_paths: null\ntokenizer: bpe\nvocab_size: 300\nseq_len: 16\nshuffle: true\nnum_workers: 0\n",
        dir.path().display()
    ));
    let d = data::build(&cfg, &opts(300, Some(&run))).unwrap();
    let tok = d.tokenizer.unwrap();
    let saved = run.join("tokenizer.json");
    assert!(saved.exists());
    assert_eq!(tok.vocab_size(), 300);
    assert_eq!(
        (tok.pad_id(), tok.bos_id(), tok.eos_id()),
        (Some(0), Some(1), Some(2))
    );
    let first = std::fs::read_to_string(&saved).unwrap();

    let reloaded = Tokenizer::from_file(&saved, "data.tokenizer").unwrap();
    for s in STRINGS {
        let ids = tok.encode(s).unwrap();
        assert_eq!(reloaded.encode(s).unwrap(), ids, "{s:?}");
        assert_eq!(reloaded.decode(&ids, false).unwrap(), *s);
    }
    // Merges were learned: common words are single tokens.
    assert!(tok.encode("the cat").unwrap().len() < "the cat".len());

    // Training is deterministic, and a run directory with a tokenizer reuses it.
    let again = Tokenizer::train_bpe(
        CORPUS
            .iter()
            .map(|c| c.repeat(4))
            .collect::<Vec<_>>()
            .iter(),
        300,
    )
    .unwrap();
    let other = dir.path().join("again.json");
    again.save(&other).unwrap();
    assert_eq!(std::fs::read_to_string(&other).unwrap(), first);
    let d2 = data::build(&cfg, &opts(300, Some(&run))).unwrap();
    assert_eq!(d2.train.len(), d.train.len());

    // Too small a vocabulary for a byte-level BPE is refused with the minimum.
    let e = err_text(Tokenizer::train_bpe(CORPUS.iter(), 100));
    assert!(
        e.starts_with("data.vocab_size: 100 is below the 259 ids"),
        "{e}"
    );
}

/// The Hugging Face `tokenizers` Python library as the oracle, both ways: it encodes with the
/// tokenizer.json files flotilla writes (byte, trained BPE, arithmetic), and it trains a BPE
/// and a WordPiece tokenizer that flotilla loads; the ids must agree everywhere.
#[test]
fn tokenizers_agree_with_the_python_library() {
    let python = common::venv_python();
    if !common::venv_imports("tokenizers") {
        return common::skip_or_fail(&format!(
            "tokenizers_agree_with_the_python_library: `import tokenizers` fails in {}; \
             run scripts/setup.sh",
            python.display()
        ));
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut strings: Vec<String> = STRINGS.iter().map(|s| s.to_string()).collect();
    strings.push("123+456=".into());
    std::fs::write(
        d.join("strings.json"),
        serde_json::to_string(&strings).unwrap(),
    )
    .unwrap();
    let bpe = Tokenizer::train_bpe(CORPUS.iter(), 290).unwrap();
    let ours: Vec<(&str, Tokenizer)> = vec![
        ("byte", Tokenizer::byte()),
        ("bpe", bpe),
        ("arithmetic", arithmetic::arithmetic_tokenizer()),
    ];
    for (name, t) in &ours {
        t.save(d.join(format!("{name}.json"))).unwrap();
    }
    let names: Vec<&str> = ours.iter().map(|(n, _)| *n).collect();
    std::fs::write(
        d.join("flotilla.json"),
        serde_json::to_string(&names).unwrap(),
    )
    .unwrap();

    let script = common::oracle_file("tokenizers_oracle.py");
    let theirs: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&common::python(script).arg(d).run()).unwrap();
    let ids_of =
        |name: &str| -> Vec<Vec<u32>> { serde_json::from_value(theirs[name].clone()).unwrap() };
    for (name, t) in &ours {
        let want = ids_of(name);
        for (s, w) in strings.iter().zip(&want) {
            assert_eq!(&t.encode(s).unwrap(), w, "{name} on {s:?}");
        }
    }
    for name in ["py_bpe", "py_wordpiece"] {
        let t = Tokenizer::from_file(d.join(format!("{name}.json")), "data.tokenizer").unwrap();
        let want = ids_of(name);
        for (s, w) in strings.iter().zip(&want) {
            assert_eq!(&t.encode(s).unwrap(), w, "{name} on {s:?}");
        }
    }
    let py_bpe = Tokenizer::from_file(d.join("py_bpe.json"), "data.tokenizer").unwrap();
    assert_eq!(
        py_bpe.eos_id(),
        Some(0),
        "<|endoftext|> is recognised as EOS"
    );
    assert_eq!(py_bpe.pad_id(), Some(1));
}

#[test]
fn tokenizer_file_errors_and_special_tokens_from_tokenizer_config() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("tok.json");
    let e = err_text(Tokenizer::from_file(&missing, "data.tokenizer"));
    assert_eq!(
        e,
        format!("data.tokenizer: file not found: {}", missing.display())
    );

    // A tokenizer whose EOS is only known from tokenizer_config.json.
    let bpe = Tokenizer::train_bpe(CORPUS.iter(), 280).unwrap();
    let mut json: serde_json::Value =
        serde_json::from_str(&bpe.inner().to_string(false).unwrap()).unwrap();
    for t in json["added_tokens"].as_array_mut().unwrap() {
        let c = t["content"]
            .as_str()
            .unwrap()
            .replace('<', "[")
            .replace('>', "]");
        t["content"] = c.into();
    }
    let vocab = json["model"]["vocab"].as_object_mut().unwrap();
    for (old, new) in [("<pad>", "[pad]"), ("<bos>", "[bos]"), ("<eos>", "[eos]")] {
        let id = vocab.remove(old).unwrap();
        vocab.insert(new.into(), id);
    }
    std::fs::write(&missing, json.to_string()).unwrap();
    let t = Tokenizer::from_file(&missing, "data.tokenizer").unwrap();
    assert_eq!(t.eos_id(), None);
    assert!(err_text(t.require_eos()).contains("has no end-of-sequence token"));
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        r#"{"eos_token": "[eos]", "bos_token": {"content": "[bos]"}, "pad_token": null}"#,
    )
    .unwrap();
    let t = Tokenizer::from_file(&missing, "data.tokenizer").unwrap();
    assert_eq!(
        (t.eos_id(), t.bos_id(), t.pad_id()),
        (Some(2), Some(1), None)
    );
}

// ------------------------------------------------------------------------------------------
// kind: arithmetic
// ------------------------------------------------------------------------------------------

fn default_arithmetic() -> DataConfig {
    let yaml = std::fs::read_to_string(common::conf_dir().join("data/arithmetic.yaml")).unwrap();
    data_config(&yaml)
}

#[test]
fn arithmetic_is_deterministic_and_disjoint() {
    let cfg = default_arithmetic();
    let DataConfig::Arithmetic(a) = &cfg else {
        panic!("conf/data/arithmetic.yaml is not kind: arithmetic")
    };
    let t1 = ArithmeticTask::generate(a).unwrap();
    let t2 = ArithmeticTask::generate(a).unwrap();
    assert_eq!(t1.train, t2.train);
    assert_eq!(t1.eval, t2.eval);
    assert_eq!((t1.train.len(), t1.eval.len()), (a.num_train, a.num_eval));
    let eval: HashSet<_> = t1.eval.iter().collect();
    assert_eq!(eval.len(), t1.eval.len(), "held-out problems are distinct");
    assert!(
        t1.train.iter().all(|p| !eval.contains(p)),
        "train and eval are disjoint"
    );
    let max = 10u64.pow(a.digits as u32);
    assert!(t1.train.iter().all(|p| p.a < max && p.b < max));
    // Every operand length occurs.
    for n in 1..=a.digits as u32 {
        let lo = if n == 1 { 0 } else { 10u64.pow(n - 1) };
        assert!(t1.train.iter().any(|p| (lo..10u64.pow(n)).contains(&p.a)));
    }
    let mut other = a.clone();
    other.seed += 1;
    assert_ne!(ArithmeticTask::generate(&other).unwrap().train, t1.train);

    // The default data builds for the tiny model (32 ids) and masks the prompt.
    let d = data::build(&cfg, &opts(32, None)).unwrap();
    assert_eq!(d.tokenizer.as_ref().unwrap().vocab_size(), 16);
    assert_eq!(d.train.len(), a.num_train);
    assert_eq!(d.eval.as_ref().unwrap().len(), a.num_eval);
    let task = d.arithmetic.as_ref().unwrap();
    let p = task.train[0];
    let s = d.train.get(0).unwrap();
    let prompt = task.prompt_ids(&p);
    let answer = task.answer_ids(&p);
    let n_prompt = prompt.len();
    assert_eq!(s.input_ids[..n_prompt], prompt[..]);
    assert!(s.labels[..n_prompt - 1].iter().all(|&l| l == IGNORE_INDEX));
    assert_eq!(
        s.labels[n_prompt - 1..n_prompt - 1 + answer.len()],
        answer[..]
    );
    assert_eq!(
        s.labels[n_prompt - 1 + answer.len()],
        arithmetic::EOS_ID as i64
    );
    assert_eq!(s.num_loss_tokens(), answer.len() + 1);
    assert_eq!(s.input_ids.len(), a.seq_len);

    // Too many held-out problems for the space, and too short a sequence, are named.
    let e = err_text(ArithmeticTask::with_params(1, 10, 60, 0));
    assert!(
        e.starts_with("data.num_eval: 60 held-out problems is more than half of the 100"),
        "{e}"
    );
    let e = err_text(t1.dataset(&t1.train, 10));
    assert!(
        e.starts_with("data.seq_len: 10 is too short for 3-digit problems"),
        "{e}"
    );
}

#[test]
fn exact_match_with_perfect_and_wrong_generators() {
    let task = ArithmeticTask::with_params(3, 50, 64, 3).unwrap();
    let eval = task.eval.clone();
    // The oracle answers each prompt by parsing it.
    let solve = |prompt: &[i64]| -> Vec<i64> {
        let text: String = prompt[1..]
            .iter()
            .map(|&t| arithmetic::id_char(t))
            .collect();
        // Operands are written least significant digit first.
        let (a, b) = text.trim_end_matches('=').split_once('+').unwrap();
        let num = |s: &str| s.chars().rev().collect::<String>().parse::<u64>().unwrap();
        let sum = num(a) + num(b);
        format!("{sum:04}")
            .chars()
            .rev()
            .map(|c| arithmetic::char_id(c) as i64)
            .collect()
    };
    let perfect = task
        .exact_match(&eval, 16, |prompts: &[Vec<i64>], max_new| {
            assert_eq!(max_new, 5);
            Ok::<_, String>(
                prompts
                    .iter()
                    .map(|p| {
                        let mut out = solve(p);
                        out.push(arithmetic::EOS_ID as i64);
                        out.push(7); // anything after EOS is ignored
                        out
                    })
                    .collect(),
            )
        })
        .unwrap();
    assert_eq!((perfect.correct, perfect.total), (64, 64));
    assert_eq!(perfect.fraction(), 1.0);

    // Off by one in the last digit, or one digit short: all wrong.
    let wrong = task
        .exact_match(&eval, 10, |prompts: &[Vec<i64>], _| {
            Ok::<_, String>(
                prompts
                    .iter()
                    .enumerate()
                    .map(|(i, p)| {
                        let mut out = solve(p);
                        if i % 2 == 0 {
                            out.pop();
                        } else {
                            *out.last_mut().unwrap() = 4 + (*out.last().unwrap() - 4 + 1) % 10;
                        }
                        out
                    })
                    .collect(),
            )
        })
        .unwrap();
    assert_eq!((wrong.correct, wrong.total), (0, 64));
    assert_eq!(wrong.failures.len(), 5);
    assert!(
        wrong.failures[0].contains(" expected="),
        "{}",
        wrong.failures[0]
    );

    // A generator error is reported as such.
    let e = err_text(task.exact_match(&eval, 8, |_: &[Vec<i64>], _| {
        Err::<Vec<Vec<i64>>, _>("boom")
    }));
    assert_eq!(e, "generate callback: boom");
}

#[test]
fn greedy_generate_drives_a_model_forward() {
    // A fake model that knows the answers: logits at the last position point at the next
    // answer digit (then EOS); through greedy_generate it must score 100%.
    let task = ArithmeticTask::with_params(2, 10, 20, 9).unwrap();
    let answers: std::collections::HashMap<Vec<i64>, Vec<i64>> = task
        .eval
        .iter()
        .map(|p| {
            let mut a = task.answer_ids(p);
            a.push(arithmetic::EOS_ID as i64);
            (task.prompt_ids(p), a)
        })
        .collect();
    let prompt_len = task.prompt_ids(&task.eval[0]).len();
    let forward = |x: &Tensor| -> Result<Tensor, String> {
        let (b, l) = (x.size()[0], x.size()[1]);
        let logits = Tensor::zeros([b, l, 16], (Kind::Float, Device::Cpu));
        for (i, row) in rows(x).iter().enumerate() {
            let next = answers[&row[..prompt_len]][row.len() - prompt_len];
            let _ = logits.get(i as i64).get(l - 1).get(next).fill_(1.0);
        }
        Ok(logits)
    };
    let acc = task
        .exact_match(&task.eval, 8, |prompts: &[Vec<i64>], n| {
            greedy_generate(prompts, n, arithmetic::EOS_ID as i64, Device::Cpu, forward)
        })
        .unwrap();
    assert_eq!((acc.correct, acc.total), (20, 20));
}

/// With `model.init_from` and `data.tokenizer` unset (`null`, the shipped default), text and
/// JSONL data are tokenized with the base's `tokenizer.json`: the same ids as naming that file,
/// and not the byte tokenizer's; without a base, unset means `byte`.
#[test]
fn unset_tokenizer_means_the_base_s() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base");
    std::fs::create_dir(&base).unwrap();
    let corpus = [
        "Add 2 and 3 to get 5",
        "Say hi and hello",
        "plain text here",
    ];
    let tok = data::Tokenizer::train_bpe(corpus.iter(), 300).unwrap();
    tok.save(base.join("tokenizer.json")).unwrap();
    let path = dir.path().join("train.jsonl");
    std::fs::write(
        &path,
        r#"{"instruction": "Add", "input": "2 and 3", "output": "5"}"#.to_string() + "\n",
    )
    .unwrap();
    let with_base = |tokenizer: &str, init_from: Option<&Path>| {
        let o = DataOptions {
            init_from,
            ..opts(400, None)
        };
        let d = data::build(&jsonl_config(&path, true, tokenizer), &o).unwrap();
        d.train.get(0).unwrap().input_ids
    };
    let named = with_base(&base.join("tokenizer.json").display().to_string(), None);
    let unset = with_base("null", Some(&base));
    let byte = with_base("null", None);
    assert_eq!(unset, named);
    assert_ne!(unset, byte);
    assert_eq!(byte, with_base("byte", None));
}
