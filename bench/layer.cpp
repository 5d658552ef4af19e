/*
 * The cpp workload's C++ side: the chain of layer.c through adg.hpp, as a
 * C++ trainer writes it: double gradients, a lambda per op capturing its
 * forward values, node handles, adg::backward. Its ns per op against
 * layer.c's is what the C++ layer costs.
 */
#include <adg.hpp>

#include <cstdint>

/* bench.h is C; the one thing wanted from it. */
extern "C" std::uint64_t bench_now_ns(void);

namespace
{

void layer_cpp_once(adg::registry &reg, int n)
{
	adg::node x = adg::leaf(reg), w = adg::leaf(reg);
	adg::node y = x;
	double yv = 1.0, wv = 1.0000001;
	for (int k = 0; k < n; k++) {
		y = adg::op(reg, {y, w},
			    [a = yv, b = wv](adg::step_call<double> &c) {
				    double g = c.grad_or(0.0);
				    c.give(0, g * b);
				    c.give(1, g * a);
			    });
		yv *= wv;
	}
	adg::backward(y, 1.0);
}

} // namespace

extern "C" double bench_layer_cpp_ns(int n, int ms)
{
	try {
		adg::registry reg;
		long ops = 0;
		std::uint64_t t0 = bench_now_ns();
		std::uint64_t end =
			t0 + static_cast<std::uint64_t>(ms) * 1000000u;
		std::uint64_t t = t0;
		while (t < end) {
			layer_cpp_once(reg, n);
			ops += n;
			t = bench_now_ns();
		}
		return static_cast<double>(t - t0) / static_cast<double>(ops);
	} catch (...) {
		return -1;
	}
}
