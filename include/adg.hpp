/*
 * adg.hpp: libadg's C++17 layer, header-only, over the C API of adg.h. It
 * adds no state to libadg: every call below is one or a few C calls.
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

#include <adg.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <initializer_list>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <system_error>
#include <type_traits>
#include <typeinfo>
#include <unordered_map>
#include <utility>
#include <vector>

namespace adg
{

namespace detail
{
struct registry_core;
struct grad_state;
struct access;

/* A C struct that begins with its size (adg.h, "ABI"): zeroed, its size
 * set, as this layer passes every one, so that its users never set it. */
template <class T> T sized() noexcept
{
	T t{};
	t.size = sizeof t;
	return t;
}
} // namespace detail

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

/* ------------------------------------------------------------------ errors */

/* The category of libadg's codes: message() is adg_strerror's text, and
 * names the codes below. */
const std::error_category &category() noexcept;

/* What a trampoline returned, before ADG_ETHREW, when a lambda threw
 * something that carries no ADG_E* code. Both are ADG_ETHREW now, whose
 * name and message say a callback threw; backward_options::failure says
 * which callback. */
[[deprecated("use ADG_ETHREW")]] inline constexpr int step_threw = ADG_ETHREW;
[[deprecated("use ADG_ETHREW")]] inline constexpr int add_threw = ADG_ETHREW;

/* Every failure of this layer, and of libadg under it. code().value() is
 * the ADG_E* code; failure() says where a backward failed (site
 * ADG_FAILED_NOWHERE elsewhere). An error from a C call that failed
 * carries that call's reason (adg_errmsg, read on the thread the moment it
 * is thrown), and what() says it: the context, then the reason
 * ("adg_registry_new: options->checkpointing 7 is no strategy (...)",
 * the reason alone when it begins with the context); a backward's failure
 * reads as the backward's reason ("adg_backward_with: step 'mul' of node
 * 7 returned -1003"), an error raised inside it after the failure's
 * context ("backward: step 'mul' of node 7: step_call::give: adg_step_give:
 * slot 3 out of range: node 7 has 2 parents (value freed)"). An error of
 * this layer alone has no reason: what() is the context, then the code's
 * message ("reducer::hook: participant 5 of 2: invalid argument"). */
class error : public std::system_error
{
public:
	explicit error(int code, const char *context = nullptr);
	error(int code, const std::string &context);
	/* A C call's failure: reason is its adg_errmsg(). */
	error(int code, const std::string &context, const std::string &reason);
	/* A backward's failure; reason, the backward's adg_errmsg(), when
	 * it comes from one (what() is then reason). */
	error(int code, const adg_failure &failure,
	      const std::string &reason = {});
	/* inner, raised inside a backward that failed at failure: the same
	 * code and reason, its context after the failure's. */
	error(const error &inner, const adg_failure &failure);
	const adg_failure &failure() const noexcept;
	/* The context alone, without the code's message or the reason. */
	const std::string &context() const noexcept;
	/* The C call's reason (adg_errmsg) when a C call failed, else "". */
	const std::string &reason() const noexcept;
	const char *what() const noexcept override;

private:
	adg_failure failure_ = detail::sized<adg_failure>();
	std::string context_;
	std::string reason_;
	std::string what_; /* with a reason; else system_error's */
};

/* Throws adg::error(rc, context, adg_errmsg()): what a C call that just
 * failed on this thread with rc raises, with its reason. */
[[noreturn]] void throw_c_error(int rc, const std::string &context);

/* Throws adg::error(rc) unless rc is 0, with the reason of the C call
 * that just failed on this thread (adg_errmsg): for the C calls this layer
 * does not wrap. */
void check(int rc, const char *context = nullptr);

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
 * a temporary (node_ref(adg::leaf(reg))) dangles once the statement ends. */
class node_ref
{
public:
	node_ref(const node &n) noexcept;
	/* raw, of reg's: throws ADG_EINVAL for null, ADG_EFOREIGN for a node
	 * of another registry. */
	node_ref(registry_ref reg, adg_node *raw);

	std::uint64_t id() const;
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

/* How a gradient of type T travels through the C API (an adg_grads, a
 * step's call->grad, the values grad_ops<T>() folds): pack makes the C
 * value of a T, which is libadg's once given; unpack reads a copy of one.
 * A T that is trivially copyable and fits a pointer (double, float, int)
 * travels inline, as its bits, not a pointer: no allocation per gradient;
 * any other T as a T * from new. C code that shares gradients with C++
 * steps goes through these two. */
template <class T> void *pack(T value);
template <class T> T unpack(const void *value);

/* The adg_grad_ops of gradient type T: add is `*sum += std::move(*value)`,
 * then delete value; free is delete. ctx null: an add that throws returns
 * ADG_ETHREW (or ADG_ENOMEM) and the exception is dropped. For
 * adg_registry_options.grad_ops, so that C calls passed NULL ops (and a
 * backward of C code) fold and free T too. */
template <class T> adg_grad_ops grad_ops() noexcept;

/* --------------------------------------------------------------- executors */

/* One job of a backward, as an executor receives it. Call it exactly once,
 * later, on any thread (not inside submit): it runs fn(arg). Never drop it
 * unrun; it returns at once when its backward is over. */
struct job {
	void (*fn)(void *arg);
	void *arg;
	void operator()() const;
};

/* libadg's thread pool, adg::pool: <adg/pool.hpp>, which this header
 * includes. */
class pool;

/* An executor made of a callable: submit(adg::job) or submit(fn, arg)
 * arranges for the job to run once, later, elsewhere (a thread pool's post,
 * say); a submit that throws refuses the job, which then never runs.
 * n_workers: how many of its threads one backward may use (adg_executor).
 * The callable is kept, moved, for the executor's life; it must outlive
 * every backward that uses it and be safe to call from several threads at
 * once. */
class executor
{
public:
	template <class Submit> executor(Submit submit, unsigned n_workers);
	executor(executor &&other) noexcept = default;
	executor &operator=(executor &&other) noexcept = default;
	executor(const executor &) = delete;
	executor &operator=(const executor &) = delete;
	~executor() = default;

	const adg_executor *c_executor() const noexcept;

private:
	std::unique_ptr<void, void (*)(void *)> submit_;
	adg_executor exec_{};
};

/* Where a backward runs its steps: nowhere else (the default), a pool, an
 * executor, or a C adg_executor; borrowed for the backward's call. An
 * empty pool or executor (default-made, moved from) throws
 * adg::error(ADG_EINVAL) here, rather than run the backward on one
 * thread unasked. */
class executor_ref
{
public:
	executor_ref() noexcept = default;
	executor_ref(const pool &p);
	executor_ref(const executor &e);
	executor_ref(const adg_executor &e) noexcept;
	const adg_executor *get() const noexcept;

private:
	const adg_executor *exec_ = nullptr;
};

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
	/* Set by reducer<G>::hook (adg/reducer.hpp): the parameters'
	 * gradients go to that reducer as participant's, after on_ready has
	 * seen them. */
	adg_reducer *reducer = nullptr;
	std::size_t participant = 0;
	const std::type_info *reducer_type = nullptr;
};

template <class T> class gradients;

/* Runs a backward from root with seed as its gradient, folding gradients of
 * type T. Returns the leaves' gradients. Throws the exception that failed
 * it (see the opening comment) or adg::error: ADG_ECONSUMED for a root
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

/* -------------------------------------------------------------- gradients */

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

class error_category final : public std::error_category
{
public:
	const char *name() const noexcept override
	{
		return "adg";
	}
	std::string message(int code) const override
	{
		return adg_strerror(code);
	}
};

inline std::string failure_context(const adg_failure &f)
{
	std::string where = "node " + std::to_string(f.node_id);
	if (f.name != nullptr)
		where = std::string("step '") + f.name + "' of " + where;
	switch (f.site) {
	case ADG_FAILED_STEP:
		return "backward: " + where;
	case ADG_FAILED_ON_STEP:
		return "backward: on_step around " + where;
	case ADG_FAILED_ON_READY:
		return "backward: on_ready for " + where;
	case ADG_FAILED_ADD:
		return "backward: add into " + where;
	case ADG_FAILED_CHECK:
		return "backward: the value check rejected the gradient that " +
		       where + " gave";
	default:
		return "backward";
	}
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

struct access {
	static registry_core *core(const registry &r) noexcept
	{
		return r.core_;
	}
	static registry_core *core(const registry_ref &r) noexcept
	{
		return r.core_;
	}
	static registry_ref ref(registry_core *core) noexcept
	{
		registry_ref r;
		r.core_ = core;
		return r;
	}
	template <class T>
	static step_call<T> call(adg_step_call *c, registry_core *core) noexcept
	{
		step_call<T> sc(c);
		sc.core_ = core;
		return sc;
	}
	static registry_core *core(const node &n) noexcept
	{
		return n.core_;
	}
	static registry_core *core(const node_ref &n) noexcept
	{
		return n.core_;
	}
	static adg_node *raw(const parent &p) noexcept
	{
		return p.raw_;
	}
	static node *moved(const parent &p) noexcept
	{
		return p.moved_;
	}
	static grad_ref ref(void *value, void **slot,
			    const std::type_info *type) noexcept
	{
		grad_ref g;
		g.value_ = value;
		g.slot_ = slot;
		g.type_ = type;
		return g;
	}
	static node adopt(adg_node *raw, registry_core *core) noexcept
	{
		node n;
		n.raw_ = raw;
		n.core_ = core;
		return n;
	}
	template <class T>
	static gradients<T> adopt(adg_grads *raw,
				  std::unique_ptr<grad_state> state) noexcept
	{
		gradients<T> g;
		g.raw_ = raw;
		g.state_ = std::move(state);
		return g;
	}
};

/* Where closures live: a thread's cache of freed blocks by size (16 to
 * 128 bytes), so that recording an op costs no malloc once the cache is
 * warm. A block freed on another thread joins that thread's cache; each
 * class keeps at most `keep` blocks, the rest go back to the heap, and a
 * thread's cache is emptied when the thread exits. */
struct block_cache {
	static constexpr std::size_t grain = 16, classes = 8, keep = 256;
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
	    !closure_cache_armed || c.count[k - 1] >= block_cache::keep) {
		::operator delete(p);
		return;
	}
	auto *b = static_cast<block_cache::block *>(p);
	b->next = c.head[k - 1];
	c.head[k - 1] = b;
	c.count[k - 1]++;
}

/* The code a trampoline returns for the exception being handled: an
 * adg::error's own (when negative), ADG_ENOMEM for std::bad_alloc,
 * ADG_ETHREW for anything else. Only inside a catch block. */
inline int thrown_code() noexcept
{
	try {
		throw;
	} catch (const error &e) {
		int rc = e.code().value();
		return rc < 0 ? rc : ADG_ETHREW;
	} catch (const std::bad_alloc &) {
		return ADG_ENOMEM;
	} catch (...) {
		return ADG_ETHREW;
	}
}

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

template <class Submit> struct submitter {
	Submit submit;

	static int run(void (*fn)(void *), void *arg, void *ctx) noexcept
	{
		auto *self = static_cast<submitter *>(ctx);
		try {
			if constexpr (std::is_invocable_v<Submit &, job>)
				self->submit(job{fn, arg});
			else
				self->submit(fn, arg);
			return 0;
		} catch (...) {
			return -1; /* refused: fn never runs */
		}
	}

	static void destroy(void *self) noexcept
	{
		delete static_cast<submitter *>(self);
	}
};

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

	/* The C options: this pass's hooks, where set, and the reducer's
	 * after them (adg_reducer_hook keeps a hook it finds, and calls it
	 * first). */
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
		if (options.reducer != nullptr) {
			if (options.reducer_type == nullptr ||
			    *options.reducer_type != type)
				throw error(ADG_EINVAL,
					    "backward: the reducer's gradient "
					    "type is not the backward's");
			check_rc(adg_reducer_hook(options.reducer,
						  options.participant, &o),
				 "adg_reducer_hook");
		}
		return o;
	}

	static void check_rc(int rc, const char *what)
	{
		if (rc != 0)
			throw_c_error(rc, what);
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

inline const std::error_category &category() noexcept
{
	static const detail::error_category instance;
	return instance;
}

inline error::error(int rc, const char *context)
    : error(rc, std::string(context ? context : "adg"))
{
}

inline error::error(int rc, const std::string &context)
    : std::system_error(rc, category(), context), context_(context)
{
	failure_.code = rc;
}

inline error::error(int rc, const std::string &context,
		    const std::string &reason)
    : error(rc, context)
{
	reason_ = reason;
	if (reason_.empty())
		return;
	/* "adg_leaf" and "adg_leaf: registry is NULL" say it once. */
	bool said = reason_.compare(0, context.size(), context) == 0 &&
		    reason_.compare(context.size(), 1, ":") == 0;
	what_ = context.empty() || said ? reason_ : context + ": " + reason_;
}

inline error::error(int rc, const adg_failure &where, const std::string &reason)
    : error(rc, detail::failure_context(where))
{
	failure_ = where;
	failure_.code = rc;
	reason_ = reason;
	what_ = reason;
}

inline error::error(const error &inner, const adg_failure &where)
    : error(inner.code().value(),
	    detail::failure_context(where) + ": " + inner.context())
{
	failure_ = where;
	failure_.code = inner.code().value();
	reason_ = inner.reason_;
	if (!reason_.empty())
		what_ = context() + ": " + reason_;
}

inline const std::string &error::reason() const noexcept
{
	return reason_;
}

inline const char *error::what() const noexcept
{
	return what_.empty() ? std::system_error::what() : what_.c_str();
}

inline void throw_c_error(int rc, const std::string &context)
{
	throw error(rc, context, adg_errmsg());
}

inline const adg_failure &error::failure() const noexcept
{
	return failure_;
}

inline const std::string &error::context() const noexcept
{
	return context_;
}

inline void check(int rc, const char *context)
{
	if (rc != 0)
		throw_c_error(rc, context ? context : "adg");
}

/* registry */

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

/* node */

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

/* steps */

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

template <class T> adg_grad_ops grad_ops() noexcept
{
	adg_grad_ops ops{};
	ops.add = &detail::typed_ops<T>::add;
	ops.free = &detail::typed_ops<T>::free;
	return ops;
}

/* executors */

inline void job::operator()() const
{
	fn(arg);
}

template <class Submit>
executor::executor(Submit submit, unsigned n_workers)
    : submit_(nullptr, &detail::submitter<Submit>::destroy)
{
	static_assert(
		std::is_invocable_v<Submit &, job> ||
			std::is_invocable_v<Submit &, void (*)(void *), void *>,
		"adg::executor: submit must take an adg::job, or fn and "
		"arg");
	auto *s = new detail::submitter<Submit>{std::move(submit)};
	submit_.reset(s);
	exec_.submit = &detail::submitter<Submit>::run;
	exec_.ctx = s;
	exec_.n_workers = n_workers;
}

inline const adg_executor *executor::c_executor() const noexcept
{
	return submit_ != nullptr ? &exec_ : nullptr;
}

inline executor_ref::executor_ref(const executor &e) : exec_(e.c_executor())
{
	if (exec_ == nullptr)
		throw error(ADG_EINVAL, "executor_ref: an empty executor");
}

inline executor_ref::executor_ref(const adg_executor &e) noexcept : exec_(&e)
{
}

inline const adg_executor *executor_ref::get() const noexcept
{
	return exec_;
}

/* backward */

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

/* seeing a graph */

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

/* checkpointing */

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
		throw_c_error(rc,
			      "step_call::output: node " + std::to_string(id));
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

/* hooks */

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

/* gradients */

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

/* The annexes' C++, as adg.h includes their C: the pool and the
 * reducer. */
#include "adg/pool.hpp"
#include "adg/reducer.hpp"

#endif /* ADG_HPP */
