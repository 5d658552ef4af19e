/*
 * adg/graph.hpp: visit, write_dot and dot: seeing a graph.
 * A part of adg.hpp, which includes it: include <adg.hpp>.
 */
#ifndef ADG_GRAPH_HPP
#define ADG_GRAPH_HPP

#include "node.hpp"

#include <ostream>
#include <sstream>
#include <string>
#include <utility>

namespace adg
{

/* ---------------------------------------------------------- seeing a graph */

/* Calls f(const adg_graph_node &) for each op of the graph n is in, as
 * adg_graph_visit does; what f throws stops the visit and is rethrown. */
template <class F> void visit(node_ref n, F &&f);

/* Writes the graph n is in to out as Graphviz DOT (adg_graph_write_dot:
 * an op's edges labelled with their parent slots where it has two
 * parents or more), its leaves labelled with the names leaf(reg, name)
 * gave them. Throws
 * adg::error, or std::ios_base::failure when out is set to throw. */
void write_dot(node_ref n, std::ostream &out);
/* The same DOT, as a string. */
std::string dot(node_ref n);

/* ---------------------------------------------------------- implementation */

namespace detail
{
template <class F> struct visit_state {
	F &f;
	std::exception_ptr thrown;

	static int call(const adg_graph_node *n, void *ctx) noexcept
	{
		auto *self = static_cast<visit_state *>(ctx);
		try {
			self->f(*n);
			return 0;
		} catch (...) {
			self->thrown = std::current_exception();
			return thrown_code();
		}
	}
};

struct dot_state {
	std::ostream &out;
	registry_core *core;
	std::string name; /* the last leaf name handed out */
	std::exception_ptr thrown;

	static int write(const char *text, std::size_t len, void *ctx) noexcept
	{
		auto *self = static_cast<dot_state *>(ctx);
		try {
			self->out.write(text,
					static_cast<std::streamsize>(len));
			return self->out ? 0 : ADG_ECALLBACK;
		} catch (...) {
			self->thrown = std::current_exception();
			return thrown_code();
		}
	}

	/* A copy, held until the next call: another thread may name a leaf
	 * meanwhile, and the map may move its strings. */
	static const char *leaf_name(std::uint64_t id, void *ctx) noexcept
	{
		auto *self = static_cast<dot_state *>(ctx);
		try {
			std::lock_guard<std::mutex> lock(self->core->mutex);
			auto it = self->core->leaf_names.find(id);
			if (it == self->core->leaf_names.end())
				return nullptr;
			self->name = it->second;
			return self->name.c_str();
		} catch (...) {
			return nullptr; /* no memory: the plain label */
		}
	}
};
} // namespace detail

template <class F> void visit(node_ref n, F &&f)
{
	detail::visit_state<F> state{f, nullptr};
	int rc =
		adg_graph_visit(n.raw(), &detail::visit_state<F>::call, &state);
	if (state.thrown)
		std::rethrow_exception(state.thrown);
	check(rc, "adg_graph_visit");
}

inline void write_dot(node_ref n, std::ostream &out)
{
	detail::dot_state state{out, detail::access::core(n), {}, nullptr};
	auto o = detail::sized<adg_dot_options>();
	if (state.core != nullptr) {
		o.leaf_name = &detail::dot_state::leaf_name;
		o.leaf_name_ctx = &state;
	}
	int rc = adg_graph_write_dot_with(n.raw(), &o,
					  &detail::dot_state::write, &state);
	if (state.thrown)
		std::rethrow_exception(state.thrown);
	if (rc != 0 && !out)
		throw error(rc, "write_dot: the output stream failed");
	check(rc, "adg_graph_write_dot");
}

inline std::string dot(node_ref n)
{
	std::ostringstream out;
	write_dot(n, out);
	return out.str();
}

} // namespace adg

#endif /* ADG_GRAPH_HPP */
