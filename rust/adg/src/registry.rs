//! The registry: owns the nodes, their graphs and steps.

use crate::checkpoint::{self, Checkpoint, Checkpointing};
use crate::error::{check, Result};
use crate::gradients::{grad_add, grad_free, Grad};
use crate::node::Node;
use crate::panic::Store;
use crate::step::{self, Parent, StepCall};
use adg_sys as sys;
use std::ffi::{c_void, CStr};
use std::marker::PhantomData;
use std::ptr::{self, NonNull};

/// What a registry's callbacks share, at a fixed address for as long as
/// the C registry lives: the failures its steps and adds leave.
#[derive(Default)]
pub(crate) struct Shared {
    pub(crate) store: Store,
}

/// A registry of nodes whose gradients are of type `T`: it owns their
/// graphs and steps. Make one per model, or one for every thread's graphs:
/// threads record and run graphs at once, on `&Registry`, and a parameter
/// (a leaf) shared by all of them is only read.
///
/// `Send + Sync`. Nodes borrow it ([`Node`]`<'r, T>`), so it outlives them.
///
/// ```
/// let reg = adg::Registry::<f64>::new()?;
/// let w = reg.leaf()?;
/// std::thread::scope(|s| {
///     for _ in 0..2 {
///         s.spawn(|| {
///             let y = reg.op(&[&w], |call| call.give(0, 1.0)).unwrap();
///             let grads = adg::backward(&y, 1.0).unwrap();
///             assert_eq!(grads.get(&w), Some(&1.0));
///         });
///     }
/// });
/// # Ok::<(), adg::Error>(())
/// ```
pub struct Registry<T: Grad = f64> {
    raw: NonNull<sys::adg_registry>,
    shared: Box<Shared>,
    _values: PhantomData<fn(T) -> T>,
}

// SAFETY: libadg's functions may be called on one registry from any thread
// at once; the values it holds are T's, which are Send + Sync.
unsafe impl<T: Grad> Send for Registry<T> {}
unsafe impl<T: Grad> Sync for Registry<T> {}

/// A registry's counters (`adg_stats`), read without stopping other
/// threads: each is exact once the threads that change it are quiescent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Stats {
    /// Nodes not yet freed, leaves included.
    pub live_nodes: u64,
    /// Steps registered and not yet released.
    pub live_steps: u64,
    /// Graphs with at least one unconsumed step.
    pub live_graphs: u64,
    /// Graphs absorbed into another, so far.
    pub merges: u64,
    /// Nodes freed, so far.
    pub nodes_freed: u64,
    /// Memory held in node slabs.
    pub slab_bytes: u64,
    /// Of which in 2 MiB slabs advised for transparent huge pages.
    pub slab_bytes_huge: u64,
}

impl<T: Grad> Registry<T> {
    /// A new registry (`adg_registry_new`), whose backward passes sum
    /// gradients with `T`'s [`Grad::add`].
    ///
    /// ```
    /// let reg = adg::Registry::<Vec<f32>>::new()?;
    /// assert_eq!(reg.stats().live_nodes, 0);
    /// # Ok::<(), adg::Error>(())
    /// ```
    pub fn new() -> Result<Self> {
        Self::with_checkpointing(Checkpointing::None)
    }

    /// A new registry that keeps forward outputs
    /// ([`Registry::op_with`]) as `strategy` says: every output until no
    /// step needs it, or, [`Checkpointing::Balanced`], memory-bound ones
    /// that can be rebuilt dropped at once and rebuilt when a step asks.
    pub fn with_checkpointing(strategy: Checkpointing) -> Result<Self> {
        let shared = Box::<Shared>::default();
        let ops = sys::adg_grad_ops {
            add: Some(grad_add::<T>),
            free: Some(grad_free::<T>),
            ctx: ptr::from_ref::<Shared>(&shared).cast_mut().cast::<c_void>(),
        };
        let options = sys::adg_registry_options {
            size: std::mem::size_of::<sys::adg_registry_options>(),
            allocator: sys::adg_allocator {
                alloc: None,
                free: None,
                ctx: ptr::null_mut(),
            },
            max_node_id: 0,
            checkpointing: strategy.to_c(),
            grad_ops: &ops, /* copied */
        };
        let mut raw = ptr::null_mut();
        // SAFETY: options and out are valid for the call.
        check(unsafe { sys::adg_registry_new(&options, &mut raw) })?;
        Ok(Registry {
            raw: NonNull::new(raw).expect("adg_registry_new returned a registry"),
            shared,
            _values: PhantomData,
        })
    }

    /// The C registry, for the crate's other modules; still this value's.
    pub(crate) fn as_ptr(&self) -> *mut sys::adg_registry {
        self.raw.as_ptr()
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.shared
    }

    /// A new leaf (`adg_leaf`): a node without parents that wants a
    /// gradient, a parameter or an input. Children keep only its id, so a
    /// leaf that many threads use as a parent is never written.
    ///
    /// Errors: [`ENOMEM`](crate::code::ENOMEM),
    /// [`ENOIDS`](crate::code::ENOIDS).
    pub fn leaf(&self) -> Result<Node<'_, T>> {
        let mut raw = ptr::null_mut();
        // SAFETY: a live registry.
        check(unsafe { sys::adg_leaf(self.as_ptr(), &mut raw) })?;
        // SAFETY: the one reference adg_leaf hands the caller.
        Ok(unsafe { Node::adopt(self, raw) })
    }

    /// A new node whose parents are `parents` (at least one; a parent may
    /// repeat, as in `x * x`) and whose backward step is `step` (`adg_op`).
    ///
    /// A backward runs the step once with the node's gradient: it gives
    /// each parent slot its gradient with [`StepCall::give`]. A consuming
    /// backward runs it once and drops it; retained passes
    /// ([`BackwardOptions::retain`](crate::BackwardOptions::retain)) run it
    /// again, and may run it concurrently with itself on several threads,
    /// hence `Fn + Sync`. The closure is dropped once, when the step goes.
    /// It may capture nodes (`'r`): a higher-order step, a node kept alive.
    ///
    /// An `Err` from the step, or a panic in it, fails the backward; a
    /// panic is caught before it reaches C and resumed on the thread that
    /// called the backward once C has returned.
    ///
    /// Parents are borrowed (`&Node`): no reference count is touched to
    /// pass one, so a parameter shared by many threads stays unwritten.
    ///
    /// ```
    /// let reg = adg::Registry::<f64>::new()?;
    /// let (a, b) = (reg.leaf()?, reg.leaf()?);
    /// let (va, vb) = (2.0, 3.0);
    /// let y = reg.op(&[&a, &b], move |call| {
    ///     let g = *call.grad().unwrap_or(&0.0);
    ///     call.give(0, g * vb)?;
    ///     call.give(1, g * va)
    /// })?;
    /// let grads = adg::backward(&y, 1.0)?;
    /// assert_eq!((grads.get(&a), grads.get(&b)), (Some(&3.0), Some(&2.0)));
    /// # Ok::<(), adg::Error>(())
    /// ```
    ///
    /// Errors: [`EINVAL`](crate::code::EINVAL) (no parent),
    /// [`EFOREIGN`](crate::code::EFOREIGN) (a parent of another registry),
    /// [`ENOMEM`](crate::code::ENOMEM), [`ENOIDS`](crate::code::ENOIDS).
    pub fn op<'r, F>(&'r self, parents: &[&Node<'r, T>], step: F) -> Result<Node<'r, T>>
    where
        F: Fn(&mut StepCall<'_, T>) -> Result<()> + Send + Sync + 'r,
    {
        step::register(self, parents, step, None)
    }

    /// [`Registry::op`] with a name for the step, which graphs show
    /// ([`write_dot`](crate::write_dot())) and failures name
    /// ([`Failure::name`](crate::Failure)).
    ///
    /// ```
    /// let reg = adg::Registry::<f64>::new()?;
    /// let x = reg.leaf()?;
    /// let y = reg.op_named(c"square", &[&x, &x], |call| {
    ///     let g = *call.grad().unwrap_or(&0.0);
    ///     call.give(0, g * 3.0)?;
    ///     call.give(1, g * 3.0)
    /// })?;
    /// let mut dot = Vec::new();
    /// adg::write_dot(&y, &mut dot)?;
    /// assert!(String::from_utf8(dot).unwrap().contains("square"));
    /// # Ok::<(), adg::Error>(())
    /// ```
    pub fn op_named<'r, F>(
        &'r self,
        name: &'static CStr,
        parents: &[&Node<'r, T>],
        step: F,
    ) -> Result<Node<'r, T>>
    where
        F: Fn(&mut StepCall<'_, T>) -> Result<()> + Send + Sync + 'r,
    {
        step::register(self, parents, step, Some(name))
    }

    /// [`Registry::op`] with parents that may be moved in
    /// (`adg_op_moving`): a [`Parent`] is a borrowed node (`(&x).into()`)
    /// or a moved one (`x.into()`), whose reference becomes the new
    /// node's. Moving saves the two atomic operations on the parent's
    /// count that borrowing it and then dropping the handle cost: a
    /// chain's `x = f(x)`, a temporary's last use.
    ///
    /// On an error the moved handles are dropped, as the array is. Only
    /// the first 64 slots can hand a reference over (libadg's mask); a
    /// node moved into a later one is dropped after the call, as a
    /// borrowed one would be.
    ///
    /// ```
    /// let reg = adg::Registry::<f64>::new()?;
    /// let w = reg.leaf()?;
    /// let mut h = reg.op(&[&w], |call| {
    ///     let g = call.take_grad().unwrap_or(0.0);
    ///     call.give(0, g)
    /// })?;
    /// for _ in 0..3 {
    ///     // h = 2 h: the old h's handle goes into the new node.
    ///     h = reg.op_moving([h.into()], |call| {
    ///         let g = call.take_grad().unwrap_or(0.0);
    ///         call.give(0, 2.0 * g)
    ///     })?;
    /// }
    /// // w, the first h and the three doublings, each held by the next
    /// // node (until the backward) and none by a second handle
    /// assert_eq!(reg.stats().live_nodes, 5);
    /// assert_eq!(adg::backward(&h, 1.0)?.get(&w), Some(&8.0));
    /// # Ok::<(), adg::Error>(())
    /// ```
    ///
    /// Errors: those of [`Registry::op`].
    pub fn op_moving<'r, F, const N: usize>(
        &'r self,
        parents: [Parent<'_, 'r, T>; N],
        step: F,
    ) -> Result<Node<'r, T>>
    where
        F: Fn(&mut StepCall<'_, T>) -> Result<()> + Send + Sync + 'r,
    {
        step::register_moving(self, parents, step, None)
    }

    /// [`Registry::op_moving`] with a name for the step, as
    /// [`Registry::op_named`].
    pub fn op_moving_named<'r, F, const N: usize>(
        &'r self,
        name: &'static CStr,
        parents: [Parent<'_, 'r, T>; N],
        step: F,
    ) -> Result<Node<'r, T>>
    where
        F: Fn(&mut StepCall<'_, T>) -> Result<()> + Send + Sync + 'r,
    {
        step::register_moving(self, parents, step, Some(name))
    }

    /// [`Registry::op`] with a forward output (`adg_op_with`): the op
    /// offers `checkpoint`'s output to the steps that ask for it, and its
    /// step asks for the outputs `checkpoint` names
    /// ([`StepCall::output`]). libadg holds an output until the last step
    /// that asked for it has run, or drops and rebuilds it
    /// ([`Registry::with_checkpointing`]). A step that needs a forward
    /// value may also keep it in its closure; offer large ones
    /// (activations) here, so that they go as soon as no step needs them.
    ///
    /// Errors: those of [`Registry::op`], and
    /// [`EINVAL`](crate::code::EINVAL) for a want out of range or of a
    /// parent that offers no output (a leaf).
    pub fn op_with<'r, V, F>(
        &'r self,
        parents: &[&Node<'r, T>],
        checkpoint: Checkpoint<'r, V>,
        step: F,
    ) -> Result<Node<'r, T>>
    where
        V: Send + Sync + 'static,
        F: Fn(&mut StepCall<'_, T>) -> Result<()> + Send + Sync + 'r,
    {
        checkpoint::register(self, parents, checkpoint, step, None)
    }

    /// [`Registry::op_with`] with a name for the step, as
    /// [`Registry::op_named`].
    pub fn op_with_named<'r, V, F>(
        &'r self,
        name: &'static CStr,
        parents: &[&Node<'r, T>],
        checkpoint: Checkpoint<'r, V>,
        step: F,
    ) -> Result<Node<'r, T>>
    where
        V: Send + Sync + 'static,
        F: Fn(&mut StepCall<'_, T>) -> Result<()> + Send + Sync + 'r,
    {
        checkpoint::register(self, parents, checkpoint, step, Some(name))
    }

    /// The registry's counters (`adg_registry_stats`).
    pub fn stats(&self) -> Stats {
        let mut s = sys::adg_stats {
            size: std::mem::size_of::<sys::adg_stats>(),
            ..Default::default()
        };
        // SAFETY: a live registry and a sized adg_stats; it cannot fail.
        unsafe { sys::adg_registry_stats(self.as_ptr(), &mut s) };
        Stats {
            live_nodes: s.live_nodes,
            live_steps: s.live_steps,
            live_graphs: s.live_graphs,
            merges: s.merges,
            nodes_freed: s.nodes_freed,
            slab_bytes: s.slab_bytes,
            slab_bytes_huge: s.slab_bytes_huge,
        }
    }
}

impl<T: Grad> Drop for Registry<T> {
    /// Frees the registry (`adg_registry_free`). Every [`Node`] borrows the
    /// registry, so none is left; nodes kept alive by a cycle no handle
    /// reaches (a step's closure holding its own node, through an `Arc`)
    /// make libadg refuse (`EBUSY`): the registry is then leaked, as the
    /// nodes are, rather than freed under them.
    fn drop(&mut self) {
        // SAFETY: no other call can run on it: nothing borrows it.
        if unsafe { sys::adg_registry_free(self.as_ptr()) } != 0 {
            let shared = std::mem::take(&mut self.shared);
            Box::leak(shared);
        }
    }
}

impl<T: Grad> std::fmt::Debug for Registry<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").field("raw", &self.raw).finish()
    }
}
