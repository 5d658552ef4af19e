// What the libtorch programs of bench/compare/ share to time their
// training: the process's CPU time, its thread count, and a clock that
// sums each epoch's wall and CPU time. Included by digits_torch.cpp,
// fashion_torch.cpp and langid_torch.cpp (scripts/compare-*.sh build
// them); not part of libadg's build.
#ifndef BENCH_COMPARE_TIMING_HPP
#define BENCH_COMPARE_TIMING_HPP

#include <chrono>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <string>

namespace timing
{

// Seconds of CPU time this process has used, all its threads together.
inline double cpu_seconds()
{
	timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return static_cast<double>(ts.tv_sec) +
	       static_cast<double>(ts.tv_nsec) * 1e-9;
}

// The threads this process has now (the kernel's count: ours, OpenMP's,
// OpenBLAS's pools), or -1 when it cannot tell.
inline int os_threads()
{
	std::ifstream in("/proc/self/status");
	std::string line;
	while (std::getline(in, line))
		if (line.rfind("Threads:", 0) == 0)
			return std::atoi(line.c_str() + 8);
	return -1;
}

// The training's time, epoch by epoch, evaluation excluded: start()
// before an epoch's training, stop() after it.
class epoch_clock
{
public:
	void start()
	{
		cpu_start_ = cpu_seconds();
		start_ = std::chrono::steady_clock::now();
	}
	// Ends the epoch: adds its times to the sums and returns its wall
	// seconds.
	double stop()
	{
		std::chrono::duration<double> took =
			std::chrono::steady_clock::now() - start_;
		cpu_ += cpu_seconds() - cpu_start_;
		wall_ += took.count();
		return took.count();
	}
	// Wall seconds, summed over the epochs stopped.
	double wall() const
	{
		return wall_;
	}
	// The process's CPU seconds, summed over the same epochs.
	double cpu() const
	{
		return cpu_;
	}

private:
	std::chrono::steady_clock::time_point start_;
	double cpu_start_ = 0, wall_ = 0, cpu_ = 0;
};

} // namespace timing

#endif // BENCH_COMPARE_TIMING_HPP
