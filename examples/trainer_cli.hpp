/* The scaffolding the C++ trainers (langid, tagger) share around their
 * models: reading their options' values, running a function on n threads,
 * the csv file of per-epoch figures, and the checks of a run's end (its
 * test accuracy, its weights against the runs before it). No libadg
 * here; each trainer keeps its own options, usage and result line. */
#ifndef EXAMPLES_TRAINER_CLI_HPP
#define EXAMPLES_TRAINER_CLI_HPP

#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace cli
{

/* ------------------------------------------------------------ options */

/* A whole number in [lo, hi], all of s. */
inline bool whole_number(const char *s, long lo, long hi, long &v)
{
	char *end;
	errno = 0;
	v = std::strtol(s, &end, 10);
	return end != s && *end == '\0' && errno == 0 && v >= lo && v <= hi;
}

/* A floating-point number, all of s. */
inline bool real_number(const char *s, double &x)
{
	char *end;
	x = std::strtod(s, &end);
	return end != s && *end == '\0';
}

/* --threads' value: thread counts 1 to 1024, separated by commas, at
 * least one. */
inline bool thread_list(const char *s, std::vector<int> &threads)
{
	threads.clear();
	for (const char *p = s; *p != '\0';) {
		char *end;
		long t = std::strtol(p, &end, 10);
		if (end == p || t < 1 || t > 1024 ||
		    (*end != ',' && *end != '\0'))
			return false;
		threads.push_back(static_cast<int>(t));
		p = *end == ',' ? end + 1 : end;
	}
	return !threads.empty();
}

/* --------------------------------------------------------------- runs */

inline double seconds_since(std::chrono::steady_clock::time_point start)
{
	return std::chrono::duration<double>(std::chrono::steady_clock::now() -
					     start)
		.count();
}

/* Runs f(0) .. f(n - 1) on n threads and rethrows the first exception
 * any of them threw, once all are done. */
template <class F> void on_threads(int n, F &&f)
{
	std::vector<std::exception_ptr> failed(static_cast<std::size_t>(n));
	std::vector<std::thread> threads;
	for (int i = 0; i < n; i++)
		threads.emplace_back([&, i] {
			try {
				f(i);
			} catch (...) {
				failed[i] = std::current_exception();
			}
		});
	for (auto &t : threads)
		t.join();
	for (auto &e : failed)
		if (e)
			std::rethrow_exception(e);
}

/* The rows [first, last) of slice k of n_slices of a matrix of rows. */
inline std::pair<int, int> rows_of(int rows, std::size_t k,
				   std::size_t n_slices)
{
	return {static_cast<int>(rows * k / n_slices),
		static_cast<int>(rows * (k + 1) / n_slices)};
}

/* --csv: the file opened and its header line written; null when path
 * is empty. Throws std::runtime_error when it cannot open it. */
inline std::FILE *open_csv(const std::string &path, const char *header)
{
	if (path.empty())
		return nullptr;
	std::FILE *csv = std::fopen(path.c_str(), "w");
	if (csv == nullptr)
		throw std::runtime_error(path + ": " + std::strerror(errno));
	std::fputs(header, csv);
	return csv;
}

/* Closes what open_csv opened (null: nothing); false, said on stderr,
 * when a write failed. */
inline bool close_csv(std::FILE *csv, const std::string &path)
{
	if (csv == nullptr || !(std::ferror(csv) | std::fclose(csv)))
		return true;
	std::fprintf(stderr, "%s: write failed\n", path.c_str());
	return false;
}

/* Run r's checks, each failure said on stderr: its test accuracy (an
 * Outcome's accuracy, in %) against min_test_accuracy unless that is
 * negative, and, with same_weights, its weights' hash against the runs
 * before it: those on as many threads or, with any_threads (the weights
 * do not depend on the thread count), all of them. threads[i] is run i's
 * thread count. False when a check failed. */
template <class Outcome>
bool check_run(const std::vector<int> &threads,
	       const std::vector<Outcome> &outcomes, std::size_t r,
	       double min_test_accuracy, bool same_weights, bool any_threads)
{
	bool ok = true;
	const Outcome &out = outcomes[r];
	if (min_test_accuracy >= 0 && out.accuracy < min_test_accuracy) {
		std::fprintf(stderr,
			     "T=%d: test accuracy %.2f%% is below %.2f%%\n",
			     threads[r], out.accuracy, min_test_accuracy);
		ok = false;
	}
	for (std::size_t q = 0; same_weights && q < r; q++)
		if ((any_threads || threads[q] == threads[r]) &&
		    outcomes[q].hash != out.hash) {
			std::fprintf(stderr,
				     "T=%d and T=%d: runs %zu and %zu end with "
				     "different weights (%016" PRIx64
				     " and %016" PRIx64 ")\n",
				     threads[q], threads[r], q + 1, r + 1,
				     outcomes[q].hash, out.hash);
			return false;
		}
	return ok;
}

} // namespace cli

#endif /* EXAMPLES_TRAINER_CLI_HPP */
