#include "train/metrics_log.h"

#include <sys/resource.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/files.h"
#include "core/terminal.h"

namespace dspine::train {

namespace {

// Rewrites `path` with only the records whose step is at most `last_step` (via a temporary file
// and a rename, so a crash here keeps the old file). Unparseable lines, such as a line cut short
// by a kill, are dropped.
void keep_records_up_to(const std::string& path, int64_t last_step) {
  std::ifstream in(path);
  if (!in) return;  // no file yet
  std::string kept, line;
  while (std::getline(in, line)) {
    const auto record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    const auto step = record.is_object() ? record.find("step") : record.end();
    if (step != record.end() && step->is_number_integer() && step->get<int64_t>() <= last_step) {
      kept += line + "\n";
    }
  }
  core::write_file_atomically(path, [&](const std::string& temp) {
    std::ofstream out(temp, std::ios::trunc);
    out << kept;
    out.close();
    if (!out) fail("cannot rewrite metrics file {} (logging.metrics_file)", path);
  });
}

}  // namespace

MetricsLog::MetricsLog(const std::string& path, int64_t resume_step) {
  if (path.empty()) return;
  if (resume_step >= 0) keep_records_up_to(path, resume_step);
  out_.open(path, resume_step >= 0 ? std::ios::app : std::ios::trunc);
  if (!out_) fail("cannot open metrics file {} (logging.metrics_file)", path);
}

void MetricsLog::write(const std::map<std::string, double>& record) {
  if (!out_.is_open()) return;
  nlohmann::json line = nlohmann::json::object();
  for (const auto& [key, value] : record) {
    if (key == "step") {
      line[key] = static_cast<int64_t>(value);
    } else {
      line[key] = value;
    }
  }
  out_ << line.dump() << "\n";
  out_.flush();
}

std::string eval_metric(const std::string& key) { return "eval/" + key; }

std::optional<RecordedValue> last_recorded(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::optional<RecordedValue> last;
  std::string line;
  while (std::getline(in, line)) {
    const auto record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!record.is_object()) continue;
    const auto value = record.find(key);
    const auto step = record.find("step");
    if (value != record.end() && value->is_number() && step != record.end() &&
        step->is_number_integer()) {
      last = RecordedValue{step->get<int64_t>(), value->get<double>()};
    }
  }
  return last;
}

ProgressLine::ProgressLine(core::ProgressMode mode, int64_t first_step, int64_t total_steps)
    : terminal_(core::on_terminal(STDERR_FILENO)),
      enabled_(mode == core::ProgressMode::kOn || (mode == core::ProgressMode::kAuto && terminal_)),
      first_step_(first_step),
      total_steps_(total_steps),
      start_(std::chrono::steady_clock::now()) {}

void ProgressLine::update(int64_t step, double loss, const std::string& measures,
                          double tokens_per_second) {
  if (!enabled_) return;
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double done = static_cast<double>(step - first_step_);
  const double rate = done > 0 ? done / elapsed : 0.0;
  const double eta = rate > 0 ? static_cast<double>(total_steps_ - step) / rate : 0.0;
  // A terminal redraws one line; a pipe or file (progress: true) gets plain lines, no escapes.
  std::fprintf(stderr, "%sstep %lld/%lld  loss %.4f%s  %.2f step/s  %.0f tok/s  ETA %02d:%02d%s",
               terminal_ ? "\r\033[K" : "", static_cast<long long>(step),
               static_cast<long long>(total_steps_), loss, measures.c_str(), rate,
               tokens_per_second,
               static_cast<int>(eta) / 60, static_cast<int>(eta) % 60, terminal_ ? "" : "\n");
  std::fflush(stderr);
}

void ProgressLine::finish() {
  if (enabled_ && terminal_) std::fprintf(stderr, "\n");
}

int64_t peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

}  // namespace dspine::train
