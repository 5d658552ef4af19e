/*
 * adg/checkpoint.hpp: recompute_call, checkpoint and op_with: a step whose
 * output may be dropped and rebuilt. A part of adg.hpp, which includes it:
 * include <adg.hpp>.
 */
#ifndef ADG_CHECKPOINT_HPP
#define ADG_CHECKPOINT_HPP

#include "step.hpp"

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace adg
{

/* ---------------------------------------------------------- checkpointing */

/* What a rebuild receives (adg_recompute_call): its parents' outputs. */
class recompute_call
{
public:
	explicit recompute_call(adg_recompute_call *call) noexcept;
	/* The output of the parent at slot, as U, the type its op_with
	 * offered; throws adg::error(ADG_EINVAL) for a leaf's (it has none:
	 * capture what the rebuild needs of leaves). */
	template <class U> const U &parent(std::size_t slot) const;
	std::size_t n_parents() const noexcept;
	std::uint64_t node_id() const noexcept;
	adg_recompute_call *raw() const noexcept;

private:
	adg_recompute_call *call_;
};

/* What op_with registers beside a step (adg_op_with): the forward output
 * the op offers its children's steps, a V, kept or rebuilt; and the
 * outputs its own step will ask for with step_call::output. */
template <class V> struct checkpoint {
	using value_type = V;
	/* The output as computed; empty: only recompute can make it. */
	std::optional<V> value;
	/* Builds it again from the parents' outputs; empty: it cannot be
	 * rebuilt. Neither value nor recompute: the op offers no output. It
	 * runs during a backward, on the thread of the step that asked, and
	 * may throw: the step's output() rethrows it. */
	std::function<V(const recompute_call &)> recompute;
	/* Cheap to rebuild: the balanced strategy drops value at once. */
	bool memory_bound = false;
	/* The step asks for its own output, and for its parents' at these
	 * slots (each must offer one). */
	bool want_self = false;
	std::vector<std::uint32_t> want_parents;
};

/* op with a checkpoint: see op and adg_op_with. Throws what adg_op_with
 * fails with (ADG_EINVAL for a malformed checkpoint). */
template <class F, class V>
node op_with(registry_ref reg, std::initializer_list<parent> parents, F &&step,
	     checkpoint<V> ckpt, const char *name = nullptr);
template <class F, class V>
node op_with(registry_ref reg, const std::vector<node> &parents, F &&step,
	     checkpoint<V> ckpt, const char *name = nullptr);
/* Parents borrowed, as op's std::vector<node_ref>: each must outlive the
 * call. */
template <class F, class V>
node op_with(registry_ref reg, const std::vector<node_ref> &parents, F &&step,
	     checkpoint<V> ckpt, const char *name = nullptr);

/* ---------------------------------------------------------- implementation */

namespace detail
{

/* What a rebuild threw, on the thread whose step_call::output ran it: a
 * recompute callback reports a code only. */
inline thread_local std::exception_ptr rebuild_thrown;

/* A step with a checkpoint: the rebuild of its output lives beside it, as
 * adg_recompute_fn is given the step's user pointer (the base's). */
template <class T, class F, class V> struct ckpt_closure : closure<T, F> {
	std::function<V(const recompute_call &)> rebuild;

	static ckpt_closure *of(void *user) noexcept
	{
		return static_cast<ckpt_closure *>(
			static_cast<closure<T, F> *>(user));
	}
	static int recompute(adg_recompute_call *call, void *user) noexcept
	{
		try {
			call->output =
				new V(of(user)->rebuild(recompute_call(call)));
			return 0;
		} catch (...) {
			rebuild_thrown = std::current_exception();
			return thrown_code();
		}
	}
	static void release(void *user) noexcept
	{
		delete of(user);
	}
	static void free_output(void *value, void *ctx) noexcept
	{
		(void)ctx;
		delete static_cast<V *>(value);
	}
};

} // namespace detail

inline recompute_call::recompute_call(adg_recompute_call *call) noexcept
    : call_(call)
{
}

template <class U> const U &recompute_call::parent(std::size_t slot) const
{
	if (slot >= call_->n_parents || call_->parent_outputs[slot] == nullptr)
		throw error(ADG_EINVAL, "recompute_call::parent: slot " +
						std::to_string(slot) +
						" has no output (a leaf?)");
	return *static_cast<const U *>(call_->parent_outputs[slot]);
}

inline std::size_t recompute_call::n_parents() const noexcept
{
	return call_->n_parents;
}

inline std::uint64_t recompute_call::node_id() const noexcept
{
	return call_->node_id;
}

inline adg_recompute_call *recompute_call::raw() const noexcept
{
	return call_;
}

template <class T>
template <class V>
const V &step_call<T>::output(std::uint64_t id) const
{
	detail::rebuild_thrown = nullptr;
	void *value = nullptr;
	int rc = adg_output_get(call_, id, &value);
	if (rc != 0) {
		std::exception_ptr e =
			std::exchange(detail::rebuild_thrown, nullptr);
		if (e)
			std::rethrow_exception(e);
		check(rc, ("step_call::output: node " + std::to_string(id))
				  .c_str());
	}
	return *static_cast<const V *>(value);
}

template <class F, class V>
node op_with(registry_ref reg, std::initializer_list<parent> parents, F &&step,
	     checkpoint<V> ckpt, const char *name)
{
	return detail::make_op<detail::deduced>(
		reg, detail::parent_list(parents), std::forward<F>(step), name,
		&ckpt);
}

template <class F, class V>
node op_with(registry_ref reg, const std::vector<node> &parents, F &&step,
	     checkpoint<V> ckpt, const char *name)
{
	return detail::make_op<detail::deduced>(
		reg, detail::parent_list(parents), std::forward<F>(step), name,
		&ckpt);
}

template <class F, class V>
node op_with(registry_ref reg, const std::vector<node_ref> &parents, F &&step,
	     checkpoint<V> ckpt, const char *name)
{
	return detail::make_op<detail::deduced>(
		reg, detail::parent_list(parents), std::forward<F>(step), name,
		&ckpt);
}

} // namespace adg

#endif /* ADG_CHECKPOINT_HPP */
