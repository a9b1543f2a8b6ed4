//! Times forward + backward of a model preset on CPU:
//! `cargo run --release --example model_step -- [PRESET] [SEQ] [BATCH] [ITERS]`
//! (defaults: small 256 4 5); PRESET may also be a Hugging Face model directory (its
//! `config.json`, any family; `benches/moe_step.py` times mixtures of experts so). Compare with `benches/model_step.py`, the same step in PyTorch
//! eager with transformers' `LlamaForCausalLM`.
//!
//! Two modes are timed: `whole` (one autograd graph, one backward) and `units` (the unit
//! engine's way: each unit on a detached leaf input, backward unit by unit with
//! `flotilla_train::model::vjp`, tied gradients summed). Prints the median step time of each.

use std::time::Instant;

use flotilla_config::schema::ModelConfig;
use flotilla_train::model::{causal_lm_loss, vjp, CausalLm};
use tch::{Device, Kind, Tensor};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let preset = args.first().map_or("small", String::as_str);
    let seq: i64 = args.get(1).map_or(256, |s| s.parse().expect("SEQ"));
    let batch: i64 = args.get(2).map_or(4, |s| s.parse().expect("BATCH"));
    let iters: usize = args.get(3).map_or(5, |s| s.parse().expect("ITERS"));

    // A Hugging Face directory's config.json (any family), else a preset of conf/model/.
    let config: ModelConfig = if std::path::Path::new(preset).is_dir() {
        flotilla_train::model::read_model_config(preset).unwrap_or_else(|e| panic!("{e}"))
    } else {
        let path = format!(
            "{}/../../conf/model/{preset}.yaml",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
    };
    let model = CausalLm::new(&config).unwrap();
    let params = model
        .init_params(0, Device::Cpu, Kind::Float)
        .requiring_grad();
    let tokens = Tensor::randint(
        config.vocab_size as i64,
        [batch, seq],
        (Kind::Int64, Device::Cpu),
    );
    println!(
        "{preset}: {:.1}M parameters, T={seq}, M={batch}, fp32 CPU, {} threads",
        params.numel() as f64 / 1e6,
        tch::get_num_threads()
    );

    let names: Vec<&str> = params.names().collect();
    let whole = || {
        let loss = causal_lm_loss(&model.forward(&params, &tokens).unwrap(), &tokens);
        let wrt: Vec<&Tensor> = names.iter().map(|n| params.get(n).unwrap()).collect();
        let grads = vjp(&loss, None, &wrt).expect("backward");
        assert!(grads.iter().all(Option::is_some));
    };
    let units = || {
        let ctx = model.ctx(seq, Device::Cpu);
        let n = model.units().len();
        let (mut inputs, mut outputs) = (Vec::new(), Vec::new());
        let mut x = tokens.shallow_clone();
        for (i, unit) in model.units().iter().enumerate() {
            let input = if i == 0 {
                x
            } else {
                x.detach().set_requires_grad(true)
            };
            let out = unit.forward(&model.unit_params(i, &params).unwrap(), &input, &ctx);
            x = out.shallow_clone();
            inputs.push(input);
            outputs.push(out);
        }
        let mut grad_out: Option<Tensor> = None;
        let mut grads = std::collections::HashMap::<String, Tensor>::new();
        for i in (0..n).rev() {
            let p = model.unit_params(i, &params).unwrap();
            let mut wrt: Vec<&Tensor> = p.iter().collect();
            if i > 0 {
                wrt.push(&inputs[i]);
            }
            let root = match grad_out {
                None => causal_lm_loss(&outputs[i], &tokens),
                Some(_) => outputs[i].shallow_clone(),
            };
            let mut g = vjp(&root, grad_out.as_ref(), &wrt).expect("backward");
            grad_out = if i > 0 { g.pop().unwrap() } else { None };
            for (name, gi) in model.units()[i].param_names().iter().zip(g) {
                let gi = gi.unwrap();
                let sum = match grads.remove(name) {
                    Some(prev) => prev + gi,
                    None => gi,
                };
                grads.insert(name.clone(), sum);
            }
        }
        assert_eq!(grads.len(), names.len());
    };

    for (mode, step) in [("whole", &whole as &dyn Fn()), ("units", &units)] {
        step(); // warm-up
        let times: Vec<f64> = (0..iters)
            .map(|_| {
                let t = Instant::now();
                step();
                t.elapsed().as_secs_f64()
            })
            .collect();
        println!(
            "{mode}: median {:.1} ms over {iters} steps",
            median(times) * 1e3
        );
    }
}
