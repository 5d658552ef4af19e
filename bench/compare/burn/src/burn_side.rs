//! The workloads through burn's own autodiff: `Autodiff<NdArray<f32>>`.

use crate::data::{leaf_value, mlp_init, Act, Mat, MlpShape, ScalarShape};
use burn::backend::ndarray::{NdArray, NdArrayDevice};
use burn::backend::Autodiff;
use burn::tensor::activation::relu;
use burn::tensor::{Tensor, TensorData};

type B = Autodiff<NdArray<f32>>;
type Inner = NdArray<f32>;

fn tensor(m: &Mat, dev: &NdArrayDevice) -> Tensor<B, 2> {
    Tensor::from_data(TensorData::new(m.data.clone(), [m.rows, m.cols]), dev)
}

/// Trains model `index` for `shape.steps` SGD steps; returns its loss at
/// every step (the loss the step's gradients come from).
pub fn train_mlp(shape: &MlpShape, index: u64) -> Vec<f32> {
    let dev = NdArrayDevice::default();
    let init = mlp_init(shape, index);
    let mut params: Vec<Tensor<B, 2>> = init
        .params
        .iter()
        .map(|m| tensor(m, &dev).require_grad())
        .collect();
    let batches: Vec<(Tensor<B, 2>, Tensor<B, 2>)> = init
        .batches
        .iter()
        .map(|(x, y)| (tensor(x, &dev), tensor(y, &dev)))
        .collect();
    let mut losses = Vec::with_capacity(shape.steps);
    for step in 0..shape.steps {
        let (x, y) = &batches[step % batches.len()];
        let p = &params;
        let act = |h: Tensor<B, 2>| match shape.act {
            Act::Tanh => h.tanh(),
            Act::Relu => relu(h),
        };
        let h1 = act(x.clone().matmul(p[0].clone()).add(p[1].clone()));
        let h2 = act(h1.matmul(p[2].clone()).add(p[3].clone()));
        let out = h2.matmul(p[4].clone()).add(p[5].clone());
        let diff = out.sub(y.clone());
        let loss = diff.clone().mul(diff).mean();
        let grads = loss.backward();
        losses.push(loss.into_scalar());
        params = params
            .into_iter()
            .map(|w| {
                let g: Tensor<Inner, 2> = w.grad(&grads).expect("a parameter's gradient");
                Tensor::from_inner(w.inner() - g.mul_scalar(shape.lr)).require_grad()
            })
            .collect();
    }
    losses
}

/// Runs `iterations` of the scalar workload on 1-element tensors, thread
/// `thread`'s leaves; returns the last backward's gradient of leaf 0.
pub fn scalar(shape: &ScalarShape, thread: usize, iterations: usize) -> f32 {
    let dev = NdArrayDevice::default();
    let leaves: Vec<Tensor<B, 1>> = (0..shape.leaves)
        .map(|i| Tensor::<B, 1>::from_floats([leaf_value(i, thread)], &dev).require_grad())
        .collect();
    let n = leaves.len();
    let mut g = 0.0;
    for _ in 0..iterations {
        let mut x = leaves[0].clone().mul(leaves[1 % n].clone());
        for i in 1..shape.chain {
            x = x.mul(leaves[(i + 1) % n].clone());
        }
        g = grad_of_leaf0(&x, &leaves[0]);
        if shape.tree >= 2 {
            let mut level: Vec<Tensor<B, 1>> = (0..shape.tree / 2)
                .map(|i| leaves[i % n].clone().mul(leaves[(i + 1) % n].clone()))
                .collect();
            while level.len() > 1 {
                level = level
                    .chunks(2)
                    .map(|pair| pair[0].clone().mul(pair[1].clone()))
                    .collect();
            }
            grad_of_leaf0(&level[0], &leaves[0]);
        }
    }
    g
}

fn grad_of_leaf0(root: &Tensor<B, 1>, leaf0: &Tensor<B, 1>) -> f32 {
    let grads = root.backward();
    leaf0.grad(&grads).map_or(0.0, |g| g.into_scalar())
}
