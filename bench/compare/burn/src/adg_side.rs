//! The workloads through libadg's `adg` crate: the forward math in Rust on
//! ndarray arrays (the ndarray burn-ndarray uses), each op recorded with
//! `Registry::op` and its backward as a closure step that captures the
//! forward values it needs, as burn's backward steps do.

use crate::data::{leaf_value, mlp_init, Act, Mat, MlpShape, ScalarShape};
use adg::{Grad, Node, Registry};
use ndarray::{Array2, Axis, Zip};
use std::sync::{Arc, LazyLock};

/// A gradient: one ndarray matrix (1 x 1 for the scalar workloads).
pub struct G(Array2<f32>);

impl Grad for G {
    fn add(&mut self, other: &Self) {
        self.0 += &other.0;
    }
}

/// One registry for every thread of the process, as burn has one global
/// graph state: the threads share it, and each builds graphs of its own.
static REGISTRY: LazyLock<Registry<G>> =
    LazyLock::new(|| Registry::new().expect("an adg registry"));

type Arr = Arc<Array2<f32>>;

/// A value and, when it is tracked, its node. Untracked values (the data)
/// are constants: no node, no gradient, as burn's tensors without
/// require_grad.
struct Var {
    node: Option<Node<'static, G>>,
    v: Arr,
}

impl Var {
    fn constant(m: &Mat) -> Var {
        Var {
            node: None,
            v: Arc::new(to_array(m)),
        }
    }

    fn leaf(v: Array2<f32>) -> Var {
        let node = REGISTRY.leaf().expect("an adg leaf");
        Var {
            node: Some(node),
            v: Arc::new(v),
        }
    }

    fn value(&self) -> Arr {
        Arc::clone(&self.v)
    }
}

fn to_array(m: &Mat) -> Array2<f32> {
    Array2::from_shape_vec((m.rows, m.cols), m.data.clone()).expect("a row-major matrix")
}

/// Records an op over the tracked ones of `inputs`: `backward` takes the
/// output's gradient and returns one gradient per input (None for the
/// untracked, which it need not compute).
fn record<F>(inputs: &[&Var], v: Arr, backward: F) -> Var
where
    F: Fn(Array2<f32>, [bool; 2]) -> [Option<Array2<f32>>; 2] + Send + Sync + 'static,
{
    let tracked = [0, 1].map(|i| inputs.get(i).is_some_and(|x| x.node.is_some()));
    let parents: Vec<&Node<'static, G>> = inputs.iter().filter_map(|x| x.node.as_ref()).collect();
    if parents.is_empty() {
        return Var { node: None, v };
    }
    let node = REGISTRY
        .op(&parents, move |call| {
            let Some(G(g)) = call.take_grad() else {
                return Ok(());
            };
            let grads = backward(g, tracked);
            for (slot, g) in grads.into_iter().flatten().enumerate() {
                call.give(slot, G(g))?;
            }
            Ok(())
        })
        .expect("an adg op");
    Var {
        node: Some(node),
        v,
    }
}

fn matmul(a: &Var, b: &Var) -> Var {
    let (av, bv) = (a.value(), b.value());
    let v = Arc::new(av.dot(&*bv));
    record(&[a, b], v, move |g, t| {
        [t[0].then(|| g.dot(&bv.t())), t[1].then(|| av.t().dot(&g))]
    })
}

/// h + b, b a 1 x n row broadcast over h's rows.
fn add_row(h: &Var, b: &Var) -> Var {
    let v = Arc::new(&*h.v + &*b.v);
    record(&[h, b], v, |g, t| {
        let gb = t[1].then(|| g.sum_axis(Axis(0)).insert_axis(Axis(0)));
        [t[0].then_some(g), gb]
    })
}

/// tanh as burn-ndarray computes it (through f64), so that both sides'
/// kernels are the same; the step keeps the output, where burn's
/// backward computes tanh of the input again.
fn tanh(x: &Var) -> Var {
    let y = Arc::new(x.v.mapv(|a| (a as f64).tanh() as f32));
    let out = Arc::clone(&y);
    record(&[x], y, move |mut g, _| {
        Zip::from(&mut g)
            .and(&*out)
            .for_each(|g, &y| *g *= 1.0 - y * y);
        [Some(g), None]
    })
}

fn relu(x: &Var) -> Var {
    let y = Arc::new(x.v.mapv(|a| a.max(0.0)));
    let out = Arc::clone(&y);
    record(&[x], y, move |mut g, _| {
        Zip::from(&mut g).and(&*out).for_each(|g, &y| {
            if y <= 0.0 {
                *g = 0.0;
            }
        });
        [Some(g), None]
    })
}

fn sub(a: &Var, b: &Var) -> Var {
    let v = Arc::new(&*a.v - &*b.v);
    record(&[a, b], v, |g, t| {
        let gb = t[1].then(|| -&g);
        [t[0].then_some(g), gb]
    })
}

fn mul(a: &Var, b: &Var) -> Var {
    let (av, bv) = (a.value(), b.value());
    let v = Arc::new(&*av * &*bv);
    record(&[a, b], v, move |g, t| {
        let ga = t[0].then(|| &g * &*bv);
        [ga, t[1].then(|| g * &*av)]
    })
}

fn mean(x: &Var) -> Var {
    let shape = x.v.raw_dim();
    let n = x.v.len() as f32;
    let v = Arc::new(Array2::from_elem((1, 1), x.v.mean().unwrap_or(0.0)));
    record(&[x], v, move |g, _| {
        [Some(Array2::from_elem(shape, g[[0, 0]] / n)), None]
    })
}

fn backward(root: &Var) -> adg::Gradients<G> {
    let node = root.node.as_ref().expect("a tracked root");
    adg::backward(node, G(Array2::ones((1, 1)))).expect("adg's backward")
}

/// Trains model `index` for `shape.steps` SGD steps; returns its loss at
/// every step, as burn_side::train_mlp does for the same model.
pub fn train_mlp(shape: &MlpShape, index: u64) -> Vec<f32> {
    let init = mlp_init(shape, index);
    let mut params: Vec<Var> = init.params.iter().map(|m| Var::leaf(to_array(m))).collect();
    let batches: Vec<(Var, Var)> = init
        .batches
        .iter()
        .map(|(x, y)| (Var::constant(x), Var::constant(y)))
        .collect();
    let mut losses = Vec::with_capacity(shape.steps);
    for step in 0..shape.steps {
        let (x, y) = &batches[step % batches.len()];
        let p = &params;
        let act = match shape.act {
            Act::Tanh => tanh,
            Act::Relu => relu,
        };
        let h1 = act(&add_row(&matmul(x, &p[0]), &p[1]));
        let h2 = act(&add_row(&matmul(&h1, &p[2]), &p[3]));
        let out = add_row(&matmul(&h2, &p[4]), &p[5]);
        let diff = sub(&out, y);
        let loss = mean(&mul(&diff, &diff));
        let mut grads = backward(&loss);
        losses.push(loss.v[[0, 0]]);
        for w in &mut params {
            let node = w.node.as_ref().expect("a parameter's node");
            let g = grads.take(node).expect("a parameter's gradient");
            w.v = Arc::new(&*w.v - &(g.0 * shape.lr));
        }
    }
    losses
}

/// Runs `iterations` of the scalar workload on 1 x 1 arrays, thread
/// `thread`'s leaves; returns the last backward's gradient of leaf 0.
pub fn scalar(shape: &ScalarShape, thread: usize, iterations: usize) -> f32 {
    let leaves: Vec<Var> = (0..shape.leaves)
        .map(|i| Var::leaf(Array2::from_elem((1, 1), leaf_value(i, thread))))
        .collect();
    let n = leaves.len();
    let mut g = 0.0;
    for _ in 0..iterations {
        let mut x = mul(&leaves[0], &leaves[1 % n]);
        for i in 1..shape.chain {
            x = mul(&x, &leaves[(i + 1) % n]);
        }
        g = grad_of_leaf0(&x, &leaves[0]);
        if shape.tree >= 2 {
            let mut level: Vec<Var> = (0..shape.tree / 2)
                .map(|i| mul(&leaves[i % n], &leaves[(i + 1) % n]))
                .collect();
            while level.len() > 1 {
                level = level
                    .chunks(2)
                    .map(|pair| mul(&pair[0], &pair[1]))
                    .collect();
            }
            grad_of_leaf0(&level[0], &leaves[0]);
        }
    }
    g
}

fn grad_of_leaf0(root: &Var, leaf0: &Var) -> f32 {
    let grads = backward(root);
    let node = leaf0.node.as_ref().expect("a leaf's node");
    grads.get(node).map_or(0.0, |g| g.0[[0, 0]])
}
