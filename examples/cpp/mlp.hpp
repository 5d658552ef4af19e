/* The 32-64-10 perceptron that examples/cpp/mlp.cpp and sync.cpp train:
 * its tensors, its data and its forward pass, which records the graph of a
 * batch's loss on adg.hpp. Tensors are flat, row-major std::vector<double>s;
 * the gradient type, vec, is one with the += that libadg sums two
 * gradients of a node with. */
#ifndef ADG_EXAMPLES_MLP_HPP
#define ADG_EXAMPLES_MLP_HPP

#include <adg.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

namespace mlp
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
inline vec make_data(std::mt19937 &rng)
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

/* y = x W^T + b, for the rows of x; W is n_o x n_i. */
inline vec affine(const vec &x, const vec &w, const vec &b)
{
	const std::size_t n_o = b.size(), n_i = w.size() / n_o;
	const std::size_t rows = x.size() / n_i;
	vec y(rows * n_o);
	for (std::size_t s = 0; s < rows; s++)
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
inline void affine_grads(const vec &dy, const vec &x, vec &dw, vec &db,
			 const vec *w = nullptr, vec *dx = nullptr)
{
	const std::size_t n_o = db.size(), n_i = dw.size() / n_o;
	const std::size_t rows = x.size() / n_i;
	for (std::size_t s = 0; s < rows; s++)
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

/* Builds the graph of the cross-entropy of m on the rows of x, samples
 * first, first + 1, ... of a batch of n_total (the mean over the batch:
 * the losses of a batch's shares sum to the batch's), puts its value in
 * *loss and returns its root. Each op computes its output now and keeps,
 * in its step's captures, the forward values the step needs. */
inline adg::node forward(adg::registry_ref reg, const model &m, const vec &x,
			 std::size_t first, std::size_t n_total, double *loss)
{
	const std::size_t rows = x.size() / n_in;
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
	for (std::size_t s = 0; s < rows; s++) {
		const double *zs = &z[s * n_out];
		double *ps = &p[s * n_out], sum = 0;
		double top = *std::max_element(zs, zs + n_out);
		for (std::size_t k = 0; k < n_out; k++)
			sum += ps[k] = std::exp(zs[k] - top);
		for (std::size_t k = 0; k < n_out; k++)
			ps[k] /= sum;
		*loss -= std::log(ps[(first + s) % n_out]) / n_total;
	}
	/* The handles hidden and logits go as this returns: the root's graph
	 * holds their nodes. */
	return adg::op(
		reg, {logits},
		[p, rows, first, n_total](adg::step_call<vec> &c) {
			double g = c.grad_or(vec{0.0})[0];
			vec dz = p;
			for (std::size_t s = 0; s < rows; s++)
				dz[s * n_out + (first + s) % n_out] -= 1;
			for (double &v : dz)
				v *= g / n_total;
			c.give(0, std::move(dz));
		},
		"softmax_xent");
}

/* The SGD step of one weight: w -= rate * grad. */
inline void sgd(vec &w, const vec &grad, double rate)
{
	for (std::size_t i = 0; i < w.size(); i++)
		w[i] -= rate * grad[i];
}

/* A fingerprint of the weights' bits (FNV-1a): equal only if every bit is. */
inline std::uint64_t fingerprint(const model &m)
{
	std::uint64_t h = 14695981039346656037ull;
	for (const param *p : {&m.w1, &m.b1, &m.w2, &m.b2})
		for (double v : p->value) {
			unsigned char bytes[sizeof v];
			std::memcpy(bytes, &v, sizeof v);
			for (unsigned char b : bytes)
				h = (h ^ b) * 1099511628211ull;
		}
	return h;
}

/* The weights, drawn from rng, as leaves of reg named W1, b1, W2, b2. */
inline model make_model(adg::registry_ref reg, std::mt19937 &rng)
{
	auto weights = [&](const char *name, std::size_t n, double scale) {
		std::uniform_real_distribution<double> u(-scale, scale);
		param p{adg::leaf(reg, name), vec(n)};
		for (double &v : p.value)
			v = u(rng);
		return p;
	};
	return model{weights("W1", n_hidden * n_in, 1 / std::sqrt(n_in)),
		     weights("b1", n_hidden, 0.0),
		     weights("W2", n_out * n_hidden, 1 / std::sqrt(n_hidden)),
		     weights("b2", n_out, 0.0)};
}

} // namespace mlp

#endif
