/* A 32-64-10 multilayer perceptron on adg.hpp (its model, data and forward
 * pass are mlp.hpp's: a tanh hidden layer and a softmax cross-entropy
 * loss), trained by gradient descent on a synthetic data set made from a
 * fixed seed, on one thread.
 *
 * Each step builds the batch's graph over the weights' leaves, named W1, b1,
 * W2 and b2, which every step's graph shares; runs backward from the loss;
 * and moves the weights against their gradients. The loss is one value,
 * so its backward takes no seed: adg::backward<vec> starts from a vec of
 * one 1 (adg::one). The loss must fall at every step. Then the gradients
 * of a few weights are checked against central differences of the loss.
 * Usage: mlp-cpp (exits 1 on a failed check). */
#include "mlp.hpp"

#include <cstdio>
#include <exception>

namespace
{

using namespace mlp;

/* Compares the gradients of two weights of each tensor with central
 * differences, (loss(w + eps) - loss(w - eps)) / 2 eps. */
int check_gradients(adg::registry &reg, model &m, const vec &x)
{
	double loss = 0;
	adg::gradients<vec> g =
		adg::backward<vec>(forward(reg, m, x, 0, n_samples, &loss));
	/* The loss alone: its graph is dropped unrun. */
	auto loss_of = [&] {
		double l = 0;
		forward(reg, m, x, 0, n_samples, &l);
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
	model m = make_model(reg, rng);

	int failed = 0;
	double first = 0, last = 0;
	for (int step = 0; step < 20; step++) {
		double loss = 0;
		adg::node root = forward(reg, m, x, 0, n_samples, &loss);
		adg::gradients<vec> g = adg::backward<vec>(root);
		for (param *p : {&m.w1, &m.b1, &m.w2, &m.b2})
			sgd(p->value, g.get(p->leaf), 0.5);
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
