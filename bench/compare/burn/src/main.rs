//! burn-vs-adg: burn issues #2729's and #715's shape, N threads in one
//! process, each training its own small model, through burn's autodiff
//! (`Autodiff<NdArray<f32>>`) and through libadg's `adg` crate doing the
//! same ndarray math in its op steps, side by side in one run.
//! `burn-vs-adg --help` lists the flags; docs/bench.md ("libadg beside
//! burn") states the models and reads the table.

mod adg_side;
mod burn_side;
mod data;

use data::{Act, MlpShape, ScalarShape, MLP_OPS_PER_STEP};
use std::process::ExitCode;
use std::sync::Barrier;
use std::time::Instant;

const HELP: &str = "\
usage: burn-vs-adg [--threads=1,2,8,32] [--workloads=mlp,chain,disjoint]
                   [--reps=7] [--models=64] [--steps=40] [--chains=128]
                   [--chain=1000] [--iterations=4096] [--check-only]
                   [--mlp=32,64,10,32] [--act=tanh] [--seed-csv=FILE]
  --threads=LIST    thread counts, each a run of its own (default 1,2,8,32)
  --workloads=LIST  mlp: each thread trains its share of --models MLPs
                    (--mlp, --act; MSE, SGD, 4 batches cycled) for
                    --steps steps; chain: --chains backwards in all of a
                    chain of --chain products of 1-element tensors over 4
                    leaves; disjoint: adg-bench's disjoint iteration (a
                    chain of 32 products and a 31-node tree over 4 leaves,
                    each with its backward), --iterations in all
  --reps=N          runs of each cell, burn and adg alternating (default 7);
                    the table shows medians
  --mlp=I,H,O,B     the MLP's sizes: I -> H -> H -> O, batches of B
                    (default 32,64,10,32)
  --act=tanh|relu   the hidden layers' activation (default tanh)
  --check-only      only the built-in checks (loss curves, gradients)
  --seed-csv=FILE   adg-bench's bench.csv of a disjoint run (impls seed and
                    adg): prints how the seed port's scaling predicted
                    burn's, beside the disjoint table
The total work of a cell is the same at every thread count: it is split
evenly over the threads.";

struct Options {
    threads: Vec<usize>,
    workloads: Vec<String>,
    reps: usize,
    models: usize,
    steps: usize,
    chains: usize,
    chain: usize,
    iterations: usize,
    check_only: bool,
    seed_csv: Option<String>,
    mlp: [usize; 4],
    act: Act,
}

fn parse_list(v: &str) -> Result<Vec<usize>, String> {
    v.split(',')
        .map(|s| s.trim().parse::<usize>().map_err(|e| format!("{s}: {e}")))
        .filter(|r| !matches!(r, Ok(0)))
        .collect()
}

fn parse_args() -> Result<Options, String> {
    let mut o = Options {
        threads: vec![1, 2, 8, 32],
        workloads: vec!["mlp".into(), "chain".into(), "disjoint".into()],
        reps: 7,
        models: 64,
        steps: 40,
        chains: 128,
        chain: 1000,
        iterations: 4096,
        check_only: false,
        seed_csv: None,
        mlp: [32, 64, 10, 32],
        act: Act::Tanh,
    };
    for arg in std::env::args().skip(1) {
        if arg == "--help" || arg == "-h" {
            println!("{HELP}");
            std::process::exit(0);
        }
        if arg == "--check-only" {
            o.check_only = true;
            continue;
        }
        let (key, value) = arg
            .split_once('=')
            .ok_or_else(|| format!("{arg}: expected --flag=value (see --help)"))?;
        let one = || value.parse::<usize>().map_err(|e| format!("{arg}: {e}"));
        match key {
            "--threads" => o.threads = parse_list(value)?,
            "--workloads" => o.workloads = value.split(',').map(str::to_owned).collect(),
            "--reps" => o.reps = one()?.max(1),
            "--models" => o.models = one()?.max(1),
            "--steps" => o.steps = one()?.max(1),
            "--chains" => o.chains = one()?.max(1),
            "--chain" => o.chain = one()?.max(2),
            "--iterations" => o.iterations = one()?.max(1),
            "--seed-csv" => o.seed_csv = Some(value.to_owned()),
            "--act" => {
                o.act = match value {
                    "tanh" => Act::Tanh,
                    "relu" => Act::Relu,
                    _ => return Err(format!("{arg}: tanh or relu")),
                }
            }
            "--mlp" => {
                o.mlp = parse_list(value)?
                    .try_into()
                    .map_err(|_| format!("{arg}: four sizes, none 0"))?
            }
            _ => return Err(format!("{arg}: unknown flag (see --help)")),
        }
    }
    for w in &o.workloads {
        if !["mlp", "chain", "disjoint"].contains(&w.as_str()) {
            return Err(format!("{w}: unknown workload (mlp, chain, disjoint)"));
        }
    }
    Ok(o)
}

fn mlp_shape(o: &Options) -> MlpShape {
    let [input, hidden, output, batch] = o.mlp;
    MlpShape {
        act: o.act,
        input,
        hidden,
        output,
        batch,
        batches: 4,
        steps: o.steps,
        lr: 0.1,
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Side {
    Burn,
    Adg,
}

/// One cell's work, split over the threads: what each thread does with its
/// share (`share` units starting at unit `first`).
struct Work {
    units: usize,
    ops_per_unit: usize,
    run: Box<dyn Fn(Side, usize, usize, usize) + Sync>,
}

fn work(o: &Options, workload: &str) -> Work {
    match workload {
        "mlp" => {
            let shape = mlp_shape(o);
            Work {
                units: o.models,
                ops_per_unit: MLP_OPS_PER_STEP * shape.steps,
                run: Box::new(move |side, _thread, first, share| {
                    for m in first..first + share {
                        let losses = match side {
                            Side::Burn => burn_side::train_mlp(&shape, m as u64),
                            Side::Adg => adg_side::train_mlp(&shape, m as u64),
                        };
                        std::hint::black_box(losses);
                    }
                }),
            }
        }
        _ => {
            let (shape, units) = scalar_shape(o, workload);
            Work {
                units,
                ops_per_unit: shape.ops(),
                run: Box::new(move |side, thread, _first, share| {
                    let g = match side {
                        Side::Burn => burn_side::scalar(&shape, thread, share),
                        Side::Adg => adg_side::scalar(&shape, thread, share),
                    };
                    std::hint::black_box(g);
                }),
            }
        }
    }
}

fn scalar_shape(o: &Options, workload: &str) -> (ScalarShape, usize) {
    if workload == "chain" {
        let shape = ScalarShape {
            chain: o.chain,
            tree: 0,
            leaves: 4,
        };
        (shape, o.chains)
    } else {
        let shape = ScalarShape {
            chain: 32,
            tree: 32,
            leaves: 4,
        };
        (shape, o.iterations)
    }
}

/// Runs one cell: `threads` threads share `work.units` evenly, released
/// together by a barrier; returns the seconds from the first thread's
/// start to the last one's end, read off the threads' own clocks (the
/// main thread may wait for a core long after the barrier lets the
/// workers go, so its clock would start late).
fn run_cell(work: &Work, side: Side, threads: usize) -> f64 {
    let barrier = Barrier::new(threads);
    let per = work.units / threads;
    let extra = work.units % threads;
    let spans: Vec<(Instant, Instant)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let first = t * per + t.min(extra);
                let share = per + usize::from(t < extra);
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    let start = Instant::now();
                    (work.run)(side, t, first, share);
                    (start, Instant::now())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a bench thread panicked"))
            .collect()
    });
    let start = spans.iter().map(|s| s.0).min().expect("a thread");
    let end = spans.iter().map(|s| s.1).max().expect("a thread");
    (end - start).as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

struct Row {
    threads: usize,
    burn_s: f64,
    adg_s: f64,
}

fn measure(o: &Options, workload: &str) -> Vec<Row> {
    let w = work(o, workload);
    // One unwarmed run of each side first: page faults, lazy statics.
    run_cell(&w, Side::Burn, 1);
    run_cell(&w, Side::Adg, 1);
    let mut rows = Vec::new();
    for &t in &o.threads {
        let (mut burn, mut adg) = (Vec::new(), Vec::new());
        for rep in 0..o.reps {
            // Alternate which side goes first, so drift in the machine's
            // load falls on both.
            let order = if rep % 2 == 0 {
                [Side::Burn, Side::Adg]
            } else {
                [Side::Adg, Side::Burn]
            };
            for side in order {
                let secs = run_cell(&w, side, t);
                match side {
                    Side::Burn => burn.push(secs),
                    Side::Adg => adg.push(secs),
                }
            }
        }
        rows.push(Row {
            threads: t,
            burn_s: median(burn),
            adg_s: median(adg),
        });
        eprintln!("  {workload} T = {t} done");
    }
    rows
}

fn fmt_rate(x: f64) -> String {
    if x >= 1e6 {
        format!("{:.2}M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.1}k", x / 1e3)
    } else {
        format!("{x:.1}")
    }
}

fn print_table(o: &Options, workload: &str, rows: &[Row]) {
    let w = work(o, workload);
    let unit = if workload == "mlp" {
        "models/s"
    } else {
        "backwards/s"
    };
    let backwards_per_unit = match workload {
        "mlp" => 1.0,
        "chain" => 1.0,
        _ => 2.0, // the chain's and the tree's
    };
    let ops = (w.units * w.ops_per_unit) as f64;
    println!();
    let what = if workload == "mlp" {
        let m = mlp_shape(o);
        format!(
            "MLP {} -> {} -> {} -> {}, {}, batch {}, {} SGD steps a model",
            m.input,
            m.hidden,
            m.hidden,
            m.output,
            if m.act == Act::Tanh { "tanh" } else { "relu" },
            m.batch,
            m.steps
        )
    } else {
        let (s, _) = scalar_shape(o, workload);
        let tree = match s.tree {
            0 => String::new(),
            t => format!(" and a tree of {}", t - 1),
        };
        format!(
            "a chain of {} products{tree} over {} leaves, 1-element tensors",
            s.chain, s.leaves
        )
    };
    println!(
        "**{workload}** ({what}): {} units of {} recorded ops each",
        w.units, w.ops_per_unit
    );
    println!();
    println!(
        "| threads | burn ns/op | adg ns/op | burn {unit} | adg {unit} | adg / burn | burn vs 1 thread | adg vs 1 thread |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    let (b1, a1) = (rows[0].burn_s, rows[0].adg_s);
    for r in rows {
        let rate = |secs: f64| w.units as f64 * backwards_per_unit / secs;
        println!(
            "| {} | {:.0} | {:.0} | {} | {} | {:.2} | {:.2} | {:.2} |",
            r.threads,
            r.burn_s * 1e9 / ops,
            r.adg_s * 1e9 / ops,
            fmt_rate(rate(r.burn_s)),
            fmt_rate(rate(r.adg_s)),
            r.burn_s / r.adg_s,
            b1 / r.burn_s,
            a1 / r.adg_s,
        );
    }
    println!();
    for r in rows {
        let (want, label) = match r.threads {
            1 => (1.0, "adg >= burn"),
            8 | 32 => (4.0, "adg >= 4 x burn"),
            _ => continue,
        };
        let ratio = r.burn_s / r.adg_s;
        let verdict = if ratio >= want { "holds " } else { "MISSED" };
        println!(
            "  {verdict} {workload}, {} threads: {label}: {ratio:.2} x",
            r.threads
        );
    }
}

/// adg-bench's median nodes/s per (impl, threads) for the disjoint
/// workload, from its bench.csv.
fn read_seed_csv(path: &str) -> Result<Vec<(String, usize, f64)>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().ok_or("empty")?.split(',').collect();
    let col = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .ok_or(format!("no column {name}"))
    };
    let (cw, ct, ci, cm) = (
        col("workload")?,
        col("threads")?,
        col("impl")?,
        col("median")?,
    );
    let mut out = Vec::new();
    for line in lines {
        let f: Vec<&str> = line.split(',').collect();
        if f.len() <= cw.max(ct).max(ci).max(cm) || f[cw] != "disjoint" {
            continue;
        }
        let threads = f[ct].parse().map_err(|e| format!("{line}: {e}"))?;
        let median = f[cm].parse().map_err(|e| format!("{line}: {e}"))?;
        out.push((f[ci].to_owned(), threads, median));
    }
    Ok(out)
}

/// How well the seed port (bench/impl_seed.c, burn's GraphMutexClient in
/// C) predicted burn: each one's throughput at T threads over its own at
/// 1 thread, on the same iteration; adg's C API and crate beside them.
fn print_seed_prediction(path: &str, rows: &[Row], ops: f64) -> Result<(), String> {
    let cells = read_seed_csv(path)?;
    let rate = |imp: &str, t: usize| cells.iter().find(|c| c.0 == imp && c.1 == t).map(|c| c.2);
    let scale = |imp: &str, t: usize| match (rate(imp, t), rate(imp, 1)) {
        (Some(r), Some(r1)) => format!("{:.2}", r / r1),
        _ => "-".into(),
    };
    let (b1, a1) = (rows[0].burn_s, rows[0].adg_s);
    println!();
    println!("**disjoint: the seed port's prediction** (throughput at T threads over 1 thread; seed and adg C from adg-bench, same iteration)");
    println!();
    println!("| threads | seed port (C) | burn 0.21 | adg C API | adg crate | seed ns/node | burn ns/op |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let seed_ns = rate("seed", r.threads).map_or("-".into(), |x| format!("{:.0}", 1e9 / x));
        println!(
            "| {} | {} | {:.2} | {} | {:.2} | {} | {:.0} |",
            r.threads,
            scale("seed", r.threads),
            b1 / r.burn_s,
            scale("adg", r.threads),
            a1 / r.adg_s,
            seed_ns,
            r.burn_s * 1e9 / ops,
        );
    }
    Ok(())
}

/// The built-in checks: both sides' loss curves agree step by step, and the
/// scalar workloads' gradients agree with each other and with the product
/// rule. A failure ends the program with status 1 before anything is timed.
fn check(o: &Options) -> Result<(), String> {
    let shape = mlp_shape(o);
    for model in [0u64, 1] {
        let b = burn_side::train_mlp(&shape, model);
        let a = adg_side::train_mlp(&shape, model);
        for (step, (lb, la)) in b.iter().zip(&a).enumerate() {
            let tol = 1e-4 * lb.abs().max(la.abs()) + 1e-6;
            if (lb - la).abs() > tol || !lb.is_finite() {
                return Err(format!(
                    "mlp model {model} step {step}: burn's loss {lb} but adg's {la}"
                ));
            }
        }
        // The last step's batch, the first time it came round: training
        // must have lowered its loss.
        let last = shape.steps - 1;
        let first_seen = last % shape.batches;
        if b.len() != shape.steps || a.len() != shape.steps || b[last] >= b[first_seen] {
            return Err(format!("mlp model {model}: the loss did not fall ({b:?})"));
        }
        println!(
            "check mlp model {model}: losses agree at all {} steps ({:.6} -> {:.6})",
            shape.steps, b[first_seen], b[last]
        );
    }
    for workload in ["chain", "disjoint"] {
        let (s, _) = scalar_shape(o, workload);
        let b = burn_side::scalar(&s, 3, 1);
        let a = adg_side::scalar(&s, 3, 1);
        // d/d leaf0 of the chain: the product of every factor but one
        // occurrence of leaf 0, times that occurrence count.
        let mut count = 0;
        let mut rest = 1.0f64;
        let factors = std::iter::once(0).chain((1..=s.chain).map(|i| i % s.leaves));
        for f in factors {
            if f == 0 {
                count += 1;
            }
            rest *= f64::from(data::leaf_value(f, 3));
        }
        let expected = count as f64 * rest / f64::from(data::leaf_value(0, 3));
        let tol = 1e-4 * expected.abs();
        if (f64::from(b) - expected).abs() > tol || (f64::from(a) - expected).abs() > tol {
            return Err(format!(
                "{workload}: d/d leaf0 should be {expected}, burn gave {b}, adg {a}"
            ));
        }
        println!("check {workload}: d/d leaf0 = {b} (burn), {a} (adg), {expected:.6} expected");
    }
    Ok(())
}

fn main() -> ExitCode {
    let o = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("burn-vs-adg: {e}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = check(&o) {
        eprintln!("burn-vs-adg: CHECK FAILED: {e}");
        return ExitCode::from(1);
    }
    if o.check_only {
        return ExitCode::SUCCESS;
    }
    println!();
    println!(
        "burn 0.21 (Autodiff<NdArray<f32>>, features std ndarray autodiff simd, no multi-threads) \
         beside adg; {} reps a cell, medians; threads {:?}",
        o.reps, o.threads
    );
    for workload in &o.workloads {
        let rows = measure(&o, workload);
        print_table(&o, workload, &rows);
        if let (true, Some(path)) = (workload == "disjoint", &o.seed_csv) {
            let w = work(&o, workload);
            let ops = (w.units * w.ops_per_unit) as f64;
            if let Err(e) = print_seed_prediction(path, &rows, ops) {
                eprintln!("burn-vs-adg: {path}: {e}");
                return ExitCode::from(1);
            }
        }
    }
    ExitCode::SUCCESS
}
