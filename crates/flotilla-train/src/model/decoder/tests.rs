//! The shared decoder's tests: units and parameter table, LoRA and bias placement, packed
//! rows, unit-by-unit backward, the cached forward.

use super::*;
use crate::model::layers::rope::inv_freq;
use crate::model::{
    causal_lm_loss, causal_lm_loss_sum, packed_attention_mask, vjp, CausalLm, KvCache, Params,
    TokenInput,
};
use flotilla_config::schema::{RopeScaling, RopeType};
use tch::{Device, Kind};

pub(crate) fn tiny(tied: bool, kv_heads: usize) -> ModelConfig {
    ModelConfig {
        name: "test".into(),
        vocab_size: 48,
        hidden_size: 32,
        intermediate_size: 40,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: kv_heads,
        max_position_embeddings: 64,
        rms_norm_eps: 1e-5,
        rope_theta: 10000.0,
        rope_scaling: None,
        partial_rotary_factor: None,
        tie_word_embeddings: tied,
        initializer_range: 0.02,
        init_from: None,
        model_type: None,
        attention_bias: None,
        sliding_window: None,
        head_dim: None,
        layer_types: None,
        query_pre_attn_scalar: None,
        attn_logit_softcapping: None,
        final_logit_softcapping: None,
        rope_local_base_freq: None,
        no_rope_layers: None,
        pad_token_id: None,
        moe: None,
    }
}

#[test]
fn a_packed_sequence_sees_only_itself() {
    let model = CausalLm::new(&tiny(false, 2)).unwrap();
    // A larger init than the default so that context visibly matters.
    let init = model.init_params(3, Device::Cpu, Kind::Float);
    let mut params = Params::new();
    for (n, t) in init.iter() {
        params.insert(n, t * 8.0);
    }
    tch::manual_seed(4);
    let ids = Tensor::randint(48, [2, 12], (Kind::Int64, Device::Cpu));
    // Row 0 packs sequences of 5 and 7 tokens; row 1 is one sequence.
    let positions: Vec<i64> = (0..5).chain(0..7).chain(0..12).collect();
    let input = TokenInput::packed(
        ids.shallow_clone(),
        Tensor::from_slice(&positions).reshape([2, 12]),
    );
    let packed = model.forward_input(&params, &input).unwrap();
    let alone = |row: i64, start: i64, len: i64| {
        let x = ids.narrow(0, row, 1).narrow(1, start, len);
        model.forward(&params, &x).unwrap()
    };
    // Relative to the largest logit.
    let diff = |a: &Tensor, b: &Tensor| {
        (a - b).abs().max().double_value(&[]) / b.abs().max().double_value(&[])
    };
    let of = |row: i64, start: i64, len: i64| packed.narrow(0, row, 1).narrow(1, start, len);
    for (row, start, len) in [(0, 0, 5), (0, 5, 7), (1, 0, 12)] {
        let d = diff(&of(row, start, len), &alone(row, start, len));
        assert!(d < 1e-5, "row {row} from {start}: {d:e}");
    }
    // Unpacked, the second sequence of row 0 would see the first: far from alone.
    let whole = model.forward(&params, &ids).unwrap();
    let seen = diff(&whole.narrow(0, 0, 1).narrow(1, 5, 7), &alone(0, 5, 7));
    assert!(seen > 1e-2, "{seen}");

    let mask = packed_attention_mask(input.positions.as_ref().unwrap());
    assert_eq!(mask.size(), [2, 1, 12, 12]);
    let row0 = Vec::<bool>::try_from(mask.get(0).get(0).get(6).to_kind(Kind::Bool)).unwrap();
    let want: Vec<bool> = (0..12).map(|j| (5..=6).contains(&j)).collect();
    assert_eq!(row0, want, "query 6 of row 0 sees keys 5 and 6");
}

#[test]
fn lora_factors_follow_the_block_weights_and_start_as_a_no_op() {
    let c = tiny(false, 2);
    let lora: LoraConfig = serde_yaml::from_str(
        "{r: 4, alpha: 8, dropout: 0.0, target_modules: [q_proj, down_proj], \
         use_rslora: false, modules_to_save: [lm_head], init_from: null, merge: false}",
    )
    .unwrap();
    let base = CausalLm::new(&c).unwrap();
    let m = CausalLm::with_lora(&c, Some(&lora)).unwrap();
    assert_eq!(m.param_specs().len(), base.param_specs().len() + 2 * 2 * 2);
    let a = m
        .param_spec("model.layers.1.self_attn.q_proj.lora_A.weight")
        .unwrap();
    let b = m
        .param_spec("model.layers.1.mlp.down_proj.lora_B.weight")
        .unwrap();
    assert_eq!(
        (a.shape.clone(), a.owner, a.trainable),
        (vec![4, 32], 2, true)
    );
    assert_eq!(
        (b.shape.clone(), b.owner, b.trainable),
        (vec![32, 4], 2, true)
    );
    assert!(matches!(a.init, Init::Uniform { bound } if (bound - 32f64.powf(-0.5)).abs() < 1e-12));
    assert!(matches!(b.init, Init::Zeros));
    let trainable: Vec<&str> = m
        .param_specs()
        .iter()
        .filter(|s| s.trainable && !s.name.contains("lora_"))
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(trainable, ["lm_head.weight"], "only the module to save");
    assert_eq!(
        m.units()[1].param_names()[9..],
        [
            "model.layers.0.self_attn.q_proj.lora_A.weight",
            "model.layers.0.self_attn.q_proj.lora_B.weight",
            "model.layers.0.mlp.down_proj.lora_A.weight",
            "model.layers.0.mlp.down_proj.lora_B.weight",
        ]
    );
    // B = 0: the base's logits; B ≠ 0: others.
    let mut p = m.init_params(5, Device::Cpu, Kind::Float);
    let tokens = Tensor::from_slice2(&[[1i64, 2, 3, 4, 5, 6]]);
    let no_op = m.forward(&p, &tokens).unwrap();
    let plain = base.forward(&p, &tokens).unwrap();
    assert!(no_op.equal(&plain));
    p.insert(
        "model.layers.0.mlp.down_proj.lora_B.weight",
        Tensor::ones([32, 4], (Kind::Float, Device::Cpu)),
    );
    let moved = m.forward(&p, &tokens).unwrap();
    assert!((moved - plain).abs().max().double_value(&[]) > 1e-3);
}

#[test]
fn units_and_parameter_table() {
    let m = CausalLm::new(&tiny(true, 2)).unwrap();
    let names: Vec<_> = m.units().iter().map(|u| u.name().to_string()).collect();
    assert_eq!(names, ["embed", "layers.0", "layers.1", "head"]);
    assert_eq!(m.param_specs().len(), 1 + 2 * 9 + 1);
    let embed = m.param_spec("model.embed_tokens.weight").unwrap();
    assert_eq!((embed.owner, embed.readers.clone()), (0, vec![0, 3]));
    assert!(embed.is_shared());
    assert_eq!(
        m.units()[3].param_names(),
        ["model.norm.weight", "model.embed_tokens.weight"]
    );
    assert_eq!(
        m.param_specs()
            .iter()
            .map(|s| s.numel() as u64)
            .sum::<u64>(),
        m.config().num_parameters()
    );
    let untied = CausalLm::new(&tiny(false, 4)).unwrap();
    assert_eq!(
        untied.units()[3].param_names(),
        ["model.norm.weight", "lm_head.weight"]
    );
    assert_eq!(untied.owned_params(3).count(), 2);
    assert_eq!(
        untied
            .param_spec("model.layers.1.self_attn.k_proj.weight")
            .unwrap()
            .shape,
        vec![32, 32]
    );
}

#[test]
fn rejects_bad_configs() {
    let mut c = tiny(true, 3);
    let err = CausalLm::new(&c).unwrap_err().to_string();
    assert!(
        err.contains("num_key_value_heads") && err.contains("3"),
        "{err}"
    );
    c = tiny(true, 2);
    c.num_attention_heads = 5;
    let err = CausalLm::new(&c).unwrap_err().to_string();
    assert!(err.starts_with("model.num_attention_heads"), "{err}");
}

#[test]
fn init_statistics() {
    let mut c = tiny(false, 2);
    c.hidden_size = 128;
    c.intermediate_size = 256;
    c.vocab_size = 512;
    c.initializer_range = 0.05;
    let m = CausalLm::new(&c).unwrap();
    let p = m.init_params(11, Device::Cpu, Kind::Float);
    m.check_params(&p).unwrap();
    for s in m.param_specs() {
        let t = p.get(&s.name).unwrap();
        match s.init {
            Init::Ones => assert_eq!(t.min().double_value(&[]), 1.0, "{}", s.name),
            Init::Normal { .. } => {
                let std = t.std(true).double_value(&[]);
                let mean = t.mean(Kind::Float).double_value(&[]);
                assert!((std / 0.05 - 1.0).abs() < 0.03, "{}: std {std}", s.name);
                assert!(mean.abs() < 0.05 * 0.03, "{}: mean {mean}", s.name);
            }
            Init::Zeros | Init::Uniform { .. } => panic!("{}: a LoRA init", s.name),
        }
    }
    // Same seed, same values (also in another dtype); another seed, other values.
    let again = m.init_params(11, Device::Cpu, Kind::BFloat16);
    let w = "model.layers.0.mlp.up_proj.weight";
    assert!(again.get(w).unwrap().to_kind(Kind::Float).equal(
        &p.get(w)
            .unwrap()
            .to_kind(Kind::BFloat16)
            .to_kind(Kind::Float)
    ));
    let other = m.init_params(12, Device::Cpu, Kind::Float);
    assert!(!other.get(w).unwrap().equal(p.get(w).unwrap()));
}

#[test]
fn llama3_scaling_changes_only_low_frequencies() {
    let mut c = tiny(true, 2);
    c.hidden_size = 64; // head_dim 16
    c.rope_theta = 500000.0;
    let plain = inv_freq(&c);
    c.rope_scaling = Some(RopeScaling {
        factor: Some(8.0),
        low_freq_factor: Some(1.0),
        high_freq_factor: Some(4.0),
        original_max_position_embeddings: Some(64), // wavelength 32.3 lies between 64/4 and 64
        ..RopeScaling::new(RopeType::Llama3)
    });
    let scaled = inv_freq(&c);
    assert_eq!(plain[0], scaled[0], "highest frequency untouched");
    let last = plain.len() - 1;
    assert!(
        (scaled[last] * 8.0 / plain[last] - 1.0).abs() < 1e-6,
        "lowest divided by factor"
    );
    assert!(
        plain
            .iter()
            .zip(&scaled)
            .any(|(p, s)| s < p && s * 8.0 > *p * 1.0001),
        "some smoothed"
    );
}

fn batch() -> Tensor {
    Tensor::from_slice(&[1i64, 5, 9, 2, 47, 0, 3, 3, 8, 13, 21, 34, 4, 4, 40, 7]).reshape([2, 8])
}

#[test]
fn causal_outputs_do_not_see_the_future() {
    let m = CausalLm::new(&tiny(true, 2)).unwrap();
    let p = m.init_params(0, Device::Cpu, Kind::Float);
    let a = batch();
    let b = a.copy();
    let _ = b.narrow(1, 5, 3).fill_(11);
    let la = m.forward(&p, &a).unwrap();
    let lb = m.forward(&p, &b).unwrap();
    assert!(la
        .narrow(1, 0, 5)
        .allclose(&lb.narrow(1, 0, 5), 0.0, 0.0, false));
    assert!(!la
        .narrow(1, 5, 1)
        .allclose(&lb.narrow(1, 5, 1), 1e-6, 1e-6, false));
}

/// The unit engine's backward (each unit on a detached leaf input, per-unit [`vjp`], shared
/// gradients summed) gives the same gradients as one backward through the whole graph.
fn unit_by_unit_equals_whole_graph(tied: bool, kv_heads: usize) {
    unit_by_unit_equals_whole_graph_of(&tiny(tied, kv_heads));
}

fn unit_by_unit_equals_whole_graph_of(c: &ModelConfig) {
    let m = CausalLm::new(c).unwrap();
    let p = m.init_params(5, Device::Cpu, Kind::Float).requiring_grad();
    let tokens = batch();

    // Whole graph.
    let loss = causal_lm_loss(&m.forward(&p, &tokens).unwrap(), &tokens);
    let names: Vec<&str> = p.names().collect();
    let refs: Vec<&Tensor> = names.iter().map(|n| p.get(n).unwrap()).collect();
    let whole = vjp(&loss, None, &refs).unwrap();

    // Unit by unit.
    let ctx = m.ctx(8, Device::Cpu);
    let mut inputs = Vec::new();
    let mut outputs = Vec::new();
    let mut x = tokens.shallow_clone();
    for (i, unit) in m.units().iter().enumerate() {
        let input = if i == 0 {
            x
        } else {
            x.detach().set_requires_grad(true)
        };
        let out = unit.forward(&m.unit_params(i, &p).unwrap(), &input, &ctx);
        x = out.shallow_clone();
        inputs.push(input);
        outputs.push(out);
    }
    let mut grads: std::collections::HashMap<String, Tensor> = Default::default();
    let mut grad_out: Option<Tensor> = None;
    for i in (0..m.units().len()).rev() {
        let unit = &m.units()[i];
        let params = m.unit_params(i, &p).unwrap();
        let mut wrt: Vec<&Tensor> = params.iter().collect();
        if i > 0 {
            wrt.push(&inputs[i]);
        }
        let root = if grad_out.is_none() {
            causal_lm_loss(&outputs[i], &tokens)
        } else {
            outputs[i].shallow_clone()
        };
        let mut g = vjp(&root, grad_out.as_ref(), &wrt).unwrap();
        grad_out = if i > 0 { g.pop().unwrap() } else { None };
        for (name, gi) in unit.param_names().iter().zip(g) {
            let gi = gi.unwrap();
            match grads.remove(name) {
                Some(prev) => grads.insert(name.clone(), prev + gi),
                None => grads.insert(name.clone(), gi),
            };
        }
    }
    for (name, w) in names.iter().zip(whole) {
        let w = w.unwrap();
        let u = &grads[*name];
        let diff = (&w - u).abs().max().double_value(&[]);
        assert_eq!(diff, 0.0, "{name}: unit-by-unit gradient differs by {diff}");
        assert!(
            w.abs().max().double_value(&[]) > 0.0,
            "{name}: zero gradient"
        );
    }
}

#[test]
fn unit_by_unit_backward_tied_gqa() {
    unit_by_unit_equals_whole_graph(true, 2);
}

#[test]
fn unit_by_unit_backward_untied_mha() {
    unit_by_unit_equals_whole_graph(false, 4);
}

fn qwen2(tied: bool) -> ModelConfig {
    ModelConfig {
        model_type: Some(flotilla_config::schema::ModelType::Qwen2),
        ..tiny(tied, 2)
    }
}

#[test]
fn unit_by_unit_backward_with_biases() {
    unit_by_unit_equals_whole_graph_of(&qwen2(true));
    let mut llama = tiny(false, 4);
    llama.attention_bias = Some(true);
    unit_by_unit_equals_whole_graph_of(&llama);
}

#[test]
fn qwen2_biases_follow_the_block_weights_and_shift_the_projections() {
    let c = qwen2(false);
    let m = CausalLm::new(&c).unwrap();
    let plain = CausalLm::new(&tiny(false, 2)).unwrap();
    assert_eq!(m.param_specs().len(), plain.param_specs().len() + 2 * 3);
    assert_eq!(
        m.units()[2].param_names()[9..],
        [
            "model.layers.1.self_attn.q_proj.bias",
            "model.layers.1.self_attn.k_proj.bias",
            "model.layers.1.self_attn.v_proj.bias",
        ]
    );
    let k = m
        .param_spec("model.layers.1.self_attn.k_proj.bias")
        .unwrap();
    assert_eq!((k.shape.clone(), k.owner), (vec![16], 2));
    assert!(matches!(k.init, Init::Zeros));
    assert_eq!(
        m.param_specs()
            .iter()
            .map(|s| s.numel() as u64)
            .sum::<u64>(),
        c.num_parameters()
    );
    // Zero biases: Llama's logits; a nonzero bias moves them.
    let mut p = m.init_params(4, Device::Cpu, Kind::Float);
    let tokens = batch();
    assert!(m
        .forward(&p, &tokens)
        .unwrap()
        .equal(&plain.forward(&p, &tokens).unwrap()));
    let before = m.forward(&p, &tokens).unwrap();
    p.insert(
        "model.layers.0.self_attn.v_proj.bias",
        Tensor::full([16], 0.5, (Kind::Float, Device::Cpu)),
    );
    let moved = m.forward(&p, &tokens).unwrap();
    assert!((&moved - &before).abs().max().double_value(&[]) > 1e-3);

    // LoRA on q_proj keeps its bias, frozen, before the adapters.
    let lora: LoraConfig = serde_yaml::from_str(
        "{r: 2, alpha: 4, dropout: 0.0, target_modules: [q_proj], use_rslora: false, \
         modules_to_save: [], init_from: null, merge: false}",
    )
    .unwrap();
    let l = CausalLm::with_lora(&c, Some(&lora)).unwrap();
    assert_eq!(
        l.units()[1].param_names()[9..],
        [
            "model.layers.0.self_attn.q_proj.bias",
            "model.layers.0.self_attn.k_proj.bias",
            "model.layers.0.self_attn.v_proj.bias",
            "model.layers.0.self_attn.q_proj.lora_A.weight",
            "model.layers.0.self_attn.q_proj.lora_B.weight",
        ]
    );
    assert!(
        !l.param_spec("model.layers.0.self_attn.q_proj.bias")
            .unwrap()
            .trainable
    );
    assert_eq!(l.trainable_mask(1)[9..], [false, false, false, true, true]);
    let mut lp = l.init_params(4, Device::Cpu, Kind::Float);
    for (n, t) in p.iter() {
        lp.insert(n, t.shallow_clone());
    }
    assert!(
        l.forward(&lp, &tokens).unwrap().equal(&moved),
        "B = 0: the base with its bias"
    );
}

/// A window of 4 over 2 layers: position 7 sees positions 4..=7 of the first layer's output,
/// which saw 1..=7: token 0 no longer reaches it, token 1 does. A cached forward attends within
/// the same window as the whole one.
#[test]
fn sliding_window_attention_forgets_what_lies_behind_it() {
    let c = ModelConfig {
        model_type: Some(flotilla_config::schema::ModelType::Mistral),
        sliding_window: Some(4),
        ..tiny(true, 2)
    };
    let m = CausalLm::new(&c).unwrap();
    let mut p = m.init_params(0, Device::Cpu, Kind::Float);
    for name in p.names().map(String::from).collect::<Vec<_>>() {
        let t = p.get(&name).unwrap() * 8.0;
        p.insert(name, t);
    }
    let a = batch();
    let last = |t: &Tensor| m.forward(&p, t).unwrap().select(1, 7);
    let changed = |pos: i64| {
        let b = a.copy();
        let _ = b.narrow(1, pos, 1).fill_(11);
        (last(&b) - last(&a)).abs().max().double_value(&[])
    };
    assert_eq!(changed(0), 0.0, "token 0 lies beyond two windows");
    assert!(changed(1) > 1e-4, "token 1 is within reach");
    let full = CausalLm::new(&ModelConfig {
        sliding_window: None,
        ..c.clone()
    })
    .unwrap();
    let unwindowed = full.forward(&p, &a).unwrap();
    let windowed = m.forward(&p, &a).unwrap();
    assert!(
        windowed
            .narrow(1, 0, 4)
            .allclose(&unwindowed.narrow(1, 0, 4), 1e-6, 1e-6, false),
        "within the window, full attention"
    );
    assert!(!windowed.allclose(&unwindowed, 1e-4, 1e-4, false));

    let mut cache = KvCache::new(&m, 8);
    let _no_grad = tch::no_grad_guard();
    for (start, len) in [(0, 3), (3, 1), (4, 2), (6, 2)] {
        let logits = m
            .forward_cached(&p, &a.narrow(1, start, len), &mut cache)
            .unwrap();
        let want = windowed.select(1, start + len - 1);
        let err = (&logits - &want).abs().max().double_value(&[]);
        assert!(err < 1e-4, "positions {start}+{len}: {err}");
    }
}

#[test]
fn reduced_precision_forward() {
    let m = CausalLm::new(&tiny(true, 2)).unwrap();
    let p32 = m.init_params(1, Device::Cpu, Kind::Float);
    let ref_logits = m.forward(&p32, &batch()).unwrap();
    for kind in [Kind::BFloat16, Kind::Half] {
        let p = p32.to(Device::Cpu, kind);
        let logits = m.forward(&p, &batch()).unwrap();
        assert_eq!(logits.kind(), kind);
        let err = (logits.to_kind(Kind::Float) - &ref_logits)
            .abs()
            .max()
            .double_value(&[]);
        let scale = ref_logits.abs().max().double_value(&[]);
        assert!(
            err / scale < 0.05,
            "{kind:?}: relative error {}",
            err / scale
        );
    }
}

#[test]
fn loss_sum_and_mean_agree() {
    let m = CausalLm::new(&tiny(false, 2)).unwrap();
    let p = m.init_params(2, Device::Cpu, Kind::Float);
    let tokens = batch();
    let labels = tokens.copy();
    let _ = labels.narrow(1, 0, 3).fill_(-100);
    let logits = m.forward(&p, &tokens).unwrap();
    let mean = causal_lm_loss(&logits, &labels).double_value(&[]);
    let (sum, n) = causal_lm_loss_sum(&logits, &labels);
    assert_eq!(n, 2 * 7 - 2 * 2);
    assert!((sum.double_value(&[]) / n as f64 - mean).abs() < 1e-6);
    // Near ln(vocab) for a freshly initialised model.
    assert!((mean - (48f64).ln()).abs() < 0.1, "{mean}");
}

/// The cached forward (a prefill, single tokens, then several at once) gives each
/// position the logits of the whole-sequence forward, with and without LoRA adapters.
#[test]
fn cached_forward_equals_the_whole_forward() {
    let lora: LoraConfig = serde_yaml::from_str(
        "{r: 2, alpha: 4, dropout: 0.0, target_modules: [q_proj, v_proj, down_proj], \
         use_rslora: false, modules_to_save: [], init_from: null, merge: false}",
    )
    .unwrap();
    for (kv_heads, lora) in [(2, None), (4, None), (2, Some(&lora))] {
        let m = CausalLm::with_lora(&tiny(false, kv_heads), lora).unwrap();
        let mut p = m.init_params(3, Device::Cpu, Kind::Float);
        if lora.is_some() {
            let b = "model.layers.1.self_attn.v_proj.lora_B.weight";
            p.insert(b, Tensor::randn([16, 2], (Kind::Float, Device::Cpu)) * 0.1);
        }
        let tokens = batch();
        let whole = m.forward(&p, &tokens).unwrap();
        let mut cache = KvCache::new(&m, 8);
        let _no_grad = tch::no_grad_guard();
        for (start, len) in [(0, 3), (3, 1), (4, 1), (5, 3)] {
            let logits = m
                .forward_cached(&p, &tokens.narrow(1, start, len), &mut cache)
                .unwrap();
            let want = whole.select(1, start + len - 1);
            let err = (&logits - &want).abs().max().double_value(&[]);
            assert!(err < 1e-5, "kv {kv_heads}, positions {start}+{len}: {err}");
        }
        assert_eq!(cache.len(), 8);
        let full = m.forward_cached(&p, &tokens.narrow(1, 0, 1), &mut cache);
        assert!(matches!(
            full,
            Err(ModelError::CacheFull {
                capacity: 8,
                needed: 9
            })
        ));
    }
}

/// fp16 weights run the residual stream in fp32, as autocast does: a residual beyond fp16's
/// range (65504) stays finite and equals the fp32 forward of the same weights.
#[test]
fn fp16_weights_keep_the_residual_stream_in_fp32() {
    let model = CausalLm::new(&tiny(false, 2)).unwrap();
    let mut params = model.init_params(5, Device::Cpu, Kind::Float);
    // Embeddings of 3e4 and attention outputs of 32 x 1200 = 3.84e4: each fits fp16, their sum
    // does not (and the second block adds as much again).
    let fill = |params: &mut Params, name: &str, v: f64| {
        let t = params.get(name).unwrap().ones_like() * v;
        params.insert(name, t);
    };
    fill(&mut params, "model.embed_tokens.weight", 3e4);
    for i in 0..2 {
        fill(
            &mut params,
            &format!("model.layers.{i}.self_attn.v_proj.weight"),
            1.0 / 32.0,
        );
        fill(
            &mut params,
            &format!("model.layers.{i}.self_attn.o_proj.weight"),
            1200.0,
        );
    }
    let half = params.to(Device::Cpu, Kind::Half);
    let rounded = half.to(Device::Cpu, Kind::Float);
    let ids = Tensor::from_slice(&[3i64, 7, 11, 5, 9]).reshape([1, 5]);
    let want = model.forward(&rounded, &ids).unwrap();
    let got = model.forward(&half, &ids).unwrap().to_kind(Kind::Float);
    assert_eq!(got.kind(), Kind::Float);
    assert!(
        bool::try_from(got.isfinite().all()).unwrap(),
        "fp16 logits overflowed: {got}"
    );
    let err = (&got - &want).abs().max().double_value(&[]);
    let scale = want.abs().max().double_value(&[]);
    assert!(
        err <= 1e-2 * scale,
        "fp16 {err} off the fp32 forward (max {scale})"
    );
    // The residual stream itself went past fp16's range.
    let embed = model.units()[0].forward(
        &model.unit_params(0, &half).unwrap(),
        &ids,
        &model.ctx(5, Device::Cpu),
    );
    assert_eq!(embed.kind(), Kind::Float);
    let block = model.units()[1].forward(
        &model.unit_params(1, &half).unwrap(),
        &embed,
        &model.ctx(5, Device::Cpu),
    );
    assert!(block.abs().max().double_value(&[]) > 65504.0);
}

/// LoRA on a mixture of experts: attention as for a dense model; the experts and router as PEFT
/// adapts transformers 5's fused parameters (shapes and names of its `ParamWrapper`s, the
/// fused gate/up at twice the rank); a gate without its up projection, an MLP name of the other
/// family and dropout on the experts are refused with the fix.
#[test]
fn lora_on_a_mixture_of_experts_adapts_experts_and_router_as_peft() {
    let moe: flotilla_config::schema::MoeConfig =
        serde_yaml::from_str("{num_experts: 4, num_experts_per_tok: 2}").unwrap();
    let c = ModelConfig {
        model_type: Some(flotilla_config::schema::ModelType::Mixtral),
        moe: Some(moe),
        ..tiny(false, 2)
    };
    let lora = |targets: &str, dropout: f64| -> LoraConfig {
        serde_yaml::from_str(&format!(
            "{{r: 2, alpha: 4, dropout: {dropout}, target_modules: {targets}, use_rslora: false, \
             modules_to_save: [], init_from: null, merge: false}}"
        ))
        .unwrap()
    };
    let trainable = |targets: &str| -> Vec<(String, Vec<i64>)> {
        CausalLm::with_lora(&c, Some(&lora(targets, 0.0)))
            .unwrap()
            .param_specs()
            .iter()
            .filter(|s| s.trainable && s.name.starts_with("model.layers.0."))
            .map(|s| {
                (
                    s.name["model.layers.0.".len()..].to_string(),
                    s.shape.clone(),
                )
            })
            .collect()
    };
    let names = |v: &[(String, Vec<i64>)]| v.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(
        names(&trainable("[q_proj, v_proj]")),
        [
            "self_attn.q_proj.lora_A.weight",
            "self_attn.q_proj.lora_B.weight",
            "self_attn.v_proj.lora_A.weight",
            "self_attn.v_proj.lora_B.weight"
        ]
    );
    let (h, inter, e, r) = (c.hidden_size as i64, c.intermediate_size as i64, 4i64, 2i64);
    let all = trainable("[all-linear]");
    let experts: Vec<&(String, Vec<i64>)> =
        all.iter().filter(|(n, _)| n.starts_with("mlp.")).collect();
    let want: Vec<(String, Vec<i64>)> = vec![
        (
            "mlp.experts.base_layer.lora_A.weight".into(),
            vec![2 * r * e, h],
        ),
        (
            "mlp.experts.base_layer.lora_B.weight".into(),
            vec![2 * inter, 2 * r * e],
        ),
        ("mlp.experts.lora_A.weight".into(), vec![r * e, inter]),
        ("mlp.experts.lora_B.weight".into(), vec![h, r * e]),
        ("mlp.gate.lora_A.weight".into(), vec![r, h]),
        ("mlp.gate.lora_B.weight".into(), vec![e, r]),
    ];
    assert_eq!(experts.into_iter().cloned().collect::<Vec<_>>(), want);
    // down alone is the outer (only) wrapper.
    assert_eq!(
        trainable("[w2]"),
        [
            ("mlp.experts.lora_A.weight".to_string(), vec![r * e, inter]),
            ("mlp.experts.lora_B.weight".to_string(), vec![h, r * e])
        ]
    );
    for (targets, dropout, fix) in [
        ("[q_proj, w1]", 0.0, "list both `w1` and `w3`"),
        ("[w3]", 0.0, "list both `w1` and `w3`"),
        ("[w1, w3]", 0.1, "set peft.dropout=0.0"),
        ("[q_proj, up_proj]", 0.0, "`w1`, `w3`, `w2`, `gate`"),
    ] {
        let err = CausalLm::with_lora(&c, Some(&lora(targets, dropout)))
            .unwrap_err()
            .to_string();
        assert!(err.contains(fix), "{targets}: {err}");
    }
    // Attention alone takes dropout as for a dense model.
    assert!(CausalLm::with_lora(&c, Some(&lora("[q_proj]", 0.1))).is_ok());
}
