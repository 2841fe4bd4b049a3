// Training telemetry: one JSON object per record in a JSONL file, and a one-line progress display
// (rate and ETA) redrawn in place on a terminal.
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <map>
#include <optional>
#include <string>

#include "core/config.h"

namespace dspine::train {

class MetricsLog {
 public:
  // path "" = no file. A fresh run (resume_step < 0) truncates the file; a run resumed at
  // resume_step keeps the records up to that step and appends after them, so records a killed
  // run wrote past its last checkpoint are not repeated.
  MetricsLog(const std::string& path, int64_t resume_step);
  void write(const std::map<std::string, double>& record);

 private:
  std::ofstream out_;
};

// One value of a metrics file and the step of its record.
struct RecordedValue {
  int64_t step = 0;
  double value = 0;
};

// The last record of the metrics file `path` that holds `key` (e.g. "eval/tau"); nullopt when
// the file is absent or no record holds it. Unparseable lines are skipped.
std::optional<RecordedValue> last_recorded(const std::string& path, const std::string& key);

// The metrics file's key of an evaluator's metric `key` (objectives/acceptance.h,
// decode/decoding_evaluation.h): "eval/" + key.
std::string eval_metric(const std::string& key);

class ProgressLine {
 public:
  // logging.progress: auto shows it only when stderr is a terminal.
  ProgressLine(core::ProgressMode mode, int64_t first_step, int64_t total_steps);
  // `measures`: the objective's measures of progress beside the loss, " name value" pairs.
  void update(int64_t step, double loss, const std::string& measures, double tokens_per_second);
  void finish();
  bool enabled() const { return enabled_; }

 private:
  bool terminal_;  // stderr is a terminal: redraw one line (escape codes); else plain lines
  bool enabled_;
  int64_t first_step_, total_steps_;
  std::chrono::steady_clock::time_point start_;
};

// Peak resident memory of this process in bytes (CPU).
int64_t peak_rss_bytes();

}  // namespace dspine::train
