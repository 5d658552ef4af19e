/* Gradients of gradients on adg.hpp: a Hessian-vector product, from a
 * retained backward whose steps record the gradients they give as ops.
 *
 * scalar below is a number of the graph: a value and, unless it is a
 * constant, the node that computes it. It is also the gradient type, so a
 * step's gradient can be a node. With a seed that is a node (a leaf of
 * value 1), each step gives g * d out / d parent as a product that is
 * recorded, so the leaves' gradients come back as nodes; a backward from
 * grad f . v then gives H v. With a constant seed the steps compute plain
 * numbers and record nothing.
 *
 * f(x, y) = x^2 y + sin(x) y^3. The program checks grad f, a second run of
 * the same retained backward, H v for three v, and a last, consuming
 * backward against the closed forms. Usage: higher-cpp (exits 1 on a
 * mismatch). */
#include <adg.hpp>

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

namespace
{

struct scalar {
	double value = 0;
	adg::node node; /* empty: a constant */

	scalar(double v = 0) : value(v)
	{
	}
	scalar(double v, adg::node n) : value(v), node(std::move(n))
	{
	}
	bool constant() const
	{
		return !node;
	}
	/* How libadg sums two gradients of a node: recorded, when either
	 * is a node. */
	scalar &operator+=(const scalar &other);
};

scalar variable(adg::registry &reg, double v, const char *name)
{
	return scalar(v, adg::leaf(reg, name));
}

scalar operator*(const scalar &a, const scalar &b);

/* y = an op of value v over args: a node whose parents are the args that
 * are nodes, or a constant when none is. Its step gives each such arg
 * g * dy/darg, partial(args, k) being dy/darg k as a scalar: made of the
 * args themselves when g is a node, so that the product is recorded too,
 * or of their values alone when g is a constant, so that nothing is. */
template <std::size_t N, class Partial>
scalar record(const char *name, double v, std::array<scalar, N> args,
	      Partial partial)
{
	std::vector<adg::node_ref> parents; /* borrowed: args holds them */
	std::vector<std::size_t> arg_of;    /* the arg at each parent slot */
	for (std::size_t k = 0; k < N; k++)
		if (!args[k].constant()) {
			parents.push_back(args[k].node);
			arg_of.push_back(k);
		}
	if (parents.empty())
		return v;
	auto step = [args, arg_of, partial](adg::step_call<scalar> &c) mutable {
		if (c.grad() == nullptr)
			return;
		const scalar &g = *c.grad();
		/* A retained backward may run the step again: it copies what
		 * it captured. A consuming one runs it once: it may take it
		 * (the handles, and so the nodes, go when the step returns). */
		std::array<scalar, N> at;
		if (c.retained())
			at = args;
		else
			at = std::move(args);
		if (g.constant())
			for (scalar &a : at)
				a = scalar(a.value);
		for (std::size_t slot = 0; slot < arg_of.size(); slot++)
			c.give(slot, g * partial(at, arg_of[slot]));
	};
	/* The parents' registry: a node knows it, so a step recording a
	 * gradient needs no registry of its own. */
	adg::registry_ref reg = parents.front().registry();
	return scalar(v, adg::op(reg, parents, std::move(step), name));
}

scalar operator+(const scalar &a, const scalar &b)
{
	return record<2>("add", a.value + b.value, {a, b},
			 [](const auto &, std::size_t) { return scalar(1.0); });
}

scalar operator*(const scalar &a, const scalar &b)
{
	if (b.constant() && b.value == 1.0)
		return a; /* nothing to record */
	if (a.constant() && a.value == 1.0)
		return b;
	return record<2>("mul", a.value * b.value, {a, b},
			 [](const auto &p, std::size_t k) { return p[1 - k]; });
}

scalar &scalar::operator+=(const scalar &other)
{
	return *this = *this + other;
}

scalar cos(const scalar &a);

scalar sin(const scalar &a)
{
	return record<1>("sin", std::sin(a.value), {a},
			 [](const auto &p, std::size_t) { return cos(p[0]); });
}

scalar cos(const scalar &a)
{
	return record<1>(
		"cos", std::cos(a.value), {a},
		[](const auto &p, std::size_t) { return -1.0 * sin(p[0]); });
}

int failed = 0;

void expect(const std::string &what, double got, double want)
{
	bool ok =
		std::fabs(got - want) <= 1e-12 * std::fmax(1, std::fabs(want));
	std::printf("%-24s %+.15f\n", what.c_str(), got);
	if (!ok) {
		std::fprintf(stderr, "%s: got %.17g, want %.17g\n",
			     what.c_str(), got, want);
		failed = 1;
	}
}

void run(adg::registry &reg)
{
	const double xv = 0.7, yv = -1.3;
	scalar x = variable(reg, xv, "x"), y = variable(reg, yv, "y");
	scalar f = x * x * y + sin(x) * y * y * y;
	const double fx = 2 * xv * yv + std::cos(xv) * yv * yv * yv,
		     fy = xv * xv + 3 * std::sin(xv) * yv * yv,
		     fxx = 2 * yv - std::sin(xv) * yv * yv * yv,
		     fxy = 2 * xv + 3 * std::cos(xv) * yv * yv,
		     fyy = 6 * std::sin(xv) * yv;

	/* grad f, recorded: a retained backward (f's steps stay, since the
	 * gradients' graph runs them again), seeded with a node. */
	adg::backward_options retain;
	retain.retain = true;
	scalar one = variable(reg, 1.0, "seed");
	adg::gradients<scalar> g = adg::backward(f.node, one, retain);
	scalar gx = g.take(x.node), gy = g.take(y.node);
	expect("df/dx", gx.value, fx);
	expect("df/dy", gy.value, fy);
	failed |= gx.constant() || gy.constant(); /* they must be nodes */

	/* The same retained backward again: the same gradients. */
	adg::gradients<scalar> again = adg::backward(f.node, one, retain);
	expect("df/dx, again", again.get(x.node).value, gx.value);
	expect("df/dy, again", again.get(y.node).value, gy.value);

	/* H v = grad (grad f . v): a backward over the gradients' graph,
	 * with a constant seed, retained to keep f's graph for the next. */
	const struct {
		const char *name;
		double x, y;
	} vs[] = {{"e_x", 1, 0}, {"e_y", 0, 1}, {"(0.5, -2)", 0.5, -2}};
	for (const auto &v : vs) {
		scalar dot = gx * v.x + gy * v.y;
		adg::gradients<scalar> h =
			adg::backward(dot.node, scalar(1.0), retain);
		expect(std::string("(H v)_x, v = ") + v.name,
		       h.get(x.node).value, fxx * v.x + fxy * v.y);
		expect(std::string("(H v)_y, v = ") + v.name,
		       h.get(y.node).value, fxy * v.x + fyy * v.y);
	}

	/* Last, a consuming backward from f: it takes f's steps; its
	 * constant seed records nothing. */
	adg::gradients<scalar> last = adg::backward(f.node, scalar(1.0));
	expect("df/dx, consuming", last.get(x.node).value, fx);
	expect("df/dy, consuming", last.get(y.node).value, fy);
	failed |= !last.get(x.node).constant();
	/* Every handle goes here: the recorded nodes with them. */
}

} // namespace

int main()
{
	try {
		adg::registry reg;
		run(reg);
		failed |= reg.stats().live_nodes != 0;
		reg.close(); /* throws ADG_EBUSY if a node were left */
	} catch (const std::exception &e) {
		std::fprintf(stderr, "higher-cpp: %s\n", e.what());
		return 1;
	}
	std::puts(failed ? "higher-cpp: FAILED" : "higher-cpp: ok");
	return failed;
}
