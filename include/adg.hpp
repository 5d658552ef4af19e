/*
 * adg.hpp: libadg's C++17 layer, header-only, over the C API of adg.h. It
 * adds no state to libadg: every call of its parts is one or a few C calls.
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
 *   a count on the registry would be a cache line every thread writes; a
 *   registry destroyed under live nodes terminates the program, loudly,
 *   rather than leak. adg::node_ref borrows a node without a count: what
 *   op takes for parents gathered at run time (a std::vector<node_ref>),
 *   since a copied handle writes the node's count, a cache line that every
 *   thread sharing a parameter would write.
 * - A step's lambda, and what it captures (forward values, node handles),
 *   is libadg's once op returns: it lives in the step's user pointer and is
 *   destroyed exactly once, through adg_step.release, when the step goes.
 *   If op throws, no node was made and libadg's copy is already destroyed.
 * - A gradient value of type T is libadg's from the moment it is given; the
 *   grad ops generated for T fold with +=. A T that is trivially copyable
 *   and fits a pointer (double, float, int) travels inline, its bits in
 *   libadg's void *, so giving one allocates nothing; any other T lives on
 *   the heap (new T, freed with delete). pack and unpack convert, for C
 *   code that shares gradients with C++ steps. One gradient type per
 *   registry: the first op<T> or backward<T> fixes it, and a different T
 *   is refused (ADG_EINVAL), since the values would be read as the wrong
 *   type.
 * - A step's closure is allocated from a per-thread cache of small blocks
 *   (up to 128 bytes), so that recording an op costs no malloc once the
 *   cache is warm; larger closures come from operator new.
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
 * catch clauses for the lambda's own types work: what the call that
 * backward_options::failure names threw, the first failure in tape order
 * whichever threw first in time, with an executor too: a step's, an add's,
 * a hook's or the value check's. Each is kept by its pass and the failure
 * that would name it (adg_callback_site tells the add and the check,
 * which are not told their node). When no exception explains the code
 * (ADG_ECONSUMED, libadg's own ADG_ENOMEM, a check that returned false),
 * it throws adg::error. backward_options::failure names the failing node
 * and step either way.
 */
#ifndef ADG_HPP
#define ADG_HPP

/* The C++ layer: a part per section of the API (include/adg/NAME.hpp),
 * each declaring its classes and functions, then defining them. In the
 * order they build on one another, which is the reference's order
 * (docs/api.md): one include a block, so that formatting keeps it. */
#include "adg/fwd.hpp"

#include "adg/value.hpp"

#include "adg/error.hpp"

#include "adg/registry.hpp"

#include "adg/node.hpp"

#include "adg/step.hpp"

#include "adg/checkpoint.hpp"

#include "adg/executor.hpp"

#include "adg/gradients.hpp"

#include "adg/backward.hpp"

#include "adg/graph.hpp"

/* The annexes' C++, as adg.h includes their C: the exact sums, the pool
 * and the reducer. */
#include "adg/exact.hpp"
#include "adg/pool.hpp"
#include "adg/reducer.hpp"

#endif /* ADG_HPP */
