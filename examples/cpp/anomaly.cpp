/* What to do when a backward goes wrong, with adg.hpp.
 *
 * (a) A step throws an exception of the program's own type: the backward
 *     rethrows it, as thrown, so a catch clause for that type works, and
 *     backward_options::failure names the step that threw.
 * (b) A step gives a NaN: a value check (std::isfinite) stops the backward
 *     at that step, and the adg::error it throws names it, in failure()
 *     and what(), as torch.autograd.detect_anomaly does.
 * (c) The graph is written as Graphviz DOT, its leaves named, to the file
 *     argv[1], and drawn into argv[1].png when graphviz's dot is on PATH;
 *     without argv[1], to stdout (and what the program reports, to
 *     stderr).
 *
 * (a) and (b) run on the calling thread, then on a pool of 2: the failure
 * names the same step either way. Usage: anomaly-cpp [FILE.dot] (exits 1
 * when an expectation fails). */
#include <adg.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

namespace
{

/* The program's own exception: a step found its input out of its domain. */
struct domain_violation : std::domain_error {
	domain_violation(const std::string &what, double at)
	    : std::domain_error(what), value(at)
	{
	}
	double value;
};

int failed = 0;
std::FILE *report = stdout; /* stderr when stdout is the DOT's */

void expect(bool ok, const char *what)
{
	if (!ok) {
		std::fprintf(stderr, "anomaly-cpp: expected %s\n", what);
		failed = 1;
	}
}

/* An op whose step gives g * slopes[k] to parent k: slopes are its partial
 * derivatives at the forward values. */
adg::node op(adg::registry &reg, const char *name,
	     const std::vector<adg::node> &parents, std::vector<double> slopes)
{
	return adg::op(
		reg, parents,
		[slopes](adg::step_call<double> &c) {
			double g = c.grad_or(0.0);
			for (std::size_t k = 0; k < slopes.size(); k++)
				c.give(k, g * slopes[k]);
		},
		name);
}

/* (a) y = 3 log(w) at w = -2: log's step refuses the point, by throwing. */
void a_step_throws(adg::registry &reg, adg::executor_ref ex)
{
	const double wv = -2;
	adg::node w = adg::leaf(reg, "w");
	adg::node lg = adg::op(
		reg, {w},
		[wv](adg::step_call<double> &c) {
			if (!(wv > 0))
				throw domain_violation("log of a number <= 0",
						       wv);
			c.give(0, c.grad_or(0.0) / wv);
		},
		"log");
	adg::node y = op(reg, "scale", {lg}, {3.0});
	adg_failure where{};
	adg::backward_options o;
	o.executor = ex;
	o.failure = &where;
	try {
		adg::backward(y, 1.0, o);
		expect(false, "(a) to throw");
	} catch (const domain_violation &e) { /* the step's own, as thrown */
		const char *name = where.name ? where.name : "";
		std::fprintf(report,
			     "(a) step '%s' of node %llu threw: %s (at %g)\n",
			     name,
			     static_cast<unsigned long long>(where.node_id),
			     e.what(), e.value);
		expect(where.site == ADG_FAILED_STEP, "(a) site: a step");
		expect(where.node_id == lg.id(), "(a) the node of log");
		expect(std::strcmp(name, "log") == 0, "(a) 'log'");
	}
}

/* f = sqrt(x) y + log1p(y) at x = y = 0: sqrt's slope there is infinite,
 * and infinity times the zero gradient that reaches it is NaN. */
struct f_graph {
	adg::node x, y, s, f; /* s: the sqrt */
};

f_graph build_f(adg::registry &reg)
{
	const double xv = 0, yv = 0;
	f_graph g;
	g.x = adg::leaf(reg, "x");
	g.y = adg::leaf(reg, "y");
	g.s = op(reg, "sqrt", {g.x}, {1 / (2 * std::sqrt(xv))});
	adg::node m = op(reg, "mul", {g.s, g.y}, {yv, std::sqrt(xv)});
	adg::node l = op(reg, "log1p", {g.y}, {1 / (yv + 1)});
	g.f = op(reg, "add", {m, l}, {1, 1});
	return g;
}

/* (b) The value check sees every gradient a step gives; a NaN fails the
 * backward at that step. */
void a_nan(adg::registry &reg, adg::executor_ref ex)
{
	f_graph g = build_f(reg);
	adg::backward_options o;
	o.executor = ex;
	o.value_check = [](adg::grad_ref v) {
		return std::isfinite(*v.get<double>());
	};
	try {
		adg::backward(g.f, 1.0, o);
		expect(false, "(b) to throw");
	} catch (const adg::error &e) {
		std::fprintf(report, "(b) %s\n", e.what());
		const adg_failure &where = e.failure();
		expect(e.code().value() == ADG_EVALUE, "(b) ADG_EVALUE");
		expect(where.site == ADG_FAILED_CHECK, "(b) the value check");
		expect(where.node_id == g.s.id(), "(b) the node of sqrt");
		expect(where.name != nullptr &&
			       std::strcmp(where.name, "sqrt") == 0,
		       "(b) 'sqrt'");
		expect(std::strstr(e.what(), "'sqrt'") != nullptr,
		       "(b) 'sqrt' in what()");
	}
}

/* A path as one sh word. */
std::string quoted(const std::string &s)
{
	std::string q = "'";
	for (char c : s)
		q += c == '\'' ? std::string("'\\''") : std::string(1, c);
	return q + "'";
}

/* (c) The graph of (b), as DOT: to path, or to stdout when null. */
void write_graph(adg::registry &reg, const char *path)
{
	f_graph g = build_f(reg);
	std::string text = adg::dot(g.f);
	expect(text.find("x (leaf " + std::to_string(g.x.id()) + ")") !=
		       std::string::npos,
	       "(c) the leaf x by name");
	expect(text.find("y (leaf " + std::to_string(g.y.id()) + ")") !=
		       std::string::npos,
	       "(c) the leaf y by name");
	expect(text.find("sqrt") != std::string::npos, "(c) the sqrt op");
	std::ofstream file;
	if (path != nullptr)
		file.open(path);
	std::ostream &out = path != nullptr ? file : std::cout;
	adg::write_dot(g.f, out); /* the same text, to a stream */
	expect(static_cast<bool>(out.flush()), "(c) the DOT written");
	if (path == nullptr)
		return;
	file.close();
	std::fprintf(report, "(c) the graph, as DOT: %s\n", path);
	/* Drawn when graphviz is there; skipped quietly when not. */
	if (std::system("command -v dot >/dev/null 2>&1") != 0)
		return;
	std::string png = std::string(path) + ".png";
	std::string draw = "dot -Tpng -o " + quoted(png) + " " + quoted(path);
	expect(std::system(draw.c_str()) == 0, "(c) dot -Tpng to draw it");
	std::fprintf(report, "(c) drawn: %s\n", png.c_str());
}

} // namespace

int main(int argc, char **argv)
{
	try {
		if (argc < 2)
			report = stderr;
		adg::registry reg;
		{
			adg::pool workers(2);
			for (adg::executor_ref ex :
			     {adg::executor_ref(),
			      adg::executor_ref(workers)}) {
				a_step_throws(reg, ex);
				a_nan(reg, ex);
			}
		} /* the pool's threads stop here: (c) may run dot */
		write_graph(reg, argc > 1 ? argv[1] : nullptr);
		expect(reg.stats().live_nodes == 0, "every node gone");
	} catch (const std::exception &e) {
		std::fprintf(stderr, "anomaly-cpp: %s\n", e.what());
		return 1;
	}
	return failed;
}
