//! Gradients against hand values, retained passes, threads, handles.

use adg::{code, BackwardOptions, Node, Registry, StepCall};

/// y = a * b, the values captured.
fn mul<'r>(
    reg: &'r Registry,
    a: &Node<'r>,
    b: &Node<'r>,
    va: f64,
    vb: f64,
) -> adg::Result<Node<'r>> {
    reg.op_named(c"mul", &[a, b], move |call: &mut StepCall<'_, f64>| {
        let g = *call.grad().unwrap_or(&0.0);
        call.give(0, g * vb)?;
        call.give(1, g * va)
    })
}

/// y = a + b.
fn add<'r>(reg: &'r Registry, a: &Node<'r>, b: &Node<'r>) -> adg::Result<Node<'r>> {
    reg.op_named(c"add", &[a, b], |call: &mut StepCall<'_, f64>| {
        let g = *call.grad().unwrap_or(&0.0);
        call.give(0, g)?;
        call.give(1, g)
    })
}

#[test]
fn gradients_of_a_small_graph_equal_hand_values() -> adg::Result<()> {
    // f = (a * b + a) * c at a = 2, b = 3, c = 5:
    // df/da = (b + 1) c = 20, df/db = a c = 10, df/dc = a b + a = 8.
    let reg = Registry::new()?;
    let (a, b, c) = (reg.leaf()?, reg.leaf()?, reg.leaf()?);
    let (va, vb, vc) = (2.0, 3.0, 5.0);
    let ab = mul(&reg, &a, &b, va, vb)?;
    let s = add(&reg, &ab, &a)?;
    let f = mul(&reg, &s, &c, va * vb + va, vc)?;
    let mut grads = adg::backward(&f, 1.0)?;
    assert_eq!(grads.len(), 3);
    assert_eq!(grads.get(&a), Some(&20.0));
    assert_eq!(grads.get(&b), Some(&10.0));
    assert_eq!(grads.get_id(c.id()), Some(&8.0));
    assert_eq!(grads.take(&c), Some(8.0));
    assert_eq!(grads.get(&c), None);
    assert_eq!(grads.take_id(b.id()), Some(10.0));
    assert_eq!(grads.len(), 1);
    // The ops' steps are consumed; their nodes are in no graph.
    assert_eq!(f.graph_id(), 0);
    drop((ab, s, f));
    let st = reg.stats();
    assert_eq!((st.live_nodes, st.live_steps), (3, 0));
    Ok(())
}

#[test]
fn a_parent_named_twice_takes_a_gradient_per_slot() -> adg::Result<()> {
    // y = x * x at x = 3: dy/dx = 2 x = 6, summed from two slots.
    let reg = Registry::new()?;
    let x = reg.leaf()?;
    let y = mul(&reg, &x, &x, 3.0, 3.0)?;
    assert_eq!(adg::backward(&y, 1.0)?.get(&x), Some(&6.0));
    Ok(())
}

#[test]
fn vector_gradients_sum_element_by_element() -> adg::Result<()> {
    let reg = Registry::<Vec<f32>>::new()?;
    let x = reg.leaf()?;
    let y = reg.op(&[&x, &x], |call| {
        call.give(0, vec![1.0, 2.0])?;
        call.give(1, vec![10.0, 20.0])
    })?;
    let grads = adg::backward(&y, vec![1.0, 1.0])?;
    assert_eq!(grads.get(&x), Some(&vec![11.0, 22.0]));
    Ok(())
}

#[test]
fn a_leaf_root_gets_its_seed() -> adg::Result<()> {
    let reg = Registry::<f32>::new()?;
    let x = reg.leaf()?;
    let grads = adg::backward(&x, 7.0)?;
    assert_eq!(grads.get(&x), Some(&7.0));
    Ok(())
}

#[test]
fn retained_passes_run_again_until_a_consuming_one() -> adg::Result<()> {
    let reg = Registry::new()?;
    let (a, b) = (reg.leaf()?, reg.leaf()?);
    let y = mul(&reg, &a, &b, 2.0, 3.0)?;
    let retained = BackwardOptions::new().retain(true);
    for seed in [1.0, 2.0] {
        let grads = adg::backward_with(&y, seed, &retained)?;
        assert_eq!(grads.get(&a), Some(&(3.0 * seed)));
        assert_eq!(grads.get(&b), Some(&(2.0 * seed)));
        assert_ne!(y.graph_id(), 0, "a retained pass leaves the graph");
    }
    let grads = adg::backward(&y, 1.0)?;
    assert_eq!(grads.get(&a), Some(&3.0));
    let gone = adg::backward_with(&y, 1.0, &retained).unwrap_err();
    assert_eq!(gone.code(), code::ECONSUMED);
    Ok(())
}

#[test]
fn a_step_sees_whether_it_is_retained() -> adg::Result<()> {
    use std::sync::Mutex;
    let reg = Registry::new()?;
    let x = reg.leaf()?;
    let seen = Mutex::new(Vec::new());
    let y = reg.op(&[&x], |call| {
        seen.lock().unwrap().push(call.retained());
        call.give(0, 1.0)
    })?;
    adg::backward_with(&y, 1.0, &BackwardOptions::new().retain(true))?;
    adg::backward(&y, 1.0)?;
    drop(y);
    assert_eq!(*seen.lock().unwrap(), [true, false]);
    Ok(())
}

#[test]
fn threads_record_over_one_shared_parameter() -> adg::Result<()> {
    // Each thread: y = w * x_t, chained n times; dy/dw summed per thread.
    let reg = Registry::new()?;
    let w = reg.leaf()?;
    let wv = 0.5;
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|t| {
                let (reg, w) = (&reg, &w);
                s.spawn(move || -> adg::Result<f64> {
                    let x = reg.leaf()?;
                    let xv = f64::from(t) + 1.0;
                    // y_1 = w x, y_k = y_{k-1} + w x: dy_n/dw = n x.
                    let mut y = mul(reg, w, &x, wv, xv)?;
                    for _ in 1..100 {
                        let wx = mul(reg, w, &x, wv, xv)?;
                        y = add(reg, &y, &wx)?;
                    }
                    let grads = adg::backward(&y, 1.0)?;
                    Ok(*grads.get(w).unwrap())
                })
            })
            .collect();
        for (t, h) in handles.into_iter().enumerate() {
            let dw = h.join().unwrap().unwrap();
            assert_eq!(dw, 100.0 * (t as f64 + 1.0));
        }
    });
    let st = reg.stats();
    assert_eq!((st.live_nodes, st.live_steps), (1, 0));
    Ok(())
}

#[test]
fn handles_are_counted_and_borrowed() -> adg::Result<()> {
    let reg = Registry::new()?;
    let x = reg.leaf()?;
    let y = reg.op(&[&x], |call| call.give(0, 1.0))?;
    let y2 = y.clone();
    assert_eq!(y2.id(), y.id());
    assert!(std::ptr::eq(y2.registry(), &reg));
    assert_eq!(reg.stats().live_nodes, 2);
    drop(y);
    assert_eq!(reg.stats().live_nodes, 2, "y2 holds it");
    let grads = adg::backward(&y2, 1.0)?;
    assert_eq!(grads.get(&x), Some(&1.0));
    drop(y2);
    assert_eq!(reg.stats().live_nodes, 1);
    Ok(())
}

/// y = 2 x, its one parent moved in.
fn double<'r>(reg: &'r Registry, x: Node<'r>) -> adg::Result<Node<'r>> {
    reg.op_moving_named(c"double", [x.into()], |call: &mut StepCall<'_, f64>| {
        let g = call.take_grad().unwrap_or(0.0);
        call.give(0, 2.0 * g)
    })
}

#[test]
fn moved_parents_hand_their_reference_over() -> adg::Result<()> {
    let reg = Registry::new()?;
    let (w, b) = (reg.leaf()?, reg.leaf()?);
    let mut h = add(&reg, &w, &w)?;
    for _ in 0..4 {
        h = double(&reg, h)?; // the old h lives on in the new node only
    }
    // One slot borrowed, one moved: h = h + b, b still ours.
    h = reg.op_moving([h.into(), (&b).into()], |call: &mut StepCall<'_, f64>| {
        let g = call.take_grad().unwrap_or(0.0);
        call.give(0, g)?;
        call.give(1, g)
    })?;
    assert_eq!(reg.stats().live_nodes, 2 + 6, "the leaves and the chain");
    let grads = adg::backward(&h, 1.0)?;
    assert_eq!((grads.get(&w), grads.get(&b)), (Some(&32.0), Some(&1.0)));
    drop((grads, h));
    // A reference moved and also dropped would have freed a node early
    // (the backward above read it); one moved and not handed over would
    // keep it now.
    assert_eq!(reg.stats().live_nodes, 2);
    drop((w, b));
    assert_eq!(reg.stats().live_nodes, 0);
    Ok(())
}

#[test]
fn a_refused_op_drops_its_moved_parents() -> adg::Result<()> {
    let (one, two) = (Registry::<f64>::new()?, Registry::<f64>::new()?);
    let x = one.leaf()?;
    let t = one.op(&[&x], |call| call.give(0, 1.0))?;
    assert_eq!(one.stats().live_nodes, 2);
    let e = two
        .op_moving([t.into()], |_: &mut StepCall<'_, f64>| Ok(()))
        .unwrap_err();
    assert_eq!(e.code(), code::EFOREIGN);
    assert_eq!(one.stats().live_nodes, 1, "t's handle dropped, not kept");
    assert_eq!(two.stats().live_steps, 0, "the step freed");
    let e = one
        .op_moving([], |_: &mut StepCall<'_, f64>| Ok(()))
        .unwrap_err();
    assert_eq!(e.code(), code::EINVAL, "no parent");
    Ok(())
}

#[test]
fn moves_past_the_64th_slot_are_dropped_as_borrows() -> adg::Result<()> {
    let reg = Registry::new()?;
    let x = reg.leaf()?;
    let parents: [adg::Parent<'_, '_, f64>; 65] = std::array::from_fn(|_| x.clone().into());
    let y = reg.op_moving(parents, |call: &mut StepCall<'_, f64>| {
        for slot in 0..call.n_parents() {
            call.give(slot, 1.0)?;
        }
        Ok(())
    })?;
    assert_eq!(adg::backward(&y, 1.0)?.get(&x), Some(&65.0));
    drop(y);
    drop(x); // the last of its 66 references: the leaf goes
    assert_eq!(reg.stats().live_nodes, 0);
    Ok(())
}

#[test]
fn handles_and_registries_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Registry<f64>>();
    send_sync::<Registry<Vec<f32>>>();
    send_sync::<Node<'static, f64>>();
    send_sync::<adg::Error>();
    send_sync::<BackwardOptions<'static, f64>>();
    send::<adg::Gradients<f64>>();
}

#[test]
fn write_dot_draws_the_graph() -> adg::Result<()> {
    let reg = Registry::new()?;
    let (a, b) = (reg.leaf()?, reg.leaf()?);
    let ab = mul(&reg, &a, &b, 1.0, 1.0)?;
    let y = add(&reg, &ab, &a)?;
    let mut out = Vec::new();
    adg::write_dot(&y, &mut out)?;
    let text = String::from_utf8(out).unwrap();
    assert!(text.starts_with("digraph"), "{text}");
    assert!(text.contains("mul") && text.contains("add"), "{text}");
    for node in [&a, &b, &ab, &y] {
        assert!(text.contains(&node.id().to_string()), "{text}");
    }
    assert!(text.contains("ellipse"), "leaves as ellipses: {text}");
    assert!(text.trim_end().ends_with('}'), "{text}");
    Ok(())
}

#[test]
fn write_dot_reports_a_writer_error_and_a_leaf() -> adg::Result<()> {
    struct Broken;
    impl std::io::Write for Broken {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::Error::other("disk full"))
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let reg = Registry::<f64>::new()?;
    let x = reg.leaf()?;
    let y = reg.op(&[&x], |_| Ok(()))?;
    let e = adg::write_dot(&y, &mut Broken).unwrap_err();
    assert_eq!(e.code(), code::ECALLBACK);
    assert!(e.reason().contains("disk full"), "{e}");
    let e = adg::write_dot(&x, &mut Vec::new()).unwrap_err();
    assert_eq!(e.code(), code::EINVAL);
    Ok(())
}

#[test]
fn visit_walks_the_ops_parents_first() -> adg::Result<()> {
    use adg::ParentKind::{Consumed, Leaf, Op};
    let reg = Registry::new()?;
    let (a, b) = (reg.leaf()?, reg.leaf()?);
    let p = reg.op_named(c"p", &[&a, &a], |_| Ok(()))?;
    adg::backward(&p, 1.0)?; // consumes p
    let ab = mul(&reg, &a, &b, 1.0, 1.0)?;
    let y = reg.op(&[&ab, &p, &b], |_| Ok(()))?;
    let mut seen = Vec::new();
    adg::visit(&y, |op| {
        assert_eq!(op.graph_id(), y.graph_id());
        let name = op.name().map(|n| n.to_str().unwrap().to_owned());
        seen.push((op.id(), name, op.depth(), op.parents().collect::<Vec<_>>()));
        Ok(())
    })?;
    assert_eq!(
        seen,
        [
            (
                ab.id(),
                Some("mul".into()),
                1,
                vec![(a.id(), Leaf), (b.id(), Leaf)]
            ),
            (
                y.id(),
                None,
                2,
                vec![(ab.id(), Op), (p.id(), Consumed), (b.id(), Leaf)]
            ),
        ]
    );
    Ok(())
}

#[test]
fn visit_stops_at_an_error_or_a_panic_and_refuses_a_leaf() -> adg::Result<()> {
    let reg = Registry::<f64>::new()?;
    let x = reg.leaf()?;
    let y = reg.op(&[&x], |_| Ok(()))?;
    let z = reg.op(&[&y], |_| Ok(()))?;
    let mut calls = 0;
    let e = adg::visit(&z, |_| {
        calls += 1;
        Err(adg::Error::new(code::EUSER - 3, "seen enough"))
    })
    .unwrap_err();
    assert_eq!(
        (calls, e.code(), e.reason()),
        (1, code::EUSER - 3, "seen enough")
    );
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        adg::visit(&z, |_| panic!("a visitor's panic"))
    }));
    let payload = caught.expect_err("resumed after libadg returned");
    assert_eq!(payload.downcast_ref::<&str>(), Some(&"a visitor's panic"));
    assert_eq!(adg::visit(&x, |_| Ok(())).unwrap_err().code(), code::EINVAL);
    adg::backward(&z, 1.0)?;
    assert_eq!(
        adg::visit(&z, |_| Ok(())).unwrap_err().code(),
        code::ECONSUMED
    );
    Ok(())
}

#[test]
fn boxed_and_inline_gradients_through_the_hooks() -> adg::Result<()> {
    // Vec<f64> travels boxed, f32 inline: both through the ready hook
    // (read, changed in place, taken) and the value check.
    let reg = Registry::<Vec<f64>>::new()?;
    let (x, z) = (reg.leaf()?, reg.leaf()?);
    let y = reg.op(&[&x, &z], |call| {
        let g = call.grad().cloned().unwrap_or_default();
        call.give(0, g.clone())?;
        call.give(1, g)
    })?;
    let zid = z.id();
    let o = BackwardOptions::new()
        .retain(true)
        .leaves_only(true)
        .value_check(|g: &Vec<f64>| g.len() == 2)
        .on_ready(move |r| {
            if r.id() == zid {
                assert_eq!(r.take(), Some(vec![1.0, 2.0]));
                assert!(r.grad().is_none());
            } else if let Some(g) = r.grad_mut() {
                g[0] = 10.0;
            }
            Ok(())
        });
    let grads = adg::backward_with(&y, vec![1.0, 2.0], &o)?;
    assert_eq!(grads.get(&x), Some(&vec![10.0, 2.0]));
    assert_eq!(grads.get(&z), None);

    let reg = Registry::<f32>::new()?;
    let x = reg.leaf()?;
    let y = reg.op(&[&x, &x], |call| {
        let g = *call.grad().unwrap();
        assert_eq!(call.grad(), Some(&g), "lent twice, the same");
        call.give(0, g)?;
        call.give(1, g * 2.0)
    })?;
    let o = BackwardOptions::new()
        .value_check(|g: &f32| *g > 0.0)
        .on_ready(|r| {
            if let Some(g) = r.grad_mut() {
                *g += 0.5;
            }
            Ok(())
        });
    let grads = adg::backward_with(&y, 1.5, &o)?;
    // The root's 1.5 + 0.5 by the hook; x gets 2 + 4, then + 0.5.
    assert_eq!(grads.get(&x), Some(&6.5));
    assert_eq!(grads.get(&x), grads.get_id(x.id()));
    Ok(())
}

#[test]
fn an_inline_gradient_is_lent_once_per_node() -> adg::Result<()> {
    let reg = Registry::new()?;
    let (a, b) = (reg.leaf()?, reg.leaf()?);
    let y = mul(&reg, &a, &b, 2.0, 3.0)?;
    let mut grads = adg::backward(&y, 1.0)?;
    let first: *const f64 = grads.get(&a).unwrap();
    for _ in 0..1000 {
        assert!(std::ptr::eq(grads.get(&a).unwrap(), first));
        assert!(std::ptr::eq(grads.get_id(a.id()).unwrap(), first));
    }
    assert_eq!(grads.take(&a), Some(3.0));
    assert_eq!(grads.get(&a), None);
    assert_eq!(grads.get(&b), Some(&2.0));
    Ok(())
}
