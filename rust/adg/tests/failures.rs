//! Errors with their codes and reasons, and panics carried out of a
//! backward without unwinding through C.

use adg::{code, BackwardOptions, Error, Grad, Registry, Site};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Counts its drops: what a step captures, to see that nothing leaks.
struct Guard(Arc<AtomicUsize>);

impl Drop for Guard {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_default()
}

#[test]
fn bad_input_is_an_error_with_its_code_and_reason() -> adg::Result<()> {
    let reg = Registry::<f64>::new()?;
    let e = reg.op(&[], |_| Ok(())).unwrap_err();
    assert_eq!(e.code(), code::EINVAL);
    assert_eq!(e.name(), "ADG_EINVAL");
    assert_eq!(e.message(), "invalid argument");
    assert!(e.reason().contains("adg_op"), "{e}");
    assert_eq!(
        e.to_string(),
        format!("ADG_EINVAL: invalid argument: {}", e.reason())
    );
    assert!(e.failure().is_none());
    // Nothing was kept of the rejected step.
    assert_eq!(reg.stats().live_steps, 0);
    Ok(())
}

#[test]
fn a_parent_of_another_registry_is_foreign() -> adg::Result<()> {
    let (one, two) = (Registry::<f64>::new()?, Registry::<f64>::new()?);
    let x = one.leaf()?;
    let e = two.op(&[&x], |_| Ok(())).unwrap_err();
    assert_eq!(e.code(), code::EFOREIGN);
    assert!(!e.reason().is_empty());
    Ok(())
}

#[test]
fn a_consumed_root_cannot_run_again() -> adg::Result<()> {
    let reg = Registry::<f64>::new()?;
    let x = reg.leaf()?;
    let y = reg.op(&[&x], |call| call.give(0, 1.0))?;
    adg::backward(&y, 1.0)?;
    let e = adg::backward(&y, 1.0).unwrap_err();
    assert_eq!(e.code(), code::ECONSUMED);
    assert!(e.reason().contains("adg_backward"), "{e}");
    Ok(())
}

#[test]
fn a_step_error_fails_the_backward_naming_the_step() -> adg::Result<()> {
    let reg = Registry::<f64>::new()?;
    let x = reg.leaf()?;
    let y = reg.op_named(c"load", &[&x], |_| {
        Err(Error::new(code::EUSER - 3, "the batch was empty"))
    })?;
    let e = adg::backward(&y, 1.0).unwrap_err();
    assert_eq!(e.code(), code::EUSER - 3);
    assert!(e.reason().contains("the batch was empty"), "{e}");
    let at = e.failure().unwrap();
    assert_eq!((at.site, at.node_id), (Site::Step, y.id()));
    assert_eq!(at.name.as_deref(), Some("load"));
    assert_ne!(at.pass_id, 0);
    Ok(())
}

#[test]
fn a_bad_slot_fails_the_step_with_libadg_reason() -> adg::Result<()> {
    let reg = Registry::<f64>::new()?;
    let x = reg.leaf()?;
    let y = reg.op(&[&x], |call| call.give(3, 1.0))?;
    let e = adg::backward(&y, 1.0).unwrap_err();
    assert_eq!(e.code(), code::EINVAL);
    assert!(e.reason().contains("slot 3"), "{e}");
    Ok(())
}

#[test]
fn a_panicking_step_is_resumed_and_nothing_leaks() -> adg::Result<()> {
    let drops = Arc::new(AtomicUsize::new(0));
    let reg = Registry::<f64>::new()?;
    let x = reg.leaf()?;
    let g1 = Guard(drops.clone());
    let below = reg.op(&[&x], move |call| {
        let _keep = &g1;
        call.give(0, 1.0)
    })?;
    let g2 = Guard(drops.clone());
    let y = reg.op(&[&below], move |_| {
        let _keep = &g2;
        panic!("step exploded")
    })?;
    let caught = catch_unwind(AssertUnwindSafe(|| adg::backward(&y, 1.0)));
    let payload = caught.expect_err("the step's panic is resumed");
    assert_eq!(panic_message(&*payload), "step exploded");
    // The failed backward released every step it took: both closures.
    assert_eq!(drops.load(Ordering::Relaxed), 2);
    drop((y, below));
    let st = reg.stats();
    assert_eq!((st.live_nodes, st.live_steps), (1, 0));
    // The registry goes on.
    let z = reg.op(&[&x], |call| call.give(0, 2.0))?;
    assert_eq!(adg::backward(&z, 1.0)?.get(&x), Some(&2.0));
    Ok(())
}

#[test]
fn an_unrun_step_drops_its_closure_with_its_node() -> adg::Result<()> {
    let drops = Arc::new(AtomicUsize::new(0));
    let reg = Registry::<f64>::new()?;
    let x = reg.leaf()?;
    let g = Guard(drops.clone());
    let y = reg.op(&[&x], move |_| {
        let _keep = &g;
        Ok(())
    })?;
    assert_eq!(drops.load(Ordering::Relaxed), 0);
    drop(y);
    assert_eq!(drops.load(Ordering::Relaxed), 1);
    Ok(())
}

#[test]
fn a_failed_op_drops_its_closure() -> adg::Result<()> {
    let drops = Arc::new(AtomicUsize::new(0));
    let reg = Registry::<f64>::new()?;
    let g = Guard(drops.clone());
    let e = reg
        .op(&[], move |_| {
            let _keep = &g;
            Ok(())
        })
        .unwrap_err();
    assert_eq!(e.code(), code::EINVAL);
    assert_eq!(drops.load(Ordering::Relaxed), 1);
    Ok(())
}

#[test]
fn a_panic_in_a_thread_stays_on_that_thread() -> adg::Result<()> {
    let reg = Registry::<f64>::new()?;
    let w = reg.leaf()?;
    std::thread::scope(|s| {
        let bad = s.spawn(|| {
            let y = reg.op(&[&w], |_| panic!("thread 0")).unwrap();
            catch_unwind(AssertUnwindSafe(|| adg::backward(&y, 1.0))).is_err()
        });
        let good = s.spawn(|| {
            let y = reg.op(&[&w], |call| call.give(0, 1.0)).unwrap();
            adg::backward(&y, 1.0).unwrap().get(&w).copied()
        });
        assert!(bad.join().unwrap());
        assert_eq!(good.join().unwrap(), Some(1.0));
    });
    Ok(())
}

/// A gradient whose add panics when asked to.
struct Fragile(f64);

impl Grad for Fragile {
    fn add(&mut self, other: &Self) {
        assert!(other.0.is_finite(), "add of a non-finite gradient");
        self.0 += other.0;
    }
}

#[test]
fn a_panicking_add_is_resumed() -> adg::Result<()> {
    let reg = Registry::<Fragile>::new()?;
    let x = reg.leaf()?;
    let y = reg.op(&[&x, &x], |call| {
        call.give(0, Fragile(1.0))?;
        call.give(1, Fragile(f64::INFINITY))
    })?;
    let payload = catch_unwind(AssertUnwindSafe(|| adg::backward(&y, Fragile(1.0))))
        .expect_err("the add's panic is resumed");
    assert_eq!(panic_message(&*payload), "add of a non-finite gradient");
    let z = reg.op(&[&x, &x], |call| {
        call.give(0, Fragile(1.0))?;
        call.give(1, Fragile(2.0))
    })?;
    assert_eq!(adg::backward(&z, Fragile(1.0))?.get(&x).unwrap().0, 3.0);
    Ok(())
}

#[test]
fn the_value_check_rejects_and_names_the_step() -> adg::Result<()> {
    let reg = Registry::<f64>::new()?;
    let x = reg.leaf()?;
    let fine = reg.op(&[&x], |call| call.give(0, 1.0))?;
    let y = reg.op_named(c"div", &[&fine], |call| {
        let r = call.give(0, f64::NAN);
        assert_eq!(r.as_ref().unwrap_err().code(), code::EVALUE);
        r
    })?;
    let o = BackwardOptions::new().value_check(|g: &f64| g.is_finite());
    let e = adg::backward_with(&y, 1.0, &o).unwrap_err();
    assert_eq!(e.code(), code::EVALUE);
    let at = e.failure().unwrap();
    assert_eq!(at.site, Site::Check);
    assert_eq!(at.node_id, y.id());
    assert_eq!(at.name.as_deref(), Some("div"));
    Ok(())
}

#[test]
fn the_value_check_fails_the_step_whatever_it_returns() -> adg::Result<()> {
    let reg = Registry::<f64>::new()?;
    let x = reg.leaf()?;
    let y = reg.op(&[&x], |call| {
        let _ = call.give(0, f64::INFINITY); /* the error ignored */
        Ok(())
    })?;
    let o = BackwardOptions::new().value_check(|g: &f64| g.is_finite());
    let e = adg::backward_with(&y, 1.0, &o).unwrap_err();
    assert_eq!(e.code(), code::EVALUE);
    assert_eq!(e.failure().unwrap().site, Site::Check);
    Ok(())
}

#[test]
fn a_panicking_value_check_is_resumed() -> adg::Result<()> {
    let reg = Registry::<f64>::new()?;
    let x = reg.leaf()?;
    let y = reg.op(&[&x], |call| call.give(0, -1.0))?;
    let o = BackwardOptions::new().value_check(|g: &f64| {
        assert!(*g >= 0.0, "negative gradient");
        true
    });
    let payload = catch_unwind(AssertUnwindSafe(|| adg::backward_with(&y, 1.0, &o)))
        .expect_err("the check's panic is resumed");
    assert_eq!(panic_message(&*payload), "negative gradient");
    Ok(())
}

#[test]
fn the_ready_hook_sees_changes_and_fails_the_backward() -> adg::Result<()> {
    let reg = Registry::<f64>::new()?;
    let x = reg.leaf()?;
    let y = reg.op(&[&x], |call| call.give(0, 2.0))?;
    let retained = BackwardOptions::new()
        .retain(true)
        .leaves_only(true)
        .on_ready(|r| {
            *r.grad_mut().unwrap() *= 10.0;
            Ok(())
        });
    assert_eq!(adg::backward_with(&y, 1.0, &retained)?.get(&x), Some(&20.0));

    let failing = BackwardOptions::new()
        .retain(true)
        .on_ready(|r| match r.grad() {
            Some(g) if *g > 1.0 => Err(Error::new(code::EUSER, "too steep")),
            _ => Ok(()),
        });
    let e = adg::backward_with(&y, 1.0, &failing).unwrap_err();
    assert_eq!(e.code(), code::EUSER);
    assert!(e.reason().contains("too steep"), "{e}");
    assert_eq!(e.failure().unwrap().site, Site::OnReady);
    assert_eq!(e.failure().unwrap().node_id, x.id());

    let panicking = BackwardOptions::new().on_ready(|_| panic!("hook"));
    let payload = catch_unwind(AssertUnwindSafe(|| adg::backward_with(&y, 1.0, &panicking)))
        .expect_err("the hook's panic is resumed");
    assert_eq!(panic_message(&*payload), "hook");
    Ok(())
}

#[test]
fn the_step_hook_fails_the_backward_at_its_step() -> adg::Result<()> {
    let reg = Registry::<f64>::new()?;
    let x = reg.leaf()?;
    let a = reg.op_named(c"a", &[&x], |call| call.give(0, 1.0))?;
    let b = reg.op_named(c"b", &[&a], |call| call.give(0, 1.0))?;
    let o = BackwardOptions::new().on_step(|e| match e.name {
        Some("a") if e.after => Err(Error::new(code::EUSER - 1, "too slow")),
        _ => Ok(()),
    });
    let e = adg::backward_with(&b, 1.0, &o).unwrap_err();
    assert_eq!(e.code(), code::EUSER - 1);
    assert!(e.reason().contains("too slow"), "{e}");
    let at = e.failure().unwrap();
    assert_eq!((at.site, at.node_id), (Site::OnStep, a.id()));

    let c = reg.op(&[&x], |call| call.give(0, 1.0))?;
    let o = BackwardOptions::new().on_step(|_| panic!("hook on step"));
    let payload = catch_unwind(AssertUnwindSafe(|| adg::backward_with(&c, 1.0, &o)))
        .expect_err("the hook's panic is resumed");
    assert_eq!(panic_message(&*payload), "hook on step");
    Ok(())
}

/// A gradient that counts its drops, to see that give_all loses none.
struct Counted(f64, Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.1.fetch_add(1, Ordering::Relaxed);
    }
}

impl Grad for Counted {
    fn add(&mut self, other: &Self) {
        self.0 += other.0;
    }
}

#[test]
fn give_all_takes_every_value_and_refuses_a_wrong_count() -> adg::Result<()> {
    let reg = Registry::<Counted>::new()?;
    let x = reg.leaf()?;
    let seeds = Arc::new(AtomicUsize::new(0));
    // (values the step hands give_all, whether it gave slot 0 before)
    for (n_values, repeat_slot_0) in [(3, false), (1, false), (2, true)] {
        let dropped = Arc::new(AtomicUsize::new(0));
        let mine = dropped.clone();
        let y = reg.op(&[&x, &x], move |call| {
            if repeat_slot_0 {
                call.give(0, Counted(1.0, mine.clone()))?;
            }
            let values = (0..n_values).map(|_| Some(Counted(1.0, mine.clone())));
            let before = mine.load(Ordering::Relaxed);
            let e = call.give_all(values).unwrap_err();
            // Refused whole, before libadg sees one; a slot given twice
            // fails in libadg, which frees it and the rest.
            assert_eq!(mine.load(Ordering::Relaxed) - before, n_values);
            Err(e)
        })?;
        let e = adg::backward(&y, Counted(1.0, seeds.clone())).unwrap_err();
        assert_eq!(e.code(), code::EINVAL, "{e}");
        if !repeat_slot_0 {
            let want = format!("{n_values} values for 2 parents");
            assert!(e.reason().contains(&want), "{e}");
        }
        drop(y);
        let given = usize::from(repeat_slot_0);
        assert_eq!(dropped.load(Ordering::Relaxed), n_values + given);
    }
    assert_eq!(seeds.load(Ordering::Relaxed), 3, "each backward's seed");
    Ok(())
}

#[test]
fn give_all_gives_past_the_inline_buffer() -> adg::Result<()> {
    let reg = Registry::<f64>::new()?;
    let (x, y) = (reg.leaf()?, reg.leaf()?);
    let parents: Vec<_> = (0..10).map(|i| if i % 3 == 0 { &y } else { &x }).collect();
    let z = reg.op(&parents, |call| {
        call.give_all((0..call.n_parents()).map(|i| (i % 2 == 0).then_some(i as f64)))
    })?;
    let grads = adg::backward(&z, 1.0)?;
    // Even slots give their index: y at 0 and 6, x at 2, 4 and 8.
    assert_eq!((grads.get(&x), grads.get(&y)), (Some(&14.0), Some(&6.0)));
    Ok(())
}
