//! Exact sums (`ExactSum`, adg/exact.h): each sum rounded once, correctly,
//! from the exact total of its terms, so the same bits in any order and
//! grouping; errors that change nothing; and a reducer over the threads'
//! accumulators, samples dealt to whichever thread is free, giving the
//! same weights at every thread count.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use adg::{code, ExactSum, Grad, Node, Reducer, Registry};

/// xorshift64*: the tests' numbers, the same on every run.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(2_685_821_657_736_338_717)
    }

    /// 0 to n - 1.
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// k * 2^e for a random 24-bit k of either sign and e in
    /// [lo, lo + span): terms of many scales.
    fn term(&mut self, lo: i32, span: u64) -> f32 {
        let k = (self.next() >> 40) as f32 - 8_388_608.0; // |k| <= 2^23
        let e = lo + (self.next() % span) as i32;
        k * pow2(e)
    }
}

/// 2^e, exactly, for e in [-149, 127] (`powi` of a negative e divides by
/// a power that may overflow).
fn pow2(e: i32) -> f32 {
    assert!((-149..=127).contains(&e));
    if e >= -126 {
        f32::from_bits(((e + 127) as u32) << 23)
    } else {
        f32::from_bits(1 << (e + 149))
    }
}

/// The sum of `terms`, each added alone to one sum, rounded.
fn sum_of(terms: &[f32]) -> f32 {
    let mut sum = ExactSum::new(1).unwrap();
    for t in terms {
        sum.add(0, std::slice::from_ref(t)).unwrap();
    }
    sum.rounded()[0]
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn assert_bits(got: f32, want: f32) {
    assert_eq!(
        got.to_bits(),
        want.to_bits(),
        "got {got:e} ({:#010x}), want {want:e} ({:#010x})",
        got.to_bits(),
        want.to_bits()
    );
}

// ------------------------------------------------------------- exactness

#[test]
fn sums_that_floats_lose_are_exact() {
    let (big, small) = (pow2(100), pow2(-100));
    assert_bits(big + small - big, 0.0); // what float addition gives
    assert_bits(sum_of(&[big, small, -big]), small);
    assert_bits(sum_of(&[big, small, -big, -small]), 0.0);
    // Subnormals, exactly: 3 * 2^-149.
    let tiny = f32::from_bits(1);
    assert_bits(sum_of(&[tiny, tiny, tiny]), f32::from_bits(3));
    assert_bits(
        sum_of(&[f32::MIN_POSITIVE, -tiny]),
        f32::from_bits(0x007f_ffff),
    );
    // Past f32::MAX and back: float addition would stay infinite.
    assert_bits(f32::MAX + f32::MAX - f32::MAX, f32::INFINITY);
    assert_bits(sum_of(&[f32::MAX, f32::MAX, -f32::MAX]), f32::MAX);
    assert_bits(sum_of(&[f32::MAX, f32::MAX]), f32::INFINITY);
    assert_bits(sum_of(&[-f32::MAX, -f32::MAX]), f32::NEG_INFINITY);
}

#[test]
fn rounding_is_to_nearest_ties_to_even() {
    let ulp = pow2(-23); // of 1
    let half = pow2(-24);
    // A tie above an even mantissa stays; above an odd one goes up.
    assert_bits(sum_of(&[1.0, half]), 1.0);
    assert_bits(sum_of(&[1.0 + ulp, half]), 1.0 + 2.0 * ulp);
    // Anything past the tie, however far below, breaks it.
    assert_bits(sum_of(&[1.0, half, pow2(-140)]), 1.0 + ulp);
    assert_bits(sum_of(&[1.0, half, -pow2(-140)]), 1.0);
    assert_bits(sum_of(&[-1.0, -half, -f32::from_bits(1)]), -1.0 - ulp);
    // Rounding up carries into the exponent.
    assert_bits(sum_of(&[2.0 - ulp, half]), 2.0);
}

#[test]
fn a_sum_of_zero_is_positive_zero() {
    assert_eq!(bits(&ExactSum::new(3).unwrap().rounded()), [0; 3]);
    assert_bits(sum_of(&[-0.0]), 0.0);
    assert_bits(sum_of(&[-0.0, -0.0]), 0.0);
    assert_bits(sum_of(&[1.0, -1.0]), 0.0);
    assert_bits(sum_of(&[-1.0, 1.0, -0.0]), 0.0);
}

/// Terms k * 2^e, |k| <= 2^23, e in [-20, -10]: an f64 sums a few hundred
/// of them exactly, and rounding it to f32 is the correctly rounded sum.
#[test]
fn random_sums_round_as_their_exact_value() {
    const SUMS: usize = 16;
    let mut rng = Rng::new(1);
    let mut sum = ExactSum::new(SUMS).unwrap();
    let mut want = [0f64; SUMS];
    let mut row = [0f32; SUMS];
    for _ in 0..400 {
        for (r, w) in row.iter_mut().zip(want.iter_mut()) {
            *r = rng.term(-20, 11);
            *w += f64::from(*r);
        }
        sum.add(0, &row).unwrap(); // one term to each sum
    }
    let want: Vec<f32> = want.iter().map(|&w| w as f32).collect();
    assert_eq!(bits(&sum.rounded()), bits(&want));
    // A range of them.
    let mut out = [0f32; 5];
    sum.round(7, &mut out).unwrap();
    assert_eq!(bits(&out), bits(&want[7..12]));
}

#[test]
fn add_merge_and_clear_work_on_their_ranges() {
    let mut a = ExactSum::new(4).unwrap();
    let mut b = ExactSum::new(4).unwrap();
    assert_eq!((a.len(), a.is_empty()), (4, false));
    a.add(1, &[1.0, 2.0]).unwrap();
    b.add(0, &[10.0, 20.0, 30.0, 40.0]).unwrap();
    a.merge_range(&b, 2, 2).unwrap();
    assert_eq!(a.rounded(), [0.0, 1.0, 32.0, 40.0]);
    a.merge(&b).unwrap();
    assert_eq!(a.rounded(), [10.0, 21.0, 62.0, 80.0]);
    assert_eq!(b.rounded(), [10.0, 20.0, 30.0, 40.0]); // only read
    Grad::add(&mut a, &b);
    assert_eq!(a.rounded(), [20.0, 41.0, 92.0, 120.0]);
    a.add(4, &[]).unwrap(); // an empty range at the end
    a.merge_range(&b, 4, 0).unwrap();
    a.round(4, &mut []).unwrap();
    a.clear();
    assert_eq!(bits(&a.rounded()), [0; 4]);
    a.add(3, &[-0.5]).unwrap();
    assert_eq!(a.rounded(), [0.0, 0.0, 0.0, -0.5]);
}

// ----------------------------------------------------- order independence

#[test]
fn any_order_and_grouping_gives_the_same_bits() {
    const SUMS: usize = 8;
    const TERMS: usize = 600;
    let mut rng = Rng::new(2);
    // Rows of terms from 2^-149 to near f32::MAX's scale, both signs:
    // the sums' bits depend on the order a float accumulator takes.
    let rows: Vec<[f32; SUMS]> = (0..TERMS)
        .map(|_| std::array::from_fn(|_| rng.term(-149, 240)))
        .collect();
    fn float_sum<'a>(rows: impl Iterator<Item = &'a [f32; SUMS]>) -> Vec<f32> {
        rows.fold(vec![0f32; SUMS], |mut s, row| {
            s.iter_mut().zip(row).for_each(|(s, r)| *s += r);
            s
        })
    }
    assert_ne!(
        bits(&float_sum(rows.iter())),
        bits(&float_sum(rows.iter().rev())),
        "the data shows order in float sums"
    );

    let mut in_order = ExactSum::new(SUMS).unwrap();
    for row in &rows {
        in_order.add(0, row).unwrap();
    }
    let want = bits(&in_order.rounded());

    for seed in 0..3 {
        let mut rng = Rng::new(100 + seed);
        let mut order: Vec<usize> = (0..TERMS).collect();
        for i in (1..TERMS).rev() {
            order.swap(i, rng.below(i + 1)); // Fisher-Yates
        }
        // Five accumulators, each row to one at random, some rows in two
        // pieces.
        let mut parts: Vec<ExactSum> = (0..5).map(|_| ExactSum::new(SUMS).unwrap()).collect();
        for &i in &order {
            let part = &mut parts[rng.below(5)];
            let cut = rng.below(SUMS + 1);
            part.add(0, &rows[i][..cut]).unwrap();
            part.add(cut, &rows[i][cut..]).unwrap();
        }
        // Merged in another order: 3 into 1, then 4, 0, 2 and 1 into a
        // fresh one, the last in two ranges.
        let (low, high) = parts.split_at_mut(3);
        low[1].merge(&high[0]).unwrap();
        let mut total = ExactSum::new(SUMS).unwrap();
        for k in [4, 0, 2] {
            total.merge(&parts[k]).unwrap();
        }
        total.merge_range(&parts[1], 0, 3).unwrap();
        total.merge_range(&parts[1], 3, SUMS - 3).unwrap();
        assert_eq!(bits(&total.rounded()), want, "order {seed}");
    }
}

// ---------------------------------------------------------------- errors

#[test]
fn bad_ranges_are_einval_and_change_nothing() {
    assert_eq!(ExactSum::new(0).unwrap_err().code(), code::EINVAL);
    assert_eq!(ExactSum::new(usize::MAX).unwrap_err().code(), code::EINVAL);
    let mut sum = ExactSum::new(3).unwrap();
    sum.add(0, &[1.0, 2.0, 3.0]).unwrap();
    let before = bits(&sum.rounded());
    let e = sum.add(2, &[1.0, 1.0]).unwrap_err();
    assert_eq!((e.code(), e.name()), (code::EINVAL, "ADG_EINVAL"));
    assert!(!e.reason().is_empty());
    assert_eq!(sum.add(4, &[]).unwrap_err().code(), code::EINVAL);
    assert_eq!(
        sum.add(usize::MAX, &[1.0]).unwrap_err().code(),
        code::EINVAL
    );
    let other = ExactSum::new(3).unwrap();
    assert_eq!(
        sum.merge_range(&other, 1, 3).unwrap_err().code(),
        code::EINVAL
    );
    let mut out = [7.0f32; 2];
    assert_eq!(sum.round(2, &mut out).unwrap_err().code(), code::EINVAL);
    assert_eq!(out, [7.0; 2]); // untouched
    assert_eq!(bits(&sum.rounded()), before);
}

#[test]
fn a_non_finite_value_is_evalue_and_adds_nothing() {
    let mut sum = ExactSum::new(3).unwrap();
    sum.add(0, &[1.0, pow2(-60), -3.0]).unwrap();
    let before = bits(&sum.rounded());
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let e = sum.add(0, &[5.0, bad, 6.0]).unwrap_err();
        assert_eq!((e.code(), e.name()), (code::EVALUE, "ADG_EVALUE"));
        assert!(e.reason().contains("values[1]"), "{}", e.reason());
        assert_eq!(bits(&sum.rounded()), before, "{bad} added nothing");
    }
}

#[test]
fn merges_of_different_lengths_fail() {
    let mut a = ExactSum::new(3).unwrap();
    a.add(0, &[1.0, 2.0, 3.0]).unwrap();
    let mut b = ExactSum::new(2).unwrap();
    b.add(0, &[4.0, 5.0]).unwrap();
    let e = a.merge(&b).unwrap_err();
    assert_eq!(e.code(), code::EINVAL);
    assert_eq!(b.merge(&a).unwrap_err().code(), code::EINVAL);
    assert_eq!(a.merge_range(&b, 0, 1).unwrap_err().code(), code::EINVAL);
    assert_eq!(a.rounded(), [1.0, 2.0, 3.0]);
    // As a gradient, it panics as the Vec gradients do.
    let panicked = catch_unwind(AssertUnwindSafe(|| Grad::add(&mut a, &b))).unwrap_err();
    let message = panicked.downcast_ref::<String>().unwrap();
    assert!(message.contains("different lengths"), "{message}");
    assert_eq!(a.rounded(), [1.0, 2.0, 3.0]);
}

#[test]
fn an_exact_sum_is_send_and_sync() {
    fn shared<S: Send + Sync>() {}
    shared::<ExactSum>();
    shared::<Reducer<ExactSum>>();
}

// ------------------------------------------------------ through a reducer

/// A trainer whose work cannot be cut into fixed units: each round's
/// SAMPLES samples are taken one at a time by whichever thread is free,
/// each sample's gradient added to the thread's own accumulator of each
/// parameter, which it gives to a `Reducer<ExactSum>` at the round's end;
/// apply rounds the sum and steps the weights. The weights must be the
/// same bits at every T, and those of one thread summing in order.
const LENS: [usize; 2] = [33, 4];
const SAMPLES: usize = 13;
const ROUNDS: usize = 4;
const RATE: f32 = 0.01;

type Weights = Arc<Vec<RwLock<Vec<f32>>>>;

fn initial_weights(lens: [usize; 2]) -> Weights {
    Arc::new(lens.iter().map(|&n| RwLock::new(vec![0.5; n])).collect())
}

/// Sample s's gradient of parameter p in round r: values of every scale
/// and sign, depending on the weights as a real gradient would.
fn gradient(weights: &Weights, p: usize, r: usize, s: usize) -> Vec<f32> {
    let mut rng = Rng::new((r * 1_000_003 + s * 7919 + p * 31 + 1) as u64);
    let w = weights[p].read().unwrap();
    w.iter().map(|&w| rng.term(-40, 40) + 0.001 * w).collect()
}

fn step(weights: &Weights, p: usize, grad: &[f32]) {
    let mut w = weights[p].write().unwrap();
    for (w, g) in w.iter_mut().zip(grad) {
        *w -= RATE * g;
    }
}

fn weight_bits(weights: &Weights) -> Vec<u32> {
    weights
        .iter()
        .flat_map(|w| bits(&w.read().unwrap()))
        .collect()
}

/// The rounds on this thread, parameters of lens sums: each parameter's
/// samples summed in order.
fn train_in_order(lens: [usize; 2]) -> Vec<u32> {
    let weights = initial_weights(lens);
    for r in 0..ROUNDS {
        let mut sums = lens.map(|n| ExactSum::new(n).unwrap());
        for s in 0..SAMPLES {
            for (p, sum) in sums.iter_mut().enumerate() {
                sum.add(0, &gradient(&weights, p, r, s)).unwrap();
            }
        }
        for (p, sum) in sums.iter().enumerate() {
            step(&weights, p, &sum.rounded());
        }
    }
    weight_bits(&weights)
}

/// The rounds on t threads through red, parameters of lens sums: each
/// round's samples taken one at a time by whichever thread is free, added
/// to the thread's own accumulators, which it gives at the round's end.
fn participate(
    red: &Reducer<ExactSum>,
    params: &[Node<'_, ExactSum>; 2],
    weights: &Weights,
    lens: [usize; 2],
    t: usize,
    seed: u64,
) {
    let next: Vec<AtomicUsize> = (0..ROUNDS).map(|_| AtomicUsize::new(0)).collect();
    std::thread::scope(|scope| {
        for me in 0..t {
            let next = &next;
            scope.spawn(move || {
                let mut rng = Rng::new(seed * 101 + me as u64);
                for (r, next) in next.iter().enumerate() {
                    red.round(me, |_| {
                        let mut mine = lens.map(|n| ExactSum::new(n).unwrap());
                        loop {
                            let s = next.fetch_add(1, Ordering::Relaxed);
                            if s >= SAMPLES {
                                break;
                            }
                            for (p, sum) in mine.iter_mut().enumerate() {
                                sum.add(0, &gradient(weights, p, r, s))?;
                            }
                            if rng.below(3) == 0 {
                                std::thread::yield_now(); // vary the deal
                            }
                        }
                        for (param, sum) in params.iter().zip(mine) {
                            red.give(me, param, sum)?;
                        }
                        Ok(())
                    })
                    .unwrap();
                }
            });
        }
    });
    assert_eq!(red.rounds(), ROUNDS as u64);
}

/// The same rounds on t threads through a `Reducer<ExactSum>`.
fn train_reducer(t: usize, seed: u64) -> Vec<u32> {
    let weights = initial_weights(LENS);
    let reg = Registry::<ExactSum>::new().unwrap();
    let params = [reg.leaf().unwrap(), reg.leaf().unwrap()];
    let red = {
        let weights = Arc::clone(&weights);
        Reducer::builder(t, &params)
            .build(move |r| {
                let sum = r.sum().expect("every participant gives a sum");
                step(&weights, r.param(), &sum.rounded());
                Ok(())
            })
            .unwrap()
    };
    participate(&red, &params, &weights, LENS, t, seed);
    weight_bits(&weights)
}

#[test]
fn a_reducer_of_exact_sums_gives_the_same_weights_at_every_t() {
    let want = train_in_order(LENS);
    for t in 1..=3 {
        for seed in 0..2 {
            assert_eq!(train_reducer(t, seed), want, "T = {t}, seed {seed}");
        }
    }
}

// ------------------------------------------------------- reducer in slices

/// The same trainer with a parameter of SLICED_LEN sums in 4 slices,
/// whose applies round their ranges side by side, and another whole; the
/// samples again taken as they come.
const SLICED_LENS: [usize; 2] = [301, 7];
const SLICES: usize = 4;

/// The same rounds on t threads through a `Reducer<ExactSum>` with
/// parameter 0 in slices; returns the weights and each slice's applies.
fn train_sliced(t: usize, seed: u64) -> (Vec<u32>, Vec<usize>) {
    let weights = initial_weights(SLICED_LENS);
    let reg = Registry::<ExactSum>::new().unwrap();
    let params = [reg.leaf().unwrap(), reg.leaf().unwrap()];
    let applied: Arc<Vec<AtomicUsize>> =
        Arc::new((0..SLICES).map(|_| AtomicUsize::new(0)).collect());
    let red = {
        let (weights, whole_weights) = (Arc::clone(&weights), Arc::clone(&weights));
        let applied = Arc::clone(&applied);
        Reducer::builder(t, &params)
            .slices(vec![SLICES, 1], move |r| {
                assert_eq!((r.param(), r.slices()), (0, SLICES));
                let len = SLICED_LENS[0];
                let (k, n) = (r.slice(), r.slices());
                assert_eq!(r.range(), len * k / n..len * (k + 1) / n);
                let grad = r.rounded();
                let mut same = vec![0.0; grad.len()];
                r.round_into(&mut same)?;
                assert_eq!(bits(&same), bits(&grad));
                let e = r.round_into(&mut [0.0; 1]).unwrap_err();
                assert_eq!(e.code(), code::EINVAL);
                // Each slice steps its own range, under the one lock.
                let mut w = weights[0].write().unwrap();
                for (w, g) in w[r.range()].iter_mut().zip(&grad) {
                    *w -= RATE * g;
                }
                applied[k].fetch_add(1, Ordering::Relaxed);
                Ok(())
            })
            .build(move |r| {
                assert_eq!(r.param(), 1);
                let sum = r.sum().expect("every participant gives a sum");
                step(&whole_weights, 1, &sum.rounded());
                Ok(())
            })
            .unwrap()
    };
    participate(&red, &params, &weights, SLICED_LENS, t, seed);
    let applied = applied.iter().map(|a| a.load(Ordering::Relaxed)).collect();
    (weight_bits(&weights), applied)
}

#[test]
fn a_reducer_of_exact_sums_in_slices_gives_the_in_order_bits() {
    let want = train_in_order(SLICED_LENS);
    for t in 1..=3 {
        for seed in 0..3 {
            let (got, applied) = train_sliced(t, seed);
            let differ = got.iter().zip(&want).filter(|(g, w)| g != w).count();
            assert_eq!(differ, 0, "T = {t}, seed {seed}: weights that differ");
            assert_eq!(
                applied, [ROUNDS; SLICES],
                "T = {t}: each slice once a round"
            );
        }
    }
}

#[test]
fn an_exact_slice_fold_of_different_lengths_fails_the_round() {
    let reg = Registry::<ExactSum>::new().unwrap();
    let w = reg.leaf().unwrap();
    let red = Reducer::builder(1, [&w])
        .units(2)
        .slices(vec![2], |_| panic!("no apply after a failed fold"))
        .build(|_| Ok(()))
        .unwrap();
    let round = catch_unwind(AssertUnwindSafe(|| {
        red.round(0, |unit| red.give(0, &w, ExactSum::new(3 + unit).unwrap()))
    }));
    let payload = round.expect_err("the fold's panic, resumed on participant 0");
    let text = payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .unwrap_or_default();
    assert!(text.contains("different lengths"), "{text}");
    assert_eq!(red.rounds(), 1);
}

// ----------------------------------------------------------------- clone

#[test]
fn a_clone_is_exact_and_then_its_own() {
    let mut rng = Rng::new(3);
    let mut a = ExactSum::new(9).unwrap();
    for _ in 0..50 {
        let row: Vec<f32> = (0..9).map(|_| rng.term(-149, 240)).collect();
        a.add(0, &row).unwrap();
    }
    let want = bits(&a.rounded());
    let mut b = a.clone();
    assert_eq!(b.len(), 9);
    assert_eq!(bits(&b.rounded()), want);
    // The same sums, not just their roundings: cancelling a's terms from
    // either leaves 0 in both.
    let mut minus = ExactSum::new(9).unwrap();
    let mut rng = Rng::new(3);
    for _ in 0..50 {
        let row: Vec<f32> = (0..9).map(|_| -rng.term(-149, 240)).collect();
        minus.add(0, &row).unwrap();
    }
    let mut c = b.clone();
    c.merge(&minus).unwrap();
    assert_eq!(bits(&c.rounded()), [0; 9]);
    // Then each changes alone.
    b.add(0, &[pow2(100); 9]).unwrap();
    assert_eq!(bits(&a.rounded()), want);
    a.clear();
    assert_ne!(bits(&b.rounded()), [0; 9]);
    b.merge(&minus).unwrap();
    assert_eq!(bits(&b.rounded()), bits(&[pow2(100); 9]));
    // clone_from, of the same length and of another.
    let mut d = ExactSum::new(9).unwrap();
    d.add(0, &[1.0; 9]).unwrap();
    d.clone_from(&c);
    assert_eq!(bits(&d.rounded()), [0; 9]);
    let mut e = ExactSum::new(2).unwrap();
    e.clone_from(&b);
    assert_eq!((e.len(), bits(&e.rounded())), (9, bits(&[pow2(100); 9])));
}
