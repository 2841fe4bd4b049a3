// The NCCL back end's guard against hangs: a thread that follows every outstanding collective
// (its completion event) and ends the job when one is not done after timeout_s or when NCCL
// reports an asynchronous error, so a failed or stopped rank never leaves the others waiting.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace dspine::dist {

// A CUDA event shared by the collective's handle (to wait on it) and the watchdog.
using CompletionEvent = std::shared_ptr<CUevent_st>;
CompletionEvent make_completion_event();

// Prints `error (rank R): <message>`, aborts `comm` (which frees kernels stuck in it) and ends
// every rank.
[[noreturn]] void abort_nccl(ncclComm_t comm, int rank, const std::string& message);

class NcclWatchdog {
 public:
  NcclWatchdog(ncclComm_t comm, int device, int rank, double timeout_s);
  ~NcclWatchdog();  // stops the thread; outstanding collectives are no longer watched
  NcclWatchdog(const NcclWatchdog&) = delete;
  NcclWatchdog& operator=(const NcclWatchdog&) = delete;

  // Follows `done`, recorded on the communication stream after the collective `name`.
  void watch(CompletionEvent done, const char* name);

 private:
  struct Outstanding {
    CompletionEvent done;
    const char* name;
    int64_t number;
    std::chrono::steady_clock::time_point start;
  };
  void run();

  ncclComm_t comm_;
  int device_;
  int rank_;
  double timeout_s_;
  std::mutex mutex_;
  std::condition_variable stop_requested_;
  std::deque<Outstanding> outstanding_;
  int64_t issued_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace dspine::dist
