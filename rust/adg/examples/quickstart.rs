//! y = a * b, and its gradients: dy/da = b, dy/db = a.

fn main() -> adg::Result<()> {
    let reg = adg::Registry::<f64>::new()?;
    let (a, b) = (reg.leaf()?, reg.leaf()?);
    let (va, vb) = (2.0, 3.0);
    // Record y = a * b: its step gives each parent its gradient.
    let y = reg.op(&[&a, &b], move |call| {
        let g = *call.grad().unwrap_or(&0.0);
        call.give(0, g * vb)?;
        call.give(1, g * va)
    })?;
    let grads = adg::backward(&y, 1.0)?;
    println!("y = {}", va * vb);
    println!("dy/da = {}", grads.get(&a).unwrap());
    println!("dy/db = {}", grads.get(&b).unwrap());
    Ok(())
}
