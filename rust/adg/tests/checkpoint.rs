//! Forward outputs: offered, asked for, kept or dropped and rebuilt.

use adg::{code, Checkpoint, Checkpointing, Node, Registry};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};

/// c = b², b = a + 1, a = 2x, each op offering its output (memory-bound,
/// rebuildable), c's step asking for b's. dc/dx = 4 b = 4 (2x + 1).
fn chain<'r>(
    reg: &'r Registry,
    x: &Node<'r>,
    xv: f64,
    rebuilds: &'r AtomicUsize,
) -> adg::Result<Node<'r>> {
    let a = reg.op_with(
        &[x],
        Checkpoint::new()
            .value(2.0 * xv)
            .memory_bound(true)
            .recompute(move |_| {
                rebuilds.fetch_add(1, Ordering::Relaxed);
                Ok(2.0 * xv) // x is a leaf: its value is captured
            }),
        |call| {
            let g = *call.grad().unwrap_or(&0.0);
            call.give(0, 2.0 * g)
        },
    )?;
    let b = reg.op_with(
        &[&a],
        Checkpoint::new()
            .value(2.0 * xv + 1.0)
            .memory_bound(true)
            .recompute(move |r| {
                rebuilds.fetch_add(1, Ordering::Relaxed);
                Ok(r.parent::<f64>(0)? + 1.0)
            }),
        |call| {
            let g = *call.grad().unwrap_or(&0.0);
            call.give(0, g)
        },
    )?;
    reg.op_with_named(
        c"square",
        &[&b],
        Checkpoint::<()>::new().want_parent(0),
        |call| {
            let bv: f64 = *call.output(call.parent_ids()[0])?;
            let g = *call.grad().unwrap_or(&0.0);
            call.give(0, 2.0 * bv * g)
        },
    )
}

#[test]
fn kept_and_rebuilt_outputs_give_the_same_gradients() -> adg::Result<()> {
    for (strategy, expected_rebuilds) in [(Checkpointing::None, 0), (Checkpointing::Balanced, 2)] {
        let rebuilds = AtomicUsize::new(0);
        let reg = Registry::with_checkpointing(strategy)?;
        let x = reg.leaf()?;
        let c = chain(&reg, &x, 1.5, &rebuilds)?;
        let grads = adg::backward(&c, 1.0)?;
        assert_eq!(grads.get(&x), Some(&16.0), "{strategy:?}");
        assert_eq!(
            rebuilds.load(Ordering::Relaxed),
            expected_rebuilds,
            "{strategy:?}"
        );
    }
    Ok(())
}

#[test]
fn an_output_read_as_another_type_is_an_error() -> adg::Result<()> {
    let reg = Registry::<f64>::new()?;
    let x = reg.leaf()?;
    let a = reg.op_with(&[&x], Checkpoint::new().value(1.0f64), |_| Ok(()))?;
    let b = reg.op_with(&[&a], Checkpoint::<()>::new().want_parent(0), |call| {
        let _: &f32 = call.output(call.parent_ids()[0])?;
        Ok(())
    })?;
    let e = adg::backward(&b, 1.0).unwrap_err();
    assert_eq!(e.code(), code::EINVAL);
    assert!(e.reason().contains("f32"), "{e}");
    Ok(())
}

#[test]
fn a_leaf_offers_no_output() -> adg::Result<()> {
    let reg = Registry::<f64>::new()?;
    let x = reg.leaf()?;
    let e = reg
        .op_with(&[&x], Checkpoint::<()>::new().want_parent(0), |_| Ok(()))
        .unwrap_err();
    assert_eq!(e.code(), code::EINVAL);
    assert_eq!(reg.stats().live_steps, 0);
    Ok(())
}

#[test]
fn a_panicking_rebuild_is_resumed_by_the_backward() -> adg::Result<()> {
    let reg = Registry::<f64>::with_checkpointing(Checkpointing::Balanced)?;
    let x = reg.leaf()?;
    let a = reg.op_with(
        &[&x],
        Checkpoint::new()
            .value(1.0f64)
            .memory_bound(true)
            .recompute(|_| panic!("rebuild failed")),
        |_| Ok(()),
    )?;
    let b = reg.op_with(&[&a], Checkpoint::<()>::new().want_parent(0), |call| {
        let _: &f64 = call.output(call.parent_ids()[0])?;
        Ok(())
    })?;
    let payload = catch_unwind(AssertUnwindSafe(|| adg::backward(&b, 1.0)))
        .expect_err("the rebuild's panic is resumed");
    assert_eq!(payload.downcast_ref::<&str>(), Some(&"rebuild failed"));
    drop((a, b));
    assert_eq!(reg.stats().live_steps, 0);
    Ok(())
}
