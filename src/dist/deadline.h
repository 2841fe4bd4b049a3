// What a rank does when a collective does not finish: it polls with a deadline instead of
// blocking, and on expiry ends the whole job with one line naming itself, so no rank hangs.
#pragma once

#include <chrono>
#include <string>
#include <thread>

namespace dspine::dist {

// Polls `done` until it returns true or `timeout_s` passes; false on timeout. Spins for the
// first millisecond (short collectives), then sleeps between polls so that a waiting rank does
// not take a core from the rank it waits for.
template <typename Done>
bool poll_until(Done&& done, double timeout_s) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(timeout_s));
  while (!done()) {
    const auto now = Clock::now();
    if (now >= deadline) return false;
    if (now - start > std::chrono::milliseconds(1))
      std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return true;
}

// Prints `error (rank R): <message>` to stderr.
void report_failure(int rank, const std::string& message);

// Ends every rank: MPI_Abort when MPI is running (mpirun stops the others), otherwise this
// process exits and its launcher stops the rest.
[[noreturn]] void end_job(int code);

// report_failure, then end_job(1).
[[noreturn]] void abort_job(int rank, const std::string& message);

}  // namespace dspine::dist
