/* A 32-64-10 multilayer perceptron on adg.hpp: a tanh hidden layer and a
 * softmax cross-entropy loss, trained by gradient descent on a synthetic
 * data set made from a fixed seed. Tensors are flat, row-major
 * std::vector<double>s; the gradient type, vec, is one with the += that
 * libadg sums two gradients of a node with.
 *
 * Each step builds the batch's graph over the weights' leaves, named W1, b1,
 * W2 and b2, which every step's graph shares; runs backward from the loss;
 * and moves the weights against their gradients. The loss must fall at
 * every step. Then the gradients of a few weights are checked against
 * central differences of the loss. Usage: mlp-cpp (exits 1 on a failed
 * check). */
#include <adg.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <exception>
#include <memory>
#include <random>
#include <vector>

namespace
{

constexpr std::size_t n_in = 32, n_hidden = 64, n_out = 10, n_samples = 100;

/* A tensor, and the gradient type. */
struct vec : std::vector<double> {
	using std::vector<double>::vector;
	vec &operator+=(const vec &other)
	{
		for (std::size_t i = 0; i < size(); i++)
			(*this)[i] += other[i];
		return *this;
	}
};

/* A weight: the leaf that stands for it in every graph, and its value. */
struct param {
	adg::node leaf;
	vec value;
};

struct model {
	param w1, b1, w2, b2; /* W1: n_hidden x n_in, W2: n_out x n_hidden */
};

/* The data set: sample s, of class s % n_out, is a point near its class's
 * centre; x is n_samples x n_in. */
vec make_data(std::mt19937 &rng)
{
	std::uniform_real_distribution<double> u(-1.0, 1.0);
	vec centre(n_out * n_in), x(n_samples * n_in);
	for (double &c : centre)
		c = u(rng);
	for (std::size_t s = 0; s < n_samples; s++)
		for (std::size_t i = 0; i < n_in; i++)
			x[s * n_in + i] =
				centre[s % n_out * n_in + i] + 0.8 * u(rng);
	return x;
}

/* y = x W^T + b, for the n_samples rows of x; W is n_o x n_i. */
vec affine(const vec &x, const vec &w, const vec &b)
{
	const std::size_t n_o = b.size(), n_i = w.size() / n_o;
	vec y(n_samples * n_o);
	for (std::size_t s = 0; s < n_samples; s++)
		for (std::size_t k = 0; k < n_o; k++) {
			double a = b[k];
			for (std::size_t i = 0; i < n_i; i++)
				a += x[s * n_i + i] * w[k * n_i + i];
			y[s * n_o + k] = a;
		}
	return y;
}

/* affine's backward: from dy, adds dW = dy^T x, db = the sum of dy's rows
 * and, given W, dx = dy W. */
void affine_grads(const vec &dy, const vec &x, vec &dw, vec &db,
		  const vec *w = nullptr, vec *dx = nullptr)
{
	const std::size_t n_o = db.size(), n_i = dw.size() / n_o;
	for (std::size_t s = 0; s < n_samples; s++)
		for (std::size_t k = 0; k < n_o; k++) {
			double g = dy[s * n_o + k];
			db[k] += g;
			for (std::size_t i = 0; i < n_i; i++) {
				dw[k * n_i + i] += g * x[s * n_i + i];
				if (dx != nullptr)
					(*dx)[s * n_i + i] +=
						g * (*w)[k * n_i + i];
			}
		}
}

/* Builds the graph of the mean cross-entropy of m on x, puts its value in
 * *loss and returns its root. Each op computes its output now and keeps,
 * in its step's captures, the forward values the step needs. */
adg::node forward(adg::registry &reg, const model &m, const vec &x,
		  double *loss)
{
	/* The hidden layer: h = tanh(x W1^T + b1). */
	vec h = affine(x, m.w1.value, m.b1.value);
	for (double &v : h)
		v = std::tanh(v);
	adg::node hidden = adg::op(
		reg, {m.w1.leaf, m.b1.leaf},
		[x, h](adg::step_call<vec> &c) {
			/* The gradient, taken rather than copied (null: no
			 * child gave one), then through tanh: dh (1 - h^2). */
			std::unique_ptr<vec> da = c.take_grad();
			if (da == nullptr)
				return;
			for (std::size_t i = 0; i < da->size(); i++)
				(*da)[i] *= 1 - h[i] * h[i];
			vec dw1(n_hidden * n_in), db1(n_hidden);
			affine_grads(*da, x, dw1, db1);
			c.give(0, std::move(dw1));
			c.give(1, std::move(db1));
		},
		"tanh_layer");

	/* The output layer: z = h W2^T + b2. */
	vec z = affine(h, m.w2.value, m.b2.value);
	adg::node logits = adg::op(
		reg, {hidden, m.w2.leaf, m.b2.leaf},
		[h, w2 = m.w2.value](adg::step_call<vec> &c) {
			const vec *dz = c.grad(); /* borrowed */
			if (dz == nullptr)
				return;
			vec dh(h.size()), dw2(w2.size()), db2(n_out);
			affine_grads(*dz, h, dw2, db2, &w2, &dh);
			c.give(0, std::move(dh));
			c.give(1, std::move(dw2));
			c.give(2, std::move(db2));
		},
		"linear");

	/* The loss: the mean of -log softmax(z)[label]. Its gradient with
	 * respect to z is (softmax(z) - onehot(label)) / n_samples. */
	vec p(z.size());
	*loss = 0;
	for (std::size_t s = 0; s < n_samples; s++) {
		const double *zs = &z[s * n_out];
		double *ps = &p[s * n_out], sum = 0;
		double top = *std::max_element(zs, zs + n_out);
		for (std::size_t k = 0; k < n_out; k++)
			sum += ps[k] = std::exp(zs[k] - top);
		for (std::size_t k = 0; k < n_out; k++)
			ps[k] /= sum;
		*loss -= std::log(ps[s % n_out]) / n_samples;
	}
	/* The handles hidden and logits go as this returns: the root's graph
	 * holds their nodes. */
	return adg::op(
		reg, {logits},
		[p](adg::step_call<vec> &c) {
			double g = c.grad_or(vec{0.0})[0];
			vec dz = p;
			for (std::size_t s = 0; s < n_samples; s++)
				dz[s * n_out + s % n_out] -= 1;
			for (double &v : dz)
				v *= g / n_samples;
			c.give(0, std::move(dz));
		},
		"softmax_xent");
}

/* Compares the gradients of two weights of each tensor with central
 * differences, (loss(w + eps) - loss(w - eps)) / 2 eps. */
int check_gradients(adg::registry &reg, model &m, const vec &x)
{
	double loss = 0;
	adg::gradients<vec> g =
		adg::backward(forward(reg, m, x, &loss), vec{1.0});
	/* The loss alone: its graph is dropped unrun. */
	auto loss_of = [&] {
		double l = 0;
		forward(reg, m, x, &l);
		return l;
	};
	const double eps = 1e-5;
	int failed = 0;
	for (param *p : {&m.w1, &m.b1, &m.w2, &m.b2})
		for (std::size_t i :
		     {p->value.size() / 3, p->value.size() - 1}) {
			const double kept = p->value[i];
			p->value[i] = kept + eps;
			double up = loss_of();
			p->value[i] = kept - eps;
			double down = loss_of();
			p->value[i] = kept;
			double numeric = (up - down) / (2 * eps);
			double analytic = g.get(p->leaf)[i];
			double err = std::fabs(analytic - numeric) /
				     std::fmax(std::fabs(numeric), 1e-4);
			std::printf("d loss / d %s[%zu]: backward %+.9f, "
				    "central difference %+.9f, error %.0e\n",
				    reg.leaf_name(p->leaf.id()).c_str(), i,
				    analytic, numeric, err);
			failed |= !(err < 1e-6);
		}
	return failed;
}

int run()
{
	adg::registry reg; /* first: it outlives every node */
	std::mt19937 rng(29);
	const vec x = make_data(rng);
	auto weights = [&](const char *name, std::size_t n, double scale) {
		std::uniform_real_distribution<double> u(-scale, scale);
		param p{adg::leaf(reg, name), vec(n)};
		for (double &v : p.value)
			v = u(rng);
		return p;
	};
	model m{weights("W1", n_hidden * n_in, 1 / std::sqrt(n_in)),
		weights("b1", n_hidden, 0.0),
		weights("W2", n_out * n_hidden, 1 / std::sqrt(n_hidden)),
		weights("b2", n_out, 0.0)};

	int failed = 0;
	double first = 0, last = 0;
	for (int step = 0; step < 20; step++) {
		double loss = 0;
		adg::node root = forward(reg, m, x, &loss);
		adg::gradients<vec> g = adg::backward(root, vec{1.0});
		for (param *p : {&m.w1, &m.b1, &m.w2, &m.b2}) {
			const vec &dp = g.get(p->leaf);
			for (std::size_t i = 0; i < p->value.size(); i++)
				p->value[i] -= 0.5 * dp[i]; /* the SGD step */
		}
		std::printf("step %2d: loss %.6f\n", step, loss);
		failed |= step > 0 && !(loss < last); /* it must fall */
		first = step == 0 ? loss : first;
		last = loss;
	}
	failed |= !(last < 0.5 * first);
	failed |= check_gradients(reg, m, x);

	/* Every graph is gone: only the four weights' leaves are left. */
	failed |= reg.stats().live_nodes != 4;
	m = {};
	reg.close(); /* throws ADG_EBUSY if a node were left */
	return failed;
}

} // namespace

int main()
{
	try {
		int failed = run();
		std::puts(failed ? "mlp-cpp: FAILED" : "mlp-cpp: ok");
		return failed;
	} catch (const std::exception &e) {
		std::fprintf(stderr, "mlp-cpp: %s\n", e.what());
		return 1;
	}
}
