//! A small trainer on T threads through the reducer: a network of one
//! hidden layer fit to synthetic data by SGD, each batch cut into work
//! units of a fixed number of samples. Whichever thread is free takes the
//! next unit and runs its forward and backward; the reducer sums each
//! weight's unit gradients in a fixed tree over unit indices and applies
//! the step once per batch. So the weights are the same to the last bit at
//! every thread count, which this checks.
//!
//! ```text
//! cargo run --example trainer                 # T = 1, 2, 3, 4
//! cargo run --example trainer -- --threads 3  # or a list: 1,2,8
//! ```

use std::ops::Range;
use std::process::ExitCode;
use std::sync::{Arc, RwLock};

use adg::{BackwardOptions, Node, Reducer, Registry};

const IN: usize = 4;
const HIDDEN: usize = 16;
const SAMPLES: usize = 512;
const BATCH: usize = 64;
/// Samples per work unit: U = BATCH / UNIT units a batch, whatever T.
const UNIT: usize = 8;
const ROUNDS: usize = 200;
const RATE: f64 = 0.5;

/// The weights, W1 (HIDDEN x IN), b1, w2 and b2, in that order: the forward
/// reads them, the reducer's apply writes them, between rounds.
type Weights = Arc<[RwLock<Vec<f64>>; 4]>;

/// Synthetic data from a fixed seed: inputs in (-1, 1), and a target that
/// a small network can learn.
fn data() -> (Vec<[f64; IN]>, Vec<f64>) {
    let mut state = 42u64;
    let mut uniform = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    };
    let xs: Vec<[f64; IN]> = (0..SAMPLES).map(|_| [(); IN].map(|()| uniform())).collect();
    let ys = xs
        .iter()
        .map(|x| (x[0] * x[1] + x[2]).sin() - 0.5 * x[3])
        .collect();
    (xs, ys)
}

fn init_weights() -> Weights {
    let mut state = 7u64;
    let mut small = move |n: usize| -> Vec<f64> {
        (0..n)
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
                ((state >> 11) as f64 / (1u64 << 53) as f64 - 0.5) * 0.8
            })
            .collect()
    };
    Arc::new([
        RwLock::new(small(HIDDEN * IN)),
        RwLock::new(vec![0.0; HIDDEN]),
        RwLock::new(small(HIDDEN)),
        RwLock::new(vec![0.0]),
    ])
}

/// The loss of the samples in `rows`, half their squared error over the
/// batch, as two ops: the hidden layer tanh(W1 x + b1) over (W1, b1), and
/// the output w2 . h + b2 and its error over (hidden, w2, b2). Each step
/// gives its parents' gradients for the unit's samples.
fn unit_loss<'r>(
    reg: &'r Registry<Vec<f64>>,
    params: &[Node<'r, Vec<f64>>],
    weights: &Weights,
    (xs, ys): (&[[f64; IN]], &[f64]),
    rows: Range<usize>,
) -> adg::Result<Node<'r, Vec<f64>>> {
    let [w1, b1, w2, b2] = [0, 1, 2, 3].map(|i| weights[i].read().unwrap().clone());
    let xs = xs[rows.clone()].to_vec();
    let h: Vec<[f64; HIDDEN]> = xs
        .iter()
        .map(|x| {
            std::array::from_fn(|j| {
                let pre: f64 = (0..IN).map(|i| w1[j * IN + i] * x[i]).sum();
                (pre + b1[j]).tanh()
            })
        })
        .collect();
    let err: Vec<f64> = h
        .iter()
        .zip(&ys[rows])
        .map(|(h, y)| h.iter().zip(&w2).map(|(h, w)| h * w).sum::<f64>() + b2[0] - y)
        .collect();

    let hidden = {
        let h = h.clone();
        reg.op(&[&params[0], &params[1]], move |call| {
            let Some(dh) = call.grad() else { return Ok(()) };
            let (mut dw1, mut db1) = (vec![0.0; HIDDEN * IN], vec![0.0; HIDDEN]);
            for (s, x) in xs.iter().enumerate() {
                for j in 0..HIDDEN {
                    let dpre = dh[s * HIDDEN + j] * (1.0 - h[s][j] * h[s][j]);
                    db1[j] += dpre;
                    for i in 0..IN {
                        dw1[j * IN + i] += dpre * x[i];
                    }
                }
            }
            call.give(0, dw1)?;
            call.give(1, db1)
        })?
    };
    reg.op(&[&hidden, &params[2], &params[3]], move |call| {
        let seed = call.grad().map_or(1.0, |g| g[0]);
        let (mut dh, mut dw2, mut db2) = (Vec::new(), vec![0.0; HIDDEN], 0.0);
        for (h, e) in h.iter().zip(&err) {
            let dout = seed * e / BATCH as f64; // d(e^2 / 2B) / dout
            dh.extend(w2.iter().map(|w| dout * w));
            for j in 0..HIDDEN {
                dw2[j] += dout * h[j];
            }
            db2 += dout;
        }
        call.give(0, dh)?;
        call.give(1, dw2)?;
        call.give(2, vec![db2])
    })
}

/// Trains on `threads` threads; returns the weights.
fn train(threads: usize, data: (&[[f64; IN]], &[f64])) -> adg::Result<Weights> {
    let reg = Registry::<Vec<f64>>::new()?;
    let params = (0..4)
        .map(|_| reg.leaf())
        .collect::<adg::Result<Vec<_>>>()?;
    let weights = init_weights();
    // The SGD step, once per weight and round, with the sum of the units'
    // gradients, after every unit's backward has run.
    let reducer = {
        let weights = Arc::clone(&weights);
        Reducer::builder(threads, &params)
            .units(BATCH / UNIT)
            .build(move |r| {
                if let Some(grad) = r.sum() {
                    let mut w = weights[r.param()].write().unwrap();
                    for (w, g) in w.iter_mut().zip(grad) {
                        *w -= RATE * g;
                    }
                }
                Ok(())
            })?
    };
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|p| {
                let (reg, params, weights, reducer) = (&reg, &params, &weights, &reducer);
                s.spawn(move || -> adg::Result<()> {
                    let hooked = reducer.hook(p, BackwardOptions::new());
                    for round in 0..ROUNDS {
                        let batch = round % (SAMPLES / BATCH) * BATCH;
                        // A forward and a backward per unit this thread
                        // takes, then the barrier: every weight updated.
                        reducer.round(p, |unit| {
                            let rows = batch + unit * UNIT..batch + (unit + 1) * UNIT;
                            let loss = unit_loss(reg, params, weights, data, rows)?;
                            adg::backward_with(&loss, vec![1.0], &hooked)?;
                            Ok(())
                        })?;
                    }
                    Ok(())
                })
            })
            .collect();
        workers.into_iter().try_for_each(|w| w.join().unwrap())
    })?;
    Ok(weights)
}

/// The mean squared error over the whole data set.
fn mse(weights: &Weights, (xs, ys): (&[[f64; IN]], &[f64])) -> f64 {
    let [w1, b1, w2, b2] = [0, 1, 2, 3].map(|i| weights[i].read().unwrap().clone());
    let error = |x: &[f64; IN], y: f64| {
        let out: f64 = (0..HIDDEN)
            .map(|j| w2[j] * ((0..IN).map(|i| w1[j * IN + i] * x[i]).sum::<f64>() + b1[j]).tanh())
            .sum();
        (out + b2[0] - y).powi(2)
    };
    xs.iter().zip(ys).map(|(x, &y)| error(x, y)).sum::<f64>() / xs.len() as f64
}

/// FNV-1a over the weights' bits.
fn fingerprint(weights: &Weights) -> u64 {
    let mut hash = 0xcbf29ce484222325u64;
    for w in weights.iter() {
        for v in w.read().unwrap().iter() {
            for byte in v.to_bits().to_le_bytes() {
                hash = (hash ^ u64::from(byte)).wrapping_mul(0x100000001b3);
            }
        }
    }
    hash
}

fn thread_counts() -> Result<Vec<usize>, String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [] => Ok(vec![1, 2, 3, 4]),
        [flag, list] if flag == "--threads" => list
            .split(',')
            .map(|t| match t.parse() {
                Ok(t) if t > 0 => Ok(t),
                _ => Err(format!("not a thread count: {t}")),
            })
            .collect(),
        _ => Err("usage: trainer [--threads N[,N...]]".into()),
    }
}

fn main() -> ExitCode {
    let counts = match thread_counts() {
        Ok(counts) => counts,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    let (xs, ys) = data();
    let data = (xs.as_slice(), ys.as_slice());
    let before = mse(&init_weights(), data);
    let mut hashes = Vec::new();
    for t in counts {
        match train(t, data) {
            Ok(weights) => {
                let hash = fingerprint(&weights);
                println!(
                    "T = {t}: mse {before:.4} -> {:.4}, weights {hash:016x}",
                    mse(&weights, data)
                );
                hashes.push(hash);
            }
            Err(e) => {
                eprintln!("trainer: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    if hashes.windows(2).any(|w| w[0] != w[1]) {
        eprintln!("trainer: the weights differ between thread counts");
        return ExitCode::FAILURE;
    }
    println!("the same weights at every thread count");
    ExitCode::SUCCESS
}
