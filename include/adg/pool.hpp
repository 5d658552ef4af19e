/*
 * adg/pool.hpp: libadg's thread pool (adg/pool.h) in C++, an annex of
 * adg.hpp, which includes it: an executor whose n_threads workers sleep
 * while there is no work.
 *
 *     adg::pool workers(4);
 *     adg::backward_options o;
 *     o.executor = workers;
 */
#ifndef ADG_POOL_HPP
#define ADG_POOL_HPP

#include "../adg.hpp" /* beside this one, whatever the include path */

namespace adg
{

/* libadg's thread pool (adg_pool): n_threads workers that sleep while there
 * is no work. It must outlive every backward that uses it. Move-only, as
 * adg::registry: a default-made or moved-from pool is empty (no threads,
 * false as a bool), and a backward given one throws adg::error(ADG_EINVAL)
 * (executor_ref); assigning a pool to it starts using that one. */
class pool
{
public:
	/* An empty pool. */
	pool() noexcept = default;
	explicit pool(unsigned n_threads);
	/* The pool's memory from allocator (registry::allocator(), say),
	 * which must outlive the pool. */
	pool(unsigned n_threads, const adg_allocator &allocator);
	pool(pool &&other) noexcept;
	pool &operator=(pool &&other) noexcept;
	pool(const pool &) = delete;
	pool &operator=(const pool &) = delete;
	/* Runs what is queued and stops the threads (adg_pool_free). */
	~pool();

	/* The C executor; null if empty. */
	const adg_executor *c_executor() const noexcept;
	/* The C handle, for calls this layer does not wrap; null if empty. */
	adg_pool *raw() const noexcept;
	explicit operator bool() const noexcept;

private:
	adg_pool *raw_ = nullptr;
	adg_executor exec_{};
};

/* -------------------------------------------------------- implementation */

inline pool::pool(unsigned n_threads)
{
	check(adg_pool_new(n_threads, &raw_), "adg_pool_new");
	adg_pool_executor(raw_, &exec_);
}

inline pool::pool(unsigned n_threads, const adg_allocator &allocator)
{
	auto options = detail::sized<adg_pool_options>();
	options.n_threads = n_threads;
	options.allocator = allocator;
	check(adg_pool_new_with(&options, &raw_), "adg_pool_new_with");
	adg_pool_executor(raw_, &exec_);
}

inline pool::pool(pool &&other) noexcept : raw_(other.raw_), exec_(other.exec_)
{
	other.raw_ = nullptr;
	other.exec_ = adg_executor{};
}

inline pool &pool::operator=(pool &&other) noexcept
{
	if (this != &other) {
		pool gone(std::move(*this));
		raw_ = other.raw_;
		exec_ = other.exec_;
		other.raw_ = nullptr;
		other.exec_ = adg_executor{};
	}
	return *this;
}

inline pool::~pool()
{
	adg_pool_free(raw_); /* NULL: a no-op */
}

inline const adg_executor *pool::c_executor() const noexcept
{
	return raw_ != nullptr ? &exec_ : nullptr;
}

inline adg_pool *pool::raw() const noexcept
{
	return raw_;
}

inline pool::operator bool() const noexcept
{
	return raw_ != nullptr;
}

inline executor_ref::executor_ref(const pool &p) : exec_(p.c_executor())
{
	if (exec_ == nullptr)
		throw error(ADG_EINVAL, "executor_ref: an empty pool");
}

} // namespace adg

#endif /* ADG_POOL_HPP */
