/*
 * adg/value.hpp: how a gradient of type T travels through the C API as a void
 * *: inline as its bits, or boxed. A part of adg.hpp, which includes it:
 * include <adg.hpp>.
 */
#ifndef ADG_VALUE_HPP
#define ADG_VALUE_HPP

#include "fwd.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

namespace adg
{

/* ------------------------------------------------------------------ values */

/* How a gradient of type T travels through the C API (an adg_grads, a
 * step's call->grad, the values grad_ops<T>() folds): pack makes the C
 * value of a T, which is libadg's once given; unpack reads a copy of one.
 * A T that is trivially copyable and fits a pointer (double, float, int)
 * travels inline, as its bits, not a pointer: no allocation per gradient;
 * any other T as a T * from new. C code that shares gradients with C++
 * steps goes through these two. */
template <class T> void *pack(T value);
template <class T> T unpack(const void *value);

/* ---------------------------------------------------------- implementation */

namespace detail
{

/* How a gradient of type T travels as libadg's void *. Inline, its bits
 * in the pointer itself, when T is trivially copyable and fits: a double,
 * a float, an int, so that giving a gradient allocates nothing. Else
 * boxed: a new T. NULL is libadg's "no gradient", so an inline value never
 * packs to it: a type narrower than a pointer carries a tag bit above its
 * bits, and a double is XORed with the bits of one signaling NaN, which no
 * arithmetic makes (that NaN, if given, arrives as the quiet NaN). */
template <class T, class = void> struct packing {
	static constexpr bool is_inline = false;
	static void *pack(T value)
	{
		return new T(std::move(value));
	}
	static void drop(void *p) noexcept
	{
		delete static_cast<T *>(p);
	}
};

template <std::size_t N> struct bits_of;
template <> struct bits_of<1> {
	using type = std::uint8_t;
};
template <> struct bits_of<2> {
	using type = std::uint16_t;
};
template <> struct bits_of<4> {
	using type = std::uint32_t;
};

template <class T>
struct packing<T, std::enable_if_t<std::is_trivially_copyable_v<T> &&
				   (sizeof(T) == 1 || sizeof(T) == 2 ||
				    sizeof(T) == 4) &&
				   sizeof(T) < sizeof(void *)>> {
	static constexpr bool is_inline = true;
	using bits = typename bits_of<sizeof(T)>::type;
	static constexpr std::uintptr_t tag = std::uintptr_t(1)
					      << (8 * sizeof(void *) - 1);
	static void *pack(T value) noexcept
	{
		bits b;
		std::memcpy(&b, &value, sizeof b);
		return reinterpret_cast<void *>(std::uintptr_t(b) | tag);
	}
	static T unpack(const void *p) noexcept
	{
		bits b = static_cast<bits>(reinterpret_cast<std::uintptr_t>(p));
		T value;
		std::memcpy(&value, &b, sizeof b);
		return value;
	}
	static void drop(void *) noexcept
	{
	}
};

template <class T>
struct packing<T, std::enable_if_t<std::is_same_v<T, double> &&
				   sizeof(double) == sizeof(void *) &&
				   std::numeric_limits<double>::is_iec559>> {
	static constexpr bool is_inline = true;
	/* A signaling NaN (quiet bit clear, payload not zero). */
	static constexpr std::uint64_t tag = 0x7ff4dead0000beefull;
	static void *pack(double value) noexcept
	{
		std::uint64_t b;
		std::memcpy(&b, &value, sizeof b);
		if (b == tag) /* would be NULL: the quiet NaN instead */
			b = 0x7ff8000000000000ull;
		return reinterpret_cast<void *>(std::uintptr_t(b ^ tag));
	}
	static double unpack(const void *p) noexcept
	{
		std::uint64_t b = reinterpret_cast<std::uintptr_t>(p) ^ tag;
		double value;
		std::memcpy(&value, &b, sizeof value);
		return value;
	}
	static void drop(void *) noexcept
	{
	}
};

template <class T> inline constexpr bool is_inline_v = packing<T>::is_inline;

/* Whether sum += value compiles for T: the reducer's default add. */
template <class T, class = void> struct has_plus_assign : std::false_type {
};
template <class T>
struct has_plus_assign<T, std::void_t<decltype(std::declval<T &>() +=
					       std::declval<const T &>())>>
    : std::true_type {
};
template <class T>
inline constexpr bool has_plus_assign_v = has_plus_assign<T>::value;

/* The T a C value holds, borrowed where it is boxed. */
template <class T> const T &unpacked(const void *p, T &scratch) noexcept
{
	if constexpr (is_inline_v<T>) {
		scratch = packing<T>::unpack(p);
		return scratch;
	} else {
		(void)scratch;
		return *static_cast<const T *>(p);
	}
}

} // namespace detail

template <class T> void *pack(T value)
{
	return detail::packing<T>::pack(std::move(value));
}

template <class T> T unpack(const void *value)
{
	if constexpr (detail::is_inline_v<T>)
		return detail::packing<T>::unpack(value);
	else
		return *static_cast<const T *>(value);
}

} // namespace adg

#endif /* ADG_VALUE_HPP */
