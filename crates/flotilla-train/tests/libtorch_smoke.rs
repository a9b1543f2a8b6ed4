//! Proves that libtorch is linked and usable from Rust: a small computation with a checked result.

use tch::{Device, Kind, Tensor};

#[test]
fn matmul_and_autograd_on_cpu() {
    let a = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0]).reshape([2, 2]);
    let b = Tensor::from_slice(&[5.0f32, 6.0, 7.0, 8.0]).reshape([2, 2]);
    let c = a.matmul(&b);
    let got: Vec<f32> = c.flatten(0, -1).try_into().unwrap();
    assert_eq!(got, vec![19.0, 22.0, 43.0, 50.0]);

    let x = Tensor::from_slice(&[3.0f64]).set_requires_grad(true);
    let y = (&x * &x * &x).sum(Kind::Double); // d/dx x^3 = 3x^2 = 27
    y.backward();
    let grad = x.grad().double_value(&[0]);
    assert_eq!(grad, 27.0);
    assert_eq!(c.device(), Device::Cpu);
}
