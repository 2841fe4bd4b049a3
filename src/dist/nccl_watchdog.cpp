#include "dist/nccl_watchdog.h"

#include <fmt/format.h>

#include "core/error.h"
#include "dist/deadline.h"

namespace dspine::dist {
namespace {

// How often the thread looks: small against any sensible timeout, cheap against a step.
constexpr auto kPollInterval = std::chrono::milliseconds(100);

}  // namespace

CompletionEvent make_completion_event() {
  cudaEvent_t event = nullptr;
  const cudaError_t status = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
  if (status != cudaSuccess)
    fail("NCCL communicator: cudaEventCreate failed: {}", cudaGetErrorString(status));
  return CompletionEvent(event, cudaEventDestroy);
}

NcclWatchdog::NcclWatchdog(ncclComm_t comm, int device, int rank, double timeout_s)
    : comm_(comm), device_(device), rank_(rank), timeout_s_(timeout_s) {
  thread_ = std::thread([this] { run(); });
}

NcclWatchdog::~NcclWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  stop_requested_.notify_all();
  thread_.join();
}

void NcclWatchdog::watch(CompletionEvent done, const char* name) {
  std::lock_guard<std::mutex> lock(mutex_);
  outstanding_.push_back({std::move(done), name, ++issued_, std::chrono::steady_clock::now()});
}

void NcclWatchdog::run() {
  cudaSetDevice(device_);  // event queries run in this device's context
  const auto timeout = std::chrono::duration<double>(timeout_s_);
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_requested_.wait_for(lock, kPollInterval, [this] { return stop_; })) {
    ncclResult_t state = ncclSuccess;
    ncclCommGetAsyncError(comm_, &state);
    if (state != ncclSuccess && state != ncclInProgress) {
      abort_nccl(comm_, rank_,
                 fmt::format("NCCL reported an error: {} ({})", ncclGetErrorString(state),
                             ncclGetLastError(comm_)));
    }
    // Collectives complete in issue order on the one communication stream: only the oldest
    // unfinished one can be overdue.
    while (!outstanding_.empty()) {
      const Outstanding& oldest = outstanding_.front();
      const cudaError_t status = cudaEventQuery(oldest.done.get());
      if (status == cudaSuccess) {
        outstanding_.pop_front();
        continue;
      }
      if (status != cudaErrorNotReady) {
        abort_nccl(comm_, rank_,
                   fmt::format("NCCL {} #{} failed: {}", oldest.name, oldest.number,
                               cudaGetErrorString(status)));
      }
      if (std::chrono::steady_clock::now() - oldest.start > timeout) {
        abort_nccl(comm_, rank_,
                   fmt::format("NCCL {} #{} did not finish within {} s (another rank failed "
                               "or stopped)",
                               oldest.name, oldest.number, timeout_s_));
      }
      break;
    }
  }
}

void abort_nccl(ncclComm_t comm, int rank, const std::string& message) {
  report_failure(rank, message);
  ncclCommAbort(comm);
  end_job(1);
}

}  // namespace dspine::dist
