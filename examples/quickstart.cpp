/* libadg's C++ quick start: y = a * b, then backward from y gives dy/da = b
 * and dy/db = a. Gradients are doubles; adg.hpp owns and frees them, and
 * an error is an adg::error exception (uncaught here: it ends the program
 * with its message). */
#include <adg.hpp>
#include <cstdio>

int main()
{
	adg::registry reg;
	adg::node a = adg::leaf(reg), b = adg::leaf(reg);
	double av = 3.0, bv = 4.0; /* forward values of a and b */
	adg::node y = adg::op(reg, {a, b}, [=](adg::step_call<double> &c) {
		c.give(0, c.grad_or(0.0) * bv);
		c.give(1, c.grad_or(0.0) * av);
	});
	adg::gradients<double> g = adg::backward(y, 1.0);
	std::printf("dy/da = %g, dy/db = %g\n", g.get(a), g.get(b)); /* 4, 3 */
}
