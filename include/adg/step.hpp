/*
 * adg/step.hpp: step_call, what a step is given, and op: registering a step,
 * its closure, and the parents' list. A part of adg.hpp, which includes it:
 * include <adg.hpp>.
 */
#ifndef ADG_STEP_HPP
#define ADG_STEP_HPP

#include "node.hpp"
#include "value.hpp"

#include <cstddef>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace adg
{

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
	std::unique_ptr<T> take_grad();

	/* Hands the gradient for the parent at slot (op's order) to the
	 * backward (adg_step_give). Throws adg::error on a bad slot ("slot 3
	 * out of range (2 parents)"), a slot given twice ("slot 0 given
	 * twice") or a value the backward's value check rejected; rethrows
	 * what T's += threw, as thrown, when the give ran the add (without
	 * an executor, where an add's failure is the step's; with one it is
	 * the backward's, later): the value is gone either way. */
	void give(std::size_t slot, T value);
	void give(std::size_t slot, std::unique_ptr<T> value);
	/* Gives every slot's gradient in one call (adg_step_give_all):
	 * values[i] for slot i, one per parent, an empty one for a slot that
	 * gets none. Every value is gone whatever happens: given, or freed
	 * when a give fails, so a step that gives several needs no cleanup.
	 * Throws adg::error for a count that is not n_parents() (nothing
	 * given), a slot already given or a value the check rejected (the
	 * slots before it given, the rest freed); rethrows what T's += threw
	 * when a give ran the add, as give does. */
	void give_all(std::vector<std::optional<T>> values);

	/* The forward output of this node or of a parent (id: node_id() or
	 * parent_id(slot)) that op_with's checkpoint asked for, as V,
	 * rebuilt first if it has to be (adg_output_get); borrowed until the
	 * step returns. Throws what the rebuild threw, or adg::error. */
	template <class V> const V &output(std::uint64_t id) const;

	std::size_t n_parents() const noexcept;
	std::uint64_t parent_id(std::size_t slot) const noexcept;
	std::uint64_t node_id() const noexcept;
	/* A retained backward: the step may run again, so it keeps what it
	 * needs (captures stay until the step goes). */
	bool retained() const noexcept;
	/* The C call: its registry for a nested backward, adg_output_get. */
	adg_step_call *raw() const noexcept;
	/* The registry of the node this step belongs to, to record ops on
	 * (higher order); throws when the step_call was made from a C call
	 * alone. */
	registry_ref registry() const;

private:
	friend struct detail::access;
	adg_step_call *call_;
	detail::registry_core *core_ = nullptr;
	/* grad()'s copy of an inline gradient (detail::packing). */
	mutable std::optional<T> unpacked_;
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
node op(registry_ref reg, std::initializer_list<parent> parents, F &&step,
	const char *name = nullptr);
template <class T, class F>
node op(registry_ref reg, std::initializer_list<parent> parents, F &&step,
	const char *name = nullptr);
/* The same with parents gathered at run time, as handles the caller
 * keeps: the vector is read, never copied. Gathering them into a new
 * std::vector<node> copies each handle, which writes its node's count:
 * for a parameter that other threads use at once, a cache line they all
 * write: two threads gathering one shared parameter that way registered
 * 0.68 to 0.77 x the nodes per second of two threads with a parameter
 * each (docs/bench.md, the cpp-shared workload). Gather borrowed parents
 * instead (below). */
template <class F>
node op(registry_ref reg, const std::vector<node> &parents, F &&step,
	const char *name = nullptr);
template <class T, class F>
node op(registry_ref reg, const std::vector<node> &parents, F &&step,
	const char *name = nullptr);
/* The same with parents gathered at run time, borrowed: no count is
 * taken or dropped to gather them, so a leaf parent (a parameter shared
 * by every thread) is only read, by this call and by the new node, which
 * keeps a leaf's id alone. An op parent gets the one reference the new
 * node holds on it, as with every form of op. Each node named must stay
 * alive, held by a handle of the caller's or another's, until op returns
 * (not a temporary: parents.push_back(adg::leaf(reg)) dangles); nothing
 * of the vector is kept afterwards, so it may be cleared and refilled for
 * the next op without an allocation. Throws as above, and
 * adg::error(ADG_EINVAL) for an empty reference. */
template <class F>
node op(registry_ref reg, const std::vector<node_ref> &parents, F &&step,
	const char *name = nullptr);
template <class T, class F>
node op(registry_ref reg, const std::vector<node_ref> &parents, F &&step,
	const char *name = nullptr);

/* ---------------------------------------------------------- implementation */

namespace detail
{

template <class T>
step_call<T> access::call(adg_step_call *c, registry_core *core) noexcept
{
	step_call<T> sc(c);
	sc.core_ = core;
	return sc;
}

/* Where closures live: a thread's cache of freed blocks by size (16 to
 * 128 bytes), so that recording an op costs no malloc once the cache is
 * warm. A block freed on another thread joins that thread's cache; each
 * class keeps at most keep_bytes of blocks (a graph of a few thousand
 * small steps, dropped, is recorded again from the cache: 2,048 blocks
 * of 32 bytes, a lambda of two doubles), the rest go back to the heap,
 * and a thread's cache is emptied when the thread exits. */
struct block_cache {
	static constexpr std::size_t grain = 16, classes = 8,
				     keep_bytes = 64 * 1024;
	struct block {
		block *next;
	};
	block *head[classes];
	std::size_t count[classes];
	bool drained; /* the thread is exiting: the heap from here on */
};

/* Trivially destructible, so that a closure freed by another
 * thread_local's destructor, late in a thread's exit, still finds it. */
inline thread_local block_cache closure_cache{};

/* Empties closure_cache when the thread exits. */
struct block_cache_drain {
	~block_cache_drain()
	{
		block_cache &c = closure_cache;
		c.drained = true;
		for (std::size_t k = 0; k < block_cache::classes; k++)
			while (c.head[k] != nullptr) {
				block_cache::block *b = c.head[k];
				c.head[k] = b->next;
				::operator delete(b);
			}
	}
};
inline thread_local bool closure_cache_armed = false;

inline void *closure_alloc(std::size_t n)
{
	block_cache &c = closure_cache;
	std::size_t k = (n + block_cache::grain - 1) / block_cache::grain;
	if (k == 0 || k > block_cache::classes || c.drained)
		return ::operator new(n);
	if (!closure_cache_armed) {
		/* Constructed on first use, destroyed at the thread's exit. */
		static thread_local block_cache_drain drain;
		(void)drain;
		closure_cache_armed = true;
	}
	block_cache::block *b = c.head[k - 1];
	if (b == nullptr)
		return ::operator new(k *block_cache::grain);
	c.head[k - 1] = b->next;
	c.count[k - 1]--;
	return b;
}

inline void closure_free(void *p, std::size_t n) noexcept
{
	block_cache &c = closure_cache;
	std::size_t k = (n + block_cache::grain - 1) / block_cache::grain;
	if (k == 0 || k > block_cache::classes || c.drained ||
	    !closure_cache_armed ||
	    c.count[k - 1] * k * block_cache::grain >=
		    block_cache::keep_bytes) {
		::operator delete(p);
		return;
	}
	auto *b = static_cast<block_cache::block *>(p);
	b->next = c.head[k - 1];
	c.head[k - 1] = b;
	c.count[k - 1]++;
}

/* A step: the callable and where to keep what it throws. */
template <class T, class F> struct closure {
	F step;
	registry_core *core;

	static void *operator new(std::size_t n)
	{
		return closure_alloc(n);
	}
	static void operator delete(void *p, std::size_t n) noexcept
	{
		closure_free(p, n);
	}

	static int run(adg_step_call *call, void *user) noexcept
	{
		auto *self = static_cast<closure *>(user);
		try {
			step_call<T> c = access::call<T>(call, self->core);
			static_assert(std::is_void_v<decltype(self->step(c))>,
				      "adg::op: a step returns nothing; it "
				      "throws to fail");
			self->step(c);
			return 0;
		} catch (...) {
			auto where = detail::sized<adg_failure>();
			where.site = ADG_FAILED_STEP;
			where.node_id = call->node_id;
			where.pass_id = call->pass_id;
			self->core->keep(where, std::current_exception());
			return thrown_code();
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
		for (const parent &p : parents) {
			/* A null handle is no reference to move; one handle
			 * named twice ({std::move(x), std::move(x)}) holds
			 * one reference, moved once. */
			if (i < 64 && access::moved(p) != nullptr &&
			    access::raw(p) != nullptr &&
			    !moved_before(parents, p))
				moved_ |= std::uint64_t{1} << i;
			data_[i++] = access::raw(p);
		}
		if (moved_ != 0)
			sources_ = parents;
	}
	explicit parent_list(const std::vector<node> &parents)
	    : parent_list(parents.size())
	{
		for (std::size_t i = 0; i < n_; i++)
			data_[i] = parents[i].raw();
	}
	/* Borrowed: the raw pointers alone, no count taken. */
	explicit parent_list(const std::vector<node_ref> &parents)
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
	/* The slots whose references the op takes over (adg_op_moving,
	 * adg_op_options.moved). */
	std::uint64_t moved() const noexcept
	{
		return moved_;
	}
	/* After a successful op: the moved handles are empty, their
	 * references the new node's. */
	void let_go_of_moved() const noexcept
	{
		std::size_t i = 0;
		for (const parent &p : sources_)
			if (i < 64 && (moved_ >> i++ & 1))
				access::moved(p)->release();
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
	/* Whether p's handle was moved at an earlier slot of list. */
	bool moved_before(std::initializer_list<parent> list,
			  const parent &p) const noexcept
	{
		std::size_t k = 0;
		for (const parent &q : list) {
			if (&q == &p)
				break;
			if ((moved_ >> k++ & 1) &&
			    access::moved(q) == access::moved(p))
				return true;
		}
		return false;
	}

	std::size_t n_;
	std::uint64_t moved_ = 0;
	std::initializer_list<parent> sources_; /* while moved_ != 0 */
};

/* A step's closure with its output's rebuild: checkpoint.hpp's, which
 * op_with, the one op that names one, includes. */
template <class T, class F, class V> struct ckpt_closure;

/* op's checkpoint when it has none. */
struct no_checkpoint {
};

/* Registers a step, and with op_with its checkpoint. */
template <class T, class F, class C>
node make_typed_op(registry_ref reg, const parent_list &parents, F &&step,
		   const char *name, C *ckpt)
{
	registry_core *core = access::core(reg);
	if (core == nullptr)
		throw error(ADG_EINVAL, "op: an empty registry");
	core->check_type<T>();
	using base = closure<T, std::decay_t<F>>;
	adg_step s{};
	s.backward = &base::run;
	s.name = name;
	adg_node *out = nullptr;
	if constexpr (std::is_same_v<C, no_checkpoint>) {
		(void)ckpt;
		auto owned = std::unique_ptr<base>(
			new base{std::forward<F>(step), core});
		s.release = &base::release;
		s.user = owned.get();
		check(adg_op_moving(core->raw, parents.data(), parents.size(),
				    parents.moved(), &s, &out),
		      "op");
		owned.release(); /* libadg's: release() deletes it */
		parents.let_go_of_moved();
	} else {
		using V = typename C::value_type;
		using full = ckpt_closure<T, std::decay_t<F>, V>;
		auto owned = std::unique_ptr<full>(
			new full{{std::forward<F>(step), core},
				 std::move(ckpt->recompute)});
		s.release = &full::release;
		s.user = static_cast<base *>(owned.get());
		std::unique_ptr<V> value;
		if (ckpt->value)
			value = std::make_unique<V>(std::move(*ckpt->value));
		adg_output output{};
		output.value = value.get();
		output.free = &full::free_output;
		if (owned->rebuild)
			output.recompute = &full::recompute;
		output.memory_bound = ckpt->memory_bound;
		auto o = detail::sized<adg_op_options>();
		if (value || owned->rebuild)
			o.output = &output;
		o.want_self = ckpt->want_self;
		o.want_parents = ckpt->want_parents.data();
		o.n_want_parents = ckpt->want_parents.size();
		o.moved = parents.moved();
		check(adg_op_with(core->raw, parents.data(), parents.size(), &s,
				  &o, &out),
		      "op_with");
		value.release(); /* libadg's: output.free deletes it */
		owned.release();
		parents.let_go_of_moved();
	}
	return access::adopt(out, core);
}

/* op's T when the step's parameter names it. */
struct deduced {
};

template <class T, class F, class C = no_checkpoint>
node make_op(registry_ref reg, const parent_list &parents, F &&step,
	     const char *name, C *ckpt = nullptr)
{
	if constexpr (std::is_same_v<T, deduced>) {
		using traits = step_type_of<F>;
		static_assert(traits::known,
			      "adg::op: the step must take adg::step_call<T> & "
			      "(for a generic lambda, write adg::op<T>)");
		if constexpr (traits::known)
			return make_typed_op<typename traits::type>(
				reg, parents, std::forward<F>(step), name,
				ckpt);
		else
			return node();
	} else {
		return make_typed_op<T>(reg, parents, std::forward<F>(step),
					name, ckpt);
	}
}

} // namespace detail

template <class T>
step_call<T>::step_call(adg_step_call *call) noexcept : call_(call)
{
}

template <class T> const T *step_call<T>::grad() const noexcept
{
	if (call_->grad == nullptr)
		return nullptr;
	if constexpr (detail::is_inline_v<T>) {
		unpacked_ = detail::packing<T>::unpack(call_->grad);
		return &*unpacked_;
	} else {
		return static_cast<const T *>(call_->grad);
	}
}

template <class T> T step_call<T>::grad_or(T fallback) const
{
	if (call_->grad == nullptr)
		return fallback;
	if constexpr (detail::is_inline_v<T>)
		return detail::packing<T>::unpack(call_->grad);
	else
		return *static_cast<const T *>(call_->grad);
}

template <class T> std::unique_ptr<T> step_call<T>::take_grad()
{
	std::unique_ptr<T> g;
	if constexpr (detail::is_inline_v<T>) {
		if (call_->grad != nullptr)
			g = std::make_unique<T>(
				detail::packing<T>::unpack(call_->grad));
	} else {
		g.reset(static_cast<T *>(call_->grad));
	}
	call_->grad = nullptr;
	return g;
}

namespace detail
{
[[noreturn]] void give_failed(int rc, std::size_t slot,
			      const adg_step_call *call, registry_core *core);
} // namespace detail

template <class T> void step_call<T>::give(std::size_t slot, T value)
{
	/* adg_step_give owns the value from the call on, failing or not */
	int rc = adg_step_give(call_, slot,
			       detail::packing<T>::pack(std::move(value)));
	if (rc != 0)
		detail::give_failed(rc, slot, call_, core_);
}

template <class T>
void step_call<T>::give(std::size_t slot, std::unique_ptr<T> value)
{
	if constexpr (detail::is_inline_v<T>) {
		give(slot, *value);
	} else {
		/* adg_step_give owns the value from the call on */
		int rc = adg_step_give(call_, slot, value.release());
		if (rc != 0)
			detail::give_failed(rc, slot, call_, core_);
	}
}

namespace detail
{
[[noreturn]] void give_all_failed(int rc, const adg_step_call *call,
				  registry_core *core);
} // namespace detail

template <class T>
void step_call<T>::give_all(std::vector<std::optional<T>> values)
{
	if (values.size() != call_->n_parents)
		throw error(
			ADG_EINVAL,
			"step_call::give_all: " +
				std::to_string(values.size()) + " values for " +
				std::to_string(call_->n_parents) + " parents");
	std::vector<void *> packed(values.size(), nullptr);
	try {
		for (std::size_t i = 0; i < values.size(); i++)
			if (values[i])
				packed[i] = detail::packing<T>::pack(
					std::move(*values[i]));
	} catch (...) {
		/* T's copy or an allocation threw: nothing given yet. */
		for (void *p : packed)
			if (p != nullptr)
				detail::packing<T>::drop(p);
		throw;
	}
	/* adg_step_give_all owns every value from the call on, failing or
	 * not */
	int rc = adg_step_give_all(call_, packed.data());
	if (rc != 0)
		detail::give_all_failed(rc, call_, core_);
}

namespace detail
{
/* step_call::give_all's error: as give's, without a slot, which the C
 * call does not report. */
[[noreturn]] inline void give_all_failed(int rc, const adg_step_call *call,
					 registry_core *core)
{
	if (core != nullptr) {
		adg_failure where{};
		where.site = ADG_FAILED_STEP;
		where.node_id = call->node_id;
		where.pass_id = call->pass_id;
		if (std::exception_ptr e = core->take_last(where))
			std::rethrow_exception(e);
	}
	std::string what = "step_call::give_all: ";
	if (rc == ADG_EINVAL)
		what += "a slot already given";
	else if (rc == ADG_EVALUE)
		what += "the value check rejected a gradient";
	else
		what += adg_strerror(rc);
	throw error(rc, what);
}

/* step_call::give's error: what an add that the give ran threw (without an
 * executor, where the add's failure is the step's: kept by the step's
 * pass and node), else what was wrong, in words. */
[[noreturn]] inline void give_failed(int rc, std::size_t slot,
				     const adg_step_call *call,
				     registry_core *core)
{
	/* Read first: the give's reason, before anything else can fail. */
	std::string reason = adg_errmsg();
	if (core != nullptr) {
		auto where = detail::sized<adg_failure>();
		where.site = ADG_FAILED_STEP;
		where.node_id = call->node_id;
		where.pass_id = call->pass_id;
		if (std::exception_ptr e = core->take_last(where))
			std::rethrow_exception(e);
	}
	(void)slot; /* adg_step_give's reason names it */
	throw error(rc, "step_call::give", reason);
}
} // namespace detail

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

template <class T> registry_ref step_call<T>::registry() const
{
	if (core_ == nullptr)
		throw error(ADG_EINVAL,
			    "step_call::registry: made from a C call alone");
	return detail::access::ref(core_);
}

template <class F>
node op(registry_ref reg, std::initializer_list<parent> parents, F &&step,
	const char *name)
{
	return detail::make_op<detail::deduced>(
		reg, detail::parent_list(parents), std::forward<F>(step), name);
}

template <class T, class F>
node op(registry_ref reg, std::initializer_list<parent> parents, F &&step,
	const char *name)
{
	return detail::make_op<T>(reg, detail::parent_list(parents),
				  std::forward<F>(step), name);
}

template <class F>
node op(registry_ref reg, const std::vector<node> &parents, F &&step,
	const char *name)
{
	return detail::make_op<detail::deduced>(
		reg, detail::parent_list(parents), std::forward<F>(step), name);
}

template <class T, class F>
node op(registry_ref reg, const std::vector<node> &parents, F &&step,
	const char *name)
{
	return detail::make_op<T>(reg, detail::parent_list(parents),
				  std::forward<F>(step), name);
}

template <class F>
node op(registry_ref reg, const std::vector<node_ref> &parents, F &&step,
	const char *name)
{
	return detail::make_op<detail::deduced>(
		reg, detail::parent_list(parents), std::forward<F>(step), name);
}

template <class T, class F>
node op(registry_ref reg, const std::vector<node_ref> &parents, F &&step,
	const char *name)
{
	return detail::make_op<T>(reg, detail::parent_list(parents),
				  std::forward<F>(step), name);
}

} // namespace adg

#endif /* ADG_STEP_HPP */
