/*
 * adg/error.hpp: adg::error, the category of libadg's codes, check, what a
 * trampoline returns for an exception, and the library's version.
 * A part of adg.hpp, which includes it: include <adg.hpp>.
 */
#ifndef ADG_ERROR_HPP
#define ADG_ERROR_HPP

#include "fwd.hpp"

#include <exception>
#include <new>
#include <string>
#include <system_error>

namespace adg
{

/* ------------------------------------------------------------------ errors */

/* The category of libadg's codes: message() is adg_strerror's text, and
 * names the codes below. */
const std::error_category &category() noexcept;

/* The version of the libadg loaded, "MAJOR.MINOR.PATCH" (adg_version): it
 * may be newer than the header compiled against (ADG_VERSION_MAJOR and
 * the rest). */
inline const char *version() noexcept
{
	return adg_version();
}

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

/* Throws adg::error(rc) unless rc is 0, with the reason of the C call
 * that just failed on this thread (adg_errmsg): for the C calls this layer
 * does not wrap. */
void check(int rc, const char *context = nullptr);

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
		throw error(rc, context ? context : "adg", adg_errmsg());
}

} // namespace adg

#endif /* ADG_ERROR_HPP */
