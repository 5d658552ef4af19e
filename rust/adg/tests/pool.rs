//! The thread pool: its limits, and backward passes on it that give the
//! sequential backward's bits, from several threads at once.

use adg::{BackwardOptions, Node, Pool, Registry};

#[test]
fn thread_counts_out_of_range_are_refused() {
    for n in [0, 257] {
        let e = Pool::new(n).unwrap_err();
        assert_eq!(e.code(), adg_sys::ADG_EINVAL, "{n} threads");
    }
    let pool = Pool::new(256).unwrap();
    assert_eq!(pool.threads(), 256);
    assert!(!pool.as_ptr().is_null());
}

/// A fan of `width` branches over one leaf, each a chain of `depth` ops
/// that multiply the gradient by a factor of their own, joined by a root:
/// the leaf's gradient is a sum whose bits depend on its order.
fn fan<'r>(reg: &'r Registry<f64>, x: &Node<'r, f64>, width: usize, depth: usize) -> Node<'r, f64> {
    let branches: Vec<Node<'r, f64>> = (0..width)
        .map(|b| {
            let mut node = x.clone();
            for d in 0..depth {
                let factor = 1.0 + 1e-3 * (b * depth + d) as f64 + 1.0 / (3.0 + b as f64);
                node = reg
                    .op(&[&node], move |call| {
                        let g = *call.grad().unwrap_or(&0.0);
                        call.give(0, g * factor)
                    })
                    .unwrap();
            }
            node
        })
        .collect();
    let parents: Vec<&Node<'r, f64>> = branches.iter().collect();
    reg.op(&parents, move |call| {
        let g = *call.grad().unwrap_or(&0.0);
        (0..width).try_for_each(|slot| call.give(slot, g * (1.0 + slot as f64 / 7.0)))
    })
    .unwrap()
}

#[test]
fn a_backward_on_a_pool_gives_the_sequential_bits() {
    let reg = Registry::<f64>::new().unwrap();
    let x = reg.leaf().unwrap();
    let sequential = adg::backward(&fan(&reg, &x, 16, 20), 1.0).unwrap();
    let want = sequential.get(&x).copied().unwrap().to_bits();
    for n in [1, 2, 4] {
        let pool = Pool::new(n).unwrap();
        let options = BackwardOptions::new().executor(&pool);
        let g = adg::backward_with(&fan(&reg, &x, 16, 20), 1.0, &options).unwrap();
        assert_eq!(g.get(&x).copied().unwrap().to_bits(), want, "{n} workers");
    }
}

#[test]
fn one_pool_serves_several_threads_at_once() {
    let reg = Registry::<f64>::new().unwrap();
    let pool = Pool::new(2).unwrap();
    let x = reg.leaf().unwrap();
    let want = adg::backward(&fan(&reg, &x, 8, 8), 1.0)
        .unwrap()
        .get(&x)
        .copied();
    std::thread::scope(|s| {
        for _ in 0..3 {
            let (reg, pool, x) = (&reg, &pool, &x);
            s.spawn(move || {
                let options = BackwardOptions::new().executor(pool);
                for _ in 0..20 {
                    let g = adg::backward_with(&fan(reg, x, 8, 8), 1.0, &options).unwrap();
                    assert_eq!(g.get(x).copied(), want);
                }
            });
        }
    });
}

#[test]
fn a_pool_is_send_and_sync() {
    fn shared<S: Send + Sync>() {}
    shared::<Pool>();
    // And may move to, and be dropped on, another thread.
    let pool = Pool::new(1).unwrap();
    std::thread::spawn(move || drop(pool)).join().unwrap();
}
