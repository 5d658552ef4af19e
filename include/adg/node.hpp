/*
 * adg/node.hpp: node and node_ref, the handles of a registered node, parent,
 * and leaf. A part of adg.hpp, which includes it: include <adg.hpp>.
 */
#ifndef ADG_NODE_HPP
#define ADG_NODE_HPP

#include "registry.hpp"

#include <cstdint>
#include <string>

namespace adg
{

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
	/* The id of the graph the node is in now (adg_node_graph_id): the
	 * smallest origin of the graphs merged into it; 0 for a leaf or a
	 * node whose step was consumed. Throws on an empty handle. */
	std::uint64_t graph_id() const;
	/* The C handle, still this handle's reference; null if empty. */
	adg_node *raw() const noexcept;
	/* Hands this handle's reference to the caller (adg_node_unref's);
	 * the handle is empty afterwards. */
	adg_node *release() noexcept;
	/* Drops the reference now; the handle is empty afterwards. */
	void reset() noexcept;
	explicit operator bool() const noexcept;
	/* The registry the node is in; throws on an empty handle. */
	registry_ref registry() const;

	/* A handle for raw, a node of reg's from C code, taking over the
	 * caller's reference (what it would have dropped with
	 * adg_node_unref). Throws adg::error: ADG_EINVAL for null,
	 * ADG_EFOREIGN for a node of another registry (the reference stays
	 * the caller's). */
	static node adopt(registry_ref reg, adg_node *raw);
	/* The same with a reference of its own (adg_node_ref): the caller
	 * keeps theirs. */
	static node borrow(registry_ref reg, adg_node *raw);

private:
	friend struct detail::access;
	adg_node *raw_ = nullptr;
	detail::registry_core *core_ = nullptr;
};

/* A node borrowed, not counted (cppzmq's socket_ref): from a node, which
 * must outlive it, or from a C handle the caller holds a reference to.
 * What takes a node to read it (backward, visit, write_dot, parent, op's
 * std::vector<node_ref>) takes one. get() makes a counted handle of it.
 * Making, copying and dropping one writes nothing to the node. Like a
 * std::string_view, it does not keep what it names alive: one made from
 * a temporary (node_ref(adg::leaf(reg))) dangles once the statement ends.
 * Default-made, it is empty (false), as one of an empty node is, so that
 * a std::vector<node_ref> can be sized first and filled after; op refuses
 * an empty parent (ADG_EINVAL). */
class node_ref
{
public:
	node_ref() noexcept = default;
	node_ref(const node &n) noexcept;
	/* raw, of reg's: throws ADG_EINVAL for null, ADG_EFOREIGN for a node
	 * of another registry. */
	node_ref(registry_ref reg, adg_node *raw);

	std::uint64_t id() const;
	std::uint64_t graph_id() const;
	adg_node *raw() const noexcept;
	/* A counted handle to the node (adg_node_ref). */
	node get() const;
	explicit operator bool() const noexcept;
	/* The registry the node is in; throws on an empty reference. */
	registry_ref registry() const;

private:
	friend struct detail::access;
	adg_node *raw_ = nullptr;
	detail::registry_core *core_ = nullptr;
};

/* A parent of op: a node borrowed for the call, or a node moved in (a
 * temporary, std::move(x)): its reference becomes the new node's
 * (adg_op_moving) and the handle is empty once op returns; if op throws,
 * it keeps its reference. Moves past the 64th parent are borrows. */
class parent
{
public:
	parent(const node &n) noexcept;
	parent(node &&n) noexcept;
	parent(node_ref n) noexcept;

private:
	friend struct detail::access;
	adg_node *raw_;
	node *moved_ = nullptr;
};

/* A new leaf of reg (adg_leaf): a parameter, an input that wants a
 * gradient. name (copied), when given, is what write_dot labels it with
 * ("W1"); names stay with the registry until it goes, so name the
 * parameters, not every input. */
node leaf(registry_ref reg, const char *name = nullptr);

/* ---------------------------------------------------------- implementation */

namespace detail
{

inline registry_core *access::core(const node &n) noexcept
{
	return n.core_;
}

inline registry_core *access::core(const node_ref &n) noexcept
{
	return n.core_;
}

inline adg_node *access::raw(const parent &p) noexcept
{
	return p.raw_;
}

inline node *access::moved(const parent &p) noexcept
{
	return p.moved_;
}

inline node access::adopt(adg_node *raw, registry_core *core) noexcept
{
	node n;
	n.raw_ = raw;
	n.core_ = core;
	return n;
}

} // namespace detail

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

inline std::uint64_t node::graph_id() const
{
	std::uint64_t value = 0;
	check(adg_node_graph_id(raw_, &value), "adg_node_graph_id");
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

inline parent::parent(node &&n) noexcept : raw_(n.raw()), moved_(&n)
{
}

inline parent::parent(node_ref n) noexcept : raw_(n.raw())
{
}

namespace detail
{
/* reg's core, after checking that raw is one of reg's nodes. */
inline registry_core *core_of(registry_ref reg, adg_node *raw, const char *what)
{
	adg_registry *owner = nullptr;
	if (raw == nullptr || adg_node_registry(raw, &owner) != 0)
		throw error(ADG_EINVAL, std::string(what) + ": a null node");
	if (owner != reg.raw())
		throw error(ADG_EFOREIGN,
			    std::string(what) + ": a node of another registry");
	return access::core(reg);
}
} // namespace detail

inline node node::adopt(registry_ref reg, adg_node *raw)
{
	return detail::access::adopt(raw,
				     detail::core_of(reg, raw, "node::adopt"));
}

inline node node::borrow(registry_ref reg, adg_node *raw)
{
	detail::registry_core *core = detail::core_of(reg, raw, "node::borrow");
	adg_node_ref(raw); /* fails only on NULL */
	return detail::access::adopt(raw, core);
}

inline node_ref::node_ref(const node &n) noexcept
    : raw_(n.raw()), core_(detail::access::core(n))
{
}

inline node_ref::node_ref(registry_ref reg, adg_node *raw)
    : raw_(raw), core_(detail::core_of(reg, raw, "node_ref"))
{
}

inline std::uint64_t node_ref::id() const
{
	std::uint64_t value = 0;
	check(adg_node_id(raw_, &value), "adg_node_id");
	return value;
}

inline std::uint64_t node_ref::graph_id() const
{
	std::uint64_t value = 0;
	check(adg_node_graph_id(raw_, &value), "adg_node_graph_id");
	return value;
}

inline adg_node *node_ref::raw() const noexcept
{
	return raw_;
}

inline node node_ref::get() const
{
	if (raw_ == nullptr)
		throw error(ADG_EINVAL, "node_ref::get: an empty reference");
	adg_node_ref(raw_);
	return detail::access::adopt(raw_, core_);
}

inline node_ref::operator bool() const noexcept
{
	return raw_ != nullptr;
}

inline registry_ref node_ref::registry() const
{
	if (core_ == nullptr)
		throw error(ADG_EINVAL,
			    "node_ref::registry: an empty reference");
	return detail::access::ref(core_);
}

inline registry_ref node::registry() const
{
	if (core_ == nullptr)
		throw error(ADG_EINVAL, "node::registry: an empty handle");
	return detail::access::ref(core_);
}

inline node leaf(registry_ref reg, const char *name)
{
	detail::registry_core *core = detail::access::core(reg);
	if (core == nullptr)
		throw error(ADG_EINVAL, "leaf: an empty registry");
	adg_node *out = nullptr;
	check(adg_leaf(reg.raw(), &out), "adg_leaf");
	node n = detail::access::adopt(out, core);
	if (name != nullptr) {
		std::lock_guard<std::mutex> lock(core->mutex);
		core->leaf_names[n.id()] = name;
	}
	return n;
}

} // namespace adg

#endif /* ADG_NODE_HPP */
