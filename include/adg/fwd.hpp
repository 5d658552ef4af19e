/*
 * adg/fwd.hpp: the names of adg.hpp's classes, declared, for the parts
 * that use one before its own part defines it; detail::access, the one
 * friend of every class, which each part's implementation defines its
 * members of; detail::sized. A part of adg.hpp: include <adg.hpp>.
 */
#ifndef ADG_FWD_HPP
#define ADG_FWD_HPP

#include "../adg.h" /* beside this one, whatever the include path */

#include <functional>
#include <memory>
#include <typeinfo>

namespace adg
{

class registry;
class registry_ref;
class node;
class node_ref;
class parent;
template <class T> class step_call;
class grad_ref;
struct backward_options;
template <class T> class gradients;

namespace detail
{

struct registry_core;
struct grad_state;

/* A C struct that begins with its size (adg.h, "ABI"): zeroed, its size
 * set, as this layer passes every one, so that its users never set it. */
template <class T> T sized() noexcept
{
	T t{};
	t.size = sizeof t;
	return t;
}

/* The one friend of every class: what the other parts reach inside a
 * class through. Each member is defined in the part of the class it
 * opens. */
struct access {
	/* registry.hpp */
	static registry_core *core(const registry &r) noexcept;
	static registry_core *core(const registry_ref &r) noexcept;
	static registry_ref ref(registry_core *core) noexcept;
	/* node.hpp */
	static registry_core *core(const node &n) noexcept;
	static registry_core *core(const node_ref &n) noexcept;
	static adg_node *raw(const parent &p) noexcept;
	static node *moved(const parent &p) noexcept;
	static node adopt(adg_node *raw, registry_core *core) noexcept;
	/* step.hpp */
	template <class T>
	static step_call<T> call(adg_step_call *c,
				 registry_core *core) noexcept;
	/* gradients.hpp */
	template <class T>
	static gradients<T> adopt(adg_grads *raw,
				  std::unique_ptr<grad_state> state) noexcept;
	/* backward.hpp */
	static grad_ref ref(void *value, void **slot,
			    const std::type_info *type) noexcept;
	static const std::function<void(adg_backward_options &,
					const std::type_info &)> &
	extension(const backward_options &o) noexcept;
};

} // namespace detail
} // namespace adg

#endif /* ADG_FWD_HPP */
