/*
 * adg/registry.hpp: the registry handle and what it owns besides the C registry
 * (the core: what steps threw, leaf names, the gradient type). A part of
 * adg.hpp, which includes it: include <adg.hpp>.
 */
#ifndef ADG_REGISTRY_HPP
#define ADG_REGISTRY_HPP

#include "error.hpp"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <typeinfo>
#include <unordered_map>
#include <utility>
#include <vector>

namespace adg
{

/* ---------------------------------------------------------------- registry */

/* Owns an adg_registry, and the exceptions steps threw, by pass, until
 * their backward returns: it rethrows the one it reports and drops the
 * rest (a second step failing at once on an executor). Those of passes run
 * by C code (adg_backward_with on steps made here) stay until the registry
 * goes. */
class registry
{
public:
	/* adg_registry_new with the defaults, or with options (copied, its
	 * size set to this header's: the caller need not set it). */
	registry();
	explicit registry(const adg_registry_options &options);
	registry(registry &&other) noexcept;
	registry &operator=(registry &&other) noexcept;
	registry(const registry &) = delete;
	registry &operator=(const registry &) = delete;
	/* Frees the registry. Nodes still alive (a node handle outlived its
	 * registry: a class that declares a node member before its registry
	 * member, say) are a bug this destructor cannot recover from: it can
	 * neither free the registry under them, nor throw, nor wait, and a
	 * registry left allocated would leak one per such object. So it says
	 * so on stderr and calls std::terminate, as std::thread's destructor
	 * does for a thread still joinable. Declare the registry first, or
	 * close() it while its nodes are gone. */
	~registry();

	/* Frees the registry now. Throws adg::error(ADG_EBUSY), the handle
	 * unchanged, while nodes are alive. Afterwards the handle is empty. */
	void close();

	/* Counters (adg_registry_stats). */
	adg_stats stats() const;
	/* The registry's allocator (adg_registry_allocator), for a pool's
	 * memory, say. */
	adg_allocator allocator() const;
	/* The name leaf(reg, name) gave leaf id; empty when none. */
	std::string leaf_name(std::uint64_t id) const;
	/* The C handle, for calls this layer does not wrap; null if empty. */
	adg_registry *raw() const noexcept;
	explicit operator bool() const noexcept;

private:
	friend struct detail::access;
	detail::registry_core *core_ = nullptr;
};

/* A registry borrowed, not owned: what op, op_with and leaf take (a
 * registry converts to one), and what a step or a node hands back
 * (step_call::registry(), node::registry()), so that a step records ops
 * on its graph's registry without capturing it. The registry must outlive
 * it. */
class registry_ref
{
public:
	registry_ref(registry &reg) noexcept;
	/* The C handle; null if empty. */
	adg_registry *raw() const noexcept;
	explicit operator bool() const noexcept;

private:
	friend struct detail::access;
	registry_ref() noexcept = default;
	detail::registry_core *core_ = nullptr;
};

/* ---------------------------------------------------------- implementation */

namespace detail
{

inline registry_core *access::core(const registry &r) noexcept
{
	return r.core_;
}

inline registry_core *access::core(const registry_ref &r) noexcept
{
	return r.core_;
}

inline registry_ref access::ref(registry_core *core) noexcept
{
	registry_ref r;
	r.core_ = core;
	return r;
}

/* What a registry handle owns besides the C registry: where trampolines
 * keep what a step threw until its backward takes it, and the registry's
 * gradient type. Written on failures and once for the type, so threads
 * building graphs share no written line through it. */
struct registry_core {
	adg_registry *raw = nullptr;
	std::atomic<const std::type_info *> grad_type{nullptr};
	std::mutex mutex; /* guards thrown and leaf_names */
	/* leaf(reg, name)'s names, by id: parameters', kept until the
	 * registry goes (children keep only a leaf's id, so the DOT asks for
	 * names here). */
	std::unordered_map<std::uint64_t, std::string> leaf_names;
	/* What steps and adds threw, by pass (adg_failure.pass_id), then by
	 * the failure that would name the call (its site and node,
	 * adg_callback_site): never by node alone, since retained passes on
	 * several threads run one step at once and each must get back what
	 * its own run threw; never "the first thrown", since with workers
	 * the first in time is not the first in tape order, which is the one
	 * the failure names. In the order they were kept. */
	struct kept {
		adg_failure_site site;
		std::uint64_t node_id;
		std::exception_ptr thrown;
	};
	std::unordered_map<std::uint64_t, std::vector<kept>> thrown;

	void keep(const adg_failure &where, std::exception_ptr e) noexcept
	{
		try {
			std::lock_guard<std::mutex> lock(mutex);
			thrown[where.pass_id].push_back(
				{where.site, where.node_id, std::move(e)});
		} catch (...) {
			/* no memory: the backward throws adg::error */
		}
	}

	/* What the call that failure names threw in its pass, the first
	 * kept (null when nothing); drops the rest of the pass's, which no
	 * one will ask for. */
	std::exception_ptr take(const adg_failure &failure) noexcept
	{
		std::exception_ptr e;
		std::lock_guard<std::mutex> lock(mutex);
		auto pass = thrown.find(failure.pass_id);
		if (pass == thrown.end())
			return e;
		for (kept &k : pass->second)
			if (!e && k.site == failure.site &&
			    k.node_id == failure.node_id)
				e = std::move(k.thrown);
		thrown.erase(pass);
		return e;
	}

	/* The last one kept at where, taken out (null when none): what an
	 * add that a step's give ran has just thrown, for the give. */
	std::exception_ptr take_last(const adg_failure &where) noexcept
	{
		std::exception_ptr e;
		std::lock_guard<std::mutex> lock(mutex);
		auto pass = thrown.find(where.pass_id);
		if (pass == thrown.end())
			return e;
		auto &all = pass->second;
		for (std::size_t i = all.size(); i-- > 0;)
			if (all[i].site == where.site &&
			    all[i].node_id == where.node_id) {
				e = std::move(all[i].thrown);
				all.erase(all.begin() +
					  static_cast<std::ptrdiff_t>(i));
				break;
			}
		if (all.empty())
			thrown.erase(pass);
		return e;
	}

	/* Drops what pass_id's calls left: a pass that succeeded all the
	 * same (a step that caught its give's exception and went on). */
	void drop(std::uint64_t pass_id) noexcept
	{
		std::lock_guard<std::mutex> lock(mutex);
		thrown.erase(pass_id);
	}

	template <class T> void check_type()
	{
		const std::type_info *want = &typeid(T);
		/* A load first: every op of every thread checks, and a
		 * compare-exchange would write the line they all read. */
		const std::type_info *have =
			grad_type.load(std::memory_order_acquire);
		if (have == want)
			return;
		if (have == nullptr &&
		    grad_type.compare_exchange_strong(
			    have, want, std::memory_order_acq_rel))
			return; /* the first: T is the registry's now */
		if (*have != *want)
			throw error(
				ADG_EINVAL,
				"gradient type differs from the registry's");
	}
};

} // namespace detail

inline registry::registry() : registry(detail::sized<adg_registry_options>())
{
}

inline registry::registry(const adg_registry_options &options)
{
	auto core = std::make_unique<detail::registry_core>();
	adg_registry_options o = options;
	o.size = sizeof o; /* this header's struct, whatever the caller set */
	check(adg_registry_new(&o, &core->raw), "adg_registry_new");
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
	if (core_ == nullptr)
		return;
	if (adg_registry_free(core_->raw) != 0) {
		std::fputs(
			"adg::registry destroyed while nodes of it are "
			"alive: a node handle outlived its registry (declare "
			"the registry before its nodes)\n",
			stderr);
		std::terminate();
	}
	delete core_;
}

inline void registry::close()
{
	if (core_ == nullptr)
		return;
	check(adg_registry_free(core_->raw), "adg_registry_free");
	delete core_;
	core_ = nullptr;
}

inline adg_stats registry::stats() const
{
	auto s = detail::sized<adg_stats>();
	check(adg_registry_stats(raw(), &s), "adg_registry_stats");
	return s;
}

inline adg_allocator registry::allocator() const
{
	adg_allocator a{};
	check(adg_registry_allocator(raw(), &a), "adg_registry_allocator");
	return a;
}

inline std::string registry::leaf_name(std::uint64_t id) const
{
	if (core_ == nullptr)
		return std::string();
	std::lock_guard<std::mutex> lock(core_->mutex);
	auto it = core_->leaf_names.find(id);
	return it != core_->leaf_names.end() ? it->second : std::string();
}

inline adg_registry *registry::raw() const noexcept
{
	return core_ != nullptr ? core_->raw : nullptr;
}

inline registry::operator bool() const noexcept
{
	return core_ != nullptr;
}

inline registry_ref::registry_ref(registry &reg) noexcept
    : core_(detail::access::core(reg))
{
}

inline adg_registry *registry_ref::raw() const noexcept
{
	return core_ != nullptr ? core_->raw : nullptr;
}

inline registry_ref::operator bool() const noexcept
{
	return core_ != nullptr;
}

} // namespace adg

#endif /* ADG_REGISTRY_HPP */
