//! The safe crate's own cost beside the C API's, in one run: a chain of
//! N two-parent ops (x_k = x_{k-1} * w, w a leaf) recorded and run
//! backward, on one thread, ns per op for each side, medians of R rounds
//! taken alternately. The C side carries each gradient inside libadg's
//! pointer (a double XORed with a NaN tag, as bench/adg_grads.h does), with
//! no allocation per gradient. Each side runs the chain twice: with steps
//! that capture nothing (C: a static step), and with steps that keep two
//! values (C: a malloc'd user freed by release; Rust: a closure, which the
//! crate keeps in a block of its thread's cache).
//!
//! `cargo run --release --example overhead [N [R]]`

use adg::{Node, Registry};
use adg_sys as sys;
use std::ffi::{c_int, c_void};
use std::hint::black_box;
use std::ptr;
use std::time::Instant;

const TAG: u64 = 0x7ff4_d1a9_c0ff_ee01;

fn encode(d: f64) -> *mut c_void {
    (d.to_bits() ^ TAG) as usize as *mut c_void
}

fn decode(p: *const c_void) -> f64 {
    f64::from_bits(p as usize as u64 ^ TAG)
}

unsafe extern "C" fn c_add(sum: *mut *mut c_void, value: *mut c_void, _: *mut c_void) -> c_int {
    // SAFETY: libadg's sum slot.
    unsafe { *sum = encode(decode(*sum) + decode(value)) };
    0
}

unsafe extern "C" fn c_free(_: *mut c_void, _: *mut c_void) {}

/// x_k = x_{k-1} * w: the chain's step, its values static (1.0).
unsafe extern "C" fn c_mul(call: *mut sys::adg_step_call, _: *mut c_void) -> c_int {
    // SAFETY: libadg's call.
    unsafe {
        let g = decode((*call).grad);
        (*call).grad = ptr::null_mut();
        let rc = sys::adg_step_give(call, 0, encode(g));
        if rc != 0 {
            return rc;
        }
        sys::adg_step_give(call, 1, encode(g))
    }
}

/// The chain through the C API on `reg`, a registry kept across rounds as
/// the Rust side's is.
/// c_mul's step keeping two values, as a C step that captures does: a
/// malloc'd user, freed by release.
unsafe extern "C" fn c_mul_user(call: *mut sys::adg_step_call, user: *mut c_void) -> c_int {
    // SAFETY: libadg's call; user is the [f64; 2] c_round gave.
    unsafe {
        let v = *user.cast::<[f64; 2]>();
        let g = decode((*call).grad);
        (*call).grad = ptr::null_mut();
        let rc = sys::adg_step_give(call, 0, encode(g * v[1]));
        if rc != 0 {
            return rc;
        }
        sys::adg_step_give(call, 1, encode(g * v[0]))
    }
}

unsafe extern "C" fn c_release(user: *mut c_void) {
    // SAFETY: malloc'd by c_round.
    unsafe { libc_free(user) };
}

extern "C" {
    #[link_name = "malloc"]
    fn libc_malloc(size: usize) -> *mut c_void;
    #[link_name = "free"]
    fn libc_free(p: *mut c_void);
}

fn c_round(reg: *mut sys::adg_registry, n: usize, capture: bool) -> f64 {
    let ops = sys::adg_grad_ops {
        add: Some(c_add),
        free: Some(c_free),
        ctx: ptr::null_mut(),
    };
    let step = sys::adg_step {
        backward: Some(c_mul),
        release: None,
        user: ptr::null_mut(),
        name: ptr::null(),
    };
    let mut w = ptr::null_mut();
    let mut x = ptr::null_mut();
    // SAFETY: the C API used as adg.h says; every handle is dropped.
    unsafe {
        assert_eq!(sys::adg_leaf(reg, &mut w), 0);
        assert_eq!(sys::adg_leaf(reg, &mut x), 0);
        let t = Instant::now();
        let mut y = x;
        sys::adg_node_ref(y);
        for _ in 0..n {
            let parents = [y, w];
            let mut out = ptr::null_mut();
            let mut step = step;
            if capture {
                let user = libc_malloc(16).cast::<[f64; 2]>();
                user.write([black_box(1.0), black_box(1.0)]);
                step = sys::adg_step {
                    backward: Some(c_mul_user),
                    release: Some(c_release),
                    user: user.cast(),
                    name: ptr::null(),
                };
            }
            // x_k's reference moves into the new node (bit 0).
            assert_eq!(
                sys::adg_op_moving(reg, parents.as_ptr(), 2, 1, &step, &mut out),
                0
            );
            y = out;
        }
        let mut grads = ptr::null_mut();
        assert_eq!(sys::adg_backward(reg, y, encode(1.0), &ops, &mut grads), 0);
        let mut v = ptr::null_mut();
        assert_eq!(sys::adg_grads_get_node(grads, w, &mut v), 0);
        black_box(decode(v));
        sys::adg_grads_free(grads);
        sys::adg_node_unref(y);
        let ns = t.elapsed().as_nanos() as f64;
        sys::adg_node_unref(w);
        sys::adg_node_unref(x);
        ns / n as f64
    }
}

/// The same chain through the adg crate; `capture`: each step keeps the
/// two values it multiplies (a closure of 16 bytes, boxed), as a real
/// step does, else none (a closure of no size, which costs nothing to
/// keep).
fn rust_round(reg: &Registry, n: usize, capture: bool) -> f64 {
    let w = reg.leaf().unwrap();
    let x = reg.leaf().unwrap();
    let t = Instant::now();
    let mut y: Node = x.clone();
    for k in 0..n {
        y = if capture {
            let (yv, wv) = (black_box(1.0), black_box(1.0 + k as f64 * 0.0));
            reg.op(&[&y, &w], move |call| {
                let g = call.take_grad().unwrap_or(0.0);
                call.give(0, g * wv)?;
                call.give(1, g * yv)
            })
        } else {
            reg.op(&[&y, &w], |call| {
                let g = call.take_grad().unwrap_or(0.0);
                call.give(0, g)?;
                call.give(1, g)
            })
        }
        .unwrap();
    }
    let grads = adg::backward(&y, 1.0).unwrap();
    black_box(grads.get(&w));
    drop((grads, y));
    t.elapsed().as_nanos() as f64 / n as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().map_or(1000, |a| a.parse().unwrap());
    let rounds: usize = args.next().map_or(2001, |a| a.parse().unwrap());
    let reg = Registry::<f64>::new().unwrap();
    let mut c_reg = ptr::null_mut();
    // SAFETY: a registry of the C side's own, freed below.
    assert_eq!(unsafe { sys::adg_registry_new(ptr::null(), &mut c_reg) }, 0);
    let (mut c, mut cc, mut r, mut rc) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        c.push(c_round(c_reg, n, false));
        cc.push(c_round(c_reg, n, true));
        r.push(rust_round(&reg, n, false));
        rc.push(rust_round(&reg, n, true));
    }
    // SAFETY: every node of it is gone.
    assert_eq!(unsafe { sys::adg_registry_free(c_reg) }, 0);
    let (c, cc, r, rc) = (median(c), median(cc), median(r), median(rc));
    println!("chain of {n} two-parent ops and its backward, median of {rounds} rounds");
    println!("                    steps capturing none   steps capturing 16 B");
    println!("C API               {c:9.1} ns/op       {cc:9.1} ns/op");
    println!("adg crate           {r:9.1} ns/op       {rc:9.1} ns/op");
    println!(
        "ratio               {:9.2}             {:9.2}",
        r / c,
        rc / cc
    );
}
