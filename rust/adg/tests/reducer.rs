//! The reducer: the same bits at any thread count, all-or-nothing rounds,
//! failures and panics reported to every participant.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, RwLock};

use adg::{BackwardOptions, Error, FailureSite, Node, Pool, Reducer, Registry};

/// Units of every round: not a power of two, so the tree has holes.
const UNITS: usize = 11;
const ROUNDS: u64 = 3;
const DIM: usize = 5;
const RATE: f64 = 1e-3;

/// splitmix64: the data from a fixed seed, the same on every thread.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A number in (-1, 1) from a seed.
fn uniform(seed: u64) -> f64 {
    (mix(seed) >> 11) as f64 / (1u64 << 52) as f64 - 1.0
}

/// Unit `unit` of a round holds 1 to 7 samples: units of varied cost, so
/// that the deal differs between runs and thread counts.
fn unit_samples(unit: usize) -> usize {
    1 + unit * 5 % 7
}

/// Sample `s` of unit `unit` in round `round`: inputs of magnitudes from
/// 0.01 to 100 (so that the order of a sum shows in its bits) and a
/// target.
fn sample(round: u64, unit: usize, s: usize) -> (Vec<f64>, f64) {
    let seed = (round << 40) ^ ((unit as u64) << 20) ^ s as u64;
    let scale = 10f64.powi((unit % 5) as i32 - 2);
    let x = (0..DIM)
        .map(|i| scale * uniform(seed.wrapping_mul(31).wrapping_add(i as u64)))
        .collect();
    (x, uniform(seed ^ 0xdead_beef))
}

/// What a unit's root step does besides its work.
#[derive(Clone, Copy, PartialEq)]
enum Sabotage {
    None,
    Error,
    Panic,
}

/// A linear model's weights (w, then b as a vector of one) and their
/// leaves.
struct Model<'r> {
    params: Vec<Node<'r, Vec<f64>>>,
    values: Arc<Vec<RwLock<Vec<f64>>>>,
}

impl<'r> Model<'r> {
    fn new(reg: &'r Registry<Vec<f64>>) -> Model<'r> {
        let w = (0..DIM).map(|i| uniform(1000 + i as u64) / 2.0).collect();
        Model {
            params: vec![reg.leaf().unwrap(), reg.leaf().unwrap()],
            values: Arc::new(vec![RwLock::new(w), RwLock::new(vec![0.0])]),
        }
    }

    fn bits(&self) -> Vec<u64> {
        let mut bits = Vec::new();
        for v in self.values.iter() {
            let v = v.read().unwrap();
            assert!(v.iter().all(|x| x.is_finite()));
            bits.extend(v.iter().map(|x| x.to_bits()));
        }
        bits
    }
}

fn sgd(value: &mut [f64], grad: &[f64]) {
    for (v, g) in value.iter_mut().zip(grad) {
        *v -= RATE * g;
    }
}

/// Unit `unit`'s loss, the sum of its samples' 0.5 * (w.x + b - t)^2: an
/// op per sample over (w, b), and a root over the samples. `sabotage`
/// makes the root's step fail or panic.
fn unit_loss<'r>(
    reg: &'r Registry<Vec<f64>>,
    m: &Model<'r>,
    round: u64,
    unit: usize,
    sabotage: Sabotage,
) -> adg::Result<Node<'r, Vec<f64>>> {
    let w = m.values[0].read().unwrap().clone();
    let b = m.values[1].read().unwrap()[0];
    let mut samples = Vec::new();
    for s in 0..unit_samples(unit) {
        let (x, t) = sample(round, unit, s);
        let r = w.iter().zip(&x).map(|(w, x)| w * x).sum::<f64>() + b - t;
        samples.push(reg.op(&[&m.params[0], &m.params[1]], move |call| {
            let g = call.grad().map_or(0.0, |g| g[0]) * r;
            call.give(0, x.iter().map(|x| g * x).collect())?;
            call.give(1, vec![g])
        })?);
    }
    let parents: Vec<&Node<'r, Vec<f64>>> = samples.iter().collect();
    let n = parents.len();
    reg.op(&parents, move |call| {
        match sabotage {
            Sabotage::None => {}
            Sabotage::Error => return Err(Error::new(adg_sys::ADG_EUSER - 7, "a bad sample")),
            Sabotage::Panic => panic!("a step's panic"),
        }
        let g = call.grad().cloned().unwrap_or_else(|| vec![1.0]);
        for slot in 0..n {
            call.give(slot, g.clone())?;
        }
        Ok(())
    })
}

/// The units' gradients folded as the reducer promises: the right half's
/// sum added into the left half's, over the smallest power of two of
/// leaves at least U.
fn fold_tree(grads: &[Option<Vec<f64>>], lo: usize, size: usize) -> Option<Vec<f64>> {
    if size == 1 {
        return grads.get(lo).cloned().flatten();
    }
    let left = fold_tree(grads, lo, size / 2);
    let right = fold_tree(grads, lo + size / 2, size / 2);
    match (left, right) {
        (Some(mut l), Some(r)) => {
            adg::Grad::add(&mut l, &r);
            Some(l)
        }
        (l, r) => l.or(r),
    }
}

/// The same units, left to right: another order, whose bits differ.
fn fold_in_order(grads: &[Option<Vec<f64>>]) -> Option<Vec<f64>> {
    grads.iter().flatten().cloned().reduce(|mut sum, g| {
        adg::Grad::add(&mut sum, &g);
        sum
    })
}

/// The rounds on this thread, a backward per unit and no reducer, the
/// units' gradients folded by `fold`.
/// A way to sum the units' gradients of one parameter.
type Fold = fn(&[Option<Vec<f64>>]) -> Option<Vec<f64>>;

fn train_by_hand(fold: Fold) -> Vec<u64> {
    let reg = Registry::<Vec<f64>>::new().unwrap();
    let m = Model::new(&reg);
    for round in 0..ROUNDS {
        let mut grads = [Vec::new(), Vec::new()];
        for unit in 0..UNITS {
            let loss = unit_loss(&reg, &m, round, unit, Sabotage::None).unwrap();
            let g = adg::backward(&loss, vec![1.0]).unwrap();
            for (p, param) in m.params.iter().enumerate() {
                grads[p].push(g.get(param).cloned());
            }
        }
        for (p, grads) in grads.iter().enumerate() {
            let sum = fold(grads).unwrap();
            sgd(&mut m.values[p].write().unwrap(), &sum);
        }
    }
    m.bits()
}

/// A reducer over m's parameters for t participants whose apply is SGD.
fn sgd_reducer(t: usize, m: &Model<'_>) -> Reducer<Vec<f64>> {
    let values = Arc::clone(&m.values);
    Reducer::builder(t, &m.params)
        .units(UNITS)
        .build(move |r| {
            if let Some(g) = r.sum() {
                sgd(&mut values[r.param()].write().unwrap(), g);
            }
            Ok(())
        })
        .unwrap()
}

/// The same, w's sum folded and applied in 3 slices.
fn sliced_sgd_reducer(t: usize, m: &Model<'_>) -> Reducer<Vec<f64>> {
    let (values, whole) = (Arc::clone(&m.values), Arc::clone(&m.values));
    Reducer::builder(t, &m.params)
        .units(UNITS)
        .slices(vec![3, 1], move |r| {
            assert_eq!((r.param(), r.slices()), (0, 3));
            sgd(&mut values[0].write().unwrap()[r.range()], r.values());
            Ok(())
        })
        .build(move |r| {
            assert_eq!(r.param(), 1); // b, whole
            if let Some(g) = r.sum() {
                sgd(&mut whole[1].write().unwrap(), g);
            }
            Ok(())
        })
        .unwrap()
}

/// A way to make the reducer of a model.
type MakeReducer = fn(usize, &Model<'_>) -> Reducer<Vec<f64>>;

/// The rounds on t threads through the reducer, each backward on `pool`
/// if given.
fn train_reducer(t: usize, pool: Option<&Pool>) -> Vec<u64> {
    train_through(t, pool, sgd_reducer)
}

/// The same through the reducer `make` makes.
fn train_through(t: usize, pool: Option<&Pool>, make: MakeReducer) -> Vec<u64> {
    let reg = Registry::<Vec<f64>>::new().unwrap();
    let m = Model::new(&reg);
    let red = make(t, &m);
    std::thread::scope(|s| {
        for p in 0..t {
            let (reg, m, red) = (&reg, &m, &red);
            s.spawn(move || {
                for round in 0..ROUNDS {
                    red.round(p, |unit| {
                        let loss = unit_loss(reg, m, round, unit, Sabotage::None)?;
                        let options = match pool {
                            Some(pool) => BackwardOptions::new().executor(pool),
                            None => BackwardOptions::new(),
                        };
                        adg::backward_with(&loss, vec![1.0], &red.hook(p, options))?;
                        Ok(())
                    })
                    .unwrap();
                }
            });
        }
    });
    assert_eq!(red.rounds(), ROUNDS);
    m.bits()
}

#[test]
fn same_bits_at_any_thread_count() {
    let tree = train_by_hand(|grads| fold_tree(grads, 0, UNITS.next_power_of_two()));
    // The data shows the order of a sum in its bits, so this test would
    // catch a reducer that folded in arrival or thread order.
    assert_ne!(tree, train_by_hand(fold_in_order));
    for t in 1..=4 {
        assert_eq!(train_reducer(t, None), tree, "T = {t}");
    }
    let pool = Pool::new(2).unwrap();
    assert_eq!(train_reducer(2, Some(&pool)), tree, "T = 2 on a pool");
}

#[test]
fn slices_give_the_same_bits() {
    let tree = train_by_hand(|grads| fold_tree(grads, 0, UNITS.next_power_of_two()));
    for t in 1..=4 {
        assert_eq!(train_through(t, None, sliced_sgd_reducer), tree, "T = {t}");
    }
}

#[test]
fn slices_need_a_count_per_parameter() {
    let reg = Registry::<Vec<f64>>::new().unwrap();
    let (a, b) = (reg.leaf().unwrap(), reg.leaf().unwrap());
    let built = Reducer::builder(2, [&a, &b])
        .slices(vec![2], |_| Ok(()))
        .build(|_| Ok(()));
    let e = built.expect_err("one count for two parameters");
    assert_eq!(e.code(), adg_sys::ADG_EINVAL);
    assert!(e.to_string().contains("1 counts for 2 parameters"), "{e}");
    // A count C refuses (0 slices) comes back with C's reason.
    let built = Reducer::builder(2, [&a, &b])
        .slices(vec![0, 1], |_| Ok(()))
        .build(|_| Ok(()));
    assert_eq!(built.expect_err("0 slices").code(), adg_sys::ADG_EINVAL);
}

#[test]
fn a_slice_fold_of_different_lengths_fails_the_round() {
    let reg = Registry::<Vec<f64>>::new().unwrap();
    let w = reg.leaf().unwrap();
    let red = Reducer::builder(1, [&w])
        .units(2)
        .slices(vec![2], |_| panic!("no apply after a failed fold"))
        .build(|_| Ok(()))
        .unwrap();
    let round = std::panic::catch_unwind(AssertUnwindSafe(|| {
        red.round(0, |unit| red.give(0, &w, vec![1.0; 3 + unit]))
    }));
    let payload = round.expect_err("the fold's panic, resumed on participant 0");
    let text = payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .unwrap_or_default();
    assert!(text.contains("different lengths"), "{text}");
    assert_eq!(red.rounds(), 1);
}

/// Runs round 0 whole, then round 1 with `sabotage` at unit 4, on t
/// threads; returns the weights after round 0, after round 1, and what
/// each participant's round 1 gave (Err: its panic's message).
#[allow(clippy::type_complexity)]
fn sabotaged_round(
    t: usize,
    sabotage: Sabotage,
) -> (
    Vec<u64>,
    Vec<u64>,
    Vec<Result<Result<(), adg::RoundError>, String>>,
) {
    let reg = Registry::<Vec<f64>>::new().unwrap();
    let m = Model::new(&reg);
    let red = sgd_reducer(t, &m);
    let run = |p: usize, round: u64, sabotage: Sabotage| {
        red.round(p, |unit| {
            let s = if unit == 4 { sabotage } else { Sabotage::None };
            let loss = unit_loss(&reg, &m, round, unit, s)?;
            adg::backward_with(&loss, vec![1.0], &red.hook(p, BackwardOptions::new()))?;
            Ok(())
        })
    };
    std::thread::scope(|s| {
        for p in 0..t {
            s.spawn(move || run(p, 0, Sabotage::None).unwrap());
        }
    });
    let before = m.bits();
    let results = std::thread::scope(|s| {
        let threads: Vec<_> = (0..t)
            .map(|p| s.spawn(move || catch_unwind(AssertUnwindSafe(|| run(p, 1, sabotage)))))
            .collect();
        threads
            .into_iter()
            .map(|h| {
                h.join().unwrap().map_err(|payload| {
                    payload
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .unwrap_or_default()
                })
            })
            .collect()
    });
    let after = m.bits();
    // The next round starts clean.
    std::thread::scope(|s| {
        for p in 0..t {
            s.spawn(move || run(p, 2, Sabotage::None).unwrap());
        }
    });
    assert_eq!(red.rounds(), 3);
    assert_ne!(m.bits(), after);
    (before, after, results)
}

#[test]
fn a_failed_round_fails_everywhere_and_applies_nothing() {
    let (before, after, results) = sabotaged_round(3, Sabotage::Error);
    assert_eq!(before, after, "a failed round applied something");
    for result in results {
        let e = result.expect("no panic").expect_err("the round failed");
        assert_eq!(e.code(), adg_sys::ADG_EUSER - 7);
        assert_eq!(e.site(), FailureSite::Participant);
        assert_eq!(e.round(), 1);
        assert_eq!(e.unit(), Some(4));
        assert!(e.participant().is_some_and(|p| p < 3));
        // The unit's own error, its reason included, on every thread.
        let cause = e.cause().expect("the failing unit's error");
        assert_eq!(cause.code(), adg_sys::ADG_EUSER - 7);
        assert!(cause.to_string().contains("a bad sample"), "{cause}");
        assert!(e.to_string().contains("round 1 abandoned"), "{e}");
        let as_error: Error = e.into();
        assert_eq!(as_error.code(), adg_sys::ADG_EUSER - 7);
    }
}

#[test]
fn a_step_panic_fails_the_round_and_unwinds_its_own_thread() {
    let (before, after, results) = sabotaged_round(2, Sabotage::Panic);
    assert_eq!(before, after, "a failed round applied something");
    let panicked: Vec<_> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert_eq!(
        panicked,
        ["a step's panic"],
        "one thread, the unit's, unwinds"
    );
    for result in results.into_iter().filter_map(Result::ok) {
        let e = result.expect_err("the round failed");
        assert_eq!(e.code(), adg_sys::ADG_ETHREW);
        assert_eq!(e.site(), FailureSite::Participant);
        assert_eq!(e.unit(), Some(4));
    }
}

/// A reducer of plain f64 over one parameter, whose units' gradients are
/// handed over with give; apply records the sums.
fn give_reducer(
    t: usize,
    units: usize,
    w: &Node<'_, f64>,
    apply: impl Fn(adg::Reduction<'_, f64>) -> adg::Result<()> + Send + Sync + 'static,
) -> Reducer<f64> {
    Reducer::builder(t, [w]).units(units).build(apply).unwrap()
}

#[test]
fn give_folds_in_the_unit_tree() {
    // Left to right this sums to 1; the tree ((u0 + u1) + (u2 + u3)) to 0.
    let grads = [1e16, 1.0, -1e16, 1.0];
    for t in [1, 2] {
        let reg = Registry::<f64>::new().unwrap();
        let w = reg.leaf().unwrap();
        let sums = Arc::new(RwLock::new(Vec::new()));
        let red = {
            let sums = Arc::clone(&sums);
            give_reducer(t, grads.len(), &w, move |r| {
                assert_eq!(r.units(), 0..4);
                sums.write()
                    .unwrap()
                    .push((r.param(), r.round(), r.sum().copied()));
                Ok(())
            })
        };
        std::thread::scope(|s| {
            for p in 0..t {
                let (red, w) = (&red, &w);
                s.spawn(move || {
                    red.round(p, |unit| red.give(p, w, grads[unit])).unwrap();
                });
            }
        });
        assert_eq!(*sums.read().unwrap(), [(0, 0, Some(0.0))], "T = {t}");
    }
}

#[test]
fn an_apply_error_is_every_participants() {
    let reg = Registry::<f64>::new().unwrap();
    let w = reg.leaf().unwrap();
    let red = give_reducer(2, 2, &w, |_| {
        Err(Error::new(adg_sys::ADG_EUSER - 1, "no step today"))
    });
    let results: Vec<_> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..2)
            .map(|p| {
                let (red, w) = (&red, &w);
                s.spawn(move || red.round(p, |_| red.give(p, w, 1.0)))
            })
            .collect();
        threads.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for result in results {
        let e = result.unwrap_err();
        assert_eq!(e.site(), FailureSite::Apply);
        assert_eq!(e.param_id(), Some(w.id()));
        assert_eq!(e.code(), adg_sys::ADG_EUSER - 1);
        assert_eq!(e.cause().map(Error::code), Some(adg_sys::ADG_EUSER - 1));
    }
}

#[test]
fn an_apply_panic_resumes_on_participant_0() {
    let reg = Registry::<f64>::new().unwrap();
    let w = reg.leaf().unwrap();
    let red = give_reducer(3, 3, &w, |_| panic!("apply's panic"));
    let results: Vec<_> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..3)
            .map(|p| {
                let (red, w) = (&red, &w);
                s.spawn(move || red.round(p, |_| red.give(p, w, 1.0)))
            })
            .collect();
        threads.into_iter().map(|h| h.join()).collect()
    });
    let mut results = results.into_iter();
    let payload = results.next().unwrap().expect_err("participant 0 unwinds");
    assert_eq!(payload.downcast_ref::<&str>(), Some(&"apply's panic"));
    for result in results {
        let e = result.expect("no panic").unwrap_err();
        assert_eq!(e.site(), FailureSite::Apply);
        assert_eq!(e.code(), adg_sys::ADG_ETHREW);
    }
    assert_eq!(red.rounds(), 1);
}

#[test]
fn misuse_is_refused_and_changes_nothing() {
    let reg = Registry::<f64>::new().unwrap();
    let (w, x) = (reg.leaf().unwrap(), reg.leaf().unwrap());
    let red = give_reducer(1, 2, &w, |_| Ok(()));
    assert_eq!((red.participants(), red.units()), (1, Some(2)));
    // No unit dealt yet; x is not a parameter; participant 1 of 1.
    assert_eq!(
        red.give(0, &w, 1.0).unwrap_err().code(),
        adg_sys::ADG_ESTATE
    );
    assert_eq!(red.next_unit(1).unwrap_err().code(), adg_sys::ADG_EINVAL);
    let y = reg.op(&[&w], |call| call.give(0, 1.0)).unwrap();
    let e = adg::backward_with(&y, 1.0, &red.hook(1, BackwardOptions::new())).unwrap_err();
    assert_eq!(
        e.code(),
        adg_sys::ADG_EINVAL,
        "a hook for participant 1 of 1"
    );
    assert_eq!(red.unit_end(0).unwrap_err().code(), adg_sys::ADG_ESTATE);
    let refused = red.end(1, Ok(())).unwrap_err();
    assert_eq!(
        (refused.site(), refused.code()),
        (FailureSite::Call, adg_sys::ADG_EINVAL)
    );
    assert_eq!(red.next_unit(0).unwrap(), Some(0));
    assert_eq!(
        red.give(0, &x, 1.0).unwrap_err().code(),
        adg_sys::ADG_EINVAL
    );
    red.give(0, &w, 1.0).unwrap();
    assert_eq!(
        red.give(0, &w, 2.0).unwrap_err().code(),
        adg_sys::ADG_ESTATE
    );
    assert_eq!(red.next_unit(0).unwrap_err().code(), adg_sys::ADG_ESTATE);
    red.unit_end(0).unwrap();
    // Ending the round with unit 1 never dealt fails it.
    let e = red.end(0, Ok(())).unwrap_err();
    assert_eq!(
        (e.site(), e.code()),
        (FailureSite::Units, adg_sys::ADG_ESTATE)
    );
    assert_eq!(red.rounds(), 1);
    // Without units, next_unit is out of order.
    let shares = Reducer::builder(1, [&w]).build(|_| Ok(())).unwrap();
    assert_eq!(shares.units(), None);
    assert_eq!(shares.next_unit(0).unwrap_err().code(), adg_sys::ADG_ESTATE);
    // A reducer with no parameter, or none of its participants.
    let none: [&Node<'_, f64>; 0] = [];
    let e = Reducer::builder(1, none).build(|_| Ok(())).unwrap_err();
    assert_eq!(e.code(), adg_sys::ADG_EINVAL);
    assert_eq!(
        Reducer::builder(0, [&w])
            .build(|_| Ok(()))
            .unwrap_err()
            .code(),
        adg_sys::ADG_EINVAL
    );
}

#[test]
fn without_units_each_participant_is_one() {
    let reg = Registry::<f64>::new().unwrap();
    let w = reg.leaf().unwrap();
    let sum = Arc::new(RwLock::new(None));
    let red = {
        let sum = Arc::clone(&sum);
        Reducer::builder(2, [&w])
            .apply_early(true)
            .build(move |r| {
                *sum.write().unwrap() = r.sum().copied();
                Ok(())
            })
            .unwrap()
    };
    std::thread::scope(|s| {
        for p in 0..2 {
            let (red, w) = (&red, &w);
            s.spawn(move || {
                red.round(p, |unit| {
                    assert_eq!(unit, p, "without units, f gets the participant");
                    red.give(p, w, (p + 1) as f64)
                })
                .unwrap()
            });
        }
    });
    assert_eq!(*sum.read().unwrap(), Some(3.0));
}

#[test]
fn a_reducer_is_send_and_sync() {
    fn shared<S: Send + Sync>() {}
    shared::<Reducer<f64>>();
    shared::<Reducer<Vec<f32>>>();
}

/// The sum of units [lo, lo + size) of a job of `total` units from the
/// ranks' partial sums (first unit, units, sum), in the job's tree.
fn fold_partials(
    partials: &[(usize, usize, f64)],
    lo: usize,
    size: usize,
    total: usize,
) -> Option<f64> {
    if lo >= total {
        return None;
    }
    let units = size.min(total - lo);
    if let Some(&(_, _, sum)) = partials.iter().find(|p| (p.0, p.1) == (lo, units)) {
        return Some(sum);
    }
    assert!(size > 1, "no partial sum covers unit {lo}");
    let left = fold_partials(partials, lo, size / 2, total);
    let right = fold_partials(partials, lo + size / 2, size / 2, total);
    match (left, right) {
        (Some(l), Some(r)) => Some(l + r),
        (l, r) => l.or(r),
    }
}

#[test]
fn ranks_fold_their_partial_sums_to_one_reducers_bits() {
    // Order-sensitive: left to right gives another sum than the tree.
    let grads = [1e16, 1.0, -1e16, 1.0, 3.0, 1e-3];
    let total = grads.len();
    let reg = Registry::<f64>::new().unwrap();
    let w = reg.leaf().unwrap();
    // One reducer of every unit, on two threads.
    let whole = Arc::new(RwLock::new(Vec::new()));
    let red = {
        let whole = Arc::clone(&whole);
        give_reducer(2, total, &w, move |r| {
            whole.write().unwrap().push(r.sum().copied().unwrap());
            Ok(())
        })
    };
    std::thread::scope(|s| {
        for p in 0..2 {
            let (red, w) = (&red, &w);
            s.spawn(move || red.round(p, |unit| red.give(p, w, grads[unit])).unwrap());
        }
    });
    // Two ranks: units 0..3 and 3..6, their partial sums kept by range.
    let partials = Arc::new(RwLock::new(Vec::new()));
    for (first, units) in [(0, 3), (3, 3)] {
        let partials = Arc::clone(&partials);
        let rank = Reducer::builder(1, [&w])
            .units(units)
            .unit_range(first, total)
            .build(move |r| {
                let range = r.units();
                let sum = r.sum().copied().unwrap();
                partials
                    .write()
                    .unwrap()
                    .push((range.start, range.len(), sum));
                Ok(())
            })
            .unwrap();
        rank.round(0, |unit| rank.give(0, &w, grads[unit])).unwrap();
    }
    let partials = partials.read().unwrap();
    assert!(
        partials.len() > 2,
        "each rank gives the largest subtrees in its range"
    );
    let folded = fold_partials(&partials, 0, total.next_power_of_two(), total).unwrap();
    assert_eq!(*whole.read().unwrap(), [folded]);
    assert_ne!(
        folded,
        grads.iter().sum::<f64>(),
        "the data shows the order"
    );
}
