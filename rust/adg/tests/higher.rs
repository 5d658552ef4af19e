//! Gradients of gradients: a gradient type that carries a node, steps that
//! record their products, an add that records an add, retained passes
//! (the guide's "Gradients of gradients", examples/higher.c in Rust).
//! f(x) = x³ at x = 2: f' = 3x² = 12, f'' = 6x = 12, f''' = 6.

use adg::{BackwardOptions, Grad, Node, Registry};

/// A value and the node that computes it; no node: a constant.
#[derive(Clone)]
struct Dual {
    node: Option<Node<'static, Dual>>,
    value: f64,
}

fn constant(value: f64) -> Dual {
    Dual { node: None, value }
}

/// An op over the operands that are nodes, whose step gives each of them
/// its gradient: `partial(k, g)`, the gradient for operand k, itself a
/// dual (so a node when g or the operands are).
fn record(
    operands: &[&Dual],
    value: f64,
    partial: impl Fn(usize, &Dual) -> Dual + Send + Sync + 'static,
) -> Dual {
    let slots: Vec<usize> = (0..operands.len())
        .filter(|&k| operands[k].node.is_some())
        .collect();
    if slots.is_empty() {
        return constant(value);
    }
    let parents: Vec<&Node<'static, Dual>> = slots
        .iter()
        .map(|&k| operands[k].node.as_ref().unwrap())
        .collect();
    // Ops are recorded on the registry of the operands' nodes.
    let reg = parents[0].registry();
    let node = reg
        .op(&parents, move |call| {
            let Some(g) = call.grad().cloned() else {
                return Ok(());
            };
            for (slot, &k) in slots.iter().enumerate() {
                call.give(slot, partial(k, &g))?;
            }
            Ok(())
        })
        .unwrap();
    Dual {
        node: Some(node),
        value,
    }
}

fn mul(a: &Dual, b: &Dual) -> Dual {
    let (ka, kb) = (a.clone(), b.clone());
    record(&[a, b], a.value * b.value, move |k, g| {
        mul(g, if k == 0 { &kb } else { &ka })
    })
}

fn add(a: &Dual, b: &Dual) -> Dual {
    record(&[a, b], a.value + b.value, |_, g| g.clone())
}

impl Grad for Dual {
    /// A sum of gradients that is a node too.
    fn add(&mut self, other: &Self) {
        *self = add(self, other);
    }
}

/// The gradient of x in a retained backward from `root`.
fn derivative(root: &Dual, x: &Dual) -> Dual {
    let retain = BackwardOptions::new().retain(true);
    let node = root.node.as_ref().unwrap();
    let mut grads = adg::backward_with(node, constant(1.0), &retain).unwrap();
    grads.take(x.node.as_ref().unwrap()).unwrap()
}

#[test]
fn derivatives_of_x_cubed_are_nodes_of_their_own() {
    // A gradient type is 'static, and the nodes it holds borrow their
    // registry, so the registry is 'static too: leaked here, and taken
    // back at the end, once every node is gone.
    let reg: &'static Registry<Dual> = Box::leak(Box::new(Registry::new().unwrap()));
    let x = Dual {
        node: Some(reg.leaf().unwrap()),
        value: 2.0,
    };
    let f = mul(&mul(&x, &x), &x);
    assert_eq!(f.value, 8.0);
    let f1 = derivative(&f, &x);
    assert_eq!(f1.value, 12.0);
    let f2 = derivative(&f1, &x);
    assert_eq!(f2.value, 12.0);
    let f3 = derivative(&f2, &x);
    assert_eq!(f3.value, 6.0);
    drop((f, f1, f2, f3, x));
    let st = reg.stats();
    assert_eq!((st.live_nodes, st.live_steps), (0, 0), "every node freed");
    // SAFETY: the Box leaked above; no node, so nothing borrows it.
    drop(unsafe { Box::from_raw(std::ptr::from_ref(reg).cast_mut()) });
}
