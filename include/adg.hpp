/*
 * adg.hpp: libadg's C++17 layer, header-only, over the C API of adg.h. It
 * adds no state to libadg: every call below is one or a few C calls.
 *
 *     adg::registry reg;
 *     adg::node a = adg::leaf(reg), b = adg::leaf(reg);
 *     adg::node y = adg::op(reg, {a, b}, [=](adg::step_call<double> &c) {
 *             c.give(0, c.grad_or(0.0) * bv); // av, bv: forward values
 *             c.give(1, c.grad_or(0.0) * av);
 *     });
 *     adg::gradients<double> g = adg::backward(y, 1.0);
 *     double da = g.get(a);
 *
 * Errors are exceptions: adg::error, a std::system_error whose code() is the
 * ADG_E* code in adg::category(). Exceptions, not std::error_code returns,
 * because the calls that fail are constructors (a registry, a pool) and
 * calls that return what they make (a node, the gradients); because a step
 * is a lambda that reports failure by throwing, and that exception, of the
 * lambda's own type, is what its caller wants back from the backward; and
 * because code on tensors throws already (std::bad_alloc). Every function
 * does what it says or throws, leaking nothing (a backward that throws has
 * consumed its graph all the same, as adg_backward does); destructors never
 * throw.
 *
 * Ownership, one rule per handle, as in adg.h:
 * - adg::registry, adg::gradients<T>, adg::pool and adg::executor own what
 *   they wrap alone: move-only. A moved-from handle is empty; assigning
 *   over a live handle frees what it held first; self-assignment is a no-op.
 * - adg::node holds one counted reference (adg_node_ref): copying it takes
 *   another, destroying it drops one. It also remembers its registry, so
 *   that backward(y, seed) needs nothing else. It holds no reference to the
 *   registry: the registry must outlive its nodes (declare it first), since
 *   a count on the registry would be a cache line every thread writes.
 * - A step's lambda, and what it captures (forward values, node handles),
 *   is libadg's once op returns: it lives in the step's user pointer and is
 *   destroyed exactly once, through adg_step.release, when the step goes.
 *   If op throws, no node was made and libadg's copy is already destroyed.
 * - A gradient value of type T lives on the heap (new T) and is libadg's
 *   from the moment it is given; the grad ops generated for T fold with
 *   += and free with delete. One gradient type per registry: the first
 *   op<T> or backward<T> fixes it, and a different T is refused
 *   (ADG_EINVAL), since the values would be freed as the wrong type.
 *
 * Threads: as in adg.h, any call from any thread, and handles may move
 * between threads; one handle object, like a std::shared_ptr, must not be
 * assigned to while another thread uses it.
 *
 * Exceptions never cross into libadg. Each callback (a step, an add) is a
 * noexcept trampoline that catches, keeps the exception and returns a
 * negative code: std::bad_alloc becomes ADG_ENOMEM, an adg::error its own
 * code, anything else ADG_ETHREW (an executor's
 * submit that throws refuses the job instead). The backward then rethrows,
 * rather than reports, the exception that failed it, as thrown, so that
 * catch clauses for the lambda's own types work: the failing step's (the
 * first in tape order, with an executor too), or, when an add threw, the
 * add's. When no exception explains the code (ADG_ECONSUMED, libadg's own
 * ADG_ENOMEM), it throws adg::error. backward_options::failure names the
 * failing node and step either way.
 */
#ifndef ADG_HPP
#define ADG_HPP

/* adg.h names a function after its struct (adg_stats, as C allows), which
 * C++'s -Wshadow reports: not a warning for a user of this header. */
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wshadow"
#endif
#include <adg.h>
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <system_error>
#include <type_traits>
#include <typeinfo>
#include <unordered_map>
#include <utility>
#include <vector>

namespace adg
{

namespace detail
{
struct registry_core;
struct grad_state;
struct access;
} // namespace detail

/* ------------------------------------------------------------------ errors */

/* The category of libadg's codes: message() is adg_strerror's text, and
 * names the codes below. */
const std::error_category &category() noexcept;

/* What a trampoline returned, before ADG_ETHREW, when a lambda threw
 * something that carries no ADG_E* code. Both are ADG_ETHREW now, whose
 * name and message say a callback threw; backward_options::failure says
 * which callback. */
[[deprecated("use ADG_ETHREW")]] inline constexpr int step_threw = ADG_ETHREW;
[[deprecated("use ADG_ETHREW")]] inline constexpr int add_threw = ADG_ETHREW;

/* Every failure of this layer, and of libadg under it. code().value() is
 * the ADG_E* code; failure() says where a backward failed (site
 * ADG_FAILED_NOWHERE elsewhere). */
class error : public std::system_error
{
public:
	explicit error(int code, const char *context = nullptr);
	error(int code, const adg_failure &failure);
	const adg_failure &failure() const noexcept;

private:
	adg_failure failure_{};
};

/* Throws adg::error(rc) unless rc is 0: for the C calls this layer does not
 * wrap. */
void check(int rc, const char *context = nullptr);

/* ---------------------------------------------------------------- registry */

/* Owns an adg_registry, and the exceptions steps threw, by pass, until
 * their backward returns: it rethrows the one it reports and drops the
 * rest (a second step failing at once on an executor). Those of passes run
 * by C code (adg_backward_with on steps made here) stay until the registry
 * goes. */
class registry
{
public:
	/* adg_registry_new with the defaults, or with options (copied). */
	registry();
	explicit registry(const adg_registry_options &options);
	registry(registry &&other) noexcept;
	registry &operator=(registry &&other) noexcept;
	registry(const registry &) = delete;
	registry &operator=(const registry &) = delete;
	/* Frees the registry. If nodes are still alive (ADG_EBUSY: a node
	 * handle outlived its registry) it is left allocated instead, a leak
	 * LeakSanitizer reports, rather than freed under them: a destructor
	 * can neither throw nor wait. close() says so. */
	~registry();

	/* Frees the registry now. Throws adg::error(ADG_EBUSY), the handle
	 * unchanged, while nodes are alive. Afterwards the handle is empty. */
	void close();

	/* Counters (adg_stats). */
	struct adg_stats stats() const;
	/* The registry's allocator (adg_registry_allocator), for a pool's
	 * memory, say. */
	adg_allocator allocator() const;
	/* The C handle, for calls this layer does not wrap; null if empty. */
	adg_registry *raw() const noexcept;
	explicit operator bool() const noexcept;

private:
	friend struct detail::access;
	detail::registry_core *core_ = nullptr;
};

/* ------------------------------------------------------------------- nodes */

/* One counted reference to a node, and the registry the node is in. */
class node
{
public:
	/* An empty handle. */
	node() noexcept = default;
	node(const node &other) noexcept;
	node(node &&other) noexcept;
	node &operator=(const node &other) noexcept;
	node &operator=(node &&other) noexcept;
	~node();

	/* The node's id (adg_node_id); throws on an empty handle. */
	std::uint64_t id() const;
	/* The C handle, still this handle's reference; null if empty. */
	adg_node *raw() const noexcept;
	/* Hands this handle's reference to the caller (adg_node_unref's);
	 * the handle is empty afterwards. */
	adg_node *release() noexcept;
	/* Drops the reference now; the handle is empty afterwards. */
	void reset() noexcept;
	explicit operator bool() const noexcept;

private:
	friend struct detail::access;
	adg_node *raw_ = nullptr;
	detail::registry_core *core_ = nullptr;
};

/* A parent of op: a node borrowed for the call (a temporary will do). */
class parent
{
public:
	parent(const node &n) noexcept;

private:
	friend struct detail::access;
	adg_node *raw_;
};

/* A new leaf of reg (adg_leaf): a parameter, an input that wants a
 * gradient. */
node leaf(registry &reg);

/* ------------------------------------------------------------------- steps */

/* What a step's lambda receives: one step_call per run. T is the gradient
 * type of the backward that runs it. */
template <class T> class step_call
{
public:
	explicit step_call(adg_step_call *call) noexcept;

	/* The node's gradient, borrowed; null when no child gave one. */
	const T *grad() const noexcept;
	/* A copy of the node's gradient, or fallback when there is none. */
	T grad_or(T fallback) const;
	/* Takes the node's gradient (null when none): the step keeps it. */
	std::unique_ptr<T> take_grad() noexcept;

	/* Hands the gradient for the parent at slot (op's order) to the
	 * backward (adg_step_give). Throws adg::error on a bad slot, a slot
	 * given twice or an add's failure: the value is gone either way. */
	void give(std::size_t slot, T value);
	void give(std::size_t slot, std::unique_ptr<T> value);

	std::size_t n_parents() const noexcept;
	std::uint64_t parent_id(std::size_t slot) const noexcept;
	std::uint64_t node_id() const noexcept;
	/* A retained backward: the step may run again, so it keeps what it
	 * needs (captures stay until the step goes). */
	bool retained() const noexcept;
	/* The C call: its registry for a nested backward, adg_output_get. */
	adg_step_call *raw() const noexcept;

private:
	adg_step_call *call_;
};

/* A new node whose step is `step`, a callable taking step_call<T>& (a
 * lambda whose parameter names T; for a generic lambda, say op<T>). The
 * callable is moved into libadg and destroyed exactly once, when the step
 * goes. It runs on the backward's threads, reports failure by throwing, and
 * must be safe to run concurrently with other steps when the backward has
 * an executor. name is adg_step.name: a string that outlives the registry
 * (a literal), or null. Throws what adg_op fails with (ADG_EFOREIGN: a
 * parent of another registry) or the registry's different gradient type
 * (ADG_EINVAL). */
template <class F>
node op(registry &reg, std::initializer_list<parent> parents, F &&step,
	const char *name = nullptr);
template <class T, class F>
node op(registry &reg, std::initializer_list<parent> parents, F &&step,
	const char *name = nullptr);
/* The same with parents gathered at run time. */
template <class F>
node op(registry &reg, const std::vector<node> &parents, F &&step,
	const char *name = nullptr);
template <class T, class F>
node op(registry &reg, const std::vector<node> &parents, F &&step,
	const char *name = nullptr);

/* The adg_grad_ops of gradient type T: add is `*sum += std::move(*value)`,
 * then delete value; free is delete. ctx null: an add that throws returns
 * ADG_ETHREW (or ADG_ENOMEM) and the exception is dropped. For
 * adg_registry_options.grad_ops, so that C calls passed NULL ops (and a
 * backward of C code) fold and free T too. */
template <class T> adg_grad_ops grad_ops() noexcept;

/* --------------------------------------------------------------- executors */

/* One job of a backward, as an executor receives it. Call it exactly once,
 * later, on any thread (not inside submit): it runs fn(arg). Never drop it
 * unrun; it returns at once when its backward is over. */
struct job {
	void (*fn)(void *arg);
	void *arg;
	void operator()() const;
};

/* libadg's thread pool (adg_pool): n_threads workers that sleep while there
 * is no work. It must outlive every backward that uses it. */
class pool
{
public:
	explicit pool(unsigned n_threads);
	/* The pool's memory from allocator (registry::allocator(), say),
	 * which must outlive the pool. */
	pool(unsigned n_threads, const adg_allocator &allocator);
	pool(pool &&other) noexcept;
	pool &operator=(pool &&other) noexcept;
	pool(const pool &) = delete;
	pool &operator=(const pool &) = delete;
	/* Runs what is queued and stops the threads (adg_pool_free). */
	~pool();

	const adg_executor *c_executor() const noexcept;

private:
	adg_pool *raw_ = nullptr;
	adg_executor exec_{};
};

/* An executor made of a callable: submit(adg::job) or submit(fn, arg)
 * arranges for the job to run once, later, elsewhere (a thread pool's post,
 * say); a submit that throws refuses the job, which then never runs.
 * n_workers: how many of its threads one backward may use (adg_executor).
 * The callable is kept, moved, for the executor's life; it must outlive
 * every backward that uses it and be safe to call from several threads at
 * once. */
class executor
{
public:
	template <class Submit> executor(Submit submit, unsigned n_workers);
	executor(executor &&other) noexcept = default;
	executor &operator=(executor &&other) noexcept = default;
	executor(const executor &) = delete;
	executor &operator=(const executor &) = delete;
	~executor() = default;

	const adg_executor *c_executor() const noexcept;

private:
	std::unique_ptr<void, void (*)(void *)> submit_;
	adg_executor exec_{};
};

/* Where a backward runs its steps: nowhere else (the default), a pool, an
 * executor, or a C adg_executor; borrowed for the backward's call. */
class executor_ref
{
public:
	executor_ref() noexcept = default;
	executor_ref(const pool &p) noexcept;
	executor_ref(const executor &e) noexcept;
	executor_ref(const adg_executor &e) noexcept;
	const adg_executor *get() const noexcept;

private:
	const adg_executor *exec_ = nullptr;
};

/* --------------------------------------------------------------- backward */

/* adg_backward_options, the parts this layer passes on. */
struct backward_options {
	/* Steps run on the calling thread and this executor's workers. */
	executor_ref executor;
	/* A retained backward: steps stay registered and may run again. */
	bool retain = false;
	/* When set, filled on every return: the result and where it came
	 * from. */
	adg_failure *failure = nullptr;
};

template <class T> class gradients;

/* Runs a backward from root with seed as its gradient, folding gradients of
 * type T. Returns the leaves' gradients. Throws the exception that failed
 * it (see the opening comment) or adg::error: ADG_ECONSUMED for a root
 * already run, ADG_EUNAVAILABLE, ADG_EINVAL for an empty root or a T that
 * is not the registry's. Write the seed as a T: backward(y, 1.0) for
 * double, not backward(y, 1). */
template <class T>
gradients<T> backward(const node &root, T seed,
		      const backward_options &options = {});

/* -------------------------------------------------------------- gradients */

/* Owns the gradients of one backward: an adg_grads of T values. */
template <class T> class gradients
{
public:
	/* An empty container. */
	gradients() noexcept = default;
	gradients(gradients &&other) noexcept;
	gradients &operator=(gradients &&other) noexcept;
	gradients(const gradients &) = delete;
	gradients &operator=(const gradients &) = delete;
	~gradients();

	/* The gradient of n (or of the node with that id), borrowed; throws
	 * adg::error(ADG_ENOTFOUND) when there is none. */
	const T &get(const node &n) const;
	T &get(const node &n);
	const T &get(std::uint64_t id) const;
	/* The same, null when there is none. */
	const T *find(const node &n) const noexcept;
	/* Moves the gradient out of the container; throws ADG_ENOTFOUND. */
	T take(const node &n);
	/* How many gradients the container holds. */
	std::size_t size() const;
	adg_grads *raw() const noexcept;

private:
	friend struct detail::access;
	adg_grads *raw_ = nullptr;
	/* The ops' ctx, which the container keeps: it lives as long. */
	std::unique_ptr<detail::grad_state> state_;
};

/* ---------------------------------------------------------- implementation */

namespace detail
{

class error_category final : public std::error_category
{
public:
	const char *name() const noexcept override
	{
		return "adg";
	}
	std::string message(int code) const override
	{
		return adg_strerror(code);
	}
};

inline std::string failure_context(const adg_failure &f)
{
	static const char *const sites[] = {
		"", "step", "on_step", "on_ready", "add", "value check of"};
	if (f.site == ADG_FAILED_NOWHERE || f.site > ADG_FAILED_CHECK)
		return "backward";
	std::string s = "backward: ";
	s += sites[f.site];
	if (f.name != nullptr)
		s += std::string(" '") + f.name + "'";
	s += " of node " + std::to_string(f.node_id);
	return s;
}

/* What a registry handle owns besides the C registry: where trampolines
 * keep what a step threw until its backward takes it, and the registry's
 * gradient type. Written on failures and once for the type, so threads
 * building graphs share no written line through it. */
struct registry_core {
	adg_registry *raw = nullptr;
	std::atomic<const std::type_info *> grad_type{nullptr};
	std::mutex mutex; /* guards thrown */
	/* By pass (adg_step_call.pass_id), then node: never by node alone,
	 * since retained passes on several threads run one step at once and
	 * each must get back what its own run of the step threw. */
	using node_exception = std::pair<std::uint64_t, std::exception_ptr>;
	std::unordered_map<std::uint64_t, std::vector<node_exception>> thrown;

	void keep(std::uint64_t pass_id, std::uint64_t node_id,
		  std::exception_ptr e) noexcept
	{
		try {
			std::lock_guard<std::mutex> lock(mutex);
			thrown[pass_id].emplace_back(node_id, std::move(e));
		} catch (...) {
			/* no memory: the backward throws adg::error */
		}
	}

	/* What node_id's step threw in pass_id (null when nothing); drops
	 * the rest of the pass's, which no one will ask for. */
	std::exception_ptr take(std::uint64_t pass_id,
				std::uint64_t node_id) noexcept
	{
		std::exception_ptr e;
		std::lock_guard<std::mutex> lock(mutex);
		auto pass = thrown.find(pass_id);
		if (pass == thrown.end())
			return e;
		for (auto &kept : pass->second)
			if (kept.first == node_id && !e)
				e = std::move(kept.second);
		thrown.erase(pass);
		return e;
	}

	template <class T> void check_type()
	{
		const std::type_info *want = &typeid(T);
		const std::type_info *have = nullptr;
		if (grad_type.compare_exchange_strong(
			    have, want, std::memory_order_acq_rel))
			return; /* the first: T is the registry's now */
		if (*have != *want)
			throw error(
				ADG_EINVAL,
				"gradient type differs from the registry's");
	}
};

/* A backward's grad ops' ctx: the first exception an add threw. */
struct grad_state {
	std::mutex mutex;
	std::exception_ptr first;

	void keep(std::exception_ptr e) noexcept
	{
		std::lock_guard<std::mutex> lock(mutex);
		if (!first)
			first = std::move(e);
	}
};

struct access {
	static registry_core *core(const registry &r) noexcept
	{
		return r.core_;
	}
	static registry_core *core(const node &n) noexcept
	{
		return n.core_;
	}
	static adg_node *raw(const parent &p) noexcept
	{
		return p.raw_;
	}
	static node adopt(adg_node *raw, registry_core *core) noexcept
	{
		node n;
		n.raw_ = raw;
		n.core_ = core;
		return n;
	}
	template <class T>
	static gradients<T> adopt(adg_grads *raw,
				  std::unique_ptr<grad_state> state) noexcept
	{
		gradients<T> g;
		g.raw_ = raw;
		g.state_ = std::move(state);
		return g;
	}
};

template <class T> struct typed_ops {
	static int add(void **sum, void *value, void *ctx) noexcept
	{
		std::unique_ptr<T> v(static_cast<T *>(value)); /* ours */
		try {
			*static_cast<T *>(*sum) += std::move(*v);
			return 0;
		} catch (const std::bad_alloc &) {
			if (ctx != nullptr)
				static_cast<grad_state *>(ctx)->keep(
					std::current_exception());
			return ADG_ENOMEM;
		} catch (...) {
			if (ctx != nullptr)
				static_cast<grad_state *>(ctx)->keep(
					std::current_exception());
			return ADG_ETHREW;
		}
	}
	static void free(void *value, void *ctx) noexcept
	{
		(void)ctx;
		delete static_cast<T *>(value);
	}
};

/* A step: the callable and where to keep what it throws. */
template <class T, class F> struct closure {
	F step;
	registry_core *core;

	static int run(adg_step_call *call, void *user) noexcept
	{
		auto *self = static_cast<closure *>(user);
		try {
			step_call<T> c(call);
			static_assert(std::is_void_v<decltype(self->step(c))>,
				      "adg::op: a step returns nothing; it "
				      "throws to fail");
			self->step(c);
			return 0;
		} catch (const error &e) {
			self->core->keep(call->pass_id, call->node_id,
					 std::current_exception());
			int rc = e.code().value();
			return rc < 0 ? rc : ADG_ETHREW;
		} catch (const std::bad_alloc &) {
			self->core->keep(call->pass_id, call->node_id,
					 std::current_exception());
			return ADG_ENOMEM;
		} catch (...) {
			self->core->keep(call->pass_id, call->node_id,
					 std::current_exception());
			return ADG_ETHREW;
		}
	}

	static void release(void *user) noexcept
	{
		delete static_cast<closure *>(user);
	}
};

/* T of a step callable whose call operator takes step_call<T>&. */
template <class M> struct step_arg {
	static constexpr bool known = false;
};
#define ADG_HPP_STEP_ARG_(qualifiers)                                          \
	template <class C, class R, class T>                                   \
	struct step_arg<R (C::*)(step_call<T> &) qualifiers> {                 \
		static constexpr bool known = true;                            \
		using type = T;                                                \
	};
ADG_HPP_STEP_ARG_()
ADG_HPP_STEP_ARG_(const)
ADG_HPP_STEP_ARG_(noexcept)
ADG_HPP_STEP_ARG_(const noexcept)
#undef ADG_HPP_STEP_ARG_

template <class F, class = void> struct step_type : step_arg<void> {
};
template <class F>
struct step_type<F, std::void_t<decltype(&F::operator())>>
    : step_arg<decltype(&F::operator())> {
};
template <class R, class T> struct step_type<R (*)(step_call<T> &), void> {
	static constexpr bool known = true;
	using type = T;
};
template <class R, class T> struct step_type<R(step_call<T> &), void> {
	static constexpr bool known = true;
	using type = T;
};

template <class F>
struct step_type_of : step_type<std::remove_cv_t<std::remove_reference_t<F>>> {
};

/* The parents' C handles: on the stack for up to 8, the common case. */
class parent_list
{
public:
	explicit parent_list(std::initializer_list<parent> parents)
	    : parent_list(parents.size())
	{
		std::size_t i = 0;
		for (const parent &p : parents)
			data_[i++] = access::raw(p);
	}
	explicit parent_list(const std::vector<node> &parents)
	    : parent_list(parents.size())
	{
		for (std::size_t i = 0; i < n_; i++)
			data_[i] = parents[i].raw();
	}
	parent_list(const parent_list &) = delete; /* data_ may point in */
	parent_list &operator=(const parent_list &) = delete;
	adg_node *const *data() const noexcept
	{
		return data_;
	}
	std::size_t size() const noexcept
	{
		return n_;
	}

private:
	explicit parent_list(std::size_t n) : n_(n)
	{
		if (n > sizeof small_ / sizeof *small_) {
			large_.resize(n);
			data_ = large_.data();
		}
	}
	adg_node *small_[8];
	std::vector<adg_node *> large_;
	adg_node **data_ = small_;
	std::size_t n_;
};

template <class T, class F>
node make_typed_op(registry &reg, const parent_list &parents, F &&step,
		   const char *name)
{
	registry_core *core = access::core(reg);
	if (core == nullptr)
		throw error(ADG_EINVAL, "op: an empty registry");
	core->check_type<T>();
	using step_closure = closure<T, std::decay_t<F>>;
	auto owned = std::unique_ptr<step_closure>(
		new step_closure{std::forward<F>(step), core});
	adg_step s{};
	s.backward = &step_closure::run;
	s.release = &step_closure::release;
	s.user = owned.get();
	s.name = name;
	adg_node *out = nullptr;
	check(adg_op(core->raw, parents.data(), parents.size(), &s, &out),
	      "op");
	owned.release(); /* libadg's: release() deletes it */
	return access::adopt(out, core);
}

/* op's T when the step's parameter names it. */
struct deduced {
};

template <class T, class F>
node make_op(registry &reg, const parent_list &parents, F &&step,
	     const char *name)
{
	if constexpr (std::is_same_v<T, deduced>) {
		using traits = step_type_of<F>;
		static_assert(traits::known,
			      "adg::op: the step must take adg::step_call<T> & "
			      "(for a generic lambda, write adg::op<T>)");
		if constexpr (traits::known)
			return make_typed_op<typename traits::type>(
				reg, parents, std::forward<F>(step), name);
		else
			return node();
	} else {
		return make_typed_op<T>(reg, parents, std::forward<F>(step),
					name);
	}
}

template <class Submit> struct submitter {
	Submit submit;

	static int run(void (*fn)(void *), void *arg, void *ctx) noexcept
	{
		auto *self = static_cast<submitter *>(ctx);
		try {
			if constexpr (std::is_invocable_v<Submit &, job>)
				self->submit(job{fn, arg});
			else
				self->submit(fn, arg);
			return 0;
		} catch (...) {
			return -1; /* refused: fn never runs */
		}
	}

	static void destroy(void *self) noexcept
	{
		delete static_cast<submitter *>(self);
	}
};

/* Rethrows what failed a backward: an add's exception when the failure is
 * an add's (or a step's give that an add failed), else the failing step's,
 * else adg::error. */
[[noreturn]] inline void rethrow(int rc, const adg_failure &failure,
				 registry_core &core, grad_state &state)
{
	/* Taken whatever the site, so that what the pass's steps threw
	 * goes with it. */
	std::exception_ptr e = core.take(failure.pass_id, failure.node_id);
	if (failure.site != ADG_FAILED_STEP)
		e = nullptr;
	bool from_add = failure.site == ADG_FAILED_ADD || rc == ADG_ETHREW;
	{
		std::lock_guard<std::mutex> lock(state.mutex);
		if (state.first && (from_add || !e))
			e = state.first;
	}
	if (e)
		std::rethrow_exception(e);
	throw error(rc, failure);
}

} // namespace detail

inline const std::error_category &category() noexcept
{
	static const detail::error_category instance;
	return instance;
}

inline error::error(int rc, const char *context)
    : std::system_error(rc, category(), context ? context : "adg")
{
	failure_.code = rc;
}

inline error::error(int rc, const adg_failure &where)
    : std::system_error(rc, category(), detail::failure_context(where)),
      failure_(where)
{
	failure_.code = rc;
}

inline const adg_failure &error::failure() const noexcept
{
	return failure_;
}

inline void check(int rc, const char *context)
{
	if (rc != 0)
		throw error(rc, context);
}

/* registry */

inline registry::registry() : registry(adg_registry_options{})
{
}

inline registry::registry(const adg_registry_options &options)
{
	auto core = std::make_unique<detail::registry_core>();
	check(adg_registry_new(&options, &core->raw), "adg_registry_new");
	core_ = core.release();
}

inline registry::registry(registry &&other) noexcept : core_(other.core_)
{
	other.core_ = nullptr;
}

inline registry &registry::operator=(registry &&other) noexcept
{
	if (this != &other) {
		registry gone(std::move(*this));
		core_ = other.core_;
		other.core_ = nullptr;
	}
	return *this;
}

inline registry::~registry()
{
	if (core_ != nullptr && adg_registry_free(core_->raw) == 0)
		delete core_;
	/* else nodes outlived it: both are left to them (~registry's
	 * comment) */
}

inline void registry::close()
{
	if (core_ == nullptr)
		return;
	check(adg_registry_free(core_->raw), "adg_registry_free");
	delete core_;
	core_ = nullptr;
}

inline struct adg_stats registry::stats() const
{
	struct adg_stats s = {};
	check(adg_stats(raw(), &s), "adg_stats");
	return s;
}

inline adg_allocator registry::allocator() const
{
	adg_allocator a{};
	check(adg_registry_allocator(raw(), &a), "adg_registry_allocator");
	return a;
}

inline adg_registry *registry::raw() const noexcept
{
	return core_ != nullptr ? core_->raw : nullptr;
}

inline registry::operator bool() const noexcept
{
	return core_ != nullptr;
}

/* node */

inline node::node(const node &other) noexcept
    : raw_(other.raw_), core_(other.core_)
{
	if (raw_ != nullptr)
		adg_node_ref(raw_); /* fails only on NULL */
}

inline node::node(node &&other) noexcept : raw_(other.raw_), core_(other.core_)
{
	other.raw_ = nullptr;
	other.core_ = nullptr;
}

inline node &node::operator=(const node &other) noexcept
{
	if (this != &other) {
		node copy(other);
		*this = std::move(copy);
	}
	return *this;
}

inline node &node::operator=(node &&other) noexcept
{
	if (this != &other) {
		node gone(std::move(*this));
		raw_ = other.raw_;
		core_ = other.core_;
		other.raw_ = nullptr;
		other.core_ = nullptr;
	}
	return *this;
}

inline node::~node()
{
	reset();
}

inline std::uint64_t node::id() const
{
	std::uint64_t value = 0;
	check(adg_node_id(raw_, &value), "adg_node_id");
	return value;
}

inline adg_node *node::raw() const noexcept
{
	return raw_;
}

inline adg_node *node::release() noexcept
{
	adg_node *n = raw_;
	raw_ = nullptr;
	core_ = nullptr;
	return n;
}

inline void node::reset() noexcept
{
	adg_node *n = release(); /* empty before closures run */
	if (n != nullptr)
		adg_node_unref(n); /* may release steps: their closures */
}

inline node::operator bool() const noexcept
{
	return raw_ != nullptr;
}

inline parent::parent(const node &n) noexcept : raw_(n.raw())
{
}

inline node leaf(registry &reg)
{
	detail::registry_core *core = detail::access::core(reg);
	adg_node *out = nullptr;
	check(adg_leaf(reg.raw(), &out), "adg_leaf");
	return detail::access::adopt(out, core);
}

/* steps */

template <class T>
step_call<T>::step_call(adg_step_call *call) noexcept : call_(call)
{
}

template <class T> const T *step_call<T>::grad() const noexcept
{
	return static_cast<const T *>(call_->grad);
}

template <class T> T step_call<T>::grad_or(T fallback) const
{
	return call_->grad != nullptr ? *grad() : fallback;
}

template <class T> std::unique_ptr<T> step_call<T>::take_grad() noexcept
{
	std::unique_ptr<T> g(static_cast<T *>(call_->grad));
	call_->grad = nullptr;
	return g;
}

template <class T> void step_call<T>::give(std::size_t slot, T value)
{
	give(slot, std::make_unique<T>(std::move(value)));
}

template <class T>
void step_call<T>::give(std::size_t slot, std::unique_ptr<T> value)
{
	/* adg_step_give owns the value from the call on, failing or not */
	check(adg_step_give(call_, slot, value.release()), "adg_step_give");
}

template <class T> std::size_t step_call<T>::n_parents() const noexcept
{
	return call_->n_parents;
}

template <class T>
std::uint64_t step_call<T>::parent_id(std::size_t slot) const noexcept
{
	return call_->parent_ids[slot];
}

template <class T> std::uint64_t step_call<T>::node_id() const noexcept
{
	return call_->node_id;
}

template <class T> bool step_call<T>::retained() const noexcept
{
	return call_->retained != 0;
}

template <class T> adg_step_call *step_call<T>::raw() const noexcept
{
	return call_;
}

template <class F>
node op(registry &reg, std::initializer_list<parent> parents, F &&step,
	const char *name)
{
	return detail::make_op<detail::deduced>(
		reg, detail::parent_list(parents), std::forward<F>(step), name);
}

template <class T, class F>
node op(registry &reg, std::initializer_list<parent> parents, F &&step,
	const char *name)
{
	return detail::make_op<T>(reg, detail::parent_list(parents),
				  std::forward<F>(step), name);
}

template <class F>
node op(registry &reg, const std::vector<node> &parents, F &&step,
	const char *name)
{
	return detail::make_op<detail::deduced>(
		reg, detail::parent_list(parents), std::forward<F>(step), name);
}

template <class T, class F>
node op(registry &reg, const std::vector<node> &parents, F &&step,
	const char *name)
{
	return detail::make_op<T>(reg, detail::parent_list(parents),
				  std::forward<F>(step), name);
}

template <class T> adg_grad_ops grad_ops() noexcept
{
	adg_grad_ops ops{};
	ops.add = &detail::typed_ops<T>::add;
	ops.free = &detail::typed_ops<T>::free;
	return ops;
}

/* executors */

inline void job::operator()() const
{
	fn(arg);
}

inline pool::pool(unsigned n_threads)
{
	check(adg_pool_new(n_threads, &raw_), "adg_pool_new");
	adg_pool_executor(raw_, &exec_);
}

inline pool::pool(unsigned n_threads, const adg_allocator &allocator)
{
	adg_pool_options options{};
	options.n_threads = n_threads;
	options.allocator = allocator;
	check(adg_pool_new_with(&options, &raw_), "adg_pool_new_with");
	adg_pool_executor(raw_, &exec_);
}

inline pool::pool(pool &&other) noexcept : raw_(other.raw_), exec_(other.exec_)
{
	other.raw_ = nullptr;
	other.exec_ = adg_executor{};
}

inline pool &pool::operator=(pool &&other) noexcept
{
	if (this != &other) {
		pool gone(std::move(*this));
		raw_ = other.raw_;
		exec_ = other.exec_;
		other.raw_ = nullptr;
		other.exec_ = adg_executor{};
	}
	return *this;
}

inline pool::~pool()
{
	adg_pool_free(raw_); /* NULL: a no-op */
}

inline const adg_executor *pool::c_executor() const noexcept
{
	return raw_ != nullptr ? &exec_ : nullptr;
}

template <class Submit>
executor::executor(Submit submit, unsigned n_workers)
    : submit_(nullptr, &detail::submitter<Submit>::destroy)
{
	static_assert(
		std::is_invocable_v<Submit &, job> ||
			std::is_invocable_v<Submit &, void (*)(void *), void *>,
		"adg::executor: submit must take an adg::job, or fn and "
		"arg");
	auto *s = new detail::submitter<Submit>{std::move(submit)};
	submit_.reset(s);
	exec_.submit = &detail::submitter<Submit>::run;
	exec_.ctx = s;
	exec_.n_workers = n_workers;
}

inline const adg_executor *executor::c_executor() const noexcept
{
	return submit_ != nullptr ? &exec_ : nullptr;
}

inline executor_ref::executor_ref(const pool &p) noexcept
    : exec_(p.c_executor())
{
}

inline executor_ref::executor_ref(const executor &e) noexcept
    : exec_(e.c_executor())
{
}

inline executor_ref::executor_ref(const adg_executor &e) noexcept : exec_(&e)
{
}

inline const adg_executor *executor_ref::get() const noexcept
{
	return exec_;
}

/* backward */

template <class T>
gradients<T> backward(const node &root, T seed, const backward_options &options)
{
	detail::registry_core *core = detail::access::core(root);
	if (core == nullptr)
		throw error(ADG_EINVAL, "backward: an empty root");
	core->check_type<T>();
	auto state = std::make_unique<detail::grad_state>();
	adg_grad_ops ops = grad_ops<T>();
	ops.ctx = state.get();
	adg_failure failure{};
	adg_backward_options o{};
	o.executor = options.executor.get();
	o.retain = options.retain ? 1 : 0;
	o.failure = &failure;
	adg_grads *out = nullptr;
	T *s = new T(std::move(seed)); /* libadg's from the call on */
	int rc = adg_backward_with(core->raw, root.raw(), s, &ops, &o, &out);
	if (options.failure != nullptr)
		*options.failure = failure;
	if (rc != 0)
		detail::rethrow(rc, failure, *core, *state);
	return detail::access::adopt<T>(out, std::move(state));
}

/* gradients */

template <class T>
gradients<T>::gradients(gradients &&other) noexcept
    : raw_(other.raw_), state_(std::move(other.state_))
{
	other.raw_ = nullptr;
}

template <class T>
gradients<T> &gradients<T>::operator=(gradients &&other) noexcept
{
	if (this != &other) {
		gradients gone(std::move(*this));
		raw_ = other.raw_;
		state_ = std::move(other.state_);
		other.raw_ = nullptr;
	}
	return *this;
}

template <class T> gradients<T>::~gradients()
{
	adg_grads_free(raw_); /* before state_, the ops' ctx */
}

template <class T> const T &gradients<T>::get(const node &n) const
{
	void *value = nullptr;
	check(adg_grads_get_node(raw_, n.raw(), &value), "adg_grads_get_node");
	return *static_cast<const T *>(value);
}

template <class T> T &gradients<T>::get(const node &n)
{
	void *value = nullptr;
	check(adg_grads_get_node(raw_, n.raw(), &value), "adg_grads_get_node");
	return *static_cast<T *>(value);
}

template <class T> const T &gradients<T>::get(std::uint64_t id) const
{
	void *value = nullptr;
	check(adg_grads_get(raw_, id, &value), "adg_grads_get");
	return *static_cast<const T *>(value);
}

template <class T> const T *gradients<T>::find(const node &n) const noexcept
{
	void *value = nullptr;
	if (adg_grads_get_node(raw_, n.raw(), &value) != 0)
		return nullptr;
	return static_cast<const T *>(value);
}

template <class T> T gradients<T>::take(const node &n)
{
	void *value = nullptr;
	check(adg_grads_take_node(raw_, n.raw(), &value),
	      "adg_grads_take_node");
	std::unique_ptr<T> owned(static_cast<T *>(value));
	return std::move(*owned);
}

template <class T> std::size_t gradients<T>::size() const
{
	std::size_t n = 0;
	check(adg_grads_count(raw_, &n), "adg_grads_count");
	return n;
}

template <class T> adg_grads *gradients<T>::raw() const noexcept
{
	return raw_;
}

} // namespace adg

#endif /* ADG_HPP */
