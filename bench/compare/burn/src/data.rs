//! The synthetic data and initial weights both sides train on: plain
//! row-major `Vec<f32>` from a fixed seed, so burn and adg start from the
//! very same numbers.

/// splitmix64: small, seedable, and the same on every platform.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [-a, a).
    pub fn uniform(&mut self, a: f32) -> f32 {
        let unit = (self.next_u64() >> 40) as f32 * (1.0 / (1u64 << 24) as f32);
        (2.0 * unit - 1.0) * a
    }
}

/// A row-major matrix: the form both sides build their tensors from.
#[derive(Clone)]
pub struct Mat {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f32>,
}

impl Mat {
    pub fn uniform(rng: &mut Rng, rows: usize, cols: usize, a: f32) -> Mat {
        let data = (0..rows * cols).map(|_| rng.uniform(a)).collect();
        Mat { rows, cols, data }
    }

    pub fn zeros(rows: usize, cols: usize) -> Mat {
        Mat {
            rows,
            cols,
            data: vec![0.0; rows * cols],
        }
    }
}

/// The hidden layers' activation.
#[derive(Clone, Copy, PartialEq)]
pub enum Act {
    Tanh,
    Relu,
}

/// The MLP: input -> hidden -> hidden -> output, the activation after both
/// hidden layers, mean squared error, plain SGD on fixed batches cycled in
/// order.
#[derive(Clone, Copy)]
pub struct MlpShape {
    pub act: Act,
    pub input: usize,
    pub hidden: usize,
    pub output: usize,
    pub batch: usize,
    pub batches: usize,
    pub steps: usize,
    pub lr: f32,
}

/// Ops each training step records (both sides record the same ones):
/// 3 matmuls, 3 bias adds, 2 activations, the difference, its square (a product
/// of the difference with itself) and the mean.
pub const MLP_OPS_PER_STEP: usize = 11;

/// One model's start: its weights and its data.
pub struct MlpInit {
    /// w1, b1, w2, b2, w3, b3, in that order.
    pub params: Vec<Mat>,
    /// (x, y) per batch.
    pub batches: Vec<(Mat, Mat)>,
}

/// Model `index`'s weights and data. The targets come from one fixed
/// teacher (tanh of a random linear map) shared by every model; inputs and
/// weights differ per model.
pub fn mlp_init(shape: &MlpShape, index: u64) -> MlpInit {
    let mut teacher_rng = Rng::new(0x7e4c_4e12);
    let teacher = Mat::uniform(&mut teacher_rng, shape.input, shape.output, 0.5);
    let mut rng = Rng::new(0x5eed_0000 ^ index.wrapping_mul(0x2545_f491_4f6c_dd1d));
    let layer = |rng: &mut Rng, fan_in: usize, fan_out: usize| {
        let w = Mat::uniform(rng, fan_in, fan_out, 1.0 / (fan_in as f32).sqrt());
        [w, Mat::zeros(1, fan_out)]
    };
    let mut params = Vec::new();
    params.extend(layer(&mut rng, shape.input, shape.hidden));
    params.extend(layer(&mut rng, shape.hidden, shape.hidden));
    params.extend(layer(&mut rng, shape.hidden, shape.output));
    let batches = (0..shape.batches)
        .map(|_| {
            let x = Mat::uniform(&mut rng, shape.batch, shape.input, 1.0);
            let y = teach(&teacher, &x);
            (x, y)
        })
        .collect();
    MlpInit { params, batches }
}

fn teach(teacher: &Mat, x: &Mat) -> Mat {
    let mut y = Mat::zeros(x.rows, teacher.cols);
    for r in 0..x.rows {
        for c in 0..teacher.cols {
            let dot: f32 = (0..x.cols)
                .map(|k| x.data[r * x.cols + k] * teacher.data[k * teacher.cols + c])
                .sum();
            y.data[r * y.cols + c] = dot.tanh();
        }
    }
    y
}

/// The scalar workloads: `chain` products in a row over `leaves` leaves,
/// then (when `tree` is set) a fan-in-2 tree of products of `tree` - 1
/// nodes over the same leaves, each followed by its backward. With
/// chain = 32, leaves = 4 and tree = 32 it is adg-bench's `disjoint`
/// iteration (bench/workloads.c), the seed port's workload.
#[derive(Clone, Copy)]
pub struct ScalarShape {
    pub chain: usize,
    pub tree: usize,
    pub leaves: usize,
}

impl ScalarShape {
    /// Ops one iteration records.
    pub fn ops(&self) -> usize {
        self.chain + self.tree.saturating_sub(1)
    }
}

/// Leaf `i`'s value on thread `thread`, as adg-bench's disjoint sets it.
pub fn leaf_value(i: usize, thread: usize) -> f32 {
    1.0 + 0.001 * (i + thread) as f32
}
