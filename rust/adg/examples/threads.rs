//! Threads building graphs over shared parameters: each thread records its
//! own graph of y = sum_k (w1 x_k + w2)^2 over one registry, with the
//! parameters w1 and w2 as parents (borrowed: no thread writes them), and
//! runs its own backward. Their graphs stay apart: no lock is shared.

use adg::{Node, Registry};

/// Records y = (w1 x + w2)^2 and returns it with its value.
fn square_error<'r>(
    reg: &'r Registry,
    w1: (&Node<'r>, f64),
    w2: (&Node<'r>, f64),
    x: f64,
) -> adg::Result<(Node<'r>, f64)> {
    let r = w1.1 * x + w2.1;
    let y = reg.op_named(c"square_error", &[w1.0, w2.0], move |call| {
        let g = *call.grad().unwrap_or(&0.0);
        call.give(0, g * 2.0 * r * x)?; // dy/dw1
        call.give(1, g * 2.0 * r) // dy/dw2
    })?;
    Ok((y, r * r))
}

/// y = a + b.
fn add<'r>(reg: &'r Registry, a: &Node<'r>, b: &Node<'r>) -> adg::Result<Node<'r>> {
    reg.op_named(c"add", &[a, b], |call| {
        let g = *call.grad().unwrap_or(&0.0);
        call.give(0, g)?;
        call.give(1, g)
    })
}

fn main() -> adg::Result<()> {
    let reg = Registry::<f64>::new()?;
    let (w1, w2) = (reg.leaf()?, reg.leaf()?);
    let (v1, v2) = (0.5, -1.0);
    let results: Vec<adg::Result<(f64, f64, f64)>> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let (reg, w1, w2) = (&reg, &w1, &w2);
                s.spawn(move || {
                    let xs = (0..1000).map(|k| f64::from(t * 1000 + k) / 4000.0);
                    let mut loss: Option<Node> = None;
                    let mut value = 0.0;
                    for x in xs {
                        let (y, v) = square_error(reg, (w1, v1), (w2, v2), x)?;
                        value += v;
                        loss = Some(match loss {
                            None => y,
                            Some(l) => add(reg, &l, &y)?,
                        });
                    }
                    let grads = adg::backward(&loss.unwrap(), 1.0)?;
                    Ok((
                        value,
                        grads.get(w1).copied().unwrap(),
                        grads.get(w2).copied().unwrap(),
                    ))
                })
            })
            .collect();
        threads.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (t, r) in results.into_iter().enumerate() {
        let (loss, d1, d2) = r?;
        println!("thread {t}: loss {loss:.3}, dloss/dw1 {d1:.3}, dloss/dw2 {d2:.3}");
    }
    let st = reg.stats();
    println!(
        "left: {} nodes (the parameters), {} steps",
        st.live_nodes, st.live_steps
    );
    Ok(())
}
