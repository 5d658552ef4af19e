/* The backward kernels of lstm.hpp against finite differences: for each
 * kernel, a loss L = sum(r * output) with fixed random r, its gradient
 * from the backward kernel, and (L(v + e) - L(v - e)) / 2e for every
 * input and parameter element v. An LSTM sequence both ways, with the
 * gradient on every step's h and on the last one only; the embedding's
 * gather; the MLP's layer with and without tanh; softmax cross-entropy.
 * No data, no libadg. Exit status 0 when every element agrees within
 * tolerance, 1 otherwise (the worst disagreement printed per check). */
#include "lstm.hpp"

#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace
{

std::uint64_t state = 42;

std::vector<float> randoms(std::size_t n, float scale = 1)
{
	std::vector<float> v(n);
	for (float &f : v)
		f = static_cast<float>(scale *
				       (2 * lstm::uniform01(state) - 1));
	return v;
}

double dot(const std::vector<float> &a, const std::vector<float> &b)
{
	double s = 0;
	for (std::size_t i = 0; i < a.size(); i++)
		s += static_cast<double>(a[i]) * b[i];
	return s;
}

int failures = 0;

/* Compares grad, the backward's gradient of loss() with respect to v,
 * with central differences, moving each element of v by eps. */
void compare(const std::string &what, std::vector<float> &v,
	     const std::vector<float> &grad,
	     const std::function<double()> &loss)
{
	const float eps = 1e-2f;
	double worst = 0;
	for (std::size_t i = 0; i < v.size(); i++) {
		float keep = v[i];
		v[i] = keep + eps;
		double up = loss();
		v[i] = keep - eps;
		double down = loss();
		v[i] = keep;
		double numeric = (up - down) / (2.0 * eps);
		double error = std::fabs(numeric - grad[i]) /
			       std::max(1.0, std::fabs(numeric));
		worst = std::max(worst, error);
	}
	bool ok = worst < 5e-3;
	std::printf("%-40s %4zu elements, worst error %.2e %s\n", what.c_str(),
		    v.size(), worst, ok ? "ok" : "FAILED");
	failures += !ok;
}

void check_sequence(bool reverse, bool every_step)
{
	const lstm::cell k{3, 4};
	const int len = 4, n = 2, rows = len * n, g = k.gates(), H = k.hidden;
	std::vector<float> x = randoms(static_cast<std::size_t>(rows) * k.in),
			   w = randoms(static_cast<std::size_t>(g) * k.cols()),
			   b = randoms(g),
			   r = randoms(static_cast<std::size_t>(
				   every_step ? rows * H : n * H));
	std::vector<float> gates(static_cast<std::size_t>(rows) * g),
		c(static_cast<std::size_t>(rows) * H),
		h(static_cast<std::size_t>(rows) * H);
	auto loss = [&] {
		lstm::sequence_forward(k, len, n, reverse, x.data(), w.data(),
				       b.data(), gates.data(), c.data(),
				       h.data());
		if (every_step)
			return dot(h, r);
		std::size_t last =
			static_cast<std::size_t>(reverse ? 0 : len - 1) * n * H;
		return dot(std::vector<float>(h.begin() + last,
					      h.begin() + last + n * H),
			   r);
	};
	loss();
	std::vector<float> dz(static_cast<std::size_t>(rows) * g), dx(x.size()),
		dw(w.size()), db(b.size());
	lstm::sequence_backward(k, len, n, reverse, x.data(), w.data(),
				gates.data(), c.data(), h.data(),
				every_step ? r.data() : nullptr,
				every_step ? nullptr : r.data(), dz.data(),
				dx.data(), dw.data(), db.data());
	std::string name = std::string("lstm ") +
			   (reverse ? "backward" : "forward") +
			   (every_step ? ", every h" : ", last h");
	compare(name + ": x", x, dx, loss);
	compare(name + ": W", w, dw, loss);
	compare(name + ": b", b, db, loss);
}

void check_gather()
{
	const int cols = 3, n = 5;
	const int ids[n] = {2, 0, 2, 3, 2};
	std::vector<float> table = randoms(4 * cols),
			   r = randoms(static_cast<std::size_t>(n) * cols),
			   out(r.size()), dtable(table.size(), 0.0f);
	auto loss = [&] {
		lstm::gather(table.data(), cols, ids, n, out.data(), cols);
		return dot(out, r);
	};
	lstm::scatter_add(r.data(), cols, ids, n, cols, dtable.data());
	compare("embedding gather: table", table, dtable, loss);
}

void check_layer(bool squash)
{
	const int n = 3, in = 5, out = 4;
	std::vector<float> x = randoms(n * in), w = randoms(out * in),
			   b = randoms(out), r = randoms(n * out), y(n * out);
	auto loss = [&] {
		lstm::layer_forward(n, in, out, x.data(), w.data(), b.data(),
				    squash, y.data());
		return dot(y, r);
	};
	loss();
	std::vector<float> dy = r, dx(x.size()), dw(w.size()), db(b.size());
	lstm::layer_backward(n, in, out, x.data(), w.data(), y.data(), squash,
			     dy.data(), dw.data(), db.data(), dx.data());
	std::string name = squash ? "layer, tanh" : "layer, linear";
	compare(name + ": x", x, dx, loss);
	compare(name + ": W", w, dw, loss);
	compare(name + ": b", b, db, loss);
}

void check_cross_entropy()
{
	const int n = 3, classes = 5;
	const int labels[n] = {1, 4, 0};
	const float scale = 0.5f;
	std::vector<float> s = randoms(n * classes, 3), ds(s.size());
	auto loss = [&] {
		return scale * lstm::cross_entropy(n, classes, s.data(), labels,
						   1, nullptr, nullptr);
	};
	lstm::cross_entropy(n, classes, s.data(), labels, scale, ds.data(),
			    nullptr);
	compare("softmax cross-entropy: scores", s, ds, loss);
}

} // namespace

int main()
{
	for (bool reverse : {false, true})
		for (bool every : {true, false})
			check_sequence(reverse, every);
	check_gather();
	check_layer(true);
	check_layer(false);
	check_cross_entropy();
	if (failures > 0)
		std::printf("%d checks FAILED\n", failures);
	return failures > 0;
}
