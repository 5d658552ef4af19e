/*
 * adg/backward.hpp: grad_ref, backward_options and backward: running a
 * backward, its hooks, and rethrowing what failed it. A part of adg.hpp, which
 * includes it: include <adg.hpp>.
 */
#ifndef ADG_BACKWARD_HPP
#define ADG_BACKWARD_HPP

#include "executor.hpp"
#include "gradients.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

namespace adg
{

/* --------------------------------------------------------------- backward */

/* A gradient a hook sees, borrowed for the hook's call. */
class grad_ref
{
public:
	/* A copy of the gradient as T, the backward's gradient type; empty
	 * when there is none. Throws adg::error(ADG_EINVAL) for another T. */
	template <class T> std::optional<T> get() const;
	/* Replaces the gradient (on_ready only; not where there is none).
	 * Throws adg::error(ADG_EINVAL) for another T, none, or a check. */
	template <class T> void set(T value) const;
	/* The gradient itself, to change in place, where T is boxed (not a
	 * double, a float or another T that travels inline: use get and
	 * set); null when there is none. */
	template <class T> T *as() const;
	explicit operator bool() const noexcept;
	/* The C value (detail::packing<T>: a T *, or T's bits). */
	void *raw() const noexcept;

private:
	friend struct detail::access;
	void *value_ = nullptr;
	void **slot_ = nullptr; /* on_ready's *grad; null in a check */
	const std::type_info *type_ = nullptr;
	template <class T> void check_type() const;
};

/* adg_backward_options, as this layer passes them on. A hook that throws
 * stops the backward where it ran (adg_failure's site), and the backward
 * rethrows what it threw. */
struct backward_options {
	/* Steps run on the calling thread and this executor's workers. */
	executor_ref executor;
	/* A retained backward: steps stay registered and may run again. */
	bool retain = false;
	/* When set, filled on every return: the result and where it came
	 * from. */
	adg_failure *failure = nullptr;
	/* Called once for each node whose gradient is final (adg_ready_fn):
	 * its id and its gradient, which the hook may read and change in
	 * place. With an executor it runs on the worker that finished the
	 * gradient, concurrently with other calls. */
	std::function<void(std::uint64_t id, grad_ref grad)> on_ready;
	/* on_ready for leaves only: a trainer's parameters. */
	bool leaves_only = false;
	/* Sets on_ready (what it held goes, as with an assignment) to call
	 * f(index, grad) for each of params whose gradient is final, index
	 * its position in params, and leaves_only: a Hogwild trainer's step
	 * on parameter index, without a map of its own from leaf ids to
	 * parameters. The ids are sorted here, once, and found by binary
	 * search; copies of these options share them. Leaves not in params
	 * (inputs) are skipped. f is copied, and called as on_ready is:
	 * with an executor, concurrently. The backward's root must be of
	 * params' registry. Throws adg::error: ADG_EINVAL for an empty
	 * handle or a leaf named twice, ADG_EFOREIGN for parameters of two
	 * registries. */
	template <class F>
	backward_options &on_param_ready(const std::vector<node> &params, F f);
	/* Called before and after each step, on the thread that runs it
	 * (adg_step_event). */
	std::function<void(const adg_step_event &event)> on_step;
	/* Anomaly detection (adg_backward_options.value_check): sees every
	 * gradient a step gives, on the step's thread; false rejects it, and
	 * the backward fails at that step with ADG_EVALUE (site
	 * ADG_FAILED_CHECK, naming the step). Empty: no check, no cost. */
	std::function<bool(grad_ref grad)> value_check;
	/* The last word on the C options a backward is given, for a layer
	 * over this one (adg::reducer<G>::hook installs the reducer's ready
	 * hook with it): f(options, type) runs after this layer has set its
	 * own hooks, with the backward's gradient type, and may change the
	 * options (chaining a hook it finds) or throw, which fails the
	 * backward before it starts. One per options: a second replaces
	 * the first. */
	using c_options_fn = std::function<void(adg_backward_options &options,
						const std::type_info &type)>;
	backward_options &extend_c_options(c_options_fn f);

private:
	friend struct detail::access;
	c_options_fn extend_;
};

template <class T> class gradients;

/* Runs a backward from root with seed as its gradient, folding gradients of
 * type T. Returns the leaves' gradients. Throws the exception that failed
 * it (see adg.hpp's opening comment) or adg::error: ADG_ECONSUMED for a root
 * already run, ADG_EUNAVAILABLE, ADG_EINVAL for an empty root or a T that
 * is not the registry's. Write the seed as a T: backward(y, 1.0) for
 * double, not backward(y, 1). */
template <class T>
gradients<T> backward(node_ref root, T seed,
		      const backward_options &options = {});

/* The seed of a backward given none: d root / d root, a T of one element
 * equal to 1, for a root whose value has one element (a loss), as
 * PyTorch's loss.backward() makes one. Defined, value() a T of 1, for
 * - an arithmetic T (double, float): T(1);
 * - another T that a double converts to implicitly (a scalar that also
 *   records, std::complex<double>): T(1.0);
 * - a container of one element: a T with a value_type V, constructible
 *   from a std::initializer_list<V> (std::vector<double>, a tensor
 *   class with a std::vector's constructors): T{V(1)}. Never T(1),
 *   which for a container is one element of 0.
 * For a T of another kind, specialize it once, beside T:
 *
 *     template <> struct adg::one<tensor> {
 *             static tensor value() { return tensor::filled(1, 1, 1.0f); }
 *     };
 *
 * libadg cannot see a value's shape: a root of more elements takes its
 * seed explicitly, as does a scaled one (backward(loss, 1.0 / n)). */
template <class T, class = void> struct one {
	/* no value(): a T of none of the kinds above */
};

/* backward from root with one<T>::value() as its seed, for a root of one
 * element: adg::backward<double>(loss), adg::backward<tensor>(loss, o).
 * Throws as backward above. */
template <class T>
gradients<T> backward(node_ref root, const backward_options &options = {});

/* During a callback that a backward runs on this thread (a step, the value
 * check, an add: T's operator+=, on_step): the adg_failure that would name
 * its failure, code 0 (adg_callback_site); empty elsewhere. What this
 * layer keys an exception caught there by. */
std::optional<adg_failure> callback_site() noexcept;

/* ---------------------------------------------------------- implementation */

namespace detail
{

inline grad_ref access::ref(void *value, void **slot,
			    const std::type_info *type) noexcept
{
	grad_ref g;
	g.value_ = value;
	g.slot_ = slot;
	g.type_ = type;
	return g;
}

inline const backward_options::c_options_fn &
access::extension(const backward_options &o) noexcept
{
	return o.extend_;
}

/* One backward call's hooks (backward_options) and what they threw, by
 * site and node, so that the one the failure names is rethrown: one
 * pass's, since the hooks are this call's alone. Lives on the backward's
 * stack: every hook has returned when it returns. */
struct pass_state {
	struct kept {
		adg_failure_site site;
		std::uint64_t node_id;
		std::exception_ptr thrown;
	};

	const backward_options &options;
	const std::type_info &type; /* the backward's T, for grad_ref */
	std::mutex mutex;	    /* guards thrown */
	std::vector<kept> thrown;

	void keep(adg_failure_site site, std::uint64_t node_id,
		  std::exception_ptr e) noexcept
	{
		try {
			std::lock_guard<std::mutex> lock(mutex);
			thrown.push_back({site, node_id, std::move(e)});
		} catch (...) {
			/* no memory: the backward throws adg::error */
		}
	}

	/* What the hook the failure names threw, the first kept: a node's
	 * checks run on its step's thread, one after another, and its
	 * failure's code is its first rejection's. Null when nothing, or
	 * when that check returned false. */
	std::exception_ptr take(const adg_failure &failure)
	{
		std::lock_guard<std::mutex> lock(mutex);
		for (kept &k : thrown)
			if (k.site == failure.site &&
			    k.node_id == failure.node_id)
				return k.thrown;
		return nullptr;
	}

	grad_ref ref(const void *value, void **slot) const noexcept
	{
		return access::ref(const_cast<void *>(value), slot, &type);
	}

	static int ready(std::uint64_t id, void **grad, void *ctx) noexcept
	{
		auto *self = static_cast<pass_state *>(ctx);
		try {
			self->options.on_ready(id, self->ref(*grad, grad));
			return 0;
		} catch (...) {
			self->keep(ADG_FAILED_ON_READY, id,
				   std::current_exception());
			return thrown_code();
		}
	}

	static int step(const adg_step_event *event, void *ctx) noexcept
	{
		auto *self = static_cast<pass_state *>(ctx);
		try {
			self->options.on_step(*event);
			return 0;
		} catch (...) {
			self->keep(ADG_FAILED_ON_STEP, event->node_id,
				   std::current_exception());
			return thrown_code();
		}
	}

	/* A rejection is kept by the step that gave the value, which a
	 * check is not told: the run says (adg_callback_site, which always
	 * answers in a check). One that returned false is kept too, as
	 * null, so that when it is the step's first rejection (the one its
	 * failure's code is) no later check's exception stands for it. */
	static int check(const void *value, void *ctx) noexcept
	{
		auto *self = static_cast<pass_state *>(ctx);
		std::exception_ptr e;
		int rc = ADG_EVALUE;
		try {
			if (self->options.value_check(
				    self->ref(value, nullptr)))
				return 0;
		} catch (...) {
			e = std::current_exception();
			rc = thrown_code();
		}
		auto where = detail::sized<adg_failure>();
		if (adg_callback_site(&where) == 0)
			self->keep(where.site, where.node_id, std::move(e));
		return rc;
	}

	/* The C options: this pass's hooks, where set, then what the
	 * options' extension makes of them (backward_options::
	 * extend_c_options). */
	adg_backward_options c_options(adg_failure *failure)
	{
		auto o = detail::sized<adg_backward_options>();
		o.executor = options.executor.get();
		o.retain = options.retain ? 1 : 0;
		o.failure = failure;
		o.leaves_only = options.leaves_only ? 1 : 0;
		if (options.on_ready) {
			o.on_ready = &ready;
			o.on_ready_ctx = this;
		}
		if (options.on_step) {
			o.on_step = &step;
			o.on_step_ctx = this;
		}
		if (options.value_check) {
			o.value_check = &check;
			o.value_check_ctx = this;
		}
		if (const auto &extend = access::extension(options))
			extend(o, type);
		return o;
	}
};

/* Rethrows what failed a backward: what the call the failure names threw
 * (its pass, site and node: a step, or an add with an executor, kept in
 * the core; a hook or the value check, in pass), else adg::error. The
 * failure is the first in tape order, and so is what is rethrown,
 * whichever threw first in time. An adg::error thrown in the backward is
 * rethrown with the failure added: its code, and a message that names
 * the step. */
[[noreturn]] inline void rethrow(int rc, const adg_failure &failure,
				 registry_core &core, pass_state &pass)
{
	/* Taken whatever the site, so that what the pass's steps and adds
	 * threw goes with it. */
	std::exception_ptr e = core.take(failure);
	if (!e)
		e = pass.take(failure);
	if (!e)
		throw error(rc, failure, adg_errmsg());
	try {
		std::rethrow_exception(e);
	} catch (const error &inner) {
		throw error(inner, failure);
	}
}

} // namespace detail

template <class T>
gradients<T> backward(node_ref root, T seed, const backward_options &options)
{
	detail::registry_core *core = detail::access::core(root);
	if (core == nullptr)
		throw error(ADG_EINVAL, "backward: an empty root");
	core->check_type<T>();
	auto state = std::make_unique<detail::grad_state>();
	state->core = core;
	adg_grad_ops ops = grad_ops<T>();
	ops.ctx = state.get();
	detail::pass_state pass{options, typeid(T), {}, {}};
	auto failure = detail::sized<adg_failure>();
	adg_backward_options o = pass.c_options(&failure);
	adg_grads *out = nullptr;
	/* libadg's from the call on */
	void *s = detail::packing<T>::pack(std::move(seed));
	int rc = adg_backward_with(core->raw, root.raw(), s, &ops, &o, &out);
	state->core = nullptr; /* the container's adds keep nothing */
	if (options.failure != nullptr)
		*options.failure = failure;
	if (rc != 0)
		detail::rethrow(rc, failure, *core, pass);
	if (state->kept.load(std::memory_order_relaxed))
		core->drop(failure.pass_id); /* caught by a step: unclaimed */
	return detail::access::adopt<T>(out, std::move(state));
}

namespace detail
{
template <class T, class = void> struct has_one : std::false_type {
};
template <class T>
struct has_one<T, std::void_t<decltype(one<T>::value())>>
    : std::is_convertible<decltype(one<T>::value()), T> {
};
} // namespace detail

namespace detail
{
/* A trainer's parameters by leaf id: (id, index) sorted by id. A search
 * costs log2(n) compares of ids and touches nothing shared but this
 * read-only table; leaf ids are not dense enough to index an array by. */
class param_index
{
public:
	explicit param_index(const std::vector<node> &params)
	{
		by_id_.reserve(params.size());
		registry_core *core = nullptr;
		for (std::size_t i = 0; i < params.size(); i++) {
			if (!params[i])
				throw error(ADG_EINVAL,
					    "on_param_ready: parameter " +
						    std::to_string(i) +
						    " is an empty handle");
			if (core != nullptr && access::core(params[i]) != core)
				throw error(ADG_EFOREIGN,
					    "on_param_ready: parameter " +
						    std::to_string(i) +
						    " is of another registry");
			core = access::core(params[i]);
			by_id_.emplace_back(params[i].id(), i);
		}
		std::sort(by_id_.begin(), by_id_.end());
		for (std::size_t k = 1; k < by_id_.size(); k++)
			if (by_id_[k].first == by_id_[k - 1].first)
				throw error(
					ADG_EINVAL,
					"on_param_ready: parameters " +
						std::to_string(
							by_id_[k - 1].second) +
						" and " +
						std::to_string(
							by_id_[k].second) +
						" are one leaf");
	}

	/* id's index in params, or none. */
	std::optional<std::size_t> find(std::uint64_t id) const noexcept
	{
		auto it = std::lower_bound(
			by_id_.begin(), by_id_.end(), id,
			[](const std::pair<std::uint64_t, std::size_t> &e,
			   std::uint64_t key) { return e.first < key; });
		if (it == by_id_.end() || it->first != id)
			return std::nullopt;
		return it->second;
	}

private:
	std::vector<std::pair<std::uint64_t, std::size_t>> by_id_;
};
} // namespace detail

inline backward_options &backward_options::extend_c_options(c_options_fn f)
{
	extend_ = std::move(f);
	return *this;
}

template <class F>
backward_options &
backward_options::on_param_ready(const std::vector<node> &params, F f)
{
	auto index = std::make_shared<const detail::param_index>(params);
	on_ready = [index = std::move(index),
		    f = std::move(f)](std::uint64_t id, grad_ref g) mutable {
		if (std::optional<std::size_t> i = index->find(id))
			f(*i, g);
	};
	leaves_only = true;
	return *this;
}

template <class T> struct one<T, std::enable_if_t<std::is_arithmetic_v<T>>> {
	static T value()
	{
		return T(1);
	}
};

template <class T>
struct one<T, std::enable_if_t<!std::is_arithmetic_v<T> &&
			       std::is_convertible_v<double, T>>> {
	static T value()
	{
		return T(1.0);
	}
};

template <class T>
struct one<
	T,
	std::enable_if_t<
		!std::is_arithmetic_v<T> && !std::is_convertible_v<double, T> &&
		std::is_constructible_v<
			T, std::initializer_list<typename T::value_type>>>> {
	static T value()
	{
		return T{typename T::value_type(1)};
	}
};

template <class T>
gradients<T> backward(node_ref root, const backward_options &options)
{
	static_assert(detail::has_one<T>::value,
		      "adg::backward<T>(root) seeds with adg::one<T>::value(), "
		      "which T has not: specialize adg::one for T, or pass the "
		      "seed");
	return backward<T>(root, one<T>::value(), options);
}

inline std::optional<adg_failure> callback_site() noexcept
{
	auto where = detail::sized<adg_failure>();
	if (adg_callback_site(&where) != 0)
		return std::nullopt;
	return where;
}

template <class T> void grad_ref::check_type() const
{
	if (type_ == nullptr || *type_ != typeid(T))
		throw error(ADG_EINVAL,
			    "grad_ref: not the backward's gradient type");
}

template <class T> std::optional<T> grad_ref::get() const
{
	check_type<T>();
	if (value_ == nullptr)
		return std::nullopt;
	if constexpr (detail::is_inline_v<T>)
		return detail::packing<T>::unpack(value_);
	else
		return *static_cast<const T *>(value_);
}

template <class T> void grad_ref::set(T value) const
{
	check_type<T>();
	if (slot_ == nullptr || *slot_ == nullptr)
		throw error(ADG_EINVAL, "grad_ref::set: no gradient to replace "
					"(or a value check's)");
	if constexpr (detail::is_inline_v<T>)
		*slot_ = detail::packing<T>::pack(value);
	else
		*static_cast<T *>(*slot_) = std::move(value);
}

template <class T> T *grad_ref::as() const
{
	static_assert(!detail::is_inline_v<T>,
		      "grad_ref::as: T travels inline (a double, say): use "
		      "get<T>() and set<T>()");
	check_type<T>();
	return static_cast<T *>(value_);
}

inline grad_ref::operator bool() const noexcept
{
	return value_ != nullptr;
}

inline void *grad_ref::raw() const noexcept
{
	return value_;
}

} // namespace adg

#endif /* ADG_BACKWARD_HPP */
