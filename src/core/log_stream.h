// Where the logs go. They go to stdout by default (a training run's console); a tool whose stdout
// carries data (dspine-eval's reports) sends them to stderr before it logs anything, so that its
// output stays parseable whatever it warns about.
#pragma once

namespace dspine::log {

void send_logs_to_stderr();

}  // namespace dspine::log
