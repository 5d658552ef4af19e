/*
 * adg/gradients.hpp: gradients<T>, a backward's result, and grad_ops<T>, the C
 * ops that fold and free T. A part of adg.hpp, which includes it: include
 * <adg.hpp>.
 */
#ifndef ADG_GRADIENTS_HPP
#define ADG_GRADIENTS_HPP

#include "node.hpp"
#include "value.hpp"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

namespace adg
{

/* -------------------------------------------------------------- gradients */

/* The adg_grad_ops of gradient type T: add is `*sum += std::move(*value)`,
 * then delete value; free is delete. ctx null: an add that throws returns
 * ADG_ETHREW (or ADG_ENOMEM) and the exception is dropped. For
 * adg_registry_options.grad_ops, so that C calls passed NULL ops (and a
 * backward of C code) fold and free T too. */
template <class T> adg_grad_ops grad_ops() noexcept;

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

	/* What get returns: the gradient itself, borrowed, where T is boxed;
	 * a copy where it travels inline (a double: detail::packing). */
	using const_reference =
		std::conditional_t<detail::is_inline_v<T>, T, const T &>;
	/* What find returns: null or empty when there is no gradient. */
	using found = std::conditional_t<detail::is_inline_v<T>,
					 std::optional<T>, const T *>;

	/* The gradient of n (or of the node with that id); throws
	 * adg::error: ADG_ENOTFOUND when there is none, ADG_EFOREIGN for a
	 * node of another registry. */
	const_reference get(node_ref n) const;
	const_reference get(std::uint64_t id) const;
	/* The gradient, to change in place, where T is boxed. */
	template <class U = T,
		  std::enable_if_t<!detail::is_inline_v<U>, int> = 0>
	U &get(node_ref n);
	/* The same, null or empty when there is none. */
	found find(node_ref n) const noexcept;
	/* Moves the gradient out of the container; throws ADG_ENOTFOUND. */
	T take(node_ref n);
	/* How many gradients the container holds. */
	std::size_t size() const;
	adg_grads *raw() const noexcept;
	/* Owns raw, a container of T values made by C code (adg_backward with
	 * grad_ops<T>(), say): freed with it. */
	static gradients adopt(adg_grads *raw) noexcept;

private:
	friend struct detail::access;
	adg_grads *raw_ = nullptr;
	/* The ops' ctx, which the container keeps: it lives as long. */
	std::unique_ptr<detail::grad_state> state_;
};

/* ---------------------------------------------------------- implementation */

namespace detail
{

template <class T>
gradients<T> access::adopt(adg_grads *raw,
			   std::unique_ptr<grad_state> state) noexcept
{
	gradients<T> g;
	g.raw_ = raw;
	g.state_ = std::move(state);
	return g;
}

/* A backward's grad ops' ctx, which its gradients keep: where an add that
 * throws keeps what it threw while the backward runs, in the registry's
 * core, by the failure that would name it (adg_callback_site): the step
 * whose give ran it without an executor, the gradient it folds with one.
 * Adds on the container after the backward (core null then) keep
 * nothing: no backward rethrows. */
struct grad_state {
	registry_core *core = nullptr;
	/* Anything kept in core. Relaxed: written by adds on the
	 * backward's threads, read by the backward once adg_backward_with
	 * has returned, which every worker has left (its run's end orders
	 * what they did before it). */
	std::atomic<bool> kept{false};

	void keep(std::exception_ptr e) noexcept
	{
		auto where = detail::sized<adg_failure>();
		if (core == nullptr || adg_callback_site(&where) != 0)
			return;
		core->keep(where, std::move(e));
		kept.store(true, std::memory_order_relaxed);
	}
};

template <class T> struct typed_ops {
	static int add(void **sum, void *value, void *ctx) noexcept
	{
		try {
			if constexpr (is_inline_v<T>) {
				T s = packing<T>::unpack(*sum);
				s += packing<T>::unpack(value);
				*sum = packing<T>::pack(s);
			} else {
				std::unique_ptr<T> v(static_cast<T *>(value));
				*static_cast<T *>(*sum) += std::move(*v);
			}
			return 0;
		} catch (...) {
			if (ctx != nullptr)
				static_cast<grad_state *>(ctx)->keep(
					std::current_exception());
			return thrown_code();
		}
	}
	static void free(void *value, void *ctx) noexcept
	{
		(void)ctx;
		packing<T>::drop(value);
	}
};

} // namespace detail

template <class T> adg_grad_ops grad_ops() noexcept
{
	adg_grad_ops ops{};
	ops.add = &detail::typed_ops<T>::add;
	ops.free = &detail::typed_ops<T>::free;
	return ops;
}

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

namespace detail
{
/* get's answer from a C value: a copy of an inline one, the boxed one
 * itself. */
template <class T>
typename gradients<T>::const_reference gradient_of(const void *value)
{
	if constexpr (is_inline_v<T>)
		return packing<T>::unpack(value);
	else
		return *static_cast<const T *>(value);
}
} // namespace detail

template <class T>
typename gradients<T>::const_reference gradients<T>::get(node_ref n) const
{
	void *value = nullptr;
	check(adg_grads_get_node(raw_, n.raw(), &value), "adg_grads_get_node");
	return detail::gradient_of<T>(value);
}

template <class T>
template <class U, std::enable_if_t<!detail::is_inline_v<U>, int>>
U &gradients<T>::get(node_ref n)
{
	void *value = nullptr;
	check(adg_grads_get_node(raw_, n.raw(), &value), "adg_grads_get_node");
	return *static_cast<U *>(value);
}

template <class T>
typename gradients<T>::const_reference gradients<T>::get(std::uint64_t id) const
{
	void *value = nullptr;
	check(adg_grads_get(raw_, id, &value), "adg_grads_get");
	return detail::gradient_of<T>(value);
}

template <class T>
typename gradients<T>::found gradients<T>::find(node_ref n) const noexcept
{
	void *value = nullptr;
	if (adg_grads_get_node(raw_, n.raw(), &value) != 0)
		return found{};
	if constexpr (detail::is_inline_v<T>)
		return detail::packing<T>::unpack(value);
	else
		return static_cast<const T *>(value);
}

template <class T> T gradients<T>::take(node_ref n)
{
	void *value = nullptr;
	check(adg_grads_take_node(raw_, n.raw(), &value),
	      "adg_grads_take_node");
	if constexpr (detail::is_inline_v<T>) {
		return detail::packing<T>::unpack(value);
	} else {
		std::unique_ptr<T> owned(static_cast<T *>(value));
		return std::move(*owned);
	}
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

template <class T> gradients<T> gradients<T>::adopt(adg_grads *raw) noexcept
{
	return detail::access::adopt<T>(raw, nullptr);
}

} // namespace adg

#endif /* ADG_GRADIENTS_HPP */
