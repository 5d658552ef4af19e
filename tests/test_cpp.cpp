/* adg.hpp's ownership and errors: every lambda and every gradient value is
 * destroyed exactly once, whatever fails (a step or an add that throws, a
 * backward refused), whatever is moved; gradients are those of the C API.
 * A plain main() rather than Criterion, so that the ThreadSanitizer build
 * (where Criterion cannot start, tests/tsan-runner/) runs the same file.
 * Prints "cpp: N passed, M failed" (and Criterion's summary line, see
 * main); exits non-zero on a failure. */
#include <adg.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fcntl.h>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <sys/wait.h>
#include <thread>
#include <type_traits>
#include <unistd.h>
#include <vector>

namespace
{

/* ------------------------------------------------------------- harness */

struct check_failed {
	std::string what;
};

#define EXPECT(cond)                                                           \
	do {                                                                   \
		if (!(cond))                                                   \
			throw check_failed{std::string(__FILE__ ":") +         \
					   std::to_string(__LINE__) + ": " +   \
					   #cond};                             \
	} while (0)

/* Runs statement, which must throw an X; binds it to e for the checks. */
#define EXPECT_THROWS(X, statement, checks)                                    \
	do {                                                                   \
		bool thrown_ = false;                                          \
		try {                                                          \
			statement;                                             \
		} catch (const X &e) {                                         \
			thrown_ = true;                                        \
			checks;                                                \
		}                                                              \
		EXPECT(thrown_ && "threw " #X);                                \
	} while (0)

struct test_case {
	const char *name;
	void (*run)();
	bool stress; /* the stress tier's (main's --stress), not the unit's */
};

std::vector<test_case> &all_tests()
{
	static std::vector<test_case> tests;
	return tests;
}

struct registrar {
	registrar(const char *name, void (*run)(), bool stress = false)
	{
		all_tests().push_back({name, run, stress});
	}
};

#define TEST(name)                                                             \
	void name();                                                           \
	const registrar name##_registrar(#name, name);                         \
	void name()

/* A concurrency stress test: the stress tier runs it (tests/meson.build). */
#define STRESS_TEST(name)                                                      \
	void name();                                                           \
	const registrar name##_registrar(#name, name, true);                   \
	void name()

/* A step's capture that counts its live copies: a closure libadg keeps is
 * one, destroyed once, when the step goes. */
struct probe {
	static std::atomic<long> live;
	probe() noexcept
	{
		live++;
	}
	probe(const probe &) noexcept
	{
		live++;
	}
	probe(probe &&) noexcept
	{
		live++;
	}
	probe &operator=(const probe &) = default;
	~probe()
	{
		live--;
	}
};
std::atomic<long> probe::live{0};

struct add_failed {
};

/* A gradient value that counts its live instances and whose += throws on
 * demand. */
struct tracked {
	static std::atomic<long> live;
	static std::atomic<bool> add_throws;
	double v;

	tracked(double x) noexcept : v(x)
	{
		live++;
	}
	tracked(const tracked &o) noexcept : v(o.v)
	{
		live++;
	}
	tracked(tracked &&o) noexcept : v(o.v)
	{
		live++;
	}
	tracked &operator=(const tracked &) = default;
	~tracked()
	{
		live--;
	}
	tracked &operator+=(const tracked &o)
	{
		if (add_throws)
			throw add_failed{};
		v += o.v;
		return *this;
	}
};
std::atomic<long> tracked::live{0};
std::atomic<bool> tracked::add_throws{false};

struct boom {
	int value;
};

template <class X> void self_move(X &x)
{
	X &alias = x; /* hides the self-move from -Wself-move */
	x = std::move(alias);
}

/* ------------------------------------------------------ graphs to run */

/* The same graph in C++ and in C: x, y, z leaves;
 *   p = x * y, q = p + x, r = q * q, s = r * z, t = s + p;
 * its gradients are folded in several places (x, p, q twice). */
const double xv = 2.0, yv = -3.0, zv = 0.5;

template <class T>
adg::node mul(adg::registry &reg, const adg::node &a, double av,
	      const adg::node &b, double bv, const char *name = "mul")
{
	return adg::op(
		reg, {a, b},
		[av, bv, p = probe()](adg::step_call<T> &c) {
			(void)p;
			T g = c.grad_or(T(0.0));
			c.give(0, T(g * bv));
			c.give(1, T(g * av));
		},
		name);
}

double value_of(double d)
{
	return d;
}
double value_of(const tracked &t)
{
	return t.v;
}
tracked operator*(const tracked &t, double d)
{
	return tracked(t.v * d);
}

template <class T>
adg::node add(adg::registry &reg, const adg::node &a, const adg::node &b)
{
	return adg::op(
		reg, {a, b},
		[p = probe()](adg::step_call<T> &c) {
			(void)p;
			std::unique_ptr<T> g = c.take_grad();
			T zero(0.0);
			c.give(0, g ? *g : zero);
			c.give(1, g ? *g : zero);
		},
		"add");
}

struct leaves {
	adg::node x, y, z;
	explicit leaves(adg::registry &reg)
	    : x(adg::leaf(reg)), y(adg::leaf(reg)), z(adg::leaf(reg))
	{
	}
};

template <class T> adg::node build(adg::registry &reg, const leaves &l)
{
	adg::node p = mul<T>(reg, l.x, xv, l.y, yv);
	double pv = xv * yv;
	adg::node q = add<T>(reg, p, l.x);
	double qv = pv + xv;
	adg::node r = mul<T>(reg, q, qv, q, qv);
	adg::node s = mul<T>(reg, r, qv * qv, l.z, zv);
	return add<T>(reg, s, p); /* p, q, r, s go: t keeps what it needs */
}

/* The C API's version, on boxed doubles. */
void *box(double v)
{
	return new double(v);
}

int c_add(void **sum, void *value, void *)
{
	*static_cast<double *>(*sum) += *static_cast<double *>(value);
	delete static_cast<double *>(value);
	return 0;
}

void c_free(void *value, void *)
{
	delete static_cast<double *>(value);
}

struct c_pair {
	double a, b;
};

int c_mul_step(adg_step_call *call, void *user)
{
	const c_pair *ab = static_cast<const c_pair *>(user);
	double g = call->grad ? *static_cast<double *>(call->grad) : 0;
	int rc = adg_step_give(call, 0, box(g * ab->b));
	return rc != 0 ? rc : adg_step_give(call, 1, box(g * ab->a));
}

int c_add_step(adg_step_call *call, void *)
{
	double g = call->grad ? *static_cast<double *>(call->grad) : 0;
	int rc = adg_step_give(call, 0, box(g));
	return rc != 0 ? rc : adg_step_give(call, 1, box(g));
}

void c_release(void *user)
{
	delete static_cast<c_pair *>(user);
}

adg_node *c_op(adg_registry *reg, adg_node *a, adg_node *b, c_pair *ab)
{
	adg_node *parents[2] = {a, b}, *out = nullptr;
	adg_step step{};
	step.backward = ab ? c_mul_step : c_add_step;
	step.release = ab ? c_release : nullptr;
	step.user = ab;
	if (adg_op(reg, parents, 2, &step, &out) != 0)
		std::abort();
	return out;
}

/* x, y, z's gradients through the C API, no executor. */
std::vector<double> c_gradients()
{
	adg_registry *reg = nullptr;
	adg_node *x, *y, *z;
	if (adg_registry_new(nullptr, &reg) != 0 || adg_leaf(reg, &x) != 0 ||
	    adg_leaf(reg, &y) != 0 || adg_leaf(reg, &z) != 0)
		std::abort();
	double pv = xv * yv, qv = pv + xv;
	adg_node *p = c_op(reg, x, y, new c_pair{xv, yv});
	adg_node *q = c_op(reg, p, x, nullptr);
	adg_node *r = c_op(reg, q, q, new c_pair{qv, qv});
	adg_node *s = c_op(reg, r, z, new c_pair{qv * qv, zv});
	adg_node *t = c_op(reg, s, p, nullptr);
	adg_grad_ops ops{c_add, c_free, nullptr};
	adg_grads *grads = nullptr;
	if (adg_backward(reg, t, box(1.0), &ops, &grads) != 0)
		std::abort();
	std::vector<double> out;
	for (adg_node *leaf : {x, y, z}) {
		void *g = nullptr;
		if (adg_grads_get_node(grads, leaf, &g) != 0)
			std::abort();
		out.push_back(*static_cast<double *>(g));
	}
	adg_grads_free(grads);
	for (adg_node *n : {t, s, r, q, p, x, y, z})
		adg_node_unref(n);
	if (adg_registry_free(reg) != 0)
		std::abort();
	return out;
}

/* The same in C++, on an executor or none. */
template <class T = double>
std::vector<double> cpp_gradients(const adg::backward_options &options = {})
{
	adg::registry reg;
	leaves l(reg);
	adg::node t = build<T>(reg, l);
	adg::gradients<T> g = adg::backward(t, T(1.0), options);
	return {value_of(g.get(l.x)), value_of(g.get(l.y)),
		value_of(g.get(l.z))};
}

bool same_bits(const std::vector<double> &a, const std::vector<double> &b)
{
	return a.size() == b.size() &&
	       std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

/* A thread pool of the test's own, for adg::executor: jobs queue up and
 * run on its threads; the destructor runs what is left, then joins. */
class job_queue
{
public:
	explicit job_queue(unsigned n)
	{
		for (unsigned i = 0; i < n; i++)
			threads_.emplace_back([this] { work(); });
	}
	~job_queue()
	{
		{
			std::lock_guard<std::mutex> lock(mutex_);
			stopping_ = true;
		}
		wake_.notify_all();
		for (std::thread &t : threads_)
			t.join();
	}
	void post(std::function<void()> job)
	{
		{
			std::lock_guard<std::mutex> lock(mutex_);
			jobs_.push_back(std::move(job));
			posted_++;
		}
		wake_.notify_one();
	}
	unsigned long posted()
	{
		std::lock_guard<std::mutex> lock(mutex_);
		return posted_;
	}

private:
	void work()
	{
		std::unique_lock<std::mutex> lock(mutex_);
		for (;;) {
			wake_.wait(lock, [this] {
				return stopping_ || !jobs_.empty();
			});
			if (jobs_.empty())
				return; /* stopping, nothing left */
			std::function<void()> job = std::move(jobs_.front());
			jobs_.pop_front();
			lock.unlock();
			job();
			lock.lock();
		}
	}
	std::mutex mutex_;
	std::condition_variable wake_;
	std::deque<std::function<void()>> jobs_;
	std::vector<std::thread> threads_;
	bool stopping_ = false;
	unsigned long posted_ = 0;
};

/* ---------------------------------------------------------------- tests */

TEST(gradients_equal_the_c_apis)
{
	std::vector<double> want = c_gradients();
	EXPECT(same_bits(cpp_gradients(), want));
	EXPECT(same_bits(cpp_gradients<tracked>(), want));
	for (unsigned n : {1u, 2u, 4u}) {
		adg::pool workers(n);
		adg::backward_options o;
		o.executor = workers;
		EXPECT(same_bits(cpp_gradients(o), want));
	}
}

/* y = sum of n products w_i * x_i: n branches at once, for executors. */
std::vector<double> wide_gradients(const adg::backward_options &options = {})
{
	const std::size_t n = 16;
	adg::registry reg;
	std::vector<adg::node> w, terms;
	for (std::size_t i = 0; i < n; i++) {
		w.push_back(adg::leaf(reg));
		adg::node x = adg::leaf(reg);
		double xi = static_cast<double>(i);
		terms.push_back(mul<double>(reg, w[i], 0.25 * xi, x, 1.0 + xi));
	}
	adg::node y = adg::op(
		reg, terms,
		[p = probe()](adg::step_call<double> &c) {
			(void)p;
			for (std::size_t i = 0; i < c.n_parents(); i++)
				c.give(i, *c.grad() * static_cast<double>(i));
		},
		"weighted sum");
	terms.clear();
	adg::gradients<double> g = adg::backward(y, 1.0, options);
	std::vector<double> out;
	for (const adg::node &wi : w)
		out.push_back(g.get(wi));
	return out;
}

/* An executor_ref borrows: from a named pool, executor or adg_executor,
 * never from a temporary, which would be gone before the backward ran. */
static_assert(
	std::is_constructible_v<adg::executor_ref, adg::pool &> &&
		std::is_constructible_v<adg::executor_ref,
					const adg::executor &> &&
		std::is_constructible_v<adg::executor_ref, adg_executor &>,
	"executor_ref takes named executors");
static_assert(
	!std::is_constructible_v<adg::executor_ref, adg::pool> &&
		!std::is_constructible_v<adg::executor_ref, adg::executor> &&
		!std::is_constructible_v<adg::executor_ref, adg_executor> &&
		!std::is_assignable_v<adg::executor_ref &, adg::pool>,
	"executor_ref refuses temporaries");

TEST(executors_from_callables)
{
	std::vector<double> want = wide_gradients();
	EXPECT(want[3] == 3 * 4.0);
	job_queue queue(3);
	adg::executor by_job([&](adg::job j) { queue.post(j); }, 3);
	adg::backward_options o;
	o.executor = by_job;
	EXPECT(same_bits(wide_gradients(o), want));
	EXPECT(queue.posted() > 0);

	adg::executor by_fn(
		[&](void (*fn)(void *), void *arg) {
			queue.post([fn, arg] { fn(arg); });
		},
		2);
	o.executor = by_fn;
	unsigned long before = queue.posted();
	EXPECT(same_bits(wide_gradients(o), want));
	EXPECT(queue.posted() > before);

	/* A submit that refuses every job: the calling thread does it all. */
	adg::executor refusing([](adg::job) { throw std::runtime_error("no"); },
			       2);
	o.executor = refusing;
	EXPECT(same_bits(wide_gradients(o), want));

	adg::pool workers(4);
	o.executor = workers;
	EXPECT(same_bits(wide_gradients(o), want));
}

TEST(closures_are_released_once_each)
{
	adg::registry reg;
	leaves l(reg);
	adg::node t = build<double>(reg, l);
	EXPECT(probe::live == 5); /* one per step, held by libadg */
	EXPECT(reg.stats().live_steps == 5);
	/* Nodes sit in slabs; a graph this small in none mapped. */
	EXPECT(reg.stats().slab_bytes >= 5 * 88);
	EXPECT(reg.stats().slab_bytes_huge == 0);
	adg::gradients<double> g = adg::backward(t, 1.0);
	EXPECT(probe::live == 0); /* consumed: released as they ran */
	EXPECT(reg.stats().live_steps == 0);
	EXPECT(g.size() == 3);
}

/* adg_stats names the struct in C++ too (issue 43): the function that
 * hid it is adg_registry_stats. */
TEST(stats_are_an_adg_stats)
{
	adg::registry reg;
	leaves l(reg);
	adg_stats st = reg.stats();
	EXPECT(st.size == sizeof st);
	EXPECT(st.live_nodes == 3);
	adg_stats raw{};
	raw.size = sizeof raw;
	EXPECT(adg_registry_stats(reg.raw(), &raw) == 0);
	EXPECT(raw.live_nodes == st.live_nodes);
}

TEST(an_unrun_graph_releases_its_closures)
{
	adg::registry reg;
	{
		leaves l(reg);
		adg::node t = build<double>(reg, l);
		EXPECT(probe::live == 5);
	}
	EXPECT(probe::live == 0);
	EXPECT(reg.stats().live_nodes == 0);
}

TEST(a_throwing_step_is_rethrown_as_thrown)
{
	for (unsigned n_workers : {0u, 2u}) {
		adg::registry reg;
		adg::pool workers(2);
		leaves l(reg);
		adg::node p = mul<tracked>(reg, l.x, xv, l.y, yv);
		adg::node bad = adg::op(
			reg, {p, l.z},
			[pr = probe()](adg::step_call<tracked> &) {
				throw boom{42};
			},
			"thrower");
		adg::node t = mul<tracked>(reg, bad, 1.0, l.z, zv);
		adg_failure why{};
		adg::backward_options o;
		if (n_workers > 0)
			o.executor = workers;
		o.failure = &why;
		EXPECT_THROWS(boom, adg::backward(t, tracked(1.0), o),
			      EXPECT(e.value == 42));
		EXPECT(why.site == ADG_FAILED_STEP);
		EXPECT(why.node_id == bad.id());
		EXPECT(std::strcmp(why.name, "thrower") == 0);
		EXPECT(why.code == ADG_ETHREW);
		EXPECT(probe::live == 0);   /* run or not, all released */
		EXPECT(tracked::live == 0); /* the seed, the gradients */
		/* Consumed: a second backward is refused. */
		EXPECT_THROWS(adg::error, adg::backward(t, tracked(1.0)),
			      EXPECT(e.code().value() == ADG_ECONSUMED));
		EXPECT(tracked::live == 0);
	}
}

TEST(an_adg_error_in_a_step_keeps_its_code)
{
	adg::registry reg;
	leaves l(reg);
	adg::node y = adg::op(reg, {l.x, l.y}, [](adg::step_call<double> &c) {
		c.give(7, 1.0); /* no slot 7: ADG_EINVAL, value freed */
	});
	adg_failure why{};
	adg::backward_options o;
	o.failure = &why;
	EXPECT_THROWS(adg::error, adg::backward(y, 1.0, o),
		      EXPECT(e.code().value() == ADG_EINVAL));
	EXPECT(why.site == ADG_FAILED_STEP && why.code == ADG_EINVAL);
}

/* step_call::give_all, in every mode: every slot at once, or some; on a
 * rejected value, a throwing add (without an executor, where the give runs
 * it) or a wrong count, every value not given is gone (tracked::live). */
TEST(give_all_gives_every_slot_and_leaves_nothing_on_failure)
{
	adg::executor alone([](adg::job j) { j(); }, 0);
	for (unsigned mode : {0u, 1u, 2u}) {
		adg::pool workers(2);
		adg::backward_options o;
		if (mode == 1)
			o.executor = alone;
		if (mode == 2)
			o.executor = workers;
		adg::registry reg;
		adg::node x = adg::leaf(reg), w = adg::leaf(reg);
		auto all = [](adg::step_call<tracked> &c) {
			c.give_all({tracked(5), tracked(3), tracked(7)});
		};
		adg::node y = adg::op(reg, {x, x, w}, all);
		{
			adg::gradients<tracked> g =
				adg::backward(y, tracked(1.0), o);
			EXPECT(g.get(x).v == 8.0 && g.get(w).v == 7.0);
		}
		auto some = [](adg::step_call<tracked> &c) {
			c.give_all({std::nullopt, tracked(3), std::nullopt});
		};
		y = adg::op(reg, {x, x, w}, some);
		{
			adg::gradients<tracked> g =
				adg::backward(y, tracked(1.0), o);
			EXPECT(g.get(x).v == 3.0 && !g.find(w));
		}
		EXPECT(tracked::live == 0);

		/* Slot 0 rejected: the rest freed. */
		y = adg::op(reg, {x, x, w}, [](adg::step_call<tracked> &c) {
			c.give_all({tracked(-1), tracked(3), tracked(7)});
		});
		adg::backward_options checked = o;
		checked.value_check = [](adg::grad_ref g) {
			return g.get<tracked>()->v >= 0;
		};
		EXPECT_THROWS(adg::error,
			      adg::backward(y, tracked(1.0), checked),
			      EXPECT(e.code().value() == ADG_EVALUE));
		EXPECT(tracked::live == 0);

		/* A count that is not the parents': nothing given. */
		y = adg::op(reg, {x, w}, [](adg::step_call<tracked> &c) {
			c.give_all({tracked(1)});
		});
		EXPECT_THROWS(adg::error, adg::backward(y, tracked(1.0), o),
			      EXPECT(e.code().value() == ADG_EINVAL));
		EXPECT(tracked::live == 0);

		/* z gives x a gradient first; y's add into it throws on slot
		 * 0: without an executor the give_all rethrows it, and frees
		 * w's value; with one the add is the backward's. */
		y = adg::op(reg, {x, w}, [](adg::step_call<tracked> &c) {
			tracked::add_throws = true;
			c.give_all({tracked(2), tracked(7)});
		});
		adg::node z =
			adg::op(reg, {y, x}, [](adg::step_call<tracked> &c) {
				c.give_all({tracked(1), tracked(4)});
			});
		EXPECT_THROWS(add_failed, adg::backward(z, tracked(1.0), o), );
		tracked::add_throws = false;
		EXPECT(tracked::live == 0);
	}
}

/* An add that throws, in every mode: no executor (the step's give runs
 * it), an executor with no worker (alone) and workers (the add is the
 * backward's, named by x). */
TEST(a_throwing_add_is_rethrown)
{
	adg::executor alone([](adg::job j) { j(); }, 0);
	for (unsigned mode : {0u, 1u, 2u}) {
		adg::registry reg;
		adg::pool workers(2);
		adg::node x = adg::leaf(reg);
		adg::node y = mul<tracked>(reg, x, xv, x, xv); /* x twice */
		adg_failure why{};
		adg::backward_options o;
		o.failure = &why;
		if (mode == 1)
			o.executor = alone;
		if (mode == 2)
			o.executor = workers;
		tracked::add_throws = true;
		EXPECT_THROWS(add_failed, adg::backward(y, tracked(1.0), o), );
		tracked::add_throws = false;
		EXPECT(mode == 0 ? why.site == ADG_FAILED_STEP &&
					   why.node_id == y.id()
				 : why.site == ADG_FAILED_ADD &&
					   why.node_id == x.id());
		EXPECT(probe::live == 0);
		EXPECT(tracked::live == 0);
	}
}

TEST(a_failed_backward_leaks_nothing)
{
	adg::registry reg;
	leaves l(reg);
	adg::node t = build<tracked>(reg, l);
	adg::gradients<tracked> g = adg::backward(t, tracked(1.0));
	EXPECT_THROWS(adg::error, adg::backward(t, tracked(1.0)),
		      EXPECT(e.code().value() == ADG_ECONSUMED));
	EXPECT(tracked::live == 3); /* the three gradients, seed freed */
	EXPECT_THROWS(adg::error, adg::backward(adg::node(), tracked(1.0)),
		      EXPECT(e.code().value() == ADG_EINVAL));
	EXPECT(tracked::live == 3);
}

TEST(a_step_rethrows_what_its_nested_backward_threw)
{
	adg::registry reg;
	adg::node a = adg::leaf(reg);
	adg::node inner = adg::op(
		reg, {a}, [](adg::step_call<double> &) { throw boom{7}; });
	adg::node b = adg::leaf(reg);
	/* The outer step keeps the inner root: released with the step. */
	adg::node outer = adg::op(
		reg, {b}, [inner, p = probe()](adg::step_call<double> &) {
			(void)p;
			adg::backward(inner, 1.0);
		});
	inner.reset();
	EXPECT_THROWS(boom, adg::backward(outer, 1.0), EXPECT(e.value == 7));
	EXPECT(probe::live == 0);
}

TEST(the_gradient_type_is_the_registrys)
{
	adg::registry reg;
	adg::node x = adg::leaf(reg);
	adg::node y = mul<double>(reg, x, 2.0, x, 2.0);
	/* An int seed would be freed as a double: refused, nothing made. */
	EXPECT_THROWS(adg::error, adg::backward(y, 1),
		      EXPECT(e.code().value() == ADG_EINVAL));
	EXPECT_THROWS(adg::error, mul<float>(reg, x, 1.0, x, 1.0),
		      EXPECT(e.code().value() == ADG_EINVAL));
	EXPECT(probe::live == 1); /* y's; the float step's lambda is gone */
	EXPECT(adg::backward(y, 1.0).get(x) == 4.0); /* 2 * 2 */
	EXPECT(probe::live == 0);
}

/* Gradient types for a backward without a seed: a container that a
 * std::vector's constructors build (a one-element tensor), where
 * column(1) would be one 0; and a type of no kind adg::one knows, which
 * gets a specialization (below, outside this namespace). */
struct column : std::vector<double> {
	using std::vector<double>::vector;
	column &operator+=(const column &o)
	{
		for (std::size_t i = 0; i < size(); i++)
			(*this)[i] += o[i];
		return *this;
	}
};

struct patch {
	int rows = 0, cols = 0;
	std::vector<float> v;
	patch &operator+=(const patch &o)
	{
		for (std::size_t i = 0; i < v.size(); i++)
			v[i] += o.v[i];
		return *this;
	}
};

struct no_unit {
	no_unit &operator+=(const no_unit &)
	{
		return *this;
	}
};

} // namespace

template <> struct adg::one<patch> {
	static patch value()
	{
		return patch{1, 1, {1.0f}};
	}
};

namespace
{

TEST(a_backward_without_a_seed_starts_from_one)
{
	static_assert(adg::detail::has_one<double>::value &&
			      adg::detail::has_one<tracked>::value &&
			      adg::detail::has_one<column>::value &&
			      adg::detail::has_one<patch>::value &&
			      !adg::detail::has_one<no_unit>::value,
		      "adg::one knows numbers, scalars, containers and "
		      "specializations");
	EXPECT(adg::one<float>::value() == 1.0f && adg::one<int>::value() == 1);
	EXPECT(adg::one<tracked>::value().v == 1.0);
	EXPECT((adg::one<std::vector<double>>::value() ==
		std::vector<double>{1.0}));
	EXPECT((adg::one<column>::value() == column{1.0}));

	/* The same gradients as a seed of 1, for each kind. */
	std::vector<double> want = c_gradients();
	{
		adg::registry reg;
		leaves l(reg);
		adg::gradients<double> g =
			adg::backward<double>(build<double>(reg, l));
		EXPECT(same_bits({g.get(l.x), g.get(l.y), g.get(l.z)}, want));
	}
	{
		adg::registry reg;
		leaves l(reg);
		adg::backward_options o;
		adg_failure failure{};
		o.failure = &failure;
		adg::gradients<tracked> g =
			adg::backward<tracked>(build<tracked>(reg, l), o);
		EXPECT(same_bits({g.get(l.x).v, g.get(l.y).v, g.get(l.z).v},
				 want));
		EXPECT(failure.code == 0 && failure.site == ADG_FAILED_NOWHERE);
	}
	adg::registry reg;
	adg::node a = adg::leaf(reg);
	adg::node y = adg::op(reg, {a}, [](adg::step_call<column> &c) {
		column d = *c.grad();
		d[0] *= 3;
		c.give(0, std::move(d));
	});
	adg::gradients<column> g = adg::backward<column>(y);
	EXPECT((g.get(a) == column{3.0}));

	adg::registry preg;
	adg::node b = adg::leaf(preg);
	adg::node z = adg::op(preg, {b}, [](adg::step_call<patch> &c) {
		patch d = *c.grad();
		d.v[0] *= 3;
		c.give(0, std::move(d));
	});
	adg::gradients<patch> pg = adg::backward<patch>(z);
	EXPECT(pg.get(b).rows == 1 && pg.get(b).v == std::vector<float>{3.0f});
}

TEST(a_refused_op_keeps_nothing)
{
	adg::registry reg, other;
	adg::node x = adg::leaf(reg), stranger = adg::leaf(other);
	EXPECT_THROWS(adg::error, mul<double>(reg, x, 1.0, stranger, 1.0),
		      EXPECT(e.code().value() == ADG_EFOREIGN));
	EXPECT_THROWS(adg::error, mul<double>(reg, x, 1.0, adg::node(), 1.0),
		      EXPECT(e.code().value() == ADG_EINVAL));
	adg::registry gone;
	adg::registry taken(std::move(gone));
	EXPECT_THROWS(adg::error, mul<double>(gone, x, 1.0, x, 1.0),
		      EXPECT(e.code().value() == ADG_EINVAL));
	EXPECT(probe::live == 0); /* each closure went with its op */
	EXPECT(reg.stats().live_steps == 0);
}

/* A temporary or std::move(x) parent moves its reference into the op's
 * node (adg_op_moving): the handle is empty after, the count is what the
 * drop would have left, the gradients the same; a refused op leaves it
 * full; one handle moved twice in a list is moved once. */
TEST(moved_parents_hand_their_reference_over)
{
	adg::registry reg;
	adg::node a = adg::leaf(reg), b = adg::leaf(reg);
	adg::node x = mul<double>(reg, a, 2.0, b, 3.0);
	for (int i = 0; i < 5; i++) {
		adg::node step = adg::op(
			reg, {std::move(x), b},
			[p = probe()](adg::step_call<double> &c) {
				(void)p;
				c.give(0, *c.grad() * 3.0);
				c.give(1, 0.0);
			},
			"times b");
		EXPECT(!x); /* moved in */
		x = std::move(step);
	}
	EXPECT(reg.stats().live_nodes == 2 + 6); /* the chain, by its tip */
	adg::node temp = adg::op(
		reg, {mul<double>(reg, a, 2.0, b, 3.0), a},
		[p = probe()](adg::step_call<double> &c) {
			(void)p;
			c.give(0, *c.grad());
			c.give(1, *c.grad());
		},
		"temporary");
	EXPECT(reg.stats().live_nodes == 2 + 6 + 2);
	EXPECT(adg::backward(x, 1.0).get(a) == 3.0 * 243.0); /* b * 3^5 */
	EXPECT(adg::backward(temp, 1.0).get(a) == 3.0 + 1.0);
	EXPECT(reg.stats().live_nodes == 2 + 1 + 1);
	x.reset();
	temp.reset();
	EXPECT(reg.stats().live_nodes == 2 && probe::live == 0);

	/* Refused: the moved handle keeps its reference. */
	adg::registry other;
	adg::node stranger = adg::leaf(other);
	adg::node y = mul<double>(reg, a, 1.0, b, 1.0);
	EXPECT_THROWS(adg::error,
		      adg::op(
			      reg, {std::move(y), stranger},
			      [](adg::step_call<double> &) {}, "refused"),
		      EXPECT(e.code().value() == ADG_EFOREIGN));
	EXPECT(y && reg.stats().live_nodes == 3);

	/* Named twice, moved once: y * y holds y's reference and one more. */
	adg::node yy = adg::op(
		reg, {std::move(y), std::move(y)},
		[](adg::step_call<double> &c) {
			c.give(0, *c.grad());
			c.give(1, *c.grad());
		},
		"square");
	EXPECT(!y && reg.stats().live_nodes == 4);
	yy.reset();
	EXPECT(reg.stats().live_nodes == 2 && probe::live == 0);
}

/* A graph of parents gathered at run time, the same calls with Parent
 * adg::node (handles copied into a std::vector, the counted form) or
 * adg::node_ref (borrowed): a chain over one parameter w and twelve
 * inputs, its ops of 1 to 15 parents (past the 8 that op keeps on the
 * stack), w named twice in every third. Returns what was built, ids made
 * into names (each registry numbers its own): each op's name and parents
 * in visit order, then w's and each input's gradient as text, exact. */
template <class Parent> std::vector<std::string> gathered_graph()
{
	adg::registry reg;
	adg::node w = adg::leaf(reg, "w");
	std::unordered_map<std::uint64_t, std::string> name{{w.id(), "w"}};
	std::vector<adg::node> inputs;
	for (int i = 0; i < 12; i++) {
		inputs.push_back(adg::leaf(reg));
		name[inputs.back().id()] = "x" + std::to_string(i);
	}
	std::vector<Parent> parents; /* refilled for each op */
	adg::node y;
	for (int k = 0; k < 24; k++) {
		parents.clear();
		if (y)
			parents.push_back(y);
		parents.push_back(w);
		for (int i = 0; i < k % 13; i++)
			parents.push_back(inputs[i]);
		if (k % 3 == 0)
			parents.push_back(w);
		double scale = 1.0 + 0.125 * k;
		y = adg::op(
			reg, parents,
			[scale](adg::step_call<double> &c) {
				for (std::size_t s = 0; s < c.n_parents(); s++)
					c.give(s, c.grad_or(0.0) * scale *
							  double(s + 1));
			},
			"gathered");
		name[y.id()] = "y" + std::to_string(k);
	}
	std::vector<std::string> built;
	adg::visit(y, [&](const adg_graph_node &n) {
		std::string line = name.at(n.id) + " " + n.name + ":";
		for (std::size_t s = 0; s < n.n_parents; s++)
			line += " " + name.at(n.parent_ids[s]);
		built.push_back(line);
	});
	adg::gradients<double> g = adg::backward(y, 1.0);
	char text[64];
	std::snprintf(text, sizeof text, "w %a", g.get(w));
	built.push_back(text);
	for (const adg::node &x : inputs) {
		std::snprintf(text, sizeof text, "%s %a",
			      name.at(x.id()).c_str(), g.get(x));
		built.push_back(text);
	}
	return built;
}

/* Parents borrowed in a std::vector<adg::node_ref> build what copied
 * handles build: the same ops, parents by slot and gradients to the bit;
 * op<T> with a generic lambda and op_with take them too. */
TEST(borrowed_parents_build_what_handles_build)
{
	std::vector<std::string> counted = gathered_graph<adg::node>();
	EXPECT(counted.size() == 24 + 1 + 12);
	EXPECT(counted[3] == "y3 gathered: y2 w x0 x1 x2 w");
	EXPECT(gathered_graph<adg::node_ref>() == counted);

	adg::registry reg;
	adg::node a = adg::leaf(reg), b = adg::leaf(reg);
	std::vector<adg::node_ref> ab{a, b};
	adg::node sum = adg::op<double>(reg, ab, [](auto &c) {
		c.give(0, c.grad_or(0.0));
		c.give(1, 2 * c.grad_or(0.0));
	});
	adg::checkpoint<double> wants;
	wants.want_parents = {0};
	adg::checkpoint<double> offers;
	offers.value = 5.0;
	adg::node h = adg::op_with(
		reg, std::vector<adg::node_ref>{sum},
		[](adg::step_call<double> &c) { c.give(0, c.grad_or(0.0)); },
		offers, "offers");
	adg::node y = adg::op_with(
		reg, std::vector<adg::node_ref>{h, a},
		[](adg::step_call<double> &c) {
			double hv = c.output<double>(c.parent_id(0));
			c.give(0, hv * c.grad_or(0.0)); /* y = h^2 / 2 + a */
			c.give(1, c.grad_or(0.0));
		},
		wants, "reads h");
	adg::gradients<double> g = adg::backward(y, 1.0);
	EXPECT(g.get(a) == 5.0 + 1.0 && g.get(b) == 2 * 5.0);

	adg::node empty;
	EXPECT_THROWS(adg::error,
		      adg::op(reg, std::vector<adg::node_ref>{a, empty},
			      [](adg::step_call<double> &) {}),
		      EXPECT(e.code().value() == ADG_EINVAL));
	/* Sized first, filled after; a slot left empty is refused too. */
	std::vector<adg::node_ref> slots(2);
	EXPECT(!slots[0] && !slots[1] && !adg::node_ref());
	slots[0] = a;
	EXPECT(slots[0] && slots[0].id() == a.id());
	EXPECT_THROWS(adg::error,
		      adg::op(reg, slots, [](adg::step_call<double> &) {}),
		      EXPECT(e.code().value() == ADG_EINVAL));
	slots[1] = b;
	adg::node filled = adg::op(reg, slots, [](adg::step_call<double> &c) {
		c.give(0, 1.0);
		c.give(1, 2.0);
	});
	adg::gradients<double> gab = adg::backward(filled, 1.0);
	EXPECT(gab.get(a) == 1.0 && gab.get(b) == 2.0);
	adg::registry other;
	adg::node stranger = adg::leaf(other);
	EXPECT_THROWS(adg::error,
		      adg::op(reg, std::vector<adg::node_ref>{a, stranger},
			      [](adg::step_call<double> &) {}),
		      EXPECT(e.code().value() == ADG_EFOREIGN));
	EXPECT(reg.stats().live_steps == 0);
}

/* A parameter gathered as a borrowed parent keeps no count from the
 * vector nor from the op: its one handle dropped, it goes at once, while
 * the vector still names it and the op it fed is alive. A copied handle
 * holds it until the vector goes. An op parent gets the new node's one
 * reference, as with every form of op. Two threads then gather one
 * shared parameter at once (under TSan in the TSan build). */
TEST(borrowed_parents_take_no_count)
{
	adg::registry reg;
	adg::node w = adg::leaf(reg), x = adg::leaf(reg);
	std::uint64_t w_id = w.id();
	std::vector<adg::node_ref> borrowed{w, x};
	adg::node y = adg::op(reg, borrowed, [](adg::step_call<double> &c) {
		c.give(0, 3.0 * c.grad_or(0.0));
		c.give(1, c.grad_or(0.0));
	});
	EXPECT(reg.stats().live_nodes == 3);
	w.reset(); /* its one counted handle */
	EXPECT(reg.stats().live_nodes == 2 && reg.stats().nodes_freed == 1);
	EXPECT(adg::backward(y, 1.0).get(w_id) == 3.0); /* by id: w is gone */
	y.reset();

	adg::node v = adg::leaf(reg);
	std::vector<adg::node> copied{v, x};
	adg::node z = adg::op(reg, copied, [](adg::step_call<double> &c) {
		c.give(0, c.grad_or(0.0));
		c.give(1, c.grad_or(0.0));
	});
	v.reset();
	EXPECT(reg.stats().live_nodes ==
	       3); /* x, z and v: copied[0] holds it */
	copied.clear();
	EXPECT(reg.stats().live_nodes == 2);

	std::vector<adg::node_ref> op_parent{z};
	adg::node zz = adg::op(reg, op_parent, [](adg::step_call<double> &c) {
		c.give(0, c.grad_or(0.0));
	});
	z.reset(); /* zz holds it: its step may still run */
	EXPECT(reg.stats().live_nodes == 3);
	zz.reset();
	EXPECT(reg.stats().live_nodes == 1); /* x */

	adg::node shared = adg::leaf(reg);
	auto gather = [&](double scale, double *grad) {
		adg::node own = adg::leaf(reg);
		std::vector<adg::node_ref> parents;
		adg::node t = own;
		for (int k = 0; k < 200; k++) {
			parents.clear();
			parents.push_back(t);
			parents.push_back(shared);
			t = adg::op(reg, parents,
				    [scale](adg::step_call<double> &c) {
					    c.give(0, c.grad_or(0.0));
					    c.give(1, scale * c.grad_or(0.0));
				    });
		}
		*grad = adg::backward(t, 1.0).get(shared);
	};
	double g1 = 0, g2 = 0;
	std::thread other([&] { gather(2.0, &g2); });
	gather(1.0, &g1);
	other.join();
	EXPECT(g1 == 200.0 && g2 == 400.0);
	shared.reset();
	x.reset();
	EXPECT(reg.stats().live_nodes == 0);
}

TEST(node_handles_move_and_copy)
{
	adg::registry reg;
	adg::node x = adg::leaf(reg);
	std::uint64_t id = x.id();

	adg::node moved(std::move(x));
	EXPECT(!x && moved && moved.id() == id);

	adg::node y1 = mul<double>(reg, moved, 1.0, moved, 1.0);
	adg::node y2 = mul<double>(reg, moved, 2.0, moved, 2.0);
	std::uint64_t id2 = y2.id();
	EXPECT(probe::live == 2);
	y1 = std::move(y2); /* over a live handle: y1's node goes */
	EXPECT(probe::live == 1 && !y2 && y1.id() == id2);
	self_move(y1);
	EXPECT(probe::live == 1 && y1 && y1.id() == id2);

	adg::node copy = y1; /* a second reference */
	y1.reset();
	EXPECT(probe::live == 1);
	adg::node other = mul<double>(reg, moved, 3.0, moved, 3.0);
	other = copy; /* copy-assigned over a live handle */
	EXPECT(probe::live == 1 && other.id() == id2);
	const adg::node &same = other;
	other = same; /* self-copy */
	EXPECT(other.id() == id2);
	copy.reset();
	EXPECT(adg::backward(other, 1.0).get(moved) == 4.0); /* y2: 2 * 2 */
	EXPECT(probe::live == 0);

	adg_node *raw = moved.release(); /* to the C API and back */
	EXPECT(!moved && adg_node_unref(raw) == 0);
	other.reset();
	EXPECT(reg.stats().live_nodes == 0);
}

TEST(registry_gradients_pool_and_executor_handles_move)
{
	adg::registry first;
	adg::registry reg(std::move(first));
	EXPECT(!first && reg && first.raw() == nullptr);
	adg::registry spare;
	spare = std::move(reg); /* over a live registry: the old one goes */
	self_move(spare);
	EXPECT(spare && !reg);
	reg = std::move(spare);

	adg::pool pool1(2);
	adg::pool pool2(std::move(pool1));
	EXPECT(pool1.c_executor() == nullptr && pool2.c_executor() != nullptr);
	adg::pool pool3(1);
	pool3 = std::move(pool2); /* over a live pool: stopped and freed */
	self_move(pool3);
	adg::executor exec1([](adg::job j) { j(); }, 0);
	adg::executor exec2(std::move(exec1));
	EXPECT(exec1.c_executor() == nullptr);
	self_move(exec2);
	EXPECT(exec2.c_executor() != nullptr);

	leaves l(reg);
	adg::backward_options o;
	o.executor = pool3;
	adg::gradients<tracked> g1 =
		adg::backward(build<tracked>(reg, l), tracked(1.0), o);
	o.executor = exec2;
	adg::gradients<tracked> g2 =
		adg::backward(build<tracked>(reg, l), tracked(1.0), o);
	EXPECT(tracked::live == 6);
	adg::gradients<tracked> g3(std::move(g1));
	EXPECT(g1.raw() == nullptr && g3.size() == 3);
	g3 = std::move(g2); /* over a live container: its values go */
	EXPECT(tracked::live == 3);
	self_move(g3);
	EXPECT(tracked::live == 3 && g3.get(l.x).v == g3.get(l.x.id()).v);
	tracked dx = g3.take(l.x); /* moved out */
	EXPECT(g3.size() == 2 && g3.find(l.x) == nullptr);
	EXPECT_THROWS(adg::error, g3.get(l.x),
		      EXPECT(e.code().value() == ADG_ENOTFOUND));
	EXPECT(tracked::live == 3 && dx.v == c_gradients()[0]);
}

/* A pool default-made or moved from is empty, as a registry is: false,
 * no C handle, and refused as a backward's executor (adg::error, not a
 * backward run on one thread unasked); a pool moved into it is used. */
TEST(an_empty_pool_is_refused_until_one_is_assigned)
{
	std::vector<double> want = c_gradients();
	adg::pool workers;
	EXPECT(!workers && workers.raw() == nullptr &&
	       workers.c_executor() == nullptr);
	adg::backward_options o;
	EXPECT_THROWS(adg::error, o.executor = workers, {
		EXPECT(e.code().value() == ADG_EINVAL);
		EXPECT(std::string(e.what()).find("an empty pool") !=
		       std::string::npos);
	});
	EXPECT(o.executor.get() == nullptr);

	adg::pool started(2);
	EXPECT(started && started.raw() != nullptr);
	workers = std::move(started);
	EXPECT(workers && !started && started.raw() == nullptr);
	EXPECT_THROWS(adg::error, o.executor = started,
		      EXPECT(e.code().value() == ADG_EINVAL));
	o.executor = workers;
	EXPECT(o.executor.get() == workers.c_executor());
	EXPECT(same_bits(cpp_gradients(o), want));

	adg::executor exec([](adg::job j) { j(); }, 1);
	adg::executor taken(std::move(exec));
	EXPECT_THROWS(adg::error, o.executor = exec, {
		EXPECT(e.code().value() == ADG_EINVAL);
		EXPECT(std::string(e.what()).find("an empty executor") !=
		       std::string::npos);
	});
	workers = adg::pool(); /* stopped and freed: empty again */
	EXPECT(!workers);
}

TEST(a_node_dropped_before_the_backward)
{
	adg::registry reg;
	adg::node a = adg::leaf(reg), b = adg::leaf(reg), c = adg::leaf(reg);
	adg::node ab = mul<double>(reg, a, 3.0, b, 4.0);
	adg::node y = mul<double>(reg, ab, 12.0, c, 5.0);
	ab.reset(); /* y still needs its step */
	a.reset();  /* a leaf: y keeps its id, and the gradient comes */
	EXPECT(probe::live == 2);
	adg::gradients<double> g = adg::backward(y, 1.0);
	EXPECT(g.get(b) == 15.0 && g.get(c) == 12.0 && g.size() == 3);
	EXPECT(probe::live == 0);
}

TEST(the_registry_is_freed_last)
{
	adg::registry reg;
	adg::gradients<tracked> g;
	std::uint64_t x_id;
	{
		leaves l(reg);
		x_id = l.x.id();
		g = adg::backward(build<tracked>(reg, l), tracked(1.0));
		/* Nodes alive: close refuses, the registry stays usable. */
		EXPECT_THROWS(adg::error, reg.close(),
			      EXPECT(e.code().value() == ADG_EBUSY));
		EXPECT(reg && adg::leaf(reg));
	}
	reg.close(); /* every node gone */
	EXPECT(!reg);
	/* A container may outlive its registry. */
	EXPECT(g.get(x_id).v == c_gradients()[0] && tracked::live == 3);
}

TEST(retained_passes_keep_the_closures)
{
	adg::registry reg;
	leaves l(reg);
	adg::node t = build<double>(reg, l);
	adg::backward_options keep;
	keep.retain = true;
	std::vector<double> want = c_gradients();
	for (int pass = 0; pass < 2; pass++) {
		adg::gradients<double> g = adg::backward(t, 1.0, keep);
		EXPECT(g.get(l.x) == want[0] && probe::live == 5);
	}
	EXPECT(adg::backward(t, 1.0).get(l.z) == want[2]);
	EXPECT(probe::live == 0);
}

TEST(c_code_runs_cpp_steps_with_the_registrys_ops)
{
	/* grad_ops<double> on the registry: a backward of C code, passed
	 * NULL ops, folds and frees the doubles of C++ steps. */
	adg_grad_ops ops = adg::grad_ops<double>();
	adg_registry_options options{};
	options.grad_ops = &ops;
	adg::registry reg(options);
	adg::pool workers(2, reg.allocator()); /* the registry's memory */
	leaves l(reg);
	adg::node t = build<double>(reg, l);
	adg_backward_options o{};
	o.size = sizeof o;
	o.executor = workers.c_executor();
	adg_grads *grads = nullptr;
	EXPECT(adg_backward_with(reg.raw(), t.raw(), adg::pack(1.0), nullptr,
				 &o, &grads) == 0);
	void *dz = nullptr;
	EXPECT(adg_grads_get_node(grads, l.z.raw(), &dz) == 0);
	EXPECT(adg::unpack<double>(dz) == c_gradients()[2]);
	adg_grads_free(grads);
	EXPECT(probe::live == 0);
}

/* What a step throws below: the thread whose pass it failed. */
struct thrown_for {
	int thread;
};

/* Retained passes over one graph on several threads at once, each failing
 * at the same step with an exception of its own (the seed says whose):
 * each backward rethrows its own, never another thread's (issue 28: kept
 * exceptions were keyed by node alone). Half the passes run on a shared
 * pool, where the step runs on a worker. */
STRESS_TEST(concurrent_retained_passes_rethrow_their_own)
{
	constexpr int threads = 3, passes = 1000;
	adg::registry reg;
	adg::pool workers(2);
	adg::node x = adg::leaf(reg);
	adg::node a = adg::op(
		reg, {x},
		[](adg::step_call<double> &c) {
			std::this_thread::yield(); /* let another pass in */
			throw thrown_for{static_cast<int>(c.grad_or(-1.0))};
		},
		"a");
	adg::node y = adg::op(
		reg, {a},
		[](adg::step_call<double> &c) { c.give(0, c.grad_or(-1.0)); },
		"y");
	std::atomic<int> own{0}, others{0}, none{0};
	std::vector<std::thread> running;
	for (int t = 0; t < threads; t++)
		running.emplace_back([&, t] {
			adg::backward_options o;
			o.retain = true;
			for (int pass = 0; pass < passes; pass++) {
				o.executor =
					pass % 2 ? adg::executor_ref(workers)
						 : adg::executor_ref();
				try {
					adg::backward(y, static_cast<double>(t),
						      o);
					none++;
				} catch (const thrown_for &e) {
					(e.thread == t ? own : others)++;
				} catch (...) {
					none++;
				}
			}
		});
	for (std::thread &t : running)
		t.join();
	if (others != 0 || none != 0)
		std::printf("  %d passes rethrew another thread's exception, "
			    "%d none of theirs\n",
			    others.load(), none.load());
	EXPECT(others == 0 && none == 0 && own == threads * passes);
}

/* An exception that counts its live copies (probe). */
struct counted_failure {
	probe alive;
};

/* Two branches that throw, on an executor: the backward rethrows the first
 * in tape order, and what the other threw (when it ran) goes when the
 * backward returns, not with the registry, so a training loop whose
 * passes fail that way does not pile exceptions up. */
TEST(unreported_exceptions_go_with_their_backward)
{
	adg::registry reg;
	adg::pool workers(2);
	adg::backward_options o;
	o.executor = workers;
	for (int round = 0; round < 50; round++) {
		adg::node x = adg::leaf(reg);
		auto thrower = [](adg::step_call<double> &) {
			throw counted_failure{};
		};
		adg::node a = adg::op(reg, {x}, thrower, "a");
		adg::node b = adg::op(reg, {x}, thrower, "b");
		adg::node y = adg::op(
			reg, {a, b},
			[](adg::step_call<double> &c) {
				c.give(0, 1.0);
				c.give(1, 1.0);
			},
			"y");
		EXPECT_THROWS(counted_failure, adg::backward(y, 1.0, o), );
		EXPECT(probe::live == 0);
	}
}

/* A gradient whose += throws a counted exception. */
struct add_throws_counted {
	double v;
	add_throws_counted &operator+=(const add_throws_counted &)
	{
		throw counted_failure{};
	}
};

int ignoring_step(adg_step_call *call, void *)
{
	adg_step_give(call, 0, adg::pack(add_throws_counted{1}));
	adg_step_give(call, 1, adg::pack(add_throws_counted{1})); /* throws */
	return 0; /* a careless step of C code: the backward succeeds */
}

/* What an add threw that no failure names (a C step ignored its give's
 * error) goes when its backward returns, not with the gradients or the
 * registry, so that such passes do not pile exceptions up. */
TEST(an_add_exception_no_failure_names_goes_with_its_backward)
{
	adg::registry reg;
	adg::node x = adg::leaf(reg);
	adg_node *xx[2] = {x.raw(), x.raw()}, *raw = nullptr;
	adg_step step{};
	step.backward = ignoring_step;
	EXPECT(adg_op(reg.raw(), xx, 2, &step, &raw) == 0);
	adg::node y = adg::node::adopt(reg, raw);
	adg::gradients<add_throws_counted> g =
		adg::backward(y, add_throws_counted{1});
	EXPECT(probe::live == 0); /* the exception is gone */
}

/* A misused give says what was wrong, and the backward's error names the
 * step it happened in (site, node, name), code kept. */
TEST(errors_say_what_and_where)
{
	adg::registry reg;
	adg::node x = adg::leaf(reg);
	adg::node twice = adg::op(
		reg, {x},
		[](adg::step_call<double> &c) {
			c.give(0, 1.0);
			c.give(0, 2.0);
		},
		"twice");
	adg_failure why{};
	adg::backward_options o;
	o.failure = &why;
	EXPECT_THROWS(adg::error, adg::backward(twice, 1.0, o), {
		std::string what = e.what();
		EXPECT(e.code().value() == ADG_EINVAL);
		EXPECT(e.failure().site == ADG_FAILED_STEP);
		EXPECT(e.failure().node_id == why.node_id);
		EXPECT(std::strcmp(e.failure().name, "twice") == 0);
		EXPECT(what.find("step 'twice' of node") != std::string::npos);
		EXPECT(what.find("slot 0 given twice") != std::string::npos);
	});
	adg::node far = adg::op(
		reg, {x}, [](adg::step_call<double> &c) { c.give(3, 1.0); },
		"far");
	EXPECT_THROWS(adg::error, adg::backward(far, 1.0), {
		/* adg_step_give's reason, which the give captured. */
		EXPECT(std::string(e.what()).find(
			       "adg_step_give: slot 3 out of range: node") !=
		       std::string::npos);
		EXPECT(e.reason().find("has 1 parents") != std::string::npos);
	});
	/* What no exception explains names the step too. */
	EXPECT_THROWS(adg::error, adg::backward(far, 1.0),
		      { EXPECT(e.code().value() == ADG_ECONSUMED); });
}

/* Hooks as callables: on_ready sees gradients (typed through grad_ref),
 * leaves only when asked; on_step sees both sides of every step; what a
 * hook throws is rethrown, as thrown. */
TEST(hooks_are_callables)
{
	for (unsigned n_workers : {0u, 2u}) {
		adg::registry reg;
		adg::pool workers(2);
		leaves l(reg);
		adg::node t = build<double>(reg, l);
		std::vector<double> want = c_gradients();
		std::mutex seen_lock;
		std::vector<std::uint64_t> ready_ids;
		std::atomic<int> before{0}, after{0};
		adg::backward_options o;
		if (n_workers > 0)
			o.executor = workers;
		o.retain = true;
		o.leaves_only = true;
		o.on_ready = [&](std::uint64_t id, adg::grad_ref g) {
			std::lock_guard<std::mutex> lock(seen_lock);
			ready_ids.push_back(id);
			if (id == l.z.id())
				g.set(*g.get<double>() * 2);
			EXPECT_THROWS(adg::error, g.get<float>(), );
		};
		o.on_step = [&](const adg_step_event &e) {
			(e.after ? after : before)++;
		};
		adg::gradients<double> g = adg::backward(t, 1.0, o);
		EXPECT(ready_ids.size() == 3); /* x, y, z: leaves only */
		EXPECT(before == 5 && after == 5);
		EXPECT(g.get(l.x) == want[0] && g.get(l.z) == 2 * want[2]);
		o.on_step = [&](const adg_step_event &e) {
			if (e.after && e.name != nullptr &&
			    std::strcmp(e.name, "add") == 0)
				throw boom{7};
		};
		adg_failure why{};
		o.failure = &why;
		EXPECT_THROWS(boom, adg::backward(t, 1.0, o),
			      EXPECT(e.value == 7));
		EXPECT(why.site == ADG_FAILED_ON_STEP);
	}
}

/* The value check names the step that gave a NaN, in every mode; a check
 * that throws is rethrown. */
/* Hogwild's hook by parameter index: each parameter's gradient once,
 * under its index in the list given (not in id order), inputs skipped;
 * on one thread and on a pool, through a copy of the options. */
TEST(the_ready_hook_calls_parameters_by_index)
{
	adg::registry reg;
	std::vector<adg::node> w;
	for (int i = 0; i < 4; i++)
		w.push_back(adg::leaf(reg));
	std::vector<adg::node> params = {w[2], w[0], w[3], w[1]};
	adg::pool workers(2);
	for (bool pooled : {false, true}) {
		adg::node x = adg::leaf(reg); /* an input: no parameter */
		std::vector<adg::node> terms;
		for (int i = 0; i < 4; i++)
			terms.push_back(mul<double>(reg, w[i], 1.0 + i, x,
						    10.0 * (i + 1)));
		adg::node y =
			adg::op(reg, terms, [](adg::step_call<double> &c) {
				for (std::size_t i = 0; i < c.n_parents(); i++)
					c.give(i, *c.grad());
			});
		terms.clear();
		std::mutex mutex;
		std::vector<double> seen(params.size(), 0.0);
		int calls = 0;
		adg::backward_options o;
		o.on_param_ready(params, [&](std::size_t i, adg::grad_ref g) {
			std::lock_guard<std::mutex> lock(mutex);
			calls++;
			seen.at(i) += *g.get<double>();
		});
		EXPECT(o.leaves_only && o.on_ready);
		if (pooled)
			o.executor = workers;
		adg::backward_options copy = o;
		adg::gradients<double> g = adg::backward<double>(y, copy);
		EXPECT(calls == 4); /* x's gradient: not a parameter's */
		EXPECT(g.get(x) == 1.0 + 2.0 + 3.0 + 4.0);
		/* w[i]'s gradient is 10 (i + 1); params: w2, w0, w3, w1. */
		EXPECT((seen == std::vector<double>{30.0, 10.0, 40.0, 20.0}));
		for (std::size_t i = 0; i < params.size(); i++)
			EXPECT(g.get(params[i]) == seen[i]);
	}

	adg::backward_options o;
	auto none = [](std::size_t, adg::grad_ref) {};
	EXPECT_THROWS(adg::error, o.on_param_ready({w[0], adg::node()}, none), {
		EXPECT(e.code().value() == ADG_EINVAL);
		EXPECT(std::string(e.what()).find("on_param_ready: parameter 1 "
						  "is an empty handle") !=
		       std::string::npos);
	});
	EXPECT_THROWS(adg::error, o.on_param_ready({w[1], w[0], w[1]}, none), {
		EXPECT(e.code().value() == ADG_EINVAL);
		EXPECT(std::string(e.what()).find("on_param_ready: parameters "
						  "0 and 2 are one leaf") !=
		       std::string::npos);
	});
	adg::registry other;
	adg::node stranger = adg::leaf(other);
	EXPECT_THROWS(adg::error, o.on_param_ready({w[0], stranger}, none),
		      EXPECT(e.code().value() == ADG_EFOREIGN));
	EXPECT(!o.on_ready && !o.leaves_only); /* refused: unchanged */
}

TEST(the_value_check_names_the_producing_step)
{
	for (unsigned n_workers : {0u, 2u}) {
		adg::registry reg;
		adg::pool workers(2);
		adg::node x = adg::leaf(reg, "x");
		adg::node root = adg::op(
			reg, {x},
			[](adg::step_call<double> &c) {
				c.give(0, std::nan(""));
			},
			"sqrt");
		adg::backward_options o;
		if (n_workers > 0)
			o.executor = workers;
		o.retain = true;
		o.value_check = [](adg::grad_ref g) {
			return !std::isnan(*g.get<double>());
		};
		EXPECT_THROWS(adg::error, adg::backward(root, 1.0, o), {
			EXPECT(e.code().value() == ADG_EVALUE);
			EXPECT(e.failure().site == ADG_FAILED_CHECK);
			EXPECT(std::strcmp(e.failure().name, "sqrt") == 0);
			EXPECT(std::string(e.what()).find("'sqrt'") !=
			       std::string::npos);
			/* The C reason: the slot and the parent too. */
			EXPECT(std::string(e.what()).find(
				       "rejected the gradient that step "
				       "'sqrt' of node 2 gave for parent slot "
				       "0 (node 1)") != std::string::npos);
		});
		o.value_check = [](adg::grad_ref) -> bool { throw boom{3}; };
		EXPECT_THROWS(boom, adg::backward(root, 1.0, o),
			      EXPECT(e.value == 3));
	}
}

/* A gradient whose += notes where it runs (adg::callback_site): one add
 * per backward below, read after it returns. */
struct sited {
	double v;
	static std::optional<adg_failure> seen;
	sited &operator+=(const sited &o)
	{
		seen = adg::callback_site();
		v += o.v;
		return *this;
	}
};
std::optional<adg_failure> sited::seen;

/* adg::callback_site: in a step, the check and an add, the failure that
 * would name a failure there (adg_callback_site); empty outside. */
TEST(callbacks_know_their_site)
{
	EXPECT(!adg::callback_site());
	for (unsigned n_workers : {0u, 2u}) {
		adg::registry reg;
		adg::pool workers(2);
		adg::node x = adg::leaf(reg);
		std::optional<adg_failure> in_step;
		adg::node y = adg::op(
			reg, {x, x},
			[&in_step](adg::step_call<sited> &c) {
				in_step = adg::callback_site();
				c.give(0, sited{1});
				c.give(1,
				       sited{2}); /* folded into x's: an add */
			},
			"y");
		std::mutex checks_lock;
		std::vector<std::optional<adg_failure>> checks;
		adg::backward_options o;
		if (n_workers > 0)
			o.executor = workers;
		adg_failure why{};
		o.failure = &why;
		o.value_check = [&](adg::grad_ref) {
			std::lock_guard<std::mutex> lock(checks_lock);
			checks.push_back(adg::callback_site());
			return true;
		};
		sited::seen.reset();
		adg::gradients<sited> g = adg::backward(y, sited{1}, o);
		EXPECT(g.get(x).v == 3);
		auto names = [&](const std::optional<adg_failure> &f,
				 adg_failure_site site, std::uint64_t id) {
			return f && f->site == site && f->node_id == id &&
			       f->pass_id == why.pass_id && f->code == 0;
		};
		EXPECT(names(in_step, ADG_FAILED_STEP, y.id()));
		EXPECT(std::strcmp(in_step->name, "y") == 0);
		EXPECT(checks.size() == 2);
		for (const auto &c : checks)
			EXPECT(names(c, ADG_FAILED_CHECK, y.id()));
		/* Without an executor the add runs in the step's give, whose
		 * failure is the step's; with one it is the backward's, at
		 * x's gradient. */
		if (n_workers == 0)
			EXPECT(names(sited::seen, ADG_FAILED_STEP, y.id()));
		else
			EXPECT(names(sited::seen, ADG_FAILED_ADD, x.id()) &&
			       sited::seen->name == nullptr);
	}
	EXPECT(!adg::callback_site());
}

/* Waits, at most 5 s, for flag: a step that must start after another
 * thread's, without a hang if it never comes. */
void wait_for(const std::atomic<bool> &flag)
{
	auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
	while (!flag && std::chrono::steady_clock::now() < until)
		std::this_thread::sleep_for(std::chrono::microseconds(100));
}

/* What a backward threw, for the tests below: a boom's value, or 0 for an
 * adg::error (then *failure is the failure it names); -1 when it threw
 * nothing. */
template <class F> int what_threw(F &&run, adg_failure *failure)
{
	try {
		run();
	} catch (const boom &e) {
		return e.value;
	} catch (const adg::error &e) {
		*failure = e.failure();
		return 0;
	}
	return -1;
}

/* Two steps whose values the check rejects, on workers: b first in tape
 * order (y's last slot runs first), a first in time (b gives only once a's
 * check has thrown). The failure names b, and the backward throws what b's
 * check threw (boom 2), or, when it merely returned false, adg::error
 * naming b: never a's (boom 1). Issue 41: a check's exception was kept
 * under node 0 and the first one kept was rethrown. */
TEST(the_check_first_in_tape_order_is_rethrown)
{
	adg::pool workers(2);
	for (bool b_throws : {false, true}) {
		for (int round = 0; round < 20; round++) {
			adg::registry reg;
			adg::node x = adg::leaf(reg);
			std::atomic<bool> a_failed{false};
			adg::node a = adg::op(
				reg, {x},
				[&a_failed](adg::step_call<double> &c) {
					try {
						c.give(0, 1.0);
					} catch (...) {
						a_failed =
							true; /* kept by now */
						throw;
					}
				},
				"a");
			adg::node b = adg::op(
				reg, {x},
				[&a_failed](adg::step_call<double> &c) {
					wait_for(a_failed);
					c.give(0, 2.0);
				},
				"b");
			adg::node y = adg::op(
				reg, {a, b},
				[](adg::step_call<double> &c) {
					c.give(0, 0.0);
					c.give(1, 0.0);
				},
				"y");
			adg_failure why{}, named{};
			adg::backward_options o;
			o.executor = workers;
			o.failure = &why;
			o.value_check = [b_throws](adg::grad_ref g) {
				double v = *g.get<double>();
				if (v == 1.0)
					throw boom{1};
				if (v == 2.0 && b_throws)
					throw boom{2};
				return v != 2.0;
			};
			int got = what_threw([&] { adg::backward(y, 1.0, o); },
					     &named);
			int want = b_throws ? 2 : 0;
			if (got != want)
				std::printf("  round %d: threw %d (1: a's), "
					    "wanted %d\n",
					    round, got, want);
			EXPECT(got == want);
			EXPECT(why.site == ADG_FAILED_CHECK &&
			       why.node_id == b.id() && a_failed);
			EXPECT(b_throws || (named.site == ADG_FAILED_CHECK &&
					    named.node_id == b.id() &&
					    named.code == ADG_EVALUE));
		}
	}
}

/* A step's first rejected value is its failure's code: when that check
 * returned false (ADG_EVALUE), a later check of the same step that threw
 * does not stand for it, and the backward throws adg::error (it threw the
 * later check's exception, kept by site alone). */
TEST(a_steps_first_rejection_is_its_failure)
{
	adg::pool workers(2);
	for (unsigned n_workers : {0u, 2u}) {
		adg::registry reg;
		adg::node x = adg::leaf(reg);
		adg::node y = adg::op(
			reg, {x, x},
			[](adg::step_call<double> &c) {
				for (std::size_t k = 0; k < 2; k++)
					try {
						c.give(k, 1.0 + k);
					} catch (const adg::error &) {
						/* rejected: go on */
					}
			},
			"y");
		adg_failure why{}, named{};
		adg::backward_options o;
		if (n_workers > 0)
			o.executor = workers;
		o.failure = &why;
		o.value_check = [](adg::grad_ref g) -> bool {
			if (*g.get<double>() == 2.0)
				throw boom{2};
			return false;
		};
		int got = what_threw([&] { adg::backward(y, 1.0, o); }, &named);
		EXPECT(got == 0 && named.code == ADG_EVALUE);
		EXPECT(why.site == ADG_FAILED_CHECK && why.node_id == y.id());
	}
}

/* A gradient whose += throws boom{tag}: the tag tells whose sum it was. */
struct tagged {
	double v;
	int tag;
	tagged &operator+=(const tagged &)
	{
		throw boom{tag};
	}
};

/* Two adds that throw, on different targets, on workers: v's first in
 * tape order (its last contributor b runs before a), u's first in time (b
 * gives only once on_ready has seen c, which a's delivery reaches after
 * u's add threw). The failure names v, and the backward throws v's add's
 * exception (boom 2), never u's (boom 1). Issue 41: the first add
 * exception kept, in time, was rethrown. */
TEST(the_add_first_in_tape_order_is_rethrown)
{
	adg::pool workers(2);
	for (int round = 0; round < 20; round++) {
		adg::registry reg;
		adg::node u = adg::leaf(reg), v = adg::leaf(reg),
			  w = adg::leaf(reg);
		adg::node c = adg::op(
			reg, {w},
			[](adg::step_call<tagged> &s) {
				s.give(0, {0, 0});
			},
			"c");
		std::uint64_t c_id = c.id();
		std::atomic<bool> u_failed{false};
		adg::node a = adg::op(
			reg, {u, u, c},
			[](adg::step_call<tagged> &s) {
				s.give(0, {1, 1});
				s.give(1, {1, 1}); /* u's add throws boom 1 */
				s.give(2, {0, 0});
			},
			"a");
		adg::node b = adg::op(
			reg, {v, v},
			[&u_failed](adg::step_call<tagged> &s) {
				wait_for(u_failed);
				s.give(0, {2, 2});
				s.give(1, {2, 2}); /* v's add throws boom 2 */
			},
			"b");
		adg::node y = adg::op(
			reg, {a, b},
			[](adg::step_call<tagged> &s) {
				s.give(0, {0, 0});
				s.give(1, {0, 0});
			},
			"y");
		c.reset();
		adg_failure why{}, named{};
		adg::backward_options o;
		o.executor = workers;
		o.failure = &why;
		/* c's gradient is final once a's delivery has folded u's. */
		o.on_ready = [&u_failed, c_id](std::uint64_t id,
					       adg::grad_ref) {
			if (id == c_id)
				u_failed = true;
		};
		int got = what_threw(
			[&] {
				adg::backward(y, tagged{1, 0}, o);
			},
			&named);
		if (got != 2)
			std::printf("  round %d: threw %d (1: u's), wanted 2\n",
				    round, got);
		EXPECT(got == 2);
		EXPECT(why.site == ADG_FAILED_ADD && why.node_id == v.id() &&
		       u_failed);
	}
}

/* Without an executor an add runs inside give, and give rethrows what it
 * threw (a boom here); a step that catches it and goes on to fail with an
 * exception of its own fails with its own, not the add's (issue 41: any
 * add's exception replaced a step's ADG_ETHREW). */
TEST(a_step_that_catches_an_adds_exception_throws_its_own)
{
	for (bool catch_it : {false, true}) {
		adg::registry reg;
		adg::node x = adg::leaf(reg);
		adg::node y = adg::op(
			reg, {x, x},
			[catch_it](adg::step_call<tagged> &s) {
				s.give(0, {1, 1});
				try {
					s.give(1, {1, 1}); /* the add throws */
				} catch (const boom &e) {
					if (catch_it && e.value == 1)
						throw boom{3};
					throw;
				}
			},
			"y");
		adg_failure why{}, named{};
		adg::backward_options o;
		o.failure = &why;
		int got = what_threw(
			[&] {
				adg::backward(y, tagged{1, 0}, o);
			},
			&named);
		if (got != (catch_it ? 3 : 1))
			std::printf("  catch_it %d: threw %d\n", catch_it, got);
		EXPECT(got == (catch_it ? 3 : 1));
		EXPECT(why.site == ADG_FAILED_STEP && why.node_id == y.id());
	}
}

/* Handles from C: adopt takes the caller's reference, borrow one of its
 * own; node_ref counts none; another registry's node is refused. */
TEST(c_handles_are_adopted_borrowed_and_referenced)
{
	adg::registry reg, other;
	adg_node *raw = nullptr;
	EXPECT(adg_leaf(reg.raw(), &raw) == 0);
	adg::node borrowed = adg::node::borrow(reg, raw);
	adg::node adopted = adg::node::adopt(reg, raw); /* ours now */
	adg::node_ref ref(reg, raw);
	EXPECT(ref.id() == adopted.id() && borrowed.raw() == raw);
	adg::node root = adg::op(
		reg, {ref}, [](adg::step_call<double> &c) { c.give(0, 4.0); });
	adg::gradients<double> g = adg::backward(adg::node_ref(root), 1.0);
	EXPECT(g.get(ref) == 4.0 && g.get(borrowed) == 4.0);
	adg::node foreign = adg::leaf(other);
	EXPECT_THROWS(adg::error, adg::node::adopt(reg, foreign.raw()),
		      EXPECT(e.code().value() == ADG_EFOREIGN));
	EXPECT_THROWS(adg::error, adg::node_ref(reg, foreign.raw()),
		      EXPECT(e.code().value() == ADG_EFOREIGN));
	EXPECT_THROWS(adg::error, adg::node::borrow(reg, nullptr),
		      EXPECT(e.code().value() == ADG_EINVAL));
	EXPECT_THROWS(adg::error, g.get(foreign),
		      EXPECT(e.code().value() == ADG_EFOREIGN));
	/* A C container, adopted: freed with its handle. */
	adg_grad_ops ops = adg::grad_ops<double>();
	adg::node y = adg::op(reg, {adopted}, [](adg::step_call<double> &c) {
		c.give(0, 2.0);
	});
	adg_grads *c_grads = nullptr;
	EXPECT(adg_backward(reg.raw(), y.raw(), adg::pack(1.0), &ops,
			    &c_grads) == 0);
	adg::gradients<double> owned = adg::gradients<double>::adopt(c_grads);
	EXPECT(owned.get(adopted) == 2.0);
}

/* Named leaves in the DOT, visit as a callable, and what it throws. */
TEST(graphs_are_seen_with_named_leaves)
{
	adg::registry reg;
	adg::node w = adg::leaf(reg, "W1"), b = adg::leaf(reg);
	adg::node y = mul<double>(reg, w, 1.0, b, 2.0, "mul");
	EXPECT(reg.leaf_name(w.id()) == "W1" && reg.leaf_name(b.id()).empty());
	std::string text = adg::dot(y);
	EXPECT(text.find("W1 (leaf " + std::to_string(w.id()) + ")") !=
	       std::string::npos);
	EXPECT(text.find("\"leaf " + std::to_string(b.id()) + "\"") !=
	       std::string::npos);
	/* mul's two edges carry their slots: w is its left, b its right. */
	std::string to_y = " -> n" + std::to_string(y.id());
	EXPECT(text.find("n" + std::to_string(w.id()) + to_y +
			 " [label=\"0\"];") != std::string::npos);
	EXPECT(text.find("n" + std::to_string(b.id()) + to_y +
			 " [label=\"1\"];") != std::string::npos);
	std::ostringstream out;
	adg::write_dot(y, out);
	EXPECT(out.str() == text);
	int ops = 0;
	adg::visit(y, [&](const adg_graph_node &n) {
		ops++;
		EXPECT(std::strcmp(n.name, "mul") == 0);
	});
	EXPECT(ops == 1);
	EXPECT_THROWS(
		boom,
		adg::visit(y, [](const adg_graph_node &) { throw boom{1}; }),
		EXPECT(e.value == 1));
	adg::backward(y, 1.0);
}

/* graph_id as the C API gives it: 0 for a leaf and once consumed; a merge
 * puts both parents' graphs under the smaller origin. */
TEST(nodes_know_their_graph)
{
	adg::registry reg;
	adg::node x = adg::leaf(reg);
	adg::node a = mul<double>(reg, x, 1.0, x, 1.0);
	adg::node b = mul<double>(reg, x, 2.0, x, 2.0);
	std::uint64_t ga = a.graph_id(), gb = b.graph_id();
	EXPECT(x.graph_id() == 0 && ga != 0 && gb != 0 && ga != gb);
	adg::node y = mul<double>(reg, a, 1.0, b, 1.0);
	std::uint64_t merged = std::min(ga, gb);
	EXPECT(y.graph_id() == merged && a.graph_id() == merged &&
	       b.graph_id() == merged);
	EXPECT(adg::node_ref(b).graph_id() == merged);
	std::uint64_t c_id = 0;
	EXPECT(adg_node_graph_id(y.raw(), &c_id) == 0 && c_id == merged);
	adg::backward(y, 1.0);
	EXPECT(y.graph_id() == 0 && a.graph_id() == 0);
	adg::node empty;
	EXPECT_THROWS(adg::error, (void)empty.graph_id(),
		      EXPECT(e.code().value() == ADG_EINVAL));
	EXPECT_THROWS(adg::error, (void)adg::node_ref().graph_id(),
		      EXPECT(e.code().value() == ADG_EINVAL));
}

/* op_with: a kept output read by the step, a rebuilt one, and a rebuild
 * that throws, rethrown from the backward as thrown. */
TEST(checkpointed_outputs_are_typed)
{
	adg::registry reg;
	adg::node x = adg::leaf(reg);
	/* h = x * 3 offers its output, rebuilt from nothing (a leaf
	 * parent: the closure keeps x's value). */
	adg::checkpoint<double> h_out;
	h_out.recompute = [](const adg::recompute_call &) { return 6.0; };
	adg::node h = adg::op_with(
		reg, {x},
		[](adg::step_call<double> &c) {
			c.give(0, 3.0 * c.grad_or(0.0));
		},
		h_out, "h");
	/* y = h * h asks for h's output. */
	adg::checkpoint<double> y_wants;
	y_wants.want_parents = {0};
	adg::node y = adg::op_with(
		reg, {h},
		[](adg::step_call<double> &c) {
			double hv = c.output<double>(c.parent_id(0));
			c.give(0, 2 * hv);
		},
		y_wants, "square");
	adg::gradients<double> g = adg::backward(y, 1.0);
	EXPECT(g.get(x) == 2 * 6.0 * 3.0);

	adg::checkpoint<double> bad;
	bad.recompute = [](const adg::recompute_call &) -> double {
		throw boom{9};
	};
	adg::node h2 = adg::op_with(
		reg, {x}, [](adg::step_call<double> &c) { c.give(0, 3.0); },
		bad, "h2");
	adg::node y2 = adg::op_with(
		reg, {h2},
		[](adg::step_call<double> &c) {
			c.give(0, c.output<double>(c.parent_id(0)));
		},
		y_wants, "reads h2");
	EXPECT_THROWS(boom, adg::backward(y2, 1.0), EXPECT(e.value == 9));
}

/* This program, as main was started (argv[0]): not /proc/self/exe, which
 * under valgrind is valgrind's. */
const char *self_path = "test_cpp";

/* The declaration-order mistake: main runs it for --outlive-a-registry. */
[[noreturn]] void outlive_a_registry()
{
	struct holder {
		adg::node n; /* declared first: destroyed last */
		adg::registry reg;
	};
	{
		holder h;
		h.n = adg::leaf(h.reg);
	}
	std::_Exit(0); /* not reached: ~registry terminates */
}

/* A registry destroyed under live nodes says so and terminates (as
 * std::thread does): checked in a child process, a fresh run of this
 * program (exec, not a fork's copy: valgrind would count the copy's pool
 * threads as lost). */
TEST(a_registry_outlived_by_its_nodes_is_loud)
{
	std::fflush(stdout);
	pid_t child = fork();
	EXPECT(child >= 0);
	if (child == 0) {
		int null = open("/dev/null", O_WRONLY);
		dup2(null, 2); /* the message is not this test's output */
		execl(self_path, self_path, "--outlive-a-registry",
		      static_cast<char *>(nullptr));
		_exit(127);
	}
	int status = 0;
	EXPECT(waitpid(child, &status, 0) == child);
	EXPECT(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
}

/* A step records ops on its node's registry through step_call::registry,
 * and a node names its registry: no capture of the registry needed. A
 * DOT to a failed stream says so. */
TEST(steps_and_nodes_know_their_registry)
{
	adg::registry reg;
	adg::node x = adg::leaf(reg);
	EXPECT(x.registry().raw() == reg.raw());
	EXPECT(adg::node_ref(x).registry().raw() == reg.raw());
	std::atomic<int> recorded{0};
	adg::node y = adg::op(
		reg, {x},
		[&recorded](adg::step_call<double> &c) {
			adg::node made = adg::leaf(c.registry());
			recorded += made ? 1 : 0;
			c.give(0, 2.0);
		},
		"records");
	adg::gradients<double> g = adg::backward(y, 1.0);
	EXPECT(recorded == 1 && g.get(x) == 2.0);
	adg_step_call raw_call{};
	adg::step_call<double> from_c(&raw_call);
	EXPECT_THROWS(adg::error, from_c.registry(),
		      EXPECT(e.code().value() == ADG_EINVAL));
	adg::node z = adg::op(
		reg, {x}, [](adg::step_call<double> &c) { c.give(0, 1.0); });
	std::ostringstream closed;
	closed.setstate(std::ios_base::badbit);
	EXPECT_THROWS(adg::error, adg::write_dot(z, closed), {
		EXPECT(std::string(e.what()).find("stream failed") !=
		       std::string::npos);
	});
	adg::backward(z, 1.0);
}

/* ---------------------------------------------------------- the reducer */

/* A model of two parameters on T participants: each participant's loss is
 * sum_i w_i * x_i(p, k) + w_0 * w_1 over its share; the reducer folds the
 * gradients in its tree and takes an SGD step. */
struct sync_model {
	adg::registry reg;
	std::vector<adg::node> params;
	double w[2] = {0.5, -0.25};
	explicit sync_model()
	{
		params.push_back(adg::leaf(reg, "w0"));
		params.push_back(adg::leaf(reg, "w1"));
	}
	/* Participant p's graph of round k; its step throws at p == bad. */
	adg::node loss(int p, int k, int bad = -1)
	{
		double x0 = 0.1 * (p + 1) + 0.01 * k, x1 = 0.2 - 0.03 * p;
		double w0 = w[0], w1 = w[1];
		return adg::op(
			reg, {params[0], params[1]},
			[=](adg::step_call<double> &c) {
				if (p == bad)
					throw std::runtime_error(
						"participant " +
						std::to_string(p) + " failed");
				double g = c.grad_or(0.0);
				c.give(0, g * (x0 + w1));
				c.give(1, g * (x1 + w0));
			},
			"loss");
	}
};

/* Trains rounds rounds on T threads; returns the weights. */
std::array<double, 2> train_sync(int t, int rounds)
{
	sync_model m;
	adg::reducer<double> red(t, m.params,
				 [&m](const adg::reduction<double> &r) {
					 if (r.sum != nullptr)
						 m.w[r.param] -= 0.1 * *r.sum;
				 });
	std::vector<std::thread> threads;
	for (int p = 0; p < t; p++)
		threads.emplace_back([&, p] {
			for (int k = 0; k < rounds; k++)
				red.round(p, [&] {
					adg::backward(m.loss(p, k), 1.0,
						      red.hook(p));
				});
		});
	for (std::thread &th : threads)
		th.join();
	EXPECT(red.rounds() == static_cast<std::uint64_t>(rounds));
	return {m.w[0], m.w[1]};
}

/* T = 1 through the reducer is the plain trainer, bitwise; two runs at
 * T = 2 and at T = 4 are bitwise equal. */
TEST(the_reducer_trains_bitwise_reproducibly)
{
	sync_model plain;
	for (int k = 0; k < 5; k++) {
		adg::gradients<double> g = adg::backward(plain.loss(0, k), 1.0);
		for (int i = 0; i < 2; i++)
			plain.w[i] -= 0.1 * g.get(plain.params[i]);
	}
	std::array<double, 2> one = train_sync(1, 5);
	EXPECT(one[0] == plain.w[0] && one[1] == plain.w[1]);
	for (int t : {2, 4})
		EXPECT(train_sync(t, 5) == train_sync(t, 5));
}

/* A step throws inside a round on 4 participants: every participant's
 * round rethrows it, message included, and no parameter changed; a
 * trainer's own on_ready ran beside the reducer's. */
TEST(a_step_that_throws_fails_the_round_for_everyone)
{
	constexpr int t = 4;
	sync_model m;
	const double before[2] = {m.w[0], m.w[1]};
	adg::reducer<double> red(t, m.params,
				 [&m](const adg::reduction<double> &r) {
					 if (r.sum != nullptr)
						 m.w[r.param] -= 0.1 * *r.sum;
				 });
	std::atomic<int> saw_message{0}, own_hook{0};
	std::vector<std::thread> threads;
	for (int p = 0; p < t; p++)
		threads.emplace_back([&, p] {
			adg::backward_options own;
			own.leaves_only = true;
			own.on_ready = [&](std::uint64_t, adg::grad_ref g) {
				if (g)
					own_hook++;
			};
			try {
				red.round(p, [&] {
					adg::backward(m.loss(p, 0, 2), 1.0,
						      red.hook(p, own));
				});
			} catch (const std::runtime_error &e) {
				if (std::string(e.what()) ==
				    "participant 2 failed")
					saw_message++;
			}
		});
	for (std::thread &th : threads)
		th.join();
	EXPECT(saw_message == t);
	EXPECT(m.w[0] == before[0] && m.w[1] == before[1]);
	EXPECT(own_hook == 2 * (t - 1)); /* every gradient given */
	/* The next round starts clean. */
	threads.clear();
	for (int p = 0; p < t; p++)
		threads.emplace_back([&, p] {
			red.round(p, [&] {
				adg::backward(m.loss(p, 1), 1.0, red.hook(p));
			});
		});
	for (std::thread &th : threads)
		th.join();
	EXPECT(m.w[0] != before[0] && red.rounds() == 2);
}

/* Trains rounds rounds of 5 units on T threads, each unit a backward
 * through the hook but unit 3, given by hand; returns the weights. */
std::array<double, 2> train_units(int t, int rounds)
{
	sync_model m;
	adg::reducer_options<double> o;
	o.units = 5;
	adg::reducer<double> red(
		t, m.params,
		[&m](const adg::reduction<double> &r) {
			if (r.sum != nullptr)
				m.w[r.param] -= 0.1 * *r.sum;
		},
		o);
	std::vector<std::thread> threads;
	for (int p = 0; p < t; p++)
		threads.emplace_back([&, p] {
			for (int k = 0; k < rounds; k++)
				red.round(p, [&](std::size_t unit) {
					int u = static_cast<int>(unit);
					if (u != 3) {
						adg::backward(m.loss(u, k), 1.0,
							      red.hook(p));
						return;
					}
					adg::gradients<double> g =
						adg::backward(m.loss(u, k),
							      1.0);
					red.give(p, m.params[1],
						 g.get(m.params[1]));
				});
		});
	for (std::thread &th : threads)
		th.join();
	EXPECT(red.rounds() == static_cast<std::uint64_t>(rounds));
	return {m.w[0], m.w[1]};
}

/* With units, the weights are bitwise the same at every T. */
TEST(an_empty_reducer_throws_where_it_crashed)
{
	adg::reducer<double> none;
	EXPECT(!none && none.raw() == nullptr);
	EXPECT_THROWS(adg::error, none.end(0), {
		EXPECT(e.code().value() == ADG_EINVAL);
		EXPECT(std::string(e.what()).find("reducer::end: an empty "
						  "reducer") !=
		       std::string::npos);
	});
	sync_model m;
	adg::reducer<double> red(1, m.params,
				 [](const adg::reduction<double> &) {});
	EXPECT(bool(red));
	adg::reducer<double> taken(std::move(red));
	EXPECT(taken && !red && red.raw() == nullptr);
	/* Each call on the moved-from one: an error, not a null state. */
	bool ran = false;
	EXPECT_THROWS(adg::error, red.round(0, [&] { ran = true; }),
		      EXPECT(e.code().value() == ADG_EINVAL));
	EXPECT(!ran);
	EXPECT_THROWS(adg::error, red.hook(0),
		      EXPECT(e.code().value() == ADG_EINVAL));
	EXPECT_THROWS(adg::error, red.next_unit(0),
		      EXPECT(e.code().value() == ADG_EINVAL));
	EXPECT_THROWS(adg::error, red.unit_end(0),
		      EXPECT(e.code().value() == ADG_EINVAL));
	EXPECT_THROWS(adg::error, red.give(0, m.params[0], 1.0),
		      EXPECT(e.code().value() == ADG_EINVAL));
	EXPECT_THROWS(adg::error, red.failure(0),
		      EXPECT(e.code().value() == ADG_EINVAL));
	EXPECT_THROWS(adg::error, red.rounds(),
		      EXPECT(e.code().value() == ADG_EINVAL));
	red = std::move(taken); /* assigned again: usable */
	red.end(0);
	EXPECT(red.rounds() == 1);
}

TEST(a_reducer_with_units_gives_the_same_bits_at_every_t)
{
	std::array<double, 2> one = train_units(1, 4);
	for (int t : {2, 3, 5, 8})
		EXPECT(train_units(t, 4) == one);
	/* Without units a unit call is refused. */
	sync_model m;
	adg::reducer<double> red(1, m.params,
				 [](const adg::reduction<double> &) {});
	EXPECT_THROWS(adg::error, red.next_unit(0),
		      EXPECT(e.code().value() == ADG_ESTATE));
	/* Given twice: the second refused, and the round ends. */
	red.give(0, m.params[0], 1.0);
	EXPECT_THROWS(adg::error, red.give(0, m.params[0], 2.0),
		      EXPECT(e.code().value() == ADG_ESTATE));
	red.end(0);
	EXPECT(red.rounds() == 1);

	/* A rank's share, units 3 and 4 of a job of 5: apply sees the
	 * partial sums of the largest subtrees of the job's tree within it,
	 * [3, 4) and [4, 8) cut at 5. */
	adg::reducer_options<double> share;
	share.units = 2;
	share.first_unit = 3;
	share.total_units = 5;
	std::vector<std::pair<std::size_t, std::size_t>> seen;
	adg::reducer<double> rank(
		1, m.params,
		[&](const adg::reduction<double> &r) {
			if (r.param == 0)
				seen.emplace_back(r.first_unit, r.n_units);
		},
		share);
	rank.round(0, [&](std::size_t unit) {
		EXPECT(unit == 3 || unit == 4);
		rank.give(0, m.params[0], 1.0);
	});
	std::sort(seen.begin(), seen.end());
	EXPECT(seen.size() == 2 && seen[0] == std::make_pair(3ul, 1ul) &&
	       seen[1] == std::make_pair(4ul, 1ul));
}

/* An apply that throws fails the round for every participant too. */
TEST(an_apply_that_throws_fails_the_round_for_everyone)
{
	constexpr int t = 2;
	sync_model m;
	adg::reducer<double> red(
		t, m.params, [](const adg::reduction<double> &r) {
			if (r.param == 1)
				throw boom{static_cast<int>(r.round) + 40};
		});
	std::atomic<int> caught{0};
	std::vector<std::thread> threads;
	for (int p = 0; p < t; p++)
		threads.emplace_back([&, p] {
			try {
				red.round(p, [&] {
					adg::backward(m.loss(p, 0), 1.0,
						      red.hook(p));
				});
			} catch (const boom &e) {
				caught += e.value == 40;
			}
		});
	for (std::thread &th : threads)
		th.join();
	EXPECT(caught == t);
	EXPECT_THROWS(adg::error, red.hook(t),
		      EXPECT(e.code().value() == ADG_EINVAL));
}

/* A gradient of n numbers, for the reducer's slices. */
struct numbers {
	std::vector<double> v;
	numbers &operator+=(const numbers &o)
	{
		for (std::size_t i = 0; i < v.size(); i++)
			v[i] += o.v[i];
		return *this;
	}
};

/* Which elements of n a slice of n_slices holds: [first, last). */
std::pair<std::size_t, std::size_t> slice_of(std::size_t n, std::size_t slice,
					     std::size_t n_slices)
{
	return {n * slice / n_slices, n * (slice + 1) / n_slices};
}

/* Two parameters of 10 numbers each, the first in 4 slices or whole, on 3
 * participants for 4 rounds; bad: the round and participant whose
 * add_slice throws (-1: none). Returns the weights; counts each slice's
 * applies in applied (by param * 4 + slice). */
std::array<std::vector<double>, 2>
train_in_slices(bool sliced, int bad_round, std::atomic<int> (&applied)[8],
		std::atomic<int> &caught)
{
	constexpr int t = 3, n = 10;
	adg::registry reg;
	std::vector<adg::node> params{adg::leaf(reg, "a"), adg::leaf(reg, "b")};
	std::array<std::vector<double>, 2> w{std::vector<double>(n, 1.0),
					     std::vector<double>(n, -1.0)};
	adg::reducer_options<numbers> o;
	if (sliced)
		o.slices = {4, 1};
	o.add_slice = [&](numbers &sum, const numbers &value, std::size_t k,
			  std::size_t n_slices) {
		EXPECT(n_slices == 4);
		auto [first, last] = slice_of(sum.v.size(), k, n_slices);
		for (std::size_t i = first; i < last; i++)
			sum.v[i] += value.v[i];
	};
	adg::reducer<numbers> red(
		t, params,
		[&](const adg::reduction<numbers> &r) {
			applied[r.param * 4 + r.slice]++;
			auto [first, last] = slice_of(n, r.slice, r.n_slices);
			for (std::size_t i = first; i < last; i++)
				w[r.param][i] -= 0.1 * r.sum->v[i];
		},
		o);
	std::vector<std::thread> threads;
	for (int p = 0; p < t; p++)
		threads.emplace_back([&, p] {
			for (int k = 0; k < 4; k++) {
				/* The values this participant reads: the
				 * barrier ordered the last round's applies
				 * before. */
				std::array<std::vector<double>, 2> mine = w;
				try {
					red.round(p,
						  [&] {
							  adg::
								  node
									  y =
										  adg::
											  op(reg,
											     params,
											     [&,
											      p,
											      k](
												     adg::step_call<
													     numbers>
													     &c) {
												     if (k == bad_round &&
													 p == 1)
													     throw boom{
														     k};
												     for (int i = 0;
													  i <
													  2;
													  i++) {
													     numbers g{std::vector<
														     double>(
														     n)};
													     for (int j = 0;
														  j <
														  n;
														  j++)
														     g.v[j] =
															     mine[1 -
																  i]
																 [j] *
															     (p +
															      1 +
															      0.1 * j);
													     c.give(i,
														    std::move(
															    g));
												     }
											     });
							  adg::backward(
								  y,
								  numbers{{1.0}},
								  red.hook(p));
						  });
				} catch (const boom &e) {
					caught += e.value == bad_round;
				}
			}
		});
	for (std::thread &th : threads)
		th.join();
	return w;
}

/* Slices fold and apply the same bits as whole parameters, each slice
 * once a round, on whichever thread; a step that throws fails the round
 * for all, and it applies nothing of a parameter in slices. */
TEST(a_reducer_in_slices_gives_the_bits_of_whole_parameters)
{
	std::atomic<int> applied[8] = {}, whole_applied[8] = {}, caught{0};
	auto sliced = train_in_slices(true, -1, applied, caught);
	auto whole = train_in_slices(false, -1, whole_applied, caught);
	EXPECT(sliced == whole);
	for (int k = 0; k < 4; k++)
		EXPECT(applied[k] == 4 && whole_applied[k] == (k == 0 ? 4 : 0));
	EXPECT(applied[4] == 4 && applied[5] == 0);
	/* Round 2 fails on every participant and changes nothing. */
	std::atomic<int> failing[8] = {};
	auto failed = train_in_slices(true, 2, failing, caught);
	EXPECT(caught == 3);
	EXPECT(failing[0] == 3 && failing[4] == 3);
	EXPECT(failed != sliced);
}

/* What the options cannot be: a count per parameter, add_slice with
 * slices, none for a G kept inline. */
TEST(a_reducers_slices_are_checked)
{
	adg::registry reg;
	std::vector<adg::node> params{adg::leaf(reg), adg::leaf(reg)};
	auto apply = [](const adg::reduction<numbers> &) {};
	adg::reducer_options<numbers> o;
	o.slices = {2};
	EXPECT_THROWS(adg::error, adg::reducer<numbers>(2, params, apply, o),
		      EXPECT(e.code().value() == ADG_EINVAL));
	o.slices = {2, 1};
	EXPECT_THROWS(adg::error, adg::reducer<numbers>(2, params, apply, o),
		      EXPECT(e.code().value() == ADG_EINVAL));
	o.add_slice = [](numbers &, const numbers &, std::size_t, std::size_t) {
	};
	o.slices = {ADG_REDUCER_MAX_SLICES + 1, 1};
	EXPECT_THROWS(adg::error, adg::reducer<numbers>(2, params, apply, o),
		      EXPECT(e.code().value() == ADG_EINVAL));
	adg::reducer_options<double> inline_options;
	inline_options.slices = {2, 1};
	inline_options.add_slice = [](double &, const double &, std::size_t,
				      std::size_t) {};
	EXPECT_THROWS(adg::error,
		      adg::reducer<double>(
			      2, params, [](const adg::reduction<double> &) {},
			      inline_options),
		      EXPECT(e.code().value() == ADG_EINVAL));
	o.slices = {2, 1};
	adg::reducer<numbers> fine(2, params, apply, o);
	EXPECT(fine.rounds() == 0);
}

TEST(generic_lambdas_name_their_type)
{
	adg::registry reg;
	adg::node x = adg::leaf(reg);
	adg::node y = adg::op<double>(reg, {x, x}, [](auto &c) {
		for (std::size_t i = 0; i < c.n_parents(); i++)
			c.give(i, *c.grad() * 3.0);
	});
	EXPECT(adg::backward(y, 2.0).get(x) == 12.0);
}

/* An error from a C call carries its reason (adg_errmsg), read when it
 * was thrown: what() says it; an error of this layer alone has none. */
TEST(errors_carry_the_c_calls_reason)
{
	std::uint64_t id;
	EXPECT_THROWS(adg::error,
		      adg::check(adg_node_id(nullptr, &id), "adg_node_id"), {
			      EXPECT(e.reason() == "adg_node_id: node is NULL");
			      EXPECT(std::string(e.what()) == e.reason());
		      });
	adg_registry_options o{};
	o.checkpointing = 7;
	EXPECT_THROWS(adg::error, adg::registry bad(o), {
		EXPECT(e.code().value() == ADG_EINVAL);
		EXPECT(std::string(e.what()).find(
			       "adg_registry_new: options->checkpointing 7") ==
		       0);
	});
	/* Read when thrown: a later failure on the thread changes nothing. */
	adg::error kept(ADG_EINVAL, "context", adg_errmsg());
	adg::registry reg;
	EXPECT_THROWS(adg::error, adg::pool none(0u), {});
	EXPECT(kept.reason().find("options->checkpointing 7") !=
	       std::string::npos);
	EXPECT(std::string(kept.what()).find("context: adg_registry_new") == 0);
	adg::error plain(ADG_EINVAL, "reducer::hook: participant 5 of 2");
	EXPECT(plain.reason().empty());
	EXPECT(std::string(plain.what()) ==
	       "reducer::hook: participant 5 of 2: invalid argument");
	/* A step's own code, in the backward's reason. */
	adg::node x = adg::leaf(reg);
	adg::node y = adg::op(
		reg, {x},
		[](adg::step_call<double> &) {
			throw adg::error(ADG_EUSER - 4, "bad data");
		},
		"load");
	EXPECT_THROWS(adg::error, adg::backward(y, 1.0), {
		EXPECT(e.code().value() == ADG_EUSER - 4);
		EXPECT(std::strcmp(e.failure().name, "load") == 0);
		EXPECT(std::string(e.what()).find("bad data") !=
		       std::string::npos);
	});
}

/* A round that participant 2 fails with an adg::error from its backward:
 * every participant's end rethrows it, and reducer::failure tells each
 * one who failed, with what code, at which step (round passed the
 * error's failure on). */
TEST(a_failed_round_tells_every_participant_who_and_where)
{
	constexpr int t = 3;
	sync_model m;
	adg::reducer<double> red(t, m.params,
				 [&m](const adg::reduction<double> &r) {
					 if (r.sum != nullptr)
						 m.w[r.param] -= 0.1 * *r.sum;
				 });
	adg::node bad = adg::op(
		m.reg, {m.params[0]},
		[](adg::step_call<double> &) {
			throw adg::error(ADG_EVALUE, "a NaN");
		},
		"mul");
	std::uint64_t bad_id = bad.id();
	std::array<adg_reducer_failure, t> told{};
	std::atomic<int> rethrown{0};
	std::vector<std::thread> threads;
	for (int p = 0; p < t; p++)
		threads.emplace_back([&, p] {
			try {
				red.round(p, [&] {
					adg::backward(p == 2 ? bad
							     : m.loss(p, 0),
						      1.0, red.hook(p));
				});
			} catch (const adg::error &e) {
				if (e.code().value() == ADG_EVALUE)
					rethrown++;
			}
			told[p] = red.failure(p);
		});
	for (std::thread &th : threads)
		th.join();
	EXPECT(rethrown == t);
	for (const adg_reducer_failure &f : told) {
		EXPECT(f.code == ADG_EVALUE);
		EXPECT(f.site == ADG_REDUCER_FAILED_RESULT);
		EXPECT(f.participant == 2);
		EXPECT(f.step.site == ADG_FAILED_STEP);
		EXPECT(f.step.node_id == bad_id);
		EXPECT(std::strcmp(f.step.name, "mul") == 0);
	}
	EXPECT_THROWS(adg::error, red.failure(t),
		      EXPECT(e.code().value() == ADG_EINVAL));
	/* No exception stands for a round ended with a unit not done: the
	 * round's reason does. */
	adg::reducer_options<double> o;
	o.units = 2;
	adg::reducer<double> units(
		1, m.params, [](auto &) {}, o);
	EXPECT(units.next_unit(0) == 0);
	units.unit_end(0);
	EXPECT_THROWS(adg::error, units.end(0), {
		EXPECT(e.code().value() == ADG_ESTATE);
		EXPECT(std::string(e.what()) ==
		       "reducer::end: adg_reducer_end_with: round 0 abandoned "
		       "with ADG_ESTATE (-10): it ended with units not done");
	});
	EXPECT(units.failure(0).site == ADG_REDUCER_FAILED_UNITS);
	EXPECT(units.failure(0).participant == SIZE_MAX);
}

/* extend_c_options: the extension sees the options this layer built, with
 * the backward's T, and its changes are the backward's; one that throws
 * fails the backward before it starts (the root is not consumed). */
TEST(an_extension_changes_the_c_options)
{
	adg::registry reg;
	leaves l(reg);
	adg::node y = adg::op(reg, {l.x, l.y}, [](adg::step_call<double> &c) {
		c.give(0, c.grad_or(0.0));
	});
	adg::backward_options o;
	o.on_step = [](const adg_step_event &) {};
	bool saw = false;
	o.extend_c_options(
		[&saw](adg_backward_options &c, const std::type_info &type) {
			saw = c.on_step != nullptr && type == typeid(double);
			c.retain = 1;
		});
	adg::backward(y, 1.0, o);
	EXPECT(saw);
	adg::backward(y, 1.0, o); /* retained by the extension */
	o.extend_c_options([](adg_backward_options &, const std::type_info &) {
		throw adg::error(ADG_EBUSY, "extension");
	});
	EXPECT_THROWS(adg::error, adg::backward(y, 1.0, o),
		      EXPECT(e.code().value() == ADG_EBUSY));
	o.extend_c_options(nullptr);
	adg::backward(y, 1.0, o); /* not consumed by the failed one */
	EXPECT_THROWS(adg::error, adg::backward(y, 1.0, o),
		      EXPECT(e.code().value() == ADG_ECONSUMED));
}

TEST(errors_name_their_codes)
{
	adg::error err(ADG_ENOMEM, "here");
	EXPECT(err.code().category() == adg::category());
	EXPECT(std::strcmp(adg::category().name(), "adg") == 0);
	EXPECT(err.code().message() == adg_strerror(ADG_ENOMEM));
	EXPECT(std::string(err.what()).find("here") != std::string::npos);
	EXPECT(err.failure().code == ADG_ENOMEM);
	EXPECT(adg::category().message(ADG_ETHREW) != "unknown error");
	EXPECT(std::strcmp(adg::version(), adg_version()) == 0);
	EXPECT(std::string(adg::version()) ==
	       std::to_string(ADG_VERSION_MAJOR) + "." +
		       std::to_string(ADG_VERSION_MINOR) + "." +
		       std::to_string(ADG_VERSION_PATCH));
	adg::check(0);
	EXPECT_THROWS(adg::error, adg::check(ADG_EBUSY),
		      EXPECT(e.code().value() == ADG_EBUSY));
	adg_grad_ops ops = adg::grad_ops<double>();
	void *sum = adg::pack(1.0);
	EXPECT(ops.add(&sum, adg::pack(2.0), nullptr) == 0);
	EXPECT(adg::unpack<double>(sum) == 3.0);
	ops.free(sum, nullptr);
	/* 0.0 is not NULL (no gradient), and a boxed type is a T *. */
	EXPECT(adg::pack(0.0) != nullptr && adg::pack(0.0f) != nullptr);
	EXPECT(adg::unpack<double>(adg::pack(-0.0)) == 0.0);
	EXPECT(std::isnan(adg::unpack<double>(adg::pack(std::nan("")))));
	adg_grad_ops boxed = adg::grad_ops<tracked>();
	void *t = adg::pack(tracked(1.5));
	EXPECT(static_cast<tracked *>(t)->v == 1.5);
	boxed.free(t, nullptr);
}

/* ----------------------------------------------------------- exact sums */

/* A float's bits, to compare -0 and +0 apart. */
std::uint32_t bits_of(float f)
{
	std::uint32_t b;
	std::memcpy(&b, &f, sizeof b);
	return b;
}

bool same_bits(const std::vector<float> &a, const std::vector<float> &b)
{
	return a.size() == b.size() &&
	       std::equal(a.begin(), a.end(), b.begin(), [](float x, float y) {
		       return bits_of(x) == bits_of(y);
	       });
}

/* exact_sum is adg/exact.h's: each sum exact whatever its terms' order,
 * rounded once, ties to even; a merge, or +=, gives the bits of the adds
 * it merges. */
TEST(exact_sums_are_the_c_apis)
{
	/* Sum 0: 2^100 + 2^-100 - 2^100, 0 in floats; sum 1: 1 + 2^-24,
	 * halfway, to 1 (even); sum 2: 1 + 2^-23 + 2^-24, halfway, to
	 * 1 + 2^-22 (even), not down. */
	const std::vector<float> terms[3] = {
		{0x1p100f, 1.0f, 1.0f + 0x1p-23f},
		{0x1p-100f, 0x1p-24f, 0x1p-24f},
		{-0x1p100f, 0.0f, -0.0f},
	};
	const std::vector<float> want{0x1p-100f, 1.0f, 1.0f + 0x1p-22f};
	adg::exact_sum sum(3);
	EXPECT(sum && sum.raw() != nullptr && sum.size() == 3);
	for (const std::vector<float> &t : terms)
		sum.add(t);
	EXPECT(same_bits(sum.rounded(), want));
	float two[2] = {};
	sum.round(two, 2, 1);
	EXPECT(bits_of(two[0]) == bits_of(want[1]) &&
	       bits_of(two[1]) == bits_of(want[2]));

	/* The terms shared out between two accumulators, element by element
	 * (add's first), then merged: the same bits. */
	adg::exact_sum a(3), b(3);
	for (const std::vector<float> &t : terms)
		for (std::size_t i = 0; i < 3; i++)
			(i % 2 == 0 ? a : b).add(&t[i], 1, i);
	a += b;
	EXPECT(same_bits(a.rounded(), want));
	/* A range merged: the others stay 0, +0 once rounded. */
	adg::exact_sum c(3);
	c.merge(sum, 1, 2);
	EXPECT(same_bits(c.rounded(), {0.0f, want[1], want[2]}));
	c.merge(a, 0, 1);
	EXPECT(same_bits(c.rounded(), want));
	/* b's terms of sum 1, 1 + 2^-24, twice: 2 + 2^-23, to 2 (even). */
	c += b;
	EXPECT(same_bits(c.rounded(), {0x1p-100f, 2.0f, want[2]}));
	/* Cleared: every sum +0; adds start again. */
	sum.clear();
	EXPECT(same_bits(sum.rounded(), {0.0f, 0.0f, 0.0f}));
	sum.add(terms[1]);
	EXPECT(same_bits(sum.rounded(), terms[1]));
	const std::vector<float> none;
	sum.add(none); /* nothing, and no error */
	EXPECT(same_bits(sum.rounded(), terms[1]));
}

/* What exact_sum refuses, with the C call's reason; an empty one (default
 * made or moved from) refuses every call, naming it. */
TEST(exact_sums_say_what_they_refuse)
{
	adg::exact_sum none;
	EXPECT(!none && none.raw() == nullptr);
	EXPECT_THROWS(adg::error, none.add(std::vector<float>{1.0f}), {
		EXPECT(e.code().value() == ADG_EINVAL);
		EXPECT(std::string(e.what()).find(
			       "exact_sum::add: an empty exact_sum") == 0);
	});
	EXPECT_THROWS(adg::error, none.size(), {
		EXPECT(e.code().value() == ADG_EINVAL);
		EXPECT(std::string(e.what()).find("exact_sum::size") == 0);
	});
	EXPECT_THROWS(adg::error, none.rounded(),
		      EXPECT(e.code().value() == ADG_EINVAL));
	EXPECT_THROWS(adg::error, none.clear(),
		      EXPECT(e.code().value() == ADG_EINVAL));
	EXPECT_THROWS(adg::error, adg::exact_sum(0), {
		EXPECT(e.code().value() == ADG_EINVAL);
		EXPECT(e.reason().find("adg_exact_new") == 0);
	});

	adg::exact_sum sum(2);
	sum.add(std::vector<float>{1.0f, 2.0f});
	/* A value not finite: nothing added, and the reason says which. */
	const std::vector<float> bad{3.0f, std::nanf("")};
	EXPECT_THROWS(adg::error, sum.add(bad), {
		EXPECT(e.code().value() == ADG_EVALUE);
		EXPECT(e.reason().find("values[1]") != std::string::npos);
		EXPECT(std::string(e.what()).find("values[1]") !=
		       std::string::npos);
	});
	const float inf = std::numeric_limits<float>::infinity();
	EXPECT_THROWS(adg::error, sum.add(&inf, 1, 1),
		      EXPECT(e.code().value() == ADG_EVALUE));
	EXPECT(same_bits(sum.rounded(), {1.0f, 2.0f}));
	/* Ranges past the sums, lengths that differ, itself, an empty one. */
	EXPECT_THROWS(adg::error, sum.add(bad.data(), 2, 1),
		      EXPECT(e.code().value() == ADG_EINVAL));
	float out[2];
	EXPECT_THROWS(adg::error, sum.round(out, 1, 2),
		      EXPECT(e.code().value() == ADG_EINVAL));
	adg::exact_sum longer(3);
	EXPECT_THROWS(adg::error, sum += longer, {
		EXPECT(e.code().value() == ADG_EINVAL);
		EXPECT(std::string(e.what()).find("adg_exact_merge") == 0);
	});
	EXPECT_THROWS(adg::error, longer.merge(sum, 0, 1),
		      EXPECT(e.code().value() == ADG_EINVAL));
	EXPECT_THROWS(adg::error, sum += sum,
		      EXPECT(e.code().value() == ADG_EINVAL));
	EXPECT_THROWS(adg::error, sum += none,
		      EXPECT(e.code().value() == ADG_EINVAL));
	EXPECT_THROWS(adg::error, none += sum, {
		EXPECT(e.code().value() == ADG_EINVAL);
		EXPECT(std::string(e.what()).find("exact_sum::operator+=") ==
		       0);
	});
	adg::exact_ref ref{&sum}, null_ref;
	EXPECT_THROWS(adg::error, ref += null_ref,
		      EXPECT(e.code().value() == ADG_EINVAL));
	EXPECT(same_bits(sum.rounded(), {1.0f, 2.0f}));

	/* Moved: the source empty, the sums with the target. */
	adg_exact *raw = sum.raw();
	adg::exact_sum taken(std::move(sum));
	EXPECT(taken.raw() == raw && !sum && sum.raw() == nullptr);
	EXPECT_THROWS(adg::error, sum.size(),
		      EXPECT(e.code().value() == ADG_EINVAL));
	longer = std::move(taken); /* frees longer's own */
	EXPECT(!taken && longer.raw() == raw && longer.size() == 2);
	EXPECT(same_bits(longer.rounded(), {1.0f, 2.0f}));
	self_move(longer); /* a no-op */
	EXPECT(longer.raw() == raw);
}

/* The exact trainer's parameters: their lengths, the first in slices. */
constexpr std::size_t exact_rounds = 5, exact_samples = 11;
const std::size_t exact_lens[2] = {40, 5};

/* Sample s's gradient of parameter k in round r, into g: values of every
 * scale and sign, plus a term of the weights w, as a real gradient's. */
void exact_gradient(std::size_t k, std::size_t r, std::size_t s,
		    const std::vector<float> &w, std::vector<float> &g)
{
	std::uint64_t state = r * 1000003u + s * 7919u + k * 31u + 1;
	g.resize(w.size());
	for (std::size_t i = 0; i < w.size(); i++) {
		state = state * 6364136223846793005ull + 1442695040888963407ull;
		int e = static_cast<int>((state >> 20) % 40) - 30;
		float m = static_cast<float>(
				  static_cast<std::int64_t>(state >> 40)) -
			  0x1p23f;
		g[i] = std::ldexp(m, e - 23) + 0.001f * w[i];
	}
}

using exact_weights = std::array<std::vector<float>, 2>;

exact_weights exact_start()
{
	return {std::vector<float>(exact_lens[0], 0.5f),
		std::vector<float>(exact_lens[1], -0.5f)};
}

/* The rounds on T threads, the samples taken from a counter by whichever
 * thread is free: each thread adds its samples' gradients to its own
 * accumulators, gives them (adg::exact_ref), ends the round and clears
 * them; the reducer merges (the first parameter in 3 slices, or whole)
 * and apply rounds and steps. Returns the weights. */
exact_weights train_exact(std::size_t t, bool sliced)
{
	adg::registry reg;
	std::vector<adg::node> params{adg::leaf(reg, "a"), adg::leaf(reg, "b")};
	exact_weights w = exact_start();
	std::vector<std::array<adg::exact_sum, 2>> mine(t);
	for (std::array<adg::exact_sum, 2> &sums : mine)
		for (std::size_t k = 0; k < 2; k++)
			sums[k] = adg::exact_sum(exact_lens[k]);
	adg::reducer_options<adg::exact_ref> o;
	if (sliced)
		o.slices = {3, 1};
	o.add_slice = [](adg::exact_ref &sum, const adg::exact_ref &value,
			 std::size_t slice, std::size_t n_slices) {
		auto [first, last] = slice_of(sum.sum->size(), slice, n_slices);
		sum.sum->merge(*value.sum, first, last - first);
	};
	auto apply = [&w](const adg::reduction<adg::exact_ref> &r) {
		if (r.sum == nullptr)
			return;
		std::vector<float> &p = w[r.param];
		auto [first, last] = slice_of(p.size(), r.slice, r.n_slices);
		std::vector<float> g(last - first);
		r.sum->sum->round(g.data(), g.size(), first);
		for (std::size_t i = first; i < last; i++)
			p[i] -= 0.01f * g[i - first];
	};
	adg::reducer<adg::exact_ref> red(t, params, apply, o);
	std::array<std::atomic<std::size_t>, exact_rounds> next{};
	std::vector<std::thread> threads;
	for (std::size_t p = 0; p < t; p++)
		threads.emplace_back([&, p] {
			std::vector<float> g;
			for (std::size_t r = 0; r < exact_rounds; r++) {
				for (std::size_t s = next[r]++;
				     s < exact_samples; s = next[r]++) {
					for (std::size_t k = 0; k < 2; k++) {
						exact_gradient(k, r, s, w[k],
							       g);
						mine[p][k].add(g);
					}
					if ((s + p) % 3 == 0)
						std::this_thread::yield();
				}
				for (std::size_t k = 0; k < 2; k++)
					red.give(p, params[k],
						 adg::exact_ref{&mine[p][k]});
				red.end(p);
				for (std::size_t k = 0; k < 2; k++)
					mine[p][k].clear();
			}
		});
	for (std::thread &th : threads)
		th.join();
	EXPECT(red.rounds() == exact_rounds);
	return w;
}

/* The same rounds on this thread, each parameter's samples added in
 * order to one accumulator (exact) or summed in floats. */
exact_weights train_in_order(bool exact)
{
	exact_weights w = exact_start();
	std::vector<float> g;
	for (std::size_t r = 0; r < exact_rounds; r++) {
		exact_weights sums{std::vector<float>(exact_lens[0]),
				   std::vector<float>(exact_lens[1])};
		for (std::size_t k = 0; k < 2; k++) {
			adg::exact_sum sum(exact_lens[k]);
			for (std::size_t s = 0; s < exact_samples; s++) {
				exact_gradient(k, r, s, w[k], g);
				sum.add(g);
				for (std::size_t i = 0; i < g.size(); i++)
					sums[k][i] += g[i];
			}
			if (exact)
				sums[k] = sum.rounded();
		}
		for (std::size_t k = 0; k < 2; k++)
			for (std::size_t i = 0; i < w[k].size(); i++)
				w[k][i] -= 0.01f * sums[k][i];
	}
	return w;
}

/* Exact sums through the reducer: the samples taken as they come, the
 * weights the same bits at T = 1, 2 and 3, in slices or whole, and those
 * of one thread's exact sums in order (which floats in order are not). */
TEST(exact_sums_through_the_reducer_give_the_same_bits_at_every_t)
{
	exact_weights in_order = train_in_order(true);
	exact_weights floats = train_in_order(false);
	EXPECT(!same_bits(floats[0], in_order[0]));
	for (std::size_t t : {1, 2, 3}) {
		exact_weights w = train_exact(t, true);
		EXPECT(same_bits(w[0], in_order[0]));
		EXPECT(same_bits(w[1], in_order[1]));
	}
	exact_weights whole = train_exact(2, false);
	EXPECT(same_bits(whole[0], in_order[0]) &&
	       same_bits(whole[1], in_order[1]));
}

/* A gradient type without += (a pointer to each participant's exact sums)
 * is a reducer's G when it brings its add; without one, the constructor
 * says so. Two threads each add {1, 0.25} and {2, -1}: the round's sum,
 * merged by that add, is {6, -1.5}. */
TEST(a_gradient_without_plus_assign_brings_its_add)
{
	static_assert(!adg::detail::has_plus_assign_v<adg::exact_sum *>);
	adg::registry reg;
	std::vector<adg::node> params{adg::leaf(reg, "w")};
	std::vector<float> got;
	auto apply = [&got](const adg::reduction<adg::exact_sum *> &r) {
		got = (*r.sum)->rounded();
	};
	adg::reducer_options<adg::exact_sum *> o;
	o.add = [](adg::exact_sum *&sum, adg::exact_sum *const &value) {
		*sum += *value;
	};
	adg::reducer<adg::exact_sum *> red(2, params, apply, o);
	std::array<adg::exact_sum, 2> mine{adg::exact_sum(2),
					   adg::exact_sum(2)};
	std::vector<std::thread> threads;
	for (std::size_t p = 0; p < 2; p++)
		threads.emplace_back([&, p] {
			mine[p].add(std::vector<float>{1.0f, 0.25f});
			mine[p].add(std::vector<float>{2.0f, -1.0f});
			red.give(p, params[0], &mine[p]);
			red.end(p);
		});
	for (std::thread &th : threads)
		th.join();
	EXPECT(got.size() == 2 && got[0] == 6.0f && got[1] == -1.5f);
	EXPECT_THROWS(adg::error,
		      (adg::reducer<adg::exact_sum *>(1, params, apply)), {
			      EXPECT(e.code().value() == ADG_EINVAL);
			      EXPECT(std::string(e.what()).find("no add") !=
				     std::string::npos);
		      });
}

} // namespace

/* No argument: the unit tier's tests; --stress: the stress tier's;
 * --outlive-a-registry: a_registry_outlived_by_its_nodes_is_loud's child. */
int main(int argc, char **argv)
{
	self_path = argv[0];
	if (argc == 2 && std::strcmp(argv[1], "--outlive-a-registry") == 0)
		outlive_a_registry();
	bool stress = argc > 1 && std::strcmp(argv[1], "--stress") == 0;
	if (argc > 2 || (argc == 2 && !stress)) {
		std::fprintf(stderr, "usage: %s [--stress]\n", argv[0]);
		return 2;
	}
	int passed = 0, failed = 0;
	for (const test_case &t : all_tests()) {
		if (t.stress != stress)
			continue;
		probe::live = 0;
		tracked::live = 0;
		std::string why;
		try {
			t.run();
			if (probe::live != 0 || tracked::live != 0)
				why = "left " + std::to_string(probe::live) +
				      " closures, " +
				      std::to_string(tracked::live) +
				      " gradient values";
		} catch (const check_failed &f) {
			why = f.what;
		} catch (const std::exception &e) {
			why = std::string("threw: ") + e.what();
		} catch (...) {
			why = "threw something else";
		}
		if (why.empty()) {
			std::printf("ok %s\n", t.name);
			passed++;
		} else {
			std::printf("FAILED %s: %s\n", t.name, why.c_str());
			failed++;
		}
	}
	std::printf("cpp: %d passed, %d failed\n", passed, failed);
	/* Criterion's summary line too: scripts/valgrind.sh runs every
	 * tests/test_* binary and wants it, and scripts/test.sh then counts
	 * the test cases rather than one test. */
	std::printf(
		"[====] Synthesis: Tested: %d | Passing: %d | Failing: %d | "
		"Crashing: 0\n",
		passed + failed, passed, failed);
	return failed == 0 ? 0 : 1;
}
