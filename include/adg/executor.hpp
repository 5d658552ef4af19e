/*
 * adg/executor.hpp: job, executor and executor_ref: where a backward's steps
 * run. A part of adg.hpp, which includes it: include <adg.hpp>.
 */
#ifndef ADG_EXECUTOR_HPP
#define ADG_EXECUTOR_HPP

#include "error.hpp"

#include <functional>
#include <memory>
#include <type_traits>
#include <utility>

namespace adg
{

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
 * thread unasked. A temporary does not convert: it would be gone before
 * the backward ran (o.executor = adg::pool(2) does not compile). */
class executor_ref
{
public:
	executor_ref() noexcept = default;
	executor_ref(const pool &p);
	executor_ref(const executor &e);
	executor_ref(const adg_executor &e) noexcept;
	executor_ref(const pool &&) = delete;
	executor_ref(const executor &&) = delete;
	executor_ref(const adg_executor &&) = delete;
	const adg_executor *get() const noexcept;

private:
	const adg_executor *exec_ = nullptr;
};

/* ---------------------------------------------------------- implementation */

namespace detail
{

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

} // namespace detail

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

} // namespace adg

#endif /* ADG_EXECUTOR_HPP */
